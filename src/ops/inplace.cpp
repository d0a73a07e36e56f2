// In-place updates composed from the out-of-place ops: each checks that self may be written (so the
// error names it), computes the new value without recording a graph, and writes it with copy_ / add_.
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/writable.h"

namespace kiln {

Tensor& sqrt_(Tensor& self) {
  check_writable(self, "sqrt_");
  KILN_CHECK(is_floating_point(self.dtype()), "sqrt_", "result type float can't be cast to the ",
             "desired output type ", dtype_name(self.dtype()));
  Tensor r;
  {
    NoGradGuard ng;
    r = sqrt(self.detach());
  }
  return self.copy_(r);
}

Tensor& clamp_(Tensor& self, std::optional<double> min, std::optional<double> max) {
  check_writable(self, "clamp_");
  Tensor r;
  {
    NoGradGuard ng;
    r = clamp(self.detach(), min, max);
  }
  return self.copy_(r);
}

Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  check_writable(self, "addcmul_");
  Tensor r;
  {
    NoGradGuard ng;
    r = mul(t1.detach(), t2.detach());
  }
  return add_(self, r, value);
}

Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  check_writable(self, "addcdiv_");
  Tensor r;
  {
    NoGradGuard ng;
    r = div(t1.detach(), t2.detach());
  }
  return add_(self, r, value);
}

Tensor& lerp_(Tensor& self, const Tensor& end, double weight) {
  check_writable(self, "lerp_");
  Tensor r;
  {
    NoGradGuard ng;
    r = sub(end.detach(), self.detach());
  }
  return add_(self, r, weight);
}

Tensor& lerp_(Tensor& self, const Tensor& end, const Tensor& weight) {
  check_writable(self, "lerp_");
  Tensor r;
  {
    NoGradGuard ng;
    r = mul(sub(end.detach(), self.detach()), weight.detach());
  }
  return add_(self, r);
}

void set_data(Tensor& self, const Tensor& src) {
  KILN_CHECK(self.defined() && src.defined(), "set_data", "undefined tensor");
  TensorImpl* d = self.impl();
  const TensorImpl* s = src.impl();
  if (d == s) return;
  d->storage = s->storage;
  d->sizes = s->sizes;
  d->strides = s->strides;
  d->offset = s->offset;
  d->dtype = s->dtype;
  self.bump_version();
}

}  // namespace kiln
