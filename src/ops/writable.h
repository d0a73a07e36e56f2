#pragma once
// The check every in-place op makes first, so its error names that op (the same rule as
// Tensor::copy_): no writes to a tensor that requires grad while grad mode is on.
#include "kiln/autograd.h"
#include "kiln/tensor.h"

namespace kiln {

inline void check_writable(const Tensor& self, const char* op) {
  KILN_CHECK(self.defined(), op, "undefined tensor");
  if (!is_grad_enabled() || !self.requires_grad()) return;
  KILN_CHECK(!self.is_leaf(), op, "a leaf tensor that requires grad is used in an in-place operation; "
             "update it with grad recording off (kiln.no_grad() / kiln::NoGradGuard)");
  KILN_FAIL(op, "in-place operations on tensors that are part of a graph are not differentiable in kiln; "
            "use the out-of-place op");
}

}  // namespace kiln
