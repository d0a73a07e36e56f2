#pragma once
// Launchers of the fused linear cross-entropy's CUDA kernels (lce_kernels.cu). Plain C++: no CUDA
// headers. `t` is the input dtype T (f32, f64, bf16, f16), also the type of the logit tiles and of
// dz; the accumulation type A is fp64 for fp64 and fp32 otherwise; pointers are device pointers;
// stream is a cudaStream_t.
#include <cstdint>

#include "kiln/dtype.h"
#include "lce/lce_math.h"

namespace kiln::cuda::lce_k {

// totals (4 x A): Totals<A> {weight_sum, count, class_sum, invalid}; one block, fixed order.
void prepare(DType t, const int64_t* target, const void* cw, const lce::Consts& k, void* totals, void* stream);
// Online logsumexp of a [rows, cols] tile (row stride ld; columns v0..) merged into state (4 rows
// of `state_stride`, A: max, sum, target logit, weighted sum); first: overwrite instead. amax
// (rows int64, or null): each row's running argmax column (the first maximum).
void stats(DType t, const void* tile, int64_t rows, int64_t cols, int64_t ld, int64_t v0, const void* bias,
           const void* cw, const int64_t* target, const lce::Consts& k, bool first, void* state,
           int64_t state_stride, int64_t* amax, void* stream);
// lse[n0 + r] and the token terms (terms: [2, n_total] A: loss_n, z_n) from the state; with amax,
// pred[n0 + r] (int64: the argmax, -1 where ignored); with tscale (A), the token scaling p(target)
// into tscale[n0 + r] and both terms multiplied by it.
void finalize(DType t, int64_t rows, int64_t n0, const void* state, int64_t state_stride, const int64_t* target,
              const void* cw, const void* totals, const lce::Consts& k, void* lse, void* terms, int64_t n_total,
              const int64_t* amax, int64_t* pred, void* tscale, void* stream);
// dz[r, j] = dL/dz for the raw logit tile (row stride ld, columns v0.., rows n0..), row stride ldz;
// dz may be the tile itself (in place, ldz = ld). g: upstream gradient (A; null means 1), one per
// token when g_per_token; tscale (A per token, or null): the token scaling factors it is multiplied by.
void grad(DType t, const void* tile, int64_t rows, int64_t cols, int64_t ld, int64_t v0, int64_t n0,
          const void* bias, const void* cw, const int64_t* target, const void* lse, const void* g, bool g_per_token,
          const void* tscale, const void* totals, const lce::Consts& k, void* dz, int64_t ldz, void* stream);
// acc[j] (A) = (first ? 0 : acc[j]) + sum_r dz[r, j], rows in order.
void colsum(DType t, const void* dz, int64_t rows, int64_t cols, int64_t ld, bool first, void* acc, void* stream);
// loss and zterm (A) from terms: reduced ([] outputs) or per token ([N]).
void reduce(DType t, const void* terms, int64_t n, const void* totals, const lce::Consts& k, void* loss, void* zterm,
            void* stream);
// dst (T) = src (A), n elements.
void store(DType t, const void* src, void* dst, int64_t n, void* stream);
// dst (T) = src (T) * g[0] (g: A).
void scale(DType t, const void* src, const void* g, void* dst, int64_t n, void* stream);

}  // namespace kiln::cuda::lce_k
