#pragma once
// Helpers shared by the indexing ops (src/ops/indexing.cpp) and embedding (src/ops/embedding.cpp).
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::indexing {

// Raises "[op] index V at position P is out of range for dim D with size N (valid range
// [0, N))" when a value of contiguous `index` lies outside [0, bound). On CUDA this reads one
// flag word back from the device (a synchronisation).
void check_indices(const Tensor& index, int64_t bound, const char* op, int64_t dim);
// Raises unless index is int64/int32 and on x's device.
void check_index_tensor(const Tensor& index, const Tensor& x, const char* op, const char* index_name = "index");

// Deterministic index_add into zeros: g has size k along dim, index [k] contiguous with values
// in [0, n) (already validated) -> g's shape with n along dim. Differentiable w.r.t. g (its
// backward is index_select), so index_select/embedding support double backward.
Tensor index_add_zeros(const Tensor& g, int64_t dim, const Tensor& index, int64_t n);

// index_select without validation (index [k] contiguous, values known to be in range);
// records autograd (backward: index_add_zeros).
Tensor index_select_impl(const Tensor& x, int64_t dim, const Tensor& index);

// Row gather out[o, i, :] = x[o, index[i], :] into a fresh tensor of shape out_shape (no
// autograd); x may be strided. index [k] contiguous and validated.
Tensor index_select_raw(const Tensor& x, int64_t dim, const Tensor& index, const Shape& out_shape);

}  // namespace kiln::indexing
