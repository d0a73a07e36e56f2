#pragma once
// The checks every optimizer makes of the parameters it is given.
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

}  // namespace kiln::optim::detail
