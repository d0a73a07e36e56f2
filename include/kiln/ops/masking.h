#pragma once
// Masks and predicates: masked_fill, tril/triu, isnan/isinf/isfinite, isclose/allclose, logical
// ops, any/all, nonzero, and boolean-mask indexing (t[mask], t[mask] = v). Masks are bool tensors.
// Built from where/compare/index_select, so they run on every device those do and carry their
// autograd. nonzero and the boolean-mask ops read the mask on the host (a sync on CUDA, as in PyTorch).
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// x: any, mask: bool broadcastable to x -> x's shape; mask ? value : x. A tensor value must be 0-d
// (its gradient is the sum over the masked positions).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);
// In place (not differentiable, like add_).
Tensor& masked_fill_(Tensor& self, const Tensor& mask, double value);
// x: [..., M, N] -> x with the elements above (tril) / below (triu) the `diagonal`-th diagonal zeroed
// (diagonal 0: the main one; > 0 above it; < 0 below it).
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// -> bool, x's shape. Integer tensors are finite and never nan.
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isfinite(const Tensor& x);
// |a - b| <= atol + rtol * |b| elementwise (broadcast), or a == b (so equal infinities are close);
// equal_nan: two nans are close.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
// Elementwise on truth values (nonzero is true), broadcast -> bool.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
// Whether all / any element along dims is nonzero (dims empty: all dims) -> bool.
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// x: any -> int64 [count of nonzeros, x.dim()], the indices in row-major order.
Tensor nonzero(const Tensor& x);
// x: any, mask: bool broadcastable with x -> 1-D: the elements where the mask is true (row-major).
Tensor masked_select(const Tensor& x, const Tensor& mask);
// t[mask]: mask of shape x.shape[:k] -> [count of trues, x.shape[k:]...] (differentiable).
Tensor index_by_mask(const Tensor& x, const Tensor& mask);
// t[mask] = value: value broadcastable to [count of trues, x.shape[k:]...] (a 0-d tensor fills).
// In place, not differentiable.
Tensor& index_put_by_mask_(Tensor& self, const Tensor& mask, const Tensor& value);

}  // namespace kiln
