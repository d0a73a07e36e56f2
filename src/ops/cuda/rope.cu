// Rotary embedding on CUDA: one thread per rotated pair (row, i), i < D/2 (the fused qkv split: per
// vector of pairs), over a grid-stride loop, its dims split by IntDivider. Consecutive threads take
// consecutive i, so both halves of a row are read and written coalesced; cos/sin ([T, D/2], small)
// stay in L2. s = +1 forward, -1 backward.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/int_divider.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/cuda/rope.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// Pair i of one row (D = 2 half values): dst = src rotated by the angle whose cos is c, sin si.
template <typename X, typename A>
__device__ __forceinline__ void rotate_pair(const X* src, X* dst, int64_t i, int64_t half, A c, A si) {
  const A x1 = convert<A>(src[i]), x2 = convert<A>(src[i + half]);
  dst[i] = convert<X>(x1 * c - x2 * si);
  dst[i + half] = convert<X>(x2 * c + x1 * si);
}

// The dims of a pair index, by IntDivider when the tensor has fewer than 2^31 pairs (narrow;
// the 64-bit divides cost ~5x the kernel's memory time), else by 64-bit arithmetic.
struct PairDims {
  bool narrow;
  int64_t half, H, T;
  IntDivider d_half, d_H, d_3, d_T;
  PairDims(int64_t pairs, int64_t half_, int64_t H_, int64_t T_) : narrow(pairs < (int64_t{1} << 31)), half(half_), H(H_), T(T_) {
    if (narrow) {
      d_half = IntDivider(static_cast<uint32_t>(half));
      d_H = IntDivider(static_cast<uint32_t>(H));
      d_3 = IntDivider(3);
      d_T = IntDivider(static_cast<uint32_t>(T));
    }
  }
  // p = row * half + i.
  __device__ __forceinline__ void split(int64_t p, int64_t& row, int64_t& i) const { divmod(p, d_half, half, row, i); }
  // a = q * (divisor of d) + r for d one of the dividers, with its 64-bit fallback n.
  __device__ __forceinline__ void divmod(int64_t a, const IntDivider& d, int64_t n, int64_t& q, int64_t& r) const {
    if (narrow) {
      uint32_t qq, rr;
      d.divmod(static_cast<uint32_t>(a), qq, rr);
      q = qq, r = rr;
    } else {
      q = a / n, r = a % n;
    }
  }
};

template <typename X, typename A>
__global__ void rotary_kernel(const X* __restrict__ x, const A* __restrict__ cos, const A* __restrict__ sin,
                              X* __restrict__ out, int64_t pairs, PairDims dims, A s) {
  const int64_t half = dims.half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, i, rh, h, bt, t;
    dims.split(p, r, i);
    dims.divmod(r, dims.d_H, dims.H, rh, h);  // r = (b T + t) H + h
    dims.divmod(rh, dims.d_T, dims.T, bt, t);
    const int64_t base = r * 2 * half;
    rotate_pair(x + base, out + base, i, half, cos[t * half + i], s * sin[t * half + i]);
  }
}

// qkv_rotary: one thread per V consecutive pairs (packed row, i..i+V) of qkv [B, T, 3, H, D], read
// and written as V-element vectors from both halves of the row; consecutive threads take
// consecutive i and h, so the packed side is contiguous and each head row is too.
template <typename X, typename A, int V>
__global__ void qkv_rotary_kernel(X* __restrict__ packed, X* __restrict__ q, X* __restrict__ k, X* __restrict__ v,
                                  const A* __restrict__ cos, const A* __restrict__ sin, int64_t pairs, PairDims dims,
                                  bool split) {
  using PX = Pack<X, V>;
  using PA = Pack<A, V>;
  const int64_t half = dims.half, H = dims.H, T = dims.T;
  for (int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x * V) {
    int64_t r, i, r3, h, bt, j, b, t;
    dims.split(p, r, i);  // r = ((b T + t) 3 + j) H + h
    dims.divmod(r, dims.d_H, H, r3, h);
    dims.divmod(r3, dims.d_3, 3, bt, j);
    dims.divmod(bt, dims.d_T, T, b, t);
    X* hr = (j == 0 ? q : j == 1 ? k : v) + ((b * H + h) * T + t) * 2 * half;
    X* pr = packed + r * 2 * half;
    const X* src = split ? pr : hr;
    X* dst = split ? hr : pr;
    const PX x1 = *reinterpret_cast<const PX*>(src + i), x2 = *reinterpret_cast<const PX*>(src + i + half);
    if (j == 2) {
      *reinterpret_cast<PX*>(dst + i) = x1;
      *reinterpret_cast<PX*>(dst + i + half) = x2;
      continue;
    }
    const PA c = *reinterpret_cast<const PA*>(cos + t * half + i), sn = *reinterpret_cast<const PA*>(sin + t * half + i);
    PX o1, o2;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A a = convert<A>(x1.v[e]), bb = convert<A>(x2.v[e]), si = split ? sn.v[e] : -sn.v[e];
      o1.v[e] = convert<X>(a * c.v[e] - bb * si);
      o2.v[e] = convert<X>(bb * c.v[e] + a * si);
    }
    *reinterpret_cast<PX*>(dst + i) = o1;
    *reinterpret_cast<PX*>(dst + i + half) = o2;
  }
}

}  // namespace

void qkv_rotary(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                const Tensor& sin, bool split) {
  const int64_t H = q.size(1), T = q.size(2), half = q.size(3) / 2;
  const int64_t pairs = qkv.numel() / 2;
  if (pairs == 0) return;
  DeviceGuard guard(qkv.device().index);
  dispatch_floating(qkv.dtype(), "qkv_rotary_split", [&](auto tag) {
    using X = device_t<typename decltype(tag)::type>;
    using A = dacc_t<X>;
    const bool aligned = reinterpret_cast<uintptr_t>(qkv.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(cos.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(sin.data_ptr()) % 16 == 0;
    auto launch = [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      qkv_rotary_kernel<X, A, V><<<blocks_for(pairs / V, kThreads), kThreads, 0, current_raw_stream(qkv.device().index)>>>(
          static_cast<X*>(qkv.data_ptr()), static_cast<X*>(q.data_ptr()), static_cast<X*>(k.data_ptr()),
          static_cast<X*>(v.data_ptr()), static_cast<const A*>(cos.data_ptr()), static_cast<const A*>(sin.data_ptr()),
          pairs, PairDims(pairs, half, H, T), split);
    };
    // 8-byte vectors of X (4 bf16 or 2 fp32) where every row half splits into them; q, k, v are
    // fresh allocations (aligned), qkv and the tables may be views.
    constexpr int kVec = static_cast<int>(8 / sizeof(X)) > 1 ? static_cast<int>(8 / sizeof(X)) : 1;
    if (aligned && half % kVec == 0) launch(std::integral_constant<int, kVec>{});
    else launch(std::integral_constant<int, 1>{});
    KILN_CUDA_CHECK_LAUNCH("qkv_rotary_split");
  });
}

void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out) {
  const int64_t T = x.size(1), H = x.size(2), half = x.size(3) / 2;
  const int64_t pairs = x.numel() / 2;
  if (pairs == 0) return;
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "apply_rotary_emb", [&](auto tag) {
    using X = device_t<typename decltype(tag)::type>;
    using A = dacc_t<X>;
    rotary_kernel<X, A><<<blocks_for(pairs, kThreads), kThreads, 0, current_raw_stream(x.device().index)>>>(
        static_cast<const X*>(x.data_ptr()), static_cast<const A*>(cos.data_ptr()),
        static_cast<const A*>(sin.data_ptr()), static_cast<X*>(out.data_ptr()), pairs, PairDims(pairs, half, H, T),
        static_cast<A>(sign));
    KILN_CUDA_CHECK_LAUNCH("apply_rotary_emb");
  });
}

}  // namespace kiln::cuda
