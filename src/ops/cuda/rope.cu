// Rotary embedding on CUDA: one thread per rotated pair (row, i), i < D/2, over a grid-stride
// loop. Consecutive threads take consecutive i, so both halves of a row are read and written
// coalesced; cos/sin ([T, D/2], small) stay in L2. s = +1 forward, -1 backward.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
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

template <typename X, typename A>
__global__ void rotary_kernel(const X* __restrict__ x, const A* __restrict__ cos, const A* __restrict__ sin,
                              X* __restrict__ out, int64_t pairs, int64_t T, int64_t H, int64_t half, A s) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = p / half, i = p % half;
    const int64_t t = (r / H) % T;
    const int64_t base = r * 2 * half;
    rotate_pair(x + base, out + base, i, half, cos[t * half + i], s * sin[t * half + i]);
  }
}

// qkv_rotary: one thread per pair (packed row, i) of qkv [B, T, 3, H, D]; consecutive threads
// take consecutive i and h, so the packed side is contiguous and each head row is too.
template <typename X, typename A>
__global__ void qkv_rotary_kernel(X* __restrict__ packed, X* __restrict__ q, X* __restrict__ k, X* __restrict__ v,
                                  const A* __restrict__ cos, const A* __restrict__ sin, int64_t pairs, int64_t T,
                                  int64_t H, int64_t half, bool split) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = p / half, i = p % half;  // r = ((b T + t) 3 + j) H + h
    const int64_t h = r % H, j = (r / H) % 3, bt = r / (3 * H), t = bt % T, b = bt / T;
    X* hr = (j == 0 ? q : j == 1 ? k : v) + ((b * H + h) * T + t) * 2 * half;
    X* pr = packed + r * 2 * half;
    const X* src = split ? pr : hr;
    X* dst = split ? hr : pr;
    if (j == 2) {
      dst[i] = src[i];
      dst[i + half] = src[i + half];
      continue;
    }
    rotate_pair(src, dst, i, half, cos[t * half + i], (split ? A(1) : A(-1)) * sin[t * half + i]);
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
    qkv_rotary_kernel<X, A><<<blocks_for(pairs, kThreads), kThreads, 0, current_raw_stream(qkv.device().index)>>>(
        static_cast<X*>(qkv.data_ptr()), static_cast<X*>(q.data_ptr()), static_cast<X*>(k.data_ptr()),
        static_cast<X*>(v.data_ptr()), static_cast<const A*>(cos.data_ptr()), static_cast<const A*>(sin.data_ptr()),
        pairs, T, H, half, split);
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
        static_cast<const A*>(sin.data_ptr()), static_cast<X*>(out.data_ptr()), pairs, T, H, half,
        static_cast<A>(sign));
    KILN_CUDA_CHECK_LAUNCH("apply_rotary_emb");
  });
}

}  // namespace kiln::cuda
