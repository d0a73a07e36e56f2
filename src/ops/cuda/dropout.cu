// Dropout on CUDA: one thread per Philox block, i.e. per 4 consecutive elements (grid-stride),
// the same keep rule as the CPU kernel (src/ops/cpu/dropout.cpp), so one seed gives the same
// mask on both backends. The mask is regenerated in backward, never stored.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/philox.h"
#include "core/tensor_impl.h"
#include "ops/cuda/dropout.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, typename A>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, uint64_t seed,
                               uint64_t offset, double keep_below, A scale) {
  const int64_t nblocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < nblocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const philox::Block r = philox::generate(seed, offset + static_cast<uint64_t>(b));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = b * 4 + k;
      if (i < n) {
        const bool keep = static_cast<double>(r.x[k] >> 8) < keep_below;
        out[i] = keep ? convert<T>(convert<A>(x[i]) * scale) : convert<T>(A(0));
      }
    }
  }
}

}  // namespace

void dropout_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    const A scale = p < 1.0 ? static_cast<A>(1.0 / (1.0 - p)) : A(0);
    dropout_kernel<T, A><<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, current_raw_stream(x.device().index)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), n, seed, offset,
        (1.0 - p) * 16777216.0, scale);
    KILN_CUDA_CHECK_LAUNCH("dropout");
  });
}

}  // namespace kiln::cuda
