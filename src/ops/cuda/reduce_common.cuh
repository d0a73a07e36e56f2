#pragma once
// Device-side reduction operators shared by the reduction and softmax kernels: accumulators,
// warp shuffles of them, and warp/block tree reductions. Trees have a fixed shape, and argmax
// breaks ties by index, so every result is independent of scheduling.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda/device_types.cuh"

namespace kiln::cuda {

template <typename A>
__device__ __forceinline__ bool d_isnan(A v) {
  if constexpr (std::is_floating_point_v<A>) {
    return isnan(v);
  } else {
    return false;
  }
}

template <typename A>
__device__ __forceinline__ A d_lowest() {
  if constexpr (std::is_floating_point_v<A>) {
    return -INFINITY;
  } else if constexpr (std::is_same_v<A, bool>) {
    return false;
  } else {
    return std::numeric_limits<A>::lowest();
  }
}
template <typename A>
__device__ __forceinline__ A d_highest() {
  if constexpr (std::is_floating_point_v<A>) {
    return INFINITY;
  } else if constexpr (std::is_same_v<A, bool>) {
    return true;
  } else {
    return std::numeric_limits<A>::max();
  }
}

// Full-precision exp/log picked by type (never the fast-math intrinsics).
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return ::exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return ::log(x); }

template <bool kMax, typename A>
__device__ __forceinline__ bool d_beats(A x, A a) {
  if (d_isnan(x)) return !d_isnan(a);
  return kMax ? x > a : x < a;
}

template <typename T>
__device__ __forceinline__ T shfl_down(T v, int off) {
  if constexpr (sizeof(T) < 4) {
    return static_cast<T>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), off));
  } else {
    return __shfl_down_sync(0xffffffffu, v, off);
  }
}

template <typename A>
struct SumOp {
  using Acc = A;
  static __device__ __forceinline__ Acc init() { return A(0); }
  static __device__ __forceinline__ void add(Acc& a, A x, int64_t) { a += x; }
  static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return a + b; }
  static __device__ __forceinline__ Acc shfl(Acc a, int off) { return shfl_down(a, off); }
};

template <typename A, bool kMax>
struct ExtremeOp {
  using Acc = A;
  static __device__ __forceinline__ Acc init() { return kMax ? d_lowest<A>() : d_highest<A>(); }
  static __device__ __forceinline__ void add(Acc& a, A x, int64_t) {
    if (d_beats<kMax>(x, a)) a = x;
  }
  static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return d_beats<kMax>(b, a) ? b : a; }
  static __device__ __forceinline__ Acc shfl(Acc a, int off) { return shfl_down(a, off); }
};

template <typename A>
struct ArgAcc {
  A v;
  int64_t i;  // -1: empty
};

template <typename A, bool kMax = true>
struct ArgMaxOp {
  using Acc = ArgAcc<A>;
  static __device__ __forceinline__ Acc init() { return {kMax ? d_lowest<A>() : d_highest<A>(), -1}; }
  static __device__ __forceinline__ void add(Acc& a, A x, int64_t idx) {
    if (a.i < 0 || d_beats<kMax>(x, a.v)) a = {x, idx};
  }
  // Order-free: equal values (or two NaNs) keep the smaller index.
  static __device__ __forceinline__ Acc merge(Acc a, Acc b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    if (d_beats<kMax>(b.v, a.v)) return b;
    if (d_beats<kMax>(a.v, b.v)) return a;
    return b.i < a.i ? b : a;
  }
  static __device__ __forceinline__ Acc shfl(Acc a, int off) { return {shfl_down(a.v, off), shfl_down(a.i, off)}; }
};

template <typename A>
struct LseAcc {
  A m, s;  // running max and sum of exp(x - m)
};

template <typename A>
struct LseOp {
  using Acc = LseAcc<A>;
  static __device__ __forceinline__ Acc init() { return {-INFINITY, A(0)}; }
  static __device__ __forceinline__ void add(Acc& a, A x, int64_t) {
    if (isnan(x) || isnan(a.m)) {
      a = {A(NAN), A(1)};
    } else if (x > a.m) {
      a.s = a.s * d_exp(a.m - x) + A(1);
      a.m = x;
    } else if (x == a.m) {
      a.s += A(1);
    } else {
      a.s += d_exp(x - a.m);
    }
  }
  static __device__ __forceinline__ Acc merge(Acc a, Acc b) {
    if (isnan(a.m) || isnan(b.m)) return {A(NAN), A(1)};
    const A m = a.m > b.m ? a.m : b.m;
    if (m == -INFINITY) return {m, a.s + b.s};
    return {m, a.s * d_exp(a.m - m) + b.s * d_exp(b.m - m)};
  }
  static __device__ __forceinline__ Acc shfl(Acc a, int off) { return {shfl_down(a.m, off), shfl_down(a.s, off)}; }
  static __device__ __forceinline__ A result(Acc a) { return a.s == A(0) ? A(-INFINITY) : a.m + d_log(a.s); }
};

template <typename Op>
__device__ __forceinline__ typename Op::Acc warp_reduce(typename Op::Acc a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a = Op::merge(a, Op::shfl(a, off));
  return a;
}

// Block-wide reduction; the result is valid in thread 0. blockDim.x must be a multiple of 32.
template <typename Op>
__device__ __forceinline__ typename Op::Acc block_reduce(typename Op::Acc a) {
  using Acc = typename Op::Acc;
  __shared__ Acc smem[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  a = warp_reduce<Op>(a);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < nwarps ? smem[lane] : Op::init();
    a = warp_reduce<Op>(a);
  }
  return a;
}

// Broadcasts thread 0's value of a block reduction to every thread.
template <typename Op>
__device__ __forceinline__ typename Op::Acc block_allreduce(typename Op::Acc a) {
  using Acc = typename Op::Acc;
  __shared__ Acc result;
  a = block_reduce<Op>(a);
  if (threadIdx.x == 0) result = a;
  __syncthreads();
  a = result;
  __syncthreads();
  return a;
}

// 16-byte vector of T.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {  // N == 1 must not pad to 16 bytes
  T v[N];
};

}  // namespace kiln::cuda
