#pragma once
// Splitting a tensor into views (torch.split / chunk / unbind) and einsum. The pieces are views of
// the input (differentiable, sharing its storage).
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// Pieces of `split_size` along dim (the last one smaller when it does not divide).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Pieces of the given sizes along dim; they must sum to x.size(dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
// `chunks` pieces of ceil(size / chunks) along dim (fewer when the size runs out), as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// x: [..., n, ...] -> n tensors with dim removed.
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);

// torch.einsum: "ij,jk->ik", "bij,bjk->bik", "ii->i", "ij->", "...ij,...jk->...ik", implicit output
// (no "->": the indices seen once, sorted). One or two operands; built from diagonal views,
// permutes, sums and one batched matmul, so it is differentiable. A repeated index in the output,
// an output index no input has, or a mismatched size raises naming the subscript.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);

// Largest (or smallest) k along dim -> (values, int64 indices). sorted: in order of value (ties keep
// the lower index first); NaN counts as the largest value, as in PyTorch. Values are a gather of x,
// so they are differentiable. The selection runs on the host (a sync on CUDA).
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
// Stable sort along dim -> (values, int64 indices); argsort returns the indices.
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);

}  // namespace kiln
