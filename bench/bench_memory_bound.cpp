// Memory-bound ops against the copy bandwidth measured in the same run.
//   CUDA: elementwise and reductions on multi-GiB tensors vs a device-to-device copy.
//   CPU:  elementwise on large fp32 arrays vs a parallel memcpy.
// Prints one JSON line per case ({"bench":"memory_bound", ...,"ratio": achieved/copy}) and a
// table at the end. Bytes are the fewest the op must move (each input read once, output written once).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;

namespace {

struct Row {
  std::string device, op, dtype;
  double ms, gbps, ratio;
};
std::vector<Row> rows;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_cuda_ms(const std::function<void()>& fn, int warm = 3, int iters = 15) {
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    cuda::Event a, b;
    a.record();
    fn();
    b.record();
    b.synchronize();
    ts.push_back(a.elapsed_ms(b));
  }
  return median(ts);
}

double time_cpu_ms(const std::function<void()>& fn, int warm = 2, int iters = 9) {
  for (int i = 0; i < warm; ++i) fn();
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ts);
}

void emit(const std::string& device, const std::string& op, DType dt, double ms, double bytes, double copy_gbps) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  const double ratio = copy_gbps > 0 ? gbps / copy_gbps : 1.0;
  rows.push_back({device, op, dtype_name(dt), ms, gbps, ratio});
  std::printf("{\"bench\":\"memory_bound\",\"device\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\",\"ms\":%.4f,"
              "\"gbps\":%.1f,\"copy_gbps\":%.1f,\"ratio\":%.3f}\n",
              device.c_str(), op.c_str(), dtype_name(dt), ms, gbps, copy_gbps, ratio);
  std::fflush(stdout);
}

void bench_cuda(int64_t bytes_per_tensor) {
  const Device dev("cuda");
  for (DType dt : {kFloat32, kBFloat16}) {
    const int64_t n = bytes_per_tensor / static_cast<int64_t>(element_size(dt));
    const double sz = static_cast<double>(n) * static_cast<double>(element_size(dt));
    Tensor a = randn({n}, TensorOptions().dtype(dt).device(dev));
    Tensor b = randn({n}, TensorOptions().dtype(dt).device(dev));
    Tensor dst = empty({n}, TensorOptions().dtype(dt).device(dev));
    const double copy_ms = time_cuda_ms([&] { dst.copy_(a); });
    const double copy_gbps = 2 * sz / (copy_ms * 1e-3) / 1e9;
    emit("cuda", "copy", dt, copy_ms, 2 * sz, copy_gbps);
    NoGradGuard no_grad;
    emit("cuda", "add", dt, time_cuda_ms([&] { add(a, b); }), 3 * sz, copy_gbps);
    emit("cuda", "mul_scalar", dt, time_cuda_ms([&] { mul(a, 1.5); }), 2 * sz, copy_gbps);
    emit("cuda", "exp", dt, time_cuda_ms([&] { exp(a); }), 2 * sz, copy_gbps);
    emit("cuda", "silu", dt, time_cuda_ms([&] { silu(a); }), 2 * sz, copy_gbps);
    emit("cuda", "gelu_tanh", dt, time_cuda_ms([&] { gelu(a, "tanh"); }), 2 * sz, copy_gbps);
    Tensor rowsx = a.view({-1, 4096});
    emit("cuda", "sum_all", dt, time_cuda_ms([&] { sum(a); }), sz, copy_gbps);
    emit("cuda", "sum_lastdim", dt, time_cuda_ms([&] { sum(rowsx, {1}); }), sz, copy_gbps);
    emit("cuda", "sum_dim0", dt, time_cuda_ms([&] { sum(rowsx, {0}); }), sz, copy_gbps);
    emit("cuda", "amax_lastdim", dt, time_cuda_ms([&] { amax(rowsx, {1}); }), sz, copy_gbps);
    emit("cuda", "softmax_lastdim", dt, time_cuda_ms([&] { softmax(rowsx, -1); }), 2 * sz, copy_gbps);
  }
}

void bench_cpu(int64_t n) {
  Tensor a = randn({n}), b = randn({n}), dst = empty({n});
  const double sz = static_cast<double>(n) * 4;
  // Parallel memcpy with the same threads kiln uses: the stricter reference.
  const int threads = omp_get_max_threads();
  const auto chunk = static_cast<size_t>((n + threads - 1) / threads) * 4;
  auto* src = static_cast<char*>(a.data_ptr());
  auto* out = static_cast<char*>(dst.data_ptr());
  const auto total = static_cast<size_t>(sz);
  const double copy_ms = time_cpu_ms([&] {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
      const size_t lo = std::min(total, t * chunk), hi = std::min(total, lo + chunk);
      std::memcpy(out + lo, src + lo, hi - lo);
    }
  });
  const double copy_gbps = 2 * sz / (copy_ms * 1e-3) / 1e9;
  emit("cpu", "memcpy", kFloat32, copy_ms, 2 * sz, copy_gbps);
  NoGradGuard no_grad;
  emit("cpu", "add", kFloat32, time_cpu_ms([&] { add(a, b); }), 3 * sz, copy_gbps);
  emit("cpu", "mul_scalar", kFloat32, time_cpu_ms([&] { mul(a, 1.5); }), 2 * sz, copy_gbps);
  emit("cpu", "exp", kFloat32, time_cpu_ms([&] { exp(a); }), 2 * sz, copy_gbps);
  emit("cpu", "silu", kFloat32, time_cpu_ms([&] { silu(a); }), 2 * sz, copy_gbps);
  emit("cpu", "sum_all", kFloat32, time_cpu_ms([&] { sum(a); }), sz, copy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string which = argc > 1 ? argv[1] : "all";
    if ((which == "all" || which == "cuda") && cuda_is_available()) bench_cuda(int64_t{2} << 30);
    if (which == "all" || which == "cpu") bench_cpu(int64_t{64} << 20);
    std::printf("\n%-6s %-16s %-9s %10s %10s %7s\n", "device", "op", "dtype", "ms", "GB/s", "ratio");
    for (const Row& r : rows)
      std::printf("%-6s %-16s %-9s %10.3f %10.1f %7.3f\n", r.device.c_str(), r.op.c_str(), r.dtype.c_str(), r.ms,
                  r.gbps, r.ratio);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_memory_bound: %s\n", e.what());
    return 1;
  }
  return 0;
}
