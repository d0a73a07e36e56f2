// RMSNorm with the residual add before it and the output cast after it, one pass each way. A block
// owns a fixed chunk of rows and walks them one at a time; each thread keeps its packs of the row
// (16-byte vectors of x) in registers, so the row is read from memory once: forward reads x (and
// the residual), writes h = x + residual, y (in the next GEMM's dtype) and rstd; backward reads
// dy, h (and the residual stream's own gradient) and writes dx (and dx in the residual's dtype),
// accumulating the weight gradient of its rows in registers. The per-chunk weight partials are
// added in a fixed order by a second small kernel: no atomics, dweight is bitwise reproducible.
#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/cuda/norm.h"
#include "ops/cuda/warp.cuh"

namespace kiln::cuda {
namespace {

// Packs per thread: one up to 1024 packs a row (bf16 H <= 8192, fp32 H <= 4096), else kMaxItems
// with at most 512 threads (twice those sizes); wider rows take the two-kernel path in norm.cu.
constexpr int kMaxItems = 4;
constexpr int kPackBytes = 16;  // one vector load of x: 4 fp32, 8 bf16

// Sum over a block of any multiple of 32 threads; every thread gets the result, added in a fixed
// order (reproducible).
template <typename A>
__device__ __forceinline__ A block_sum_any(A v) {
  __shared__ A partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  A total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += partial[w];
  __syncthreads();
  return total;
}

template <typename To, typename From, int N>
__device__ __forceinline__ void load_pack(const From* p, int64_t pack, To (&out)[N]) {
  const Pack<From, N> v = reinterpret_cast<const Pack<From, N>*>(p)[pack];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = convert<To>(v.v[i]);
}

template <typename To, typename From, int N>
__device__ __forceinline__ void store_pack(To* p, int64_t pack, const From (&in)[N]) {
  Pack<To, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = convert<To>(in[i]);
  reinterpret_cast<Pack<To, N>*>(p)[pack] = v;
}

struct NormGeometry {
  int64_t rows, H, chunk;
  int packs;  // H / N
};

// x, residual: [rows, H]; h (written when residual is given), y: [rows, H]; rstd: [rows].
template <typename X, typename Y, typename R, int kItems>
__global__ void __launch_bounds__(kItems == 1 ? 1024 : 512) fused_rms_forward(const X* __restrict__ x, const R* __restrict__ residual,
                                                          const X* __restrict__ w, X* __restrict__ h,
                                                          Y* __restrict__ y, dacc_t<X>* __restrict__ rstd,
                                                          NormGeometry g, dacc_t<X> eps) {
  using A = dacc_t<X>;
  constexpr int N = kPackBytes / sizeof(X);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * g.chunk, last = min(g.rows, first + g.chunk);
  for (int64_t r = first; r < last; ++r) {
    const X* xr = x + r * g.H;
    A v[kItems][N];
    A ss = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p >= g.packs) continue;
      load_pack<A>(xr, p, v[i]);
      if (residual) {
        A rv[N];
        load_pack<A>(residual + r * g.H, p, rv);
        // h is rounded to X before the statistics, so backward (which reads h) sees the same values.
#pragma unroll
        for (int k = 0; k < N; ++k) v[i][k] = convert<A>(convert<X>(v[i][k] + rv[k]));
        store_pack<X>(h + r * g.H, p, v[i]);
      }
#pragma unroll
      for (int k = 0; k < N; ++k) ss += v[i][k] * v[i][k];
    }
    const A rs = static_cast<A>(1) / sqrt(block_sum_any(ss) / static_cast<A>(g.H) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p >= g.packs) continue;
      A wv[N];
      if (w) load_pack<A>(w, p, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) v[i][k] = v[i][k] * rs * (w ? wv[k] : static_cast<A>(1));
      store_pack<Y>(y + r * g.H, p, v[i]);
    }
  }
}

// dy: [rows, H] (y's dtype); h: the normalised input; dres: the gradient h gets from its other
// uses, added to dx (or null); dx: [rows, H] in X; dr: the same values in R (or null);
// partial: [gridDim.x, H] per-chunk weight gradients (or null).
template <typename X, typename Y, typename R, int kItems>
__global__ void __launch_bounds__(kItems == 1 ? 1024 : 512) fused_rms_backward(const Y* __restrict__ dy, const X* __restrict__ h,
                                                           const X* __restrict__ w, const dacc_t<X>* __restrict__ rstd,
                                                           const X* __restrict__ dres, X* __restrict__ dx,
                                                           R* __restrict__ dr, dacc_t<X>* __restrict__ partial,
                                                           NormGeometry g) {
  using A = dacc_t<X>;
  constexpr int N = kPackBytes / sizeof(X);
  A dw[kItems][N] = {};
  const int64_t first = static_cast<int64_t>(blockIdx.x) * g.chunk, last = min(g.rows, first + g.chunk);
  for (int64_t r = first; r < last; ++r) {
    const A rs = rstd[r];
    A gw[kItems][N], xh[kItems][N];
    A dot = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p >= g.packs) continue;
      A gv[N], wv[N];
      load_pack<A>(dy + r * g.H, p, gv);
      load_pack<A>(h + r * g.H, p, xh[i]);
      if (w) load_pack<A>(w, p, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        xh[i][k] *= rs;
        dw[i][k] += gv[k] * xh[i][k];
        gw[i][k] = w ? gv[k] * wv[k] : gv[k];
        dot += gw[i][k] * xh[i][k];
      }
    }
    const A mean_dot = block_sum_any(dot) / static_cast<A>(g.H);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p >= g.packs) continue;
      A out[N], extra[N];
      if (dres) load_pack<A>(dres + r * g.H, p, extra);
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = rs * (gw[i][k] - xh[i][k] * mean_dot) + (dres ? extra[k] : static_cast<A>(0));
      store_pack<X>(dx + r * g.H, p, out);
      if (dr) store_pack<R>(dr + r * g.H, p, out);
    }
  }
  if (!partial) return;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = threadIdx.x + i * blockDim.x;
    if (p < g.packs) store_pack<A>(partial + static_cast<int64_t>(blockIdx.x) * g.H, p, dw[i]);
  }
}

// dw[j] = the chunks' partials of column j added in a fixed order: a block takes 32 columns, its
// 32 row groups (threadIdx.y) each add every 32nd chunk, then one thread per column adds the 32
// group sums in order. Many short sums in parallel: one thread per column over 1024 chunks was
// latency-bound (tens of microseconds for a few MB).
template <typename A, typename X>
__global__ void __launch_bounds__(1024) sum_weight_partials(const A* __restrict__ partial, X* __restrict__ dw,
                                                            int64_t nchunks, int64_t H) {
  __shared__ A group_sum[32][33];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A s = 0;
  if (j < H)
    for (int64_t c = threadIdx.y; c < nchunks; c += 32) s += partial[c * H + j];
  group_sum[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= H) return;
  A total = 0;
  for (int g = 0; g < 32; ++g) total += group_sum[g][threadIdx.x];
  dw[j] = convert<X>(total);
}

// Elements per 16-byte pack of x.
int pack_elems(DType x) { return static_cast<int>(kPackBytes / element_size(x)); }

struct Launch {
  NormGeometry g;
  int threads, items;
  unsigned blocks;
};

// Rows per chunk: at least 16 and at most 1024 chunks, a function of the row count only (the
// weight gradient's summation order must not depend on the device).
Launch plan_launch(int64_t rows, int64_t H, int n) {
  Launch l;
  l.g.rows = rows, l.g.H = H, l.g.packs = static_cast<int>(H / n);
  l.items = l.g.packs <= 1024 ? 1 : kMaxItems;
  l.threads = ((l.g.packs + l.items - 1) / l.items + 31) / 32 * 32;
  l.g.chunk = std::max<int64_t>(16, (rows + 1023) / 1024);
  l.blocks = static_cast<unsigned>((rows + l.g.chunk - 1) / l.g.chunk);
  return l;
}

// Calls fn(TypeTag<X>, TypeTag<Y>, TypeTag<R>, integral_constant<int, items>) for the kernels'
// device types (the pairs fused_rms_norm_supported admits) and packs per thread.
template <typename Fn>
void dispatch_norm(DType x, DType y, DType r, int items, const char* op, Fn&& fn) {
  auto with_items = [&](auto xt, auto yt, auto rt) {
    if (items <= 1) return fn(xt, yt, rt, std::integral_constant<int, 1>{});
    return fn(xt, yt, rt, std::integral_constant<int, kMaxItems>{});
  };
  dispatch_floating(x, op, [&](auto xt) {
    using X = device_t<typename decltype(xt)::type>;
    if (y == x && r == x) return with_items(TypeTag<X>{}, TypeTag<X>{}, TypeTag<X>{});
    if constexpr (std::is_same_v<X, float>) {
      dispatch_floating(y, op, [&](auto yt) {
        using Y = device_t<typename decltype(yt)::type>;
        if constexpr (!std::is_same_v<Y, double>) {
          if (r == x) return with_items(TypeTag<X>{}, TypeTag<Y>{}, TypeTag<X>{});
          if (r == y) return with_items(TypeTag<X>{}, TypeTag<Y>{}, TypeTag<Y>{});
        }
        KILN_FAIL(op, "no fused kernel for x ", dtype_name(x), ", y ", dtype_name(y), ", residual ", dtype_name(r));
      });
      return;
    }
    KILN_FAIL(op, "no fused kernel for x ", dtype_name(x), ", y ", dtype_name(y), ", residual ", dtype_name(r));
  });
}

}  // namespace

bool fused_rms_norm_supported(DType x, DType y, DType residual, int64_t H) {
  const bool dtypes = (y == x && residual == x) ||
                      (x == kFloat32 && y != kFloat64 && (residual == x || residual == y));
  const int n = pack_elems(x);
  return dtypes && H > 0 && H % n == 0 && H / n <= 512 * kMaxItems;
}

void fused_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h,
                            const Tensor& y, const Tensor& rstd) {
  const int64_t H = x.size(-1), rows = x.numel() / H;
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = current_raw_stream(x.device().index);
  const Launch l = plan_launch(rows, H, pack_elems(x.dtype()));
  const DType rdt = residual.defined() ? residual.dtype() : x.dtype();
  dispatch_norm(x.dtype(), y.dtype(), rdt, l.items, "rms_norm", [&](auto xt, auto yt, auto rt, auto items) {
    using X = typename decltype(xt)::type;
    using R = typename decltype(rt)::type;
    using A = dacc_t<X>;
    fused_rms_forward<X, typename decltype(yt)::type, R, decltype(items)::value><<<l.blocks, l.threads, 0, stream>>>(
        static_cast<const X*>(x.data_ptr()), residual.defined() ? static_cast<const R*>(residual.data_ptr()) : nullptr,
        weight.defined() ? static_cast<const X*>(weight.data_ptr()) : nullptr,
        h.defined() ? static_cast<X*>(h.data_ptr()) : nullptr, static_cast<typename decltype(yt)::type*>(y.data_ptr()),
        static_cast<A*>(rstd.data_ptr()), l.g, static_cast<A>(eps));
    KILN_CUDA_CHECK_LAUNCH("rms_norm");
  });
}

void fused_rms_norm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                             const Tensor& dres, const Tensor& dx, const Tensor& dr, const Tensor& dweight) {
  const int64_t H = h.size(-1), rows = h.numel() / H;
  DeviceGuard guard(h.device().index);
  cudaStream_t stream = current_raw_stream(h.device().index);
  if (rows == 0) {
    if (dweight.defined()) Tensor(dweight).zero_();
    return;
  }
  const Launch l = plan_launch(rows, H, pack_elems(h.dtype()));
  const DType rdt = dr.defined() ? dr.dtype() : h.dtype();
  Tensor partial = dweight.defined() ? empty({static_cast<int64_t>(l.blocks), H}, rstd.options()) : Tensor();
  dispatch_norm(h.dtype(), dy.dtype(), rdt, l.items, "rms_norm_backward", [&](auto xt, auto yt, auto rt, auto items) {
    using X = typename decltype(xt)::type;
    using R = typename decltype(rt)::type;
    using A = dacc_t<X>;
    fused_rms_backward<X, typename decltype(yt)::type, R, decltype(items)::value><<<l.blocks, l.threads, 0, stream>>>(
        static_cast<const typename decltype(yt)::type*>(dy.data_ptr()), static_cast<const X*>(h.data_ptr()),
        weight.defined() ? static_cast<const X*>(weight.data_ptr()) : nullptr,
        static_cast<const A*>(rstd.data_ptr()), dres.defined() ? static_cast<const X*>(dres.data_ptr()) : nullptr,
        static_cast<X*>(dx.data_ptr()), dr.defined() ? static_cast<R*>(dr.data_ptr()) : nullptr,
        partial.defined() ? static_cast<A*>(partial.data_ptr()) : nullptr, l.g);
    KILN_CUDA_CHECK_LAUNCH("rms_norm_backward");
    if (!dweight.defined()) return;
    sum_weight_partials<A, X><<<static_cast<unsigned>((H + 31) / 32), dim3(32, 32), 0, stream>>>(
        static_cast<const A*>(partial.data_ptr()), static_cast<X*>(dweight.data_ptr()), l.blocks, H);
    KILN_CUDA_CHECK_LAUNCH("rms_norm_backward");
  });
}

}  // namespace kiln::cuda
