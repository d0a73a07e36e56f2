// RMSNorm on CUDA. Forward: one warp per row (8 rows per 256-thread block): each lane sums x^2
// over a strided slice in fp32 (fp64 for fp64), a shuffle reduction gives rstd, which is stored
// for backward, then the lanes write y = x * rstd * w. Backward: the same warp-per-row layout
// writes dx; dweight is reduced without atomics: a column kernel writes one partial per fixed
// chunk of rows (chunking depends only on the row count), and a second pass adds the partials in
// chunk order. Warps per row suit the usual hidden sizes (H <= 16K): the row stays in L1/L2
// between the two passes over it.
#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/warp.cuh"

namespace kiln::cuda {
namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kColThreads = 256;

template <typename T, typename A>
__global__ void rms_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                   A* __restrict__ rstd, int64_t rows, int64_t H, A eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const T* xr = x + r * H;
  T* yr = y + r * H;
  A ss = 0;
  for (int64_t j = threadIdx.x; j < H; j += 32) {
    const A v = convert<A>(xr[j]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const A rs = static_cast<A>(1) / sqrt(ss / static_cast<A>(H) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t j = threadIdx.x; j < H; j += 32) {
    A v = convert<A>(xr[j]) * rs;
    if (w) v *= convert<A>(w[j]);
    yr[j] = convert<T>(v);
  }
}

template <typename T, typename A>
__global__ void rms_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                       const A* __restrict__ rstd, T* __restrict__ dx, int64_t rows, int64_t H) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const T* xr = x + r * H;
  const T* gr = dy + r * H;
  T* dxr = dx + r * H;
  const A rs = rstd[r];
  A dot = 0;
  for (int64_t j = threadIdx.x; j < H; j += 32) {
    A g = convert<A>(gr[j]);
    if (w) g *= convert<A>(w[j]);
    dot += g * convert<A>(xr[j]) * rs;
  }
  const A k = warp_sum(dot) / static_cast<A>(H);
  for (int64_t j = threadIdx.x; j < H; j += 32) {
    A g = convert<A>(gr[j]);
    if (w) g *= convert<A>(w[j]);
    const A xh = convert<A>(xr[j]) * rs;
    dxr[j] = convert<T>(rs * (g - xh * k));
  }
}

// partial[chunk, j] = sum over the chunk's rows of dy * x * rstd (one thread per column).
template <typename T, typename A>
__global__ void rms_dweight_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                           const A* __restrict__ rstd, A* __restrict__ partial, int64_t rows,
                                           int64_t H, int64_t per) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (j >= H) return;
  const int64_t c = blockIdx.y;
  const int64_t end = min(rows, (c + 1) * per);
  A s = 0;
  for (int64_t r = c * per; r < end; ++r) s += convert<A>(dy[r * H + j]) * convert<A>(x[r * H + j]) * rstd[r];
  partial[c * H + j] = s;
}

template <typename T, typename A>
__global__ void rms_dweight_final_kernel(const A* __restrict__ partial, T* __restrict__ dw, int64_t nchunks,
                                         int64_t H) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (j >= H) return;
  A s = 0;
  for (int64_t c = 0; c < nchunks; ++c) s += partial[c * H + j];
  dw[j] = convert<T>(s);
}

// At least 32 rows per partial and at most 1024 partials (enough blocks to fill the GPU); a
// function of the row count only, so dweight is reproducible.
int64_t chunk_rows(int64_t rows) { return std::max<int64_t>(32, (rows + 1023) / 1024); }

}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = current_raw_stream(x.device().index);
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    rms_forward_kernel<T, A><<<blocks, dim3(32, kRowsPerBlock), 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr,
        static_cast<T*>(y.data_ptr()), static_cast<A*>(rstd.data_ptr()), rows, H, static_cast<A>(eps));
    KILN_CUDA_CHECK_LAUNCH("rms_norm");
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight) {
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = current_raw_stream(x.device().index);
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    if (rows > 0) {
      const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
      rms_backward_dx_kernel<T, A><<<blocks, dim3(32, kRowsPerBlock), 0, stream>>>(
          static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
          weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr,
          static_cast<const A*>(rstd.data_ptr()), static_cast<T*>(dx.data_ptr()), rows, H);
      KILN_CUDA_CHECK_LAUNCH("rms_norm_backward");
    }
    if (!dweight.defined() || H == 0) return;
    if (rows == 0) {
      Tensor dw = dweight;
      dw.zero_();
      return;
    }
    const int64_t per = chunk_rows(rows);
    const int64_t nchunks = (rows + per - 1) / per;
    Tensor partial = empty({nchunks, H}, rstd.options());
    const unsigned col_blocks = static_cast<unsigned>((H + kColThreads - 1) / kColThreads);
    rms_dweight_partial_kernel<T, A><<<dim3(col_blocks, static_cast<unsigned>(nchunks)), kColThreads, 0, stream>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
        static_cast<const A*>(rstd.data_ptr()), static_cast<A*>(partial.data_ptr()), rows, H, per);
    KILN_CUDA_CHECK_LAUNCH("rms_norm_backward");
    rms_dweight_final_kernel<T, A><<<col_blocks, kColThreads, 0, stream>>>(
        static_cast<const A*>(partial.data_ptr()), static_cast<T*>(dweight.data_ptr()), nchunks, H);
    KILN_CUDA_CHECK_LAUNCH("rms_norm_backward");
  });
}

}  // namespace kiln::cuda
