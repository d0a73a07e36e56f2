#pragma once
// CPU kernels of the indexing family (src/ops/cpu/indexing.cpp). Indices are validated by the
// caller before any kernel runs; kernels still skip an out-of-range index rather than touch
// memory outside the tensor.
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {

// First position (row-major over `index`) whose value is outside [0, bound), or -1.
int64_t find_bad_index(const Tensor& index, int64_t bound);

// Row gather: x contiguous [outer, n, inner], out contiguous [outer, k, inner], index [k]
// contiguous: out[o, i, :] = x[o, index[i], :]. Any dtype (pure data movement).
void index_select_rows(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n,
                       int64_t inner);

// Strided gather: out, x_r and index_r all have out's sizes; x_r is x with stride 0 along the
// indexed dim, whose real stride is x_dim_stride and size bound:
// out[p] = x_r[p + index_r[p] * x_dim_stride]. Any dtype.
void index_gather(const Tensor& out, const Tensor& x_r, const Tensor& index_r, int64_t x_dim_stride, int64_t bound);

// Deterministic index_add into a fresh buffer (the backward of index_select and embedding):
// grad_x [outer, n, inner] contiguous, g [outer, k, inner] contiguous, index [k] contiguous:
// grad_x[o, j, :] = sum over i with index[i] == j, in increasing i, of g[o, i, :].
// Accumulates in fp32 for 16-bit dtypes; every element of grad_x is written.
void index_add_rows(const Tensor& grad_x, const Tensor& g, const Tensor& index, int64_t outer, int64_t n,
                    int64_t k, int64_t inner);

// Deterministic scatter-add along lines: out_l, index_l, src_l share the sizes of one "line
// grid" (index's shape without the scattered dim). For each line, for i = 0..m-1 in order:
// out[line + index[line + i*index_sd] * out_sd] += src[line + i*src_sd].
// out's dtype is acc_t of src's dtype (fp32 staging for 16-bit floats).
void scatter_add_lines(const Tensor& out_l, const Tensor& index_l, const Tensor& src_l, int64_t m, int64_t out_sd,
                       int64_t index_sd, int64_t src_sd, int64_t bound);

}  // namespace kiln::cpu
