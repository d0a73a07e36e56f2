#pragma once
// Statistics over dims (torch.var / torch.std / torch.linalg.vector_norm). `dims` empty means all
// dims. Floating-point inputs only; 16-bit floats are computed in fp32 and returned in their dtype.
// Differentiable (their backward is built from differentiable ops, so create_graph works).
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// x: any float -> x with `dims` removed (kept as 1 with keepdim).
// var = sum((x - mean)^2) / max(0, N - correction), N the number of reduced elements
// (correction 1: the unbiased estimate; 0: the population variance). N - correction <= 0 gives
// inf or nan, as in PyTorch.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);
// Vector p-norm over dims: (sum |x|^p)^(1/p); p = inf: max |x|; p = -inf: min |x|; p = 0: the count
// of nonzeros. The gradient at a zero norm is zero (not nan), as in PyTorch.
Tensor norm(const Tensor& x, double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);

}  // namespace kiln
