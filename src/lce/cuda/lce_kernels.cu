// CUDA kernels of the fused linear cross-entropy. The logits exist only as tiles of T written by
// cuBLASLt (16-bit T: the fp32 sums rounded once, as torch's linear stores them). These kernels
// read each tile once per pass, 16-byte vectors converted to A in registers:
//   stats:   one block per tile row; each thread keeps an online (max, sum exp) over its strided
//            16-byte column vectors (coalesced, two in flight), applying bias and soft-cap on the
//            fly, one rescale per vector (its max first), plus the weighted logit sum for label
//            smoothing; exps are ex2.approx over 16-bit tiles (row_exp); the block merges the pairs in a
//            fixed tree, thread 0 merges into the running row state. Reads the tile, writes O(rows).
//   grad:    one block per row: dz = (a p - c w_v - b [v == y]) (1 - (s / cap)^2), p = exp(s - lse),
//            with the row's a, b, c computed once per thread from (g, lse, target, totals). Reads
//            the raw tile once, writes dz (T) once, possibly over the tile itself (16-bit for 16-bit
//            inputs: the dx/dW GEMMs take bf16/fp16 operands with fp32 accumulation, as cuBLASLt's
//            fast path wants).
//   colsum:  bias gradient, one thread per column, rows in order (deterministic, no atomics).
//   prepare/reduce: single-block reductions in a fixed order (double accumulation).
// 256 threads per block: enough warps to hide latency on a row of a few thousand columns.
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "lce/cuda/lce_device.cuh"
#include "lce/cuda/lce_kernels.h"

namespace kiln::cuda::lce_k {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

// Block-wide sum in a fixed order (shared-memory tree); all threads get the result.
template <typename A>
__device__ A block_sum(A v, A* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const A r = sh[0];
  __syncthreads();
  return r;
}

template <typename A>
__global__ void prepare_kernel(const int64_t* target, const A* cw, lce::Consts k, A* totals) {
  __shared__ double sh[kReduceThreads];
  double ws = 0, cnt = 0, bad = 0, cs = 0;
  for (int64_t i = threadIdx.x; i < k.n; i += blockDim.x) {
    const int64_t y = target[i];
    if (lce::is_ignored(y, k)) continue;
    if (y < 0 || y >= k.v) {
      bad += 1;
      continue;
    }
    ws += cw ? static_cast<double>(cw[y]) : 1.0;
    cnt += 1;
  }
  if (cw) {
    for (int64_t j = threadIdx.x; j < k.v; j += blockDim.x) cs += static_cast<double>(cw[j]);
  }
  ws = block_sum(ws, sh);
  cnt = block_sum(cnt, sh);
  bad = block_sum(bad, sh);
  cs = block_sum(cs, sh);
  if (threadIdx.x == 0) {
    totals[0] = static_cast<A>(ws);
    totals[1] = static_cast<A>(cnt);
    totals[2] = static_cast<A>(cw ? cs : static_cast<double>(k.v));
    totals[3] = static_cast<A>(bad);
  }
}

// Online (max, sum exp) over the tile row, VW columns per load and two loads in
// flight per thread (the tile is read once; one scalar load at a time left the kernel latency-bound).
// Per vector: its max first, one rescale of the running sum when it moves, then VW exps.
// kPlain (16-bit tiles, fp32; no bias, soft-cap or smoothing): per element one convert, one FFMA,
// one ex2 and one add; the general path's per-element checks made these passes instruction-bound
// (~70 instructions an element: 1.9-2.7 TB/s on the H200).
template <typename T, typename A, int VW, bool kPlain>
__global__ void stats_kernel(const T* tile, int64_t cols, int64_t ld, int64_t v0, const T* bias, const A* cw,
                             const int64_t* target, lce::Consts k, bool first, A* state, int64_t st, int64_t* amax) {
  __shared__ A sm[kThreads], ss[kThreads], sw[kThreads];
  __shared__ int64_t si[kThreads];  // argmax: each thread's first column holding its maximum
  const int64_t r = blockIdx.x;
  const T* z = tile + r * ld;
  const A cap = static_cast<A>(k.softcap);
  const int64_t y = target[r] - v0;
  const bool smooth = k.eps != 0.0;
  A m = -INFINITY, s = 0, ws = 0, m_log2e = -INFINITY;
  int64_t am = INT64_MAX;  // this thread's argmax column (ties: the lower column wins the merge)
  // Column j's logit: bias and soft-cap applied.
  auto logit = [&](T raw, int64_t j) {
    A v = convert<A>(raw);
    if constexpr (kPlain) return v;
    if (bias) v += convert<A>(bias[v0 + j]);
    return softcap(v, cap);
  };
  // n logits of columns j.. into the running (m, s) and the weighted sum.
  auto take = [&](const A (&v)[VW], int n, int64_t j) {
    A mv = v[0];
#pragma unroll
    for (int e = 1; e < VW; ++e)
      if (e < n) mv = fmax(mv, v[e]);
    if (amax && mv > m) {  // a new maximum: its first column in this vector (rare after the start)
#pragma unroll
      for (int e = VW - 1; e >= 0; --e)
        if (e < n && v[e] == mv) am = v0 + j + e;
    }
    if constexpr (kPlain) {
      if (mv > m) {
        s *= fast_ex2((m - mv) * kLog2e);
        m = mv;
        m_log2e = m * kLog2e;
      }
#pragma unroll
      for (int e = 0; e < VW; ++e)
        if (e < n) s += fast_ex2(fmaf(v[e], kLog2e, -m_log2e));
      return;
    }
    take_vector<A, T, VW>(v, n, cw ? cw + v0 : nullptr, j, smooth, m, s, ws);
  };
  const int64_t step = static_cast<int64_t>(blockDim.x) * VW;
  int64_t j = static_cast<int64_t>(threadIdx.x) * VW;
  for (; j + step + VW <= cols; j += 2 * step) {  // two full vectors
    const Vec<T, VW> a = *reinterpret_cast<const Vec<T, VW>*>(z + j);
    const Vec<T, VW> b = *reinterpret_cast<const Vec<T, VW>*>(z + j + step);
    A va[VW], vb[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) va[e] = logit(a.v[e], j + e), vb[e] = logit(b.v[e], j + step + e);
    take(va, VW, j);
    take(vb, VW, j + step);
  }
  for (; j < cols; j += step) {
    const int n = static_cast<int>(cols - j < VW ? cols - j : VW);
    A v[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) v[e] = e < n ? logit(z[j + e], j + e) : A(0);
    take(v, n, j);
  }
  // The target's logit, when this tile holds it (one tile does: the first one zeroes it otherwise).
  if (threadIdx.x == 0 && y >= 0 && y < cols) state[2 * st + r] = logit(z[y], y);
  A tile_max = -INFINITY;
  int64_t tile_arg = INT64_MAX;
  if (amax) {  // uniform: amax is the same for the whole grid
    block_argmax(m, am, sm, si);
    tile_max = sm[0];
    tile_arg = si[0];
    __syncthreads();  // sm is reused below
  }
  block_merge_stats(m, s, ws, sm, ss, sw);
  if (threadIdx.x == 0) {
    A mm = first ? A(-INFINITY) : state[r], sv = first ? A(0) : state[st + r];
    if (amax && (first || tile_max > mm)) amax[r] = tile_arg == INT64_MAX ? 0 : tile_arg;  // ties: the earlier tile
    merge(mm, sv, sm[0], ss[0]);
    state[r] = mm;
    state[st + r] = sv;
    state[3 * st + r] = (first ? A(0) : state[3 * st + r]) + (smooth ? sw[0] : A(0));
    if (first && !(y >= 0 && y < cols)) state[2 * st + r] = A(0);
  }
}

template <typename A>
__global__ void finalize_kernel(int64_t rows, int64_t n0, const A* state, int64_t st, const int64_t* target,
                                const A* cw, const A* totals, lce::Consts k, A* lse, A* terms, int64_t n_total,
                                const int64_t* amax, int64_t* pred, A* tscale) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const int64_t i = n0 + r, y = target[i];
  const A l = finish_token<A>(i, y, state[r], state[st + r], state[2 * st + r], state[3 * st + r], cw, totals, k, lse,
                              terms, n_total);
  const bool ignored = lce::is_ignored(y, k);
  if (pred) pred[i] = ignored ? -1 : amax[r];
  if (tscale) {
    const A sc = ignored ? A(0) : dexp<A>(state[2 * st + r] - l);
    tscale[i] = sc;
    terms[i] *= sc;
    terms[n_total + i] *= sc;
  }
}

// One block per tile row, VW columns per thread per segment of blockDim.x * VW columns; the
// row's coefficients are computed once per thread. In place, each thread overwrites only what it
// read itself: no barrier.
template <typename T, typename A, int VW, bool kPlain>
__global__ void grad_kernel(const T* tile, int64_t cols, int64_t ld, int64_t v0, int64_t n0, const T* bias,
                            const A* cw, const int64_t* target, const A* lse_all, const A* g, bool g_per_token,
                            const A* tscale, const A* totals, lce::Consts k, T* dz, int64_t ldz) {
  const int64_t r = blockIdx.x, i = n0 + r;
  const T* z = tile + r * ld;
  T* out = dz + r * ldz;
  const int64_t y = target[i];
  const A g_up = (g ? g[g_per_token ? i : 0] : A(1)) * (tscale ? tscale[i] : A(1));
  const RowGrad<A> rg = row_grad<A>(y, lse_all[i], g_up, cw, totals, k);
  const bool dead = rg.dead;  // uniform over the block
  const A cap = static_cast<A>(k.softcap);
  const int64_t step = static_cast<int64_t>(blockDim.x) * VW;
  for (int64_t base = 0; base < cols; base += step) {
    const int64_t j0 = base + static_cast<int64_t>(threadIdx.x) * VW;
    const bool full = j0 + VW <= cols;
    if (j0 >= cols) continue;
    Vec<T, VW> in;
    if (!dead) {
      if (full) {
        in = *reinterpret_cast<const Vec<T, VW>*>(z + j0);
      } else {
        for (int e = 0; e < VW; ++e) in.v[e] = j0 + e < cols ? z[j0 + e] : convert<T>(A(0));
      }
    }
    Vec<T, VW> o;
    if constexpr (kPlain) {  // dz = a exp(s - lse) - b [v == y], full vectors without per-element checks
      if (!dead && full) {
        const float l2 = rg.lse * kLog2e;
        float d[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) d[e] = rg.c.a * fast_ex2(fmaf(convert<float>(in.v[e]), kLog2e, -l2));
        const int64_t yl = y - v0 - j0;  // the target's place in this vector, if it is here
        if (yl >= 0 && yl < VW)
#pragma unroll
          for (int e = 0; e < VW; ++e)
            if (e == yl) d[e] -= rg.c.b;
#pragma unroll
        for (int e = 0; e < VW; ++e) o.v[e] = convert<T>(d[e]);
        *reinterpret_cast<Vec<T, VW>*>(out + j0) = o;
        continue;
      }
    }
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      const int64_t j = j0 + e;
      A d = 0;
      if (!dead && j < cols) {
        A sv = convert<A>(in.v[e]);
        if (bias) sv += convert<A>(bias[v0 + j]);
        d = element_grad<A, T>(softcap(sv, cap), v0 + j, y, rg, cw, cap);
      }
      o.v[e] = convert<T>(d);
    }
    if (full) {
      *reinterpret_cast<Vec<T, VW>*>(out + j0) = o;
    } else {
      for (int e = 0; e < VW && j0 + e < cols; ++e) out[j0 + e] = o.v[e];
    }
  }
}

template <typename T, typename A>
__global__ void colsum_kernel(const T* dz, int64_t rows, int64_t cols, int64_t ld, bool first, A* acc) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  A s = first ? A(0) : acc[j];
  for (int64_t r = 0; r < rows; ++r) s += convert<A>(dz[r * ld + j]);
  acc[j] = s;
}

template <typename A>
__global__ void reduce_kernel(const A* terms, int64_t n, const A* totals, lce::Consts k, A* loss, A* zterm) {
  __shared__ double sh[kReduceThreads];
  double ls = 0, zs = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    ls += static_cast<double>(terms[i]);
    zs += static_cast<double>(terms[n + i]);
  }
  ls = block_sum(ls, sh);
  zs = block_sum(zs, sh);
  if (threadIdx.x == 0) {
    if (k.red == lce::Red::Mean) {
      ls /= static_cast<double>(totals[0]);  // 0 / 0 = NaN with every target ignored, as PyTorch
      zs /= static_cast<double>(totals[1]);
    }
    if (k.z_coef == 0.0) zs = 0;
    if (totals[3] != A(0)) ls = NAN;
    loss[0] = static_cast<A>(ls + zs);
    zterm[0] = static_cast<A>(zs);
  }
}

template <typename A>
__global__ void per_token_kernel(const A* terms, int64_t n, A* loss, A* zterm) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  loss[i] = terms[i] + terms[n + i];
  zterm[i] = terms[n + i];
}

template <typename T, typename A>
__global__ void convert_kernel(const A* src, T* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(src[i]);
}

template <typename T, typename A>
__global__ void scale_kernel(const T* src, const A* g, T* dst, int64_t n) {
  const A gv = g[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(convert<A>(src[i]) * gv);
}

// Calls f(T-tag, A-tag) with device element types.
template <typename F>
void with_types(DType t, F&& f) {
  dispatch_floating(t, "linear_cross_entropy", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    f(TypeTag<T>{}, TypeTag<A>{});
  });
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The row passes' plain path: 16-bit tiles summed in fp32, no bias, soft-cap or label smoothing.
template <typename A, typename T>
constexpr bool is_plain_capable() {
  return sizeof(T) == 2 && std::is_same_v<A, float>;
}
template <typename A, typename T>
bool plain_rows(const void* bias, const lce::Consts& k) {
  return is_plain_capable<A, T>() && bias == nullptr && k.softcap == 0.0 && k.eps == 0.0;
}

// Rows of `ld` elements starting at p can be read as `bytes`-wide aligned vectors.
template <typename P>
bool vector_ok(const P* p, int64_t ld, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && (ld * sizeof(P)) % bytes == 0;
}

}  // namespace

void prepare(DType t, const int64_t* target, const void* cw, const lce::Consts& k, void* totals, void* stream) {
  with_types(t, [&](auto, auto at) {
    using A = typename decltype(at)::type;
    prepare_kernel<A><<<1, kReduceThreads, 0, as_stream(stream)>>>(target, static_cast<const A*>(cw), k,
                                                                     static_cast<A*>(totals));
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void stats(DType t, const void* tile, int64_t rows, int64_t cols, int64_t ld, int64_t v0, const void* bias,
           const void* cw, const int64_t* target, const lce::Consts& k, bool first, void* state, int64_t state_stride,
           int64_t* amax, void* stream) {
  if (rows == 0) return;
  with_types(t, [&](auto ttag, auto at) {
    using T = typename decltype(ttag)::type;
    using A = typename decltype(at)::type;
    constexpr int VW = 16 / sizeof(T);  // 16-byte vectors: 8 elements of a 16-bit tile
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(tile), cols, ld, v0, static_cast<const T*>(bias), static_cast<const A*>(cw), target,
          k, first, static_cast<A*>(state), state_stride, amax);
    };
    if (!vector_ok(static_cast<const T*>(tile), ld, 16)) launch(stats_kernel<T, A, 1, false>);
    else if (plain_rows<A, T>(bias, k)) launch(stats_kernel<T, A, VW, is_plain_capable<A, T>()>);
    else launch(stats_kernel<T, A, VW, false>);
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void finalize(DType t, int64_t rows, int64_t n0, const void* state, int64_t state_stride, const int64_t* target,
              const void* cw, const void* totals, const lce::Consts& k, void* lse, void* terms, int64_t n_total,
              const int64_t* amax, int64_t* pred, void* tscale, void* stream) {
  if (rows == 0) return;
  with_types(t, [&](auto, auto at) {
    using A = typename decltype(at)::type;
    finalize_kernel<A><<<blocks_for(rows, kThreads), kThreads, 0, as_stream(stream)>>>(
        rows, n0, static_cast<const A*>(state), state_stride, target, static_cast<const A*>(cw),
        static_cast<const A*>(totals), k, static_cast<A*>(lse), static_cast<A*>(terms), n_total, amax, pred,
        static_cast<A*>(tscale));
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void grad(DType t, const void* tile, int64_t rows, int64_t cols, int64_t ld, int64_t v0, int64_t n0,
          const void* bias, const void* cw, const int64_t* target, const void* lse, const void* g, bool g_per_token,
          const void* tscale, const void* totals, const lce::Consts& k, void* dz, int64_t ldz, void* stream) {
  if (rows == 0 || cols == 0) return;
  with_types(t, [&](auto ttag, auto at) {
    using T = typename decltype(ttag)::type;
    using A = typename decltype(at)::type;
    constexpr int VW = 32 / sizeof(T);  // two 16-byte loads per thread per segment
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(tile), cols, ld, v0, n0, static_cast<const T*>(bias), static_cast<const A*>(cw),
          target, static_cast<const A*>(lse), static_cast<const A*>(g), g_per_token, static_cast<const A*>(tscale),
          static_cast<const A*>(totals), k, static_cast<T*>(dz), ldz);
    };
    if (vector_ok(static_cast<const T*>(tile), ld, 32) && vector_ok(static_cast<const T*>(dz), ldz, 32))
      plain_rows<A, T>(bias, k) ? launch(grad_kernel<T, A, VW, is_plain_capable<A, T>()>)
                                : launch(grad_kernel<T, A, VW, false>);
    else
      launch(grad_kernel<T, A, 1, false>);
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void colsum(DType t, const void* dz, int64_t rows, int64_t cols, int64_t ld, bool first, void* acc, void* stream) {
  if (cols == 0) return;
  with_types(t, [&](auto tt, auto at) {
    using T = typename decltype(tt)::type;
    using A = typename decltype(at)::type;
    colsum_kernel<T, A><<<blocks_for(cols, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(dz), rows, cols, ld, first, static_cast<A*>(acc));
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void reduce(DType t, const void* terms, int64_t n, const void* totals, const lce::Consts& k, void* loss, void* zterm,
            void* stream) {
  with_types(t, [&](auto tt, auto at) {
    using T = typename decltype(tt)::type;
    using A = typename decltype(at)::type;
    if (k.red == lce::Red::None) {
      if (n == 0) return;
      per_token_kernel<A><<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
          static_cast<const A*>(terms), n, static_cast<A*>(loss), static_cast<A*>(zterm));
    } else {
      reduce_kernel<A><<<1, kReduceThreads, 0, as_stream(stream)>>>(
          static_cast<const A*>(terms), n, static_cast<const A*>(totals), k, static_cast<A*>(loss),
          static_cast<A*>(zterm));
    }
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void store(DType t, const void* src, void* dst, int64_t n, void* stream) {
  if (n == 0) return;
  with_types(t, [&](auto tt, auto at) {
    using T = typename decltype(tt)::type;
    using A = typename decltype(at)::type;
    convert_kernel<T, A><<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(static_cast<const A*>(src),
                                                                                      static_cast<T*>(dst), n);
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

void scale(DType t, const void* src, const void* g, void* dst, int64_t n, void* stream) {
  if (n == 0) return;
  with_types(t, [&](auto tt, auto at) {
    using T = typename decltype(tt)::type;
    using A = typename decltype(at)::type;
    scale_kernel<T, A><<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(src), static_cast<const A*>(g), static_cast<T*>(dst), n);
    KILN_CUDA_CHECK_LAUNCH("linear_cross_entropy");
  });
}

}  // namespace kiln::cuda::lce_k
