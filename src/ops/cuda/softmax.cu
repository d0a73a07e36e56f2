// CUDA softmax / log_softmax, forward and backward, over contiguous [outer, n, inner].
// Rows (inner == 1) of 128 to 2048 vectors: a 256-thread block per row keeps the row in registers
// (up to 8 vectors a thread), so it is read once: block max, then exp(x - max) kept in place and
// block sum, then the scaled write (backward: sum(g * y) or sum(g) over the held y and g, then
// the write). The two-pass kernels re-read the row (from L2 when it is still there, which at
// a few GiB it mostly was not: 0.56-0.61 of copy bandwidth on the H200).
// Other rows: a warp per row when n <= 8192 (8 rows per 256-thread block, no block barriers), a
// 512-thread block per row otherwise. Pass 1 keeps an online (max, sum exp) per thread and merges
// it through a fixed shuffle tree; pass 2 re-reads the row and writes exp(x - max) / sum, or
// x - max - log(sum). 16-byte vector loads/stores when n and the pointers allow. Backward is the
// same shape: pass 1 reduces sum(g * y) (softmax) or sum(g) (log_softmax), pass 2 writes
// y * (g - s) or g - exp(y) * s.
// Columns (inner > 1): one thread per (outer, inner) column walking n with stride inner, so a
// warp reads 32 adjacent columns per step.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "ops/cuda/reduce_common.cuh"
#include "ops/cuda/softmax.h"

namespace kiln::cuda {
namespace {

constexpr int kWarpRowThreads = 256;
constexpr int kBlockRowThreads = 512;
constexpr int64_t kWarpRowMax = 8192;  // a block per row only for long rows: short blocks starve the SMs of loads in flight
constexpr unsigned kMaxBlocks = 65535u * 16u;

template <typename A>
__device__ __forceinline__ A bcast0(A v) {
  return __shfl_sync(0xffffffffu, v, 0);
}
template <typename A>
__device__ __forceinline__ LseAcc<A> bcast0(LseAcc<A> v) {
  return {bcast0(v.m), bcast0(v.s)};
}

// Group-wide reduction whose result every thread of the group sees (lane/thread 0's value).
template <typename Op, bool kWarp>
__device__ __forceinline__ typename Op::Acc group_allreduce(typename Op::Acc a) {
  if constexpr (kWarp) {
    return bcast0(warp_reduce<Op>(a));
  } else {
    return block_allreduce<Op>(a);
  }
}

struct RowIter {
  int64_t first_row, row_step;
  int tid, nt;
};

template <bool kWarp>
__device__ __forceinline__ RowIter row_iter() {
  if constexpr (kWarp) {
    const int per_block = blockDim.x >> 5;
    return {static_cast<int64_t>(blockIdx.x) * per_block + (threadIdx.x >> 5), static_cast<int64_t>(gridDim.x) * per_block,
            static_cast<int>(threadIdx.x & 31), 32};
  } else {
    return {blockIdx.x, gridDim.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
  }
}

template <typename T, int VEC, bool kWarp>
__global__ void fwd_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool is_log) {
  using A = dacc_t<T>;
  using P = Pack<T, VEC>;
  const RowIter it = row_iter<kWarp>();
  const int64_t nv = n / VEC;
  for (int64_t row = it.first_row; row < rows; row += it.row_step) {
    const P* xr = reinterpret_cast<const P*>(x + row * n);
    P* yr = reinterpret_cast<P*>(y + row * n);
    LseAcc<A> a = LseOp<A>::init();
    for (int64_t k = it.tid; k < nv; k += it.nt) {
      const P v = xr[k];
#pragma unroll
      for (int e = 0; e < VEC; ++e) LseOp<A>::add(a, convert<A>(v.v[e]), 0);
    }
    a = group_allreduce<LseOp<A>, kWarp>(a);
    const A c = is_log ? a.m + d_log(a.s) : A(1) / a.s;
    for (int64_t k = it.tid; k < nv; k += it.nt) {
      const P v = xr[k];
      P out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A xv = convert<A>(v.v[e]);
        out.v[e] = convert<T>(is_log ? xv - c : d_exp(xv - a.m) * c);
      }
      yr[k] = out;
    }
  }
}

template <typename T, int VEC, bool kWarp>
__global__ void bwd_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t rows, int64_t n,
                         bool is_log) {
  using A = dacc_t<T>;
  using P = Pack<T, VEC>;
  const RowIter it = row_iter<kWarp>();
  const int64_t nv = n / VEC;
  for (int64_t row = it.first_row; row < rows; row += it.row_step) {
    const P* yr = reinterpret_cast<const P*>(y + row * n);
    const P* gr = reinterpret_cast<const P*>(g + row * n);
    P* gxr = reinterpret_cast<P*>(gx + row * n);
    A s = 0;
    for (int64_t k = it.tid; k < nv; k += it.nt) {
      const P gv = gr[k];
      if (is_log) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += convert<A>(gv.v[e]);
      } else {
        const P yv = yr[k];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += convert<A>(gv.v[e]) * convert<A>(yv.v[e]);
      }
    }
    s = group_allreduce<SumOp<A>, kWarp>(s);
    for (int64_t k = it.tid; k < nv; k += it.nt) {
      const P gv = gr[k], yv = yr[k];
      P out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A ya = convert<A>(yv.v[e]), ga = convert<A>(gv.v[e]);
        out.v[e] = convert<T>(is_log ? ga - d_exp(ya) * s : ya * (ga - s));
      }
      gxr[k] = out;
    }
  }
}

constexpr int kRegThreads = 256;
constexpr int kRegMaxVectors = 8;  // per thread: rows up to 2048 vectors (8192 fp32, 16384 bf16)

// A block per row, the row held in registers: vector k of the row is v[k / kRegThreads] of thread
// k % kRegThreads (coalesced loads). R = vectors per thread, a power of two >= ceil(nv / 256).
template <typename T, int VEC, int R>
__global__ void __launch_bounds__(kRegThreads) fwd_rows_reg(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                            int64_t n, bool is_log) {
  using A = dacc_t<T>;
  using P = Pack<T, VEC>;
  const int64_t nv = n / VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * n);
    P* yr = reinterpret_cast<P*>(y + row * n);
    A v[R][VEC];
    A mx = d_lowest<A>();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t k = threadIdx.x + r * kRegThreads;
      if (k < nv) {
        const P p = xr[k];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          v[r][e] = convert<A>(p.v[e]);
          ExtremeOp<A, true>::add(mx, v[r][e], 0);
        }
      }
    }
    mx = block_allreduce<ExtremeOp<A, true>>(mx);
    A sum = 0;
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (threadIdx.x + r * kRegThreads < nv) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A ex = d_exp(v[r][e] - mx);
          sum += ex;
          if (!is_log) v[r][e] = ex;
        }
      }
    sum = block_allreduce<SumOp<A>>(sum);
    const A c = is_log ? mx + d_log(sum) : A(1) / sum;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t k = threadIdx.x + r * kRegThreads;
      if (k < nv) {
        P out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) out.v[e] = convert<T>(is_log ? v[r][e] - c : v[r][e] * c);
        yr[k] = out;
      }
    }
  }
}

template <typename T, int VEC, int R>
__global__ void __launch_bounds__(kRegThreads) bwd_rows_reg(const T* __restrict__ y, const T* __restrict__ g,
                                                            T* __restrict__ gx, int64_t rows, int64_t n, bool is_log) {
  using A = dacc_t<T>;
  using P = Pack<T, VEC>;
  const int64_t nv = n / VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* yr = reinterpret_cast<const P*>(y + row * n);
    const P* gr = reinterpret_cast<const P*>(g + row * n);
    P* gxr = reinterpret_cast<P*>(gx + row * n);
    A yv[R][VEC], gv[R][VEC];
    A s = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t k = threadIdx.x + r * kRegThreads;
      if (k < nv) {
        const P pg = gr[k], py = yr[k];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          gv[r][e] = convert<A>(pg.v[e]);
          yv[r][e] = convert<A>(py.v[e]);
          s += is_log ? gv[r][e] : gv[r][e] * yv[r][e];
        }
      }
    }
    s = block_allreduce<SumOp<A>>(s);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t k = threadIdx.x + r * kRegThreads;
      if (k < nv) {
        P out;
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out.v[e] = convert<T>(is_log ? gv[r][e] - d_exp(yv[r][e]) * s : yv[r][e] * (gv[r][e] - s));
        gxr[k] = out;
      }
    }
  }
}

// Vectors per thread for the register kernels (0: the row does not suit them).
int reg_vectors(int64_t nv) {
  if (nv < 4 * 32 || nv > int64_t{kRegThreads} * kRegMaxVectors) return 0;  // short rows: a warp per row
  int r = 1;
  while (int64_t{r} * kRegThreads < nv) r *= 2;
  return r;
}

// Launches kernel<T, VEC, R> with R picked at run time from {1, 2, 4, 8}.
template <template <typename, int, int> class K, typename T, int VEC, typename... Args>
void launch_reg_rows(cudaStream_t s, int r, int64_t rows, Args... args) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks));
  switch (r) {
    case 1: K<T, VEC, 1>::launch(blocks, s, args...); break;
    case 2: K<T, VEC, 2>::launch(blocks, s, args...); break;
    case 4: K<T, VEC, 4>::launch(blocks, s, args...); break;
    default: K<T, VEC, 8>::launch(blocks, s, args...); break;
  }
}
template <typename T, int VEC, int R>
struct FwdReg {
  template <typename... Args>
  static void launch(unsigned blocks, cudaStream_t s, Args... args) {
    fwd_rows_reg<T, VEC, R><<<blocks, kRegThreads, 0, s>>>(args...);
  }
};
template <typename T, int VEC, int R>
struct BwdReg {
  template <typename... Args>
  static void launch(unsigned blocks, cudaStream_t s, Args... args) {
    bwd_rows_reg<T, VEC, R><<<blocks, kRegThreads, 0, s>>>(args...);
  }
};

template <typename T>
__global__ void fwd_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner, bool is_log) {
  using A = dacc_t<T>;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < outer * inner;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (q / inner) * n * inner + q % inner;
    LseAcc<A> a = LseOp<A>::init();
    for (int64_t k = 0; k < n; ++k) LseOp<A>::add(a, convert<A>(x[base + k * inner]), 0);
    const A c = is_log ? a.m + d_log(a.s) : A(1) / a.s;
    for (int64_t k = 0; k < n; ++k) {
      const A xv = convert<A>(x[base + k * inner]);
      y[base + k * inner] = convert<T>(is_log ? xv - c : d_exp(xv - a.m) * c);
    }
  }
}

template <typename T>
__global__ void bwd_cols(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, int64_t outer, int64_t n,
                         int64_t inner, bool is_log) {
  using A = dacc_t<T>;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < outer * inner;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (q / inner) * n * inner + q % inner;
    A s = 0;
    for (int64_t k = 0; k < n; ++k) {
      const A ga = convert<A>(g[base + k * inner]);
      s += is_log ? ga : ga * convert<A>(y[base + k * inner]);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j = base + k * inner;
      const A ya = convert<A>(y[j]), ga = convert<A>(g[j]);
      gx[j] = convert<T>(is_log ? ga - d_exp(ya) * s : ya * (ga - s));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int VEC, bool kWarp, typename... Args>
void launch_fwd_rows(cudaStream_t s, int64_t rows, Args... args) {
  const int threads = kWarp ? kWarpRowThreads : kBlockRowThreads;
  const int64_t per_block = kWarp ? kWarpRowThreads / 32 : 1;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((rows + per_block - 1) / per_block, kMaxBlocks));
  fwd_rows<T, VEC, kWarp><<<blocks, threads, 0, s>>>(args...);
}

template <typename T, int VEC, bool kWarp, typename... Args>
void launch_bwd_rows(cudaStream_t s, int64_t rows, Args... args) {
  const int threads = kWarp ? kWarpRowThreads : kBlockRowThreads;
  const int64_t per_block = kWarp ? kWarpRowThreads / 32 : 1;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((rows + per_block - 1) / per_block, kMaxBlocks));
  bwd_rows<T, VEC, kWarp><<<blocks, threads, 0, s>>>(args...);
}

}  // namespace

void softmax_forward(const Tensor& xt, const Tensor& yt, int64_t outer, int64_t n, int64_t inner, bool is_log) {
  const char* op = is_log ? "log_softmax" : "softmax";
  DeviceGuard guard(xt.device().index);
  cudaStream_t s = current_raw_stream(xt.device().index);
  dispatch_floating(xt.dtype(), op, [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    T* y = static_cast<T*>(yt.data_ptr());
    if (inner > 1) {
      fwd_cols<T><<<blocks_for(outer * inner, 256, kMaxBlocks), 256, 0, s>>>(x, y, outer, n, inner, is_log);
    } else {
      constexpr int kVec = 16 / sizeof(T);
      const bool vec = n % kVec == 0 && aligned16(x) && aligned16(y);
      const bool warp = n <= kWarpRowMax;
      const int r = reg_vectors(vec ? n / kVec : n);
      if (r && vec) launch_reg_rows<FwdReg, T, kVec>(s, r, outer, x, y, outer, n, is_log);
      else if (r) launch_reg_rows<FwdReg, T, 1>(s, r, outer, x, y, outer, n, is_log);
      else if (vec && warp) launch_fwd_rows<T, kVec, true>(s, outer, x, y, outer, n, is_log);
      else if (vec) launch_fwd_rows<T, kVec, false>(s, outer, x, y, outer, n, is_log);
      else if (warp) launch_fwd_rows<T, 1, true>(s, outer, x, y, outer, n, is_log);
      else launch_fwd_rows<T, 1, false>(s, outer, x, y, outer, n, is_log);
    }
    KILN_CUDA_CHECK_LAUNCH(op);
  });
}

void softmax_backward(const Tensor& yt, const Tensor& gt, const Tensor& gxt, int64_t outer, int64_t n, int64_t inner,
                      bool is_log) {
  const char* op = is_log ? "log_softmax" : "softmax";
  DeviceGuard guard(yt.device().index);
  cudaStream_t s = current_raw_stream(yt.device().index);
  dispatch_floating(yt.dtype(), op, [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    const T* y = static_cast<const T*>(yt.data_ptr());
    const T* g = static_cast<const T*>(gt.data_ptr());
    T* gx = static_cast<T*>(gxt.data_ptr());
    if (inner > 1) {
      bwd_cols<T><<<blocks_for(outer * inner, 256, kMaxBlocks), 256, 0, s>>>(y, g, gx, outer, n, inner, is_log);
    } else {
      constexpr int kVec = 16 / sizeof(T);
      const bool vec = n % kVec == 0 && aligned16(y) && aligned16(g) && aligned16(gx);
      const bool warp = n <= kWarpRowMax;
      const int r = reg_vectors(vec ? n / kVec : n);
      if (r && vec) launch_reg_rows<BwdReg, T, kVec>(s, r, outer, y, g, gx, outer, n, is_log);
      else if (r) launch_reg_rows<BwdReg, T, 1>(s, r, outer, y, g, gx, outer, n, is_log);
      else if (vec && warp) launch_bwd_rows<T, kVec, true>(s, outer, y, g, gx, outer, n, is_log);
      else if (vec) launch_bwd_rows<T, kVec, false>(s, outer, y, g, gx, outer, n, is_log);
      else if (warp) launch_bwd_rows<T, 1, true>(s, outer, y, g, gx, outer, n, is_log);
      else launch_bwd_rows<T, 1, false>(s, outer, y, g, gx, outer, n, is_log);
    }
    KILN_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace kiln::cuda
