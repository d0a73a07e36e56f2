#pragma once
// Reductions over dims. `dims` empty means all dims. Accumulation is fp32 for 16-bit floats
// (fp64 for fp64); outputs take the input dtype. CPU results are bitwise identical for any
// thread count (fixed split of the reduction, fixed combination order).
#include <optional>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// x: any -> x with `dims` removed (kept as 1 with keepdim)
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Max over all elements -> [].
Tensor max(const Tensor& x);
// Max over one dim -> (values, int64 indices of the first maximum).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
// int64 index of the first maximum; over the flattened tensor when dim is empty.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// The same for the minimum (NaN counts as the minimum, as in PyTorch).
Tensor min(const Tensor& x);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// Sums broadcast dims away so the result has `shape` (the backward of broadcasting).
Tensor sum_to_size(const Tensor& x, const Shape& shape);

}  // namespace kiln
