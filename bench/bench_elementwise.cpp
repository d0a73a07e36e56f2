// Elementwise bandwidth against copies: CPU kernels vs memcpy, CUDA kernels vs a device copy
// (cudaMemcpyAsync through Tensor::copy_). Outputs are preallocated so page faults and the
// allocator stay out of the numbers. Usage: bench_elementwise [log2(elements), default 28]
// Targets: CPU elementwise >= 70% of memcpy, CUDA >= 80% of device copy (bytes read + written).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kiln/cuda.h"
#include "kiln/kiln.h"
#include "ops/cpu/elementwise.h"
#ifdef KILN_WITH_CUDA
#include "ops/cuda/elementwise.h"
#endif

using namespace kiln;

namespace {

double best_seconds(const std::function<void()>& f, const std::function<void()>& sync, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sync();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

#ifdef KILN_WITH_CUDA
#define KILN_GPU(call) call
#else
#define KILN_GPU(call) (void)0
#endif

void run(Device device, int64_t n) {
  const bool gpu = device.is_cuda();
  auto sync = [&] {
    if (gpu) cuda::synchronize(device.index);
  };
  for (DType dt : {kFloat32, kBFloat16}) {
    const Tensor a = randn({n}, TensorOptions(dt).device(device)), b = randn({n}, TensorOptions(dt).device(device));
    const Tensor pos = abs(a);  // log/rsqrt inputs in their domain
    Tensor o = empty({n}, TensorOptions(dt).device(device));
    o.fill_(1.0);
    const double bytes = static_cast<double>(n) * element_size(dt);
    double copy_s;
    if (gpu) {
      copy_s = best_seconds([&] { o.copy_(a); }, sync, 10);
    } else {
      // Parallel memcpy with the threads the kernels use (a one-thread copy would flatter them).
      std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 2);
      const int threads = omp_get_max_threads();
      const size_t total = src.size(), chunk = (total + threads - 1) / threads;
      copy_s = best_seconds(
          [&] {
#pragma omp parallel for schedule(static)
            for (int t = 0; t < threads; ++t) {
              const size_t lo = std::min(total, t * chunk), hi = std::min(total, lo + chunk);
              std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
            }
          },
          sync, 10);
    }
    const double copy_bw = 2 * bytes / copy_s;
    std::printf("%s %s n=%lld: copy %.1f GB/s\n", device.str().c_str(), dtype_name(dt), static_cast<long long>(n),
                copy_bw / 1e9);
    struct Case {
      std::string name;
      double streams;  // bytes moved per element, in units of the dtype's size
      std::function<void()> f;
    };
    const double es = static_cast<double>(element_size(dt));
    const Tensor cond = gt(a, b);  // bool, one byte per element
    Tensor bo = empty({n}, TensorOptions(kBool).device(device));
    auto bin_p = [&](BinaryOp op, const Tensor& x, const Tensor& y, EwParams p) {
      return [&, op, p] { gpu ? KILN_GPU(cuda::binary(op, o, x, y, p)) : cpu::binary(op, o, x, y, p); };
    };
    auto un_p = [&](UnaryOp op, const Tensor& x, EwParams p) {
      return [&, op, p] { gpu ? KILN_GPU(cuda::unary(op, o, x, p)) : cpu::unary(op, o, x, p); };
    };
    EwParams sub_p, clamp_p;
    sub_p.alpha = -1.0;
    clamp_p.lo = -0.5;
    clamp_p.hi = 0.5;
    auto un = [&](UnaryOp op, const Tensor& x) {
      return [&, op] { gpu ? KILN_GPU(cuda::unary(op, o, x, {})) : cpu::unary(op, o, x, {}); };
    };
    auto bin = [&](BinaryOp op) {
      return [&, op] { gpu ? KILN_GPU(cuda::binary(op, o, a, b, {})) : cpu::binary(op, o, a, b, {}); };
    };
    const std::vector<Case> cases = {
        {"add", 3, bin(BinaryOp::Add)},
        {"mul_scalar", 2,
         [&] { gpu ? KILN_GPU(cuda::binary_scalar(BinaryOp::Mul, o, a, 1.5, {})) : cpu::binary_scalar(BinaryOp::Mul, o, a, 1.5, {}); }},
        {"exp", 2, un(UnaryOp::Exp, a)},
        {"log", 2, un(UnaryOp::Log, pos)},
        {"sigmoid", 2, un(UnaryOp::Sigmoid, a)},
        {"tanh", 2, un(UnaryOp::Tanh, a)},
        {"silu", 2, un(UnaryOp::Silu, a)},
        {"gelu", 2, un(UnaryOp::Gelu, a)},
        {"gelu_tanh", 2, un(UnaryOp::GeluTanh, a)},
        {"erf", 2, un(UnaryOp::Erf, a)},
        {"rsqrt", 2, un(UnaryOp::Rsqrt, pos)},
        {"silu_backward", 3, bin(BinaryOp::SiluBackward)},
        {"gelu_backward", 3, bin(BinaryOp::GeluBackward)},
        {"sub", 3, bin_p(BinaryOp::Add, a, b, sub_p)},
        {"div", 3, bin(BinaryOp::Div)},
        {"pow", 3, bin_p(BinaryOp::Pow, pos, b, {})},
        {"maximum", 3, bin(BinaryOp::Maximum)},
        {"neg", 2, un(UnaryOp::Neg, a)},
        {"sqrt", 2, un(UnaryOp::Sqrt, pos)},
        {"relu", 2, un(UnaryOp::Relu, a)},
        {"clamp", 2, un_p(UnaryOp::Clamp, a, clamp_p)},
        {"lt", (2 * es + 1) / es,
         [&] { gpu ? KILN_GPU(cuda::compare(CompareOp::Lt, bo, a, b)) : cpu::compare(CompareOp::Lt, bo, a, b); }},
        {"where", (3 * es + 1) / es, [&] { gpu ? KILN_GPU(cuda::where(o, cond, a, b)) : cpu::where(o, cond, a, b); }},
    };
    for (const Case& c : cases) {
      const double s = best_seconds(c.f, sync, 10);
      const double bw = c.streams * bytes / s;
      std::printf("  %-14s %8.1f GB/s  %5.1f%% of copy\n", c.name.c_str(), bw / 1e9, 100 * bw / copy_bw);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int log2n = argc > 1 ? std::atoi(argv[1]) : 28;
  const int64_t n = int64_t{1} << log2n;
  run(kCPU, std::min<int64_t>(n, int64_t{1} << 26));
  if (cuda_is_available()) run(Device("cuda"), n);
  return 0;
}
