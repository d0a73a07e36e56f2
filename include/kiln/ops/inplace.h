#pragma once
// In-place updates that optimizers and hand-written training loops use (torch's sqrt_, addcmul_,
// addcdiv_, lerp_, clamp_). Not differentiable (like add_); they raise on a leaf that requires grad
// while grad mode is on. The result is computed in the promoted dtype and stored in self's.
#include <optional>

#include "kiln/tensor.h"

namespace kiln {

Tensor& sqrt_(Tensor& self);
Tensor& clamp_(Tensor& self, std::optional<double> min, std::optional<double> max);
// self += value * t1 * t2
Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, double value = 1.0);
// self += value * t1 / t2
Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, double value = 1.0);
// self += weight * (end - self)
Tensor& lerp_(Tensor& self, const Tensor& end, double weight);
Tensor& lerp_(Tensor& self, const Tensor& end, const Tensor& weight);
// torch's `self.data = src`: self now shares src's storage, shape, strides and dtype (its autograd
// state is kept). Not differentiable.
void set_data(Tensor& self, const Tensor& src);

}  // namespace kiln
