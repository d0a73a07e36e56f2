#pragma once
// Joining and indexing. Index tensors are int64 or int32; an index out of range raises.
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// tensors: same shape except along dim -> concatenated along dim
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// tensors: same shape -> new dim inserted at `dim`
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// x: [..., n, ...], index: [k] -> x with size k along dim
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j] = x[index[i][j]][j] (dim 0), index has x's rank -> index's shape
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x; out[index[i][j]][j] += src[i][j] (dim 0); deterministic on both backends
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace kiln
