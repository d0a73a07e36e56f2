// Elementwise bandwidth against copies: CPU kernels vs memcpy, CUDA kernels vs a device copy
// (cudaMemcpyAsync through Tensor::copy_). Outputs are preallocated so page faults and the
// allocator stay out of the numbers. Usage: bench_elementwise [log2(elements), default 28]
// Targets: CPU elementwise >= 70% of memcpy, CUDA >= 80% of device copy (bytes read + written).
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
#include "ops/cuda/elementwise.h"

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

void run(Device device, int64_t n) {
  const bool gpu = device.is_cuda();
  auto sync = [&] {
    if (gpu) cuda::synchronize(device.index);
  };
  for (DType dt : {kFloat32, kBFloat16}) {
    const Tensor a = randn({n}, TensorOptions(dt).device(device)), b = randn({n}, TensorOptions(dt).device(device));
    Tensor o = empty({n}, TensorOptions(dt).device(device));
    o.fill_(1.0);
    const double bytes = static_cast<double>(n) * element_size(dt);
    double copy_s;
    if (gpu) {
      copy_s = best_seconds([&] { o.copy_(a); }, sync, 10);
    } else {
      std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 2);
      copy_s = best_seconds([&] { std::memcpy(dst.data(), src.data(), src.size()); }, sync, 10);
    }
    const double copy_bw = 2 * bytes / copy_s;
    std::printf("%s %s n=%lld: copy %.1f GB/s\n", device.str().c_str(), dtype_name(dt), static_cast<long long>(n),
                copy_bw / 1e9);
    struct Case {
      std::string name;
      int streams;
      std::function<void()> f;
    };
    const std::vector<Case> cases = {
        {"add", 3, [&] { gpu ? cuda::binary(BinaryOp::Add, o, a, b, {}) : cpu::binary(BinaryOp::Add, o, a, b, {}); }},
        {"mul_scalar", 2,
         [&] { gpu ? cuda::binary_scalar(BinaryOp::Mul, o, a, 1.5, {}) : cpu::binary_scalar(BinaryOp::Mul, o, a, 1.5, {}); }},
        {"exp", 2, [&] { gpu ? cuda::unary(UnaryOp::Exp, o, a, {}) : cpu::unary(UnaryOp::Exp, o, a, {}); }},
        {"silu", 2, [&] { gpu ? cuda::unary(UnaryOp::Silu, o, a, {}) : cpu::unary(UnaryOp::Silu, o, a, {}); }},
        {"gelu", 2, [&] { gpu ? cuda::unary(UnaryOp::Gelu, o, a, {}) : cpu::unary(UnaryOp::Gelu, o, a, {}); }},
        {"silu_backward", 3, [&] {
           gpu ? cuda::binary(BinaryOp::SiluBackward, o, a, b, {}) : cpu::binary(BinaryOp::SiluBackward, o, a, b, {});
         }},
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
