#pragma once
// What every optimizer does with the parameters it is given: checks them, clears their gradients.
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::optim::detail {

// Checks params (numbered from first in messages) are defined floating-point leaves; returns
// first + params.size().
inline size_t check_parameters(const char* op, const std::vector<Tensor>& params, size_t first) {
  size_t index = first;
  for (const Tensor& p : params) {
    KILN_CHECK(p.defined(), op, "parameter ", index, " is undefined");
    KILN_CHECK(is_floating_point(p.dtype()), op, "parameter ", index, " must be floating point, got ",
               dtype_name(p.dtype()));
    KILN_CHECK(p.is_leaf(), op, "parameter ", index, " is not a leaf tensor");
    ++index;
  }
  return index;
}

// zero_grad: drops each gradient (set_to_none) or zeroes it in place.
inline void zero_grads(std::vector<Tensor>& params, bool set_to_none) {
  for (Tensor& p : params) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      Tensor g = p.grad();
      g.zero_();
    }
  }
}

}  // namespace kiln::optim::detail
