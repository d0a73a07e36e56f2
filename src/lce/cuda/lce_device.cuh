#pragma once
// Device helpers of the fused linear cross-entropy's kernels (lce_kernels.cu): exps and logs in the
// accumulation type A, the soft-cap, online logsumexp merges, aligned vectors, and the per-token
// finish / per-row gradient coefficients, so every kernel runs the same FP operations per element.
// E is the logit tiles' element type.
#include <cmath>
#include <type_traits>

#include "core/cuda/device_types.cuh"
#include "lce/lce_math.h"

namespace kiln::cuda::lce_k {

template <typename A> __device__ __forceinline__ A dexp(A x) { return exp(x); }
template <> __device__ __forceinline__ float dexp<float>(float x) { return expf(x); }
template <typename A> __device__ __forceinline__ A dlog(A x) { return log(x); }
template <> __device__ __forceinline__ float dlog<float>(float x) { return logf(x); }
template <typename A> __device__ __forceinline__ A dtanh(A x) { return tanh(x); }
template <> __device__ __forceinline__ float dtanh<float>(float x) { return tanhf(x); }

template <typename A>
__device__ __forceinline__ A softcap(A z, A cap) {
  return cap > A(0) ? cap * dtanh<A>(z / cap) : z;
}

template <typename A>
__device__ __forceinline__ void merge(A& m, A& s, A m2, A s2) {
  lce::lse_merge(m, s, m2, s2, [](A e) { return dexp<A>(e); });
}

// VW consecutive elements of type E moved as one aligned vector.
template <typename E, int VW>
struct alignas(sizeof(E) * VW) Vec {
  E v[VW];
};

// exp of the row passes: ex2.approx (__expf) over 16-bit tiles, whose logits already carry a 2^-8
// rounding (the accurate expf made both passes compute-bound: ~1.2 TB/s); expf / exp otherwise.
template <typename A, typename E>
__device__ __forceinline__ A row_exp(A x) {
  if constexpr (sizeof(E) == 2 && std::is_same_v<A, float>) return __expf(x);
  else return dexp<A>(x);
}

// 2^x by the SFU (ex2.approx.ftz: what __expf runs after its multiply). The plain row passes fold
// exp(s - c) into one FFMA and this: ex2(s log2e - c log2e).
__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// The first n logits of one vector into a running (m, s = sum exp(x - m)): the vector's max first,
// one rescale of s when it moves; with smoothing also the weighted sum ws (cw from column j).
template <typename A, typename E, int VW>
__device__ __forceinline__ void take_vector(const A (&v)[VW], int n, const A* cw, int64_t j, bool smooth, A& m, A& s,
                                            A& ws) {
  A mv = v[0];
#pragma unroll
  for (int e = 1; e < VW; ++e)
    if (e < n) mv = fmax(mv, v[e]);
  if (mv > m) {
    s *= row_exp<A, E>(m - mv);
    m = mv;
  }
#pragma unroll
  for (int e = 0; e < VW; ++e)
    if (e < n) s += row_exp<A, E>(v[e] - m);
  if (smooth)
#pragma unroll
    for (int e = 0; e < VW; ++e)
      if (e < n) ws += cw ? cw[j + e] * v[e] : v[e];
}

// Each thread's (m, s, ws) merged over the block in a fixed tree (deterministic); the block's
// result lands in sm[0], ss[0], sw[0] (shared arrays of blockDim.x).
template <typename A>
__device__ __forceinline__ void block_merge_stats(A m, A s, A ws, A* sm, A* ss, A* sw) {
  sm[threadIdx.x] = m;
  ss[threadIdx.x] = s;
  sw[threadIdx.x] = ws;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) {
      A mm = sm[threadIdx.x], sv = ss[threadIdx.x];
      merge(mm, sv, sm[threadIdx.x + h], ss[threadIdx.x + h]);
      sm[threadIdx.x] = mm;
      ss[threadIdx.x] = sv;
      sw[threadIdx.x] += sw[threadIdx.x + h];
    }
    __syncthreads();
  }
}

// Each thread's (max, argmax column) reduced over the block in a fixed tree: the largest maximum,
// the lowest column among equal ones. The result lands in sm[0], si[0] (shared arrays of blockDim.x).
template <typename A>
__device__ __forceinline__ void block_argmax(A m, int64_t am, A* sm, int64_t* si) {
  sm[threadIdx.x] = m;
  si[threadIdx.x] = am;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) {
      const A m2 = sm[threadIdx.x + h];
      const int64_t a2 = si[threadIdx.x + h];
      if (m2 > sm[threadIdx.x] || (m2 == sm[threadIdx.x] && a2 < si[threadIdx.x])) {
        sm[threadIdx.x] = m2;
        si[threadIdx.x] = a2;
      }
    }
    __syncthreads();
  }
}

// Row i's logsumexp from its (max, sum exp) into lse[i], and its loss and z-loss terms into
// terms[i], terms[n_total + i] (an out-of-range target gives a NaN loss instead of a host check
// that would synchronise). Returns the lse.
template <typename A>
__device__ __forceinline__ A finish_token(int64_t i, int64_t y, A m, A s, A s_y, A ws, const A* cw, const A* totals,
                                          const lce::Consts& k, A* lse, A* terms, int64_t n_total) {
  const A l = m + dlog<A>(s);
  lse[i] = l;
  A loss = 0, zl = 0;
  if (!lce::is_ignored(y, k)) {
    if (y < 0 || y >= k.v) {
      loss = NAN;
    } else {
      loss = lce::token_loss<A>(l, s_y, cw ? cw[y] : A(1), ws, totals[2], k);
      zl = static_cast<A>(k.z_coef) * l * l;
    }
  }
  terms[i] = loss;
  terms[n_total + i] = zl;
  return l;
}

// One row's gradient coefficients (lce_math.h); a dead row (ignored or out-of-range target) has
// dz = 0. g_up: the upstream gradient of this token's share.
template <typename A>
struct RowGrad {
  bool dead = true;
  A lse = 0;
  lce::CoefT<A> c;
};

template <typename A>
__device__ __forceinline__ RowGrad<A> row_grad(int64_t y, A lse, A g_up, const A* cw, const A* totals,
                                               const lce::Consts& k) {
  RowGrad<A> r;
  r.dead = lce::is_ignored(y, k) || y < 0 || y >= k.v;
  if (r.dead) return r;
  lce::Totals<A> tot;
  tot.weight_sum = totals[0];
  tot.count = totals[1];
  tot.class_sum = totals[2];
  r.lse = lse;
  A gl, gz;
  lce::token_scales<A>(g_up, tot, k, gl, gz);
  r.c = lce::row_coef<A>(gl, gz, lse, cw ? cw[y] : A(1), tot.class_sum, k);
  return r;
}

// dL/dz of one live element: sv is its logit with bias and soft-cap applied, v its class.
template <typename A, typename E>
__device__ __forceinline__ A element_grad(A sv, int64_t v, int64_t y, const RowGrad<A>& rg, const A* cw, A cap) {
  A d = rg.c.a * row_exp<A, E>(sv - rg.lse);
  if (rg.c.c != A(0)) d -= rg.c.c * (cw ? cw[v] : A(1));  // label smoothing only
  if (v == y) d -= rg.c.b;
  if (cap > A(0)) d *= A(1) - (sv / cap) * (sv / cap);
  return d;
}

}  // namespace kiln::cuda::lce_k
