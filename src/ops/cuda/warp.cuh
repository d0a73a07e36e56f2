#pragma once
// Warp and block reductions shared by the nn kernels (norm, loss, optim). Fixed shuffle order, so
// results are bitwise reproducible run to run.
#include <cuda_runtime.h>

namespace kiln::cuda {

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over a 1-D block of kThreads (a multiple of 32, at most 1024); every thread gets the result.
template <int kThreads, typename A>
__device__ __forceinline__ A block_sum(A v) {
  __shared__ A partial[kThreads / 32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  A total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();  // partial may be reused by a following call
  return total;
}

}  // namespace kiln::cuda
