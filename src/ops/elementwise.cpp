// BOOTSTRAP (to be replaced by the elementwise family): CPU-only add/add_ via float64,
// just enough for the autograd engine and the core tests.
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(x == y || x == 1 || y == 1, op, "shapes ", shape_str(a), " and ", shape_str(b),
               " are not broadcastable");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "add");
  KILN_CHECK(a.device().is_cpu() && b.device().is_cpu(), "add", "bootstrap add is CPU-only");
  const std::vector<double> x = a.expand(shape).contiguous().to_vector();
  const std::vector<double> y = b.expand(shape).contiguous().to_vector();
  std::vector<double> z(x.size());
  for (size_t i = 0; i < z.size(); ++i) z[i] = x[i] + alpha * y[i];
  Tensor out = empty(shape, a.options().dtype(promote_types(a.dtype(), b.dtype())));
  {
    NoGradGuard g;
    out.copy_(from_blob(z.data(), shape, kFloat64));
  }
  if (autograd::needs_grad({a, b})) {
    const Shape sa = a.sizes(), sb = b.sizes();
    autograd::record("add", {out}, {a, b}, [sa, sb, alpha](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_size(g[0], sa), sum_to_size(alpha == 1.0 ? g[0] : g[0] * alpha, sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, double b) {
  std::vector<double> x = a.contiguous().to_vector();
  for (double& v : x) v *= b;
  Tensor out = empty(a.sizes(), a.options());
  {
    NoGradGuard g;
    out.copy_(from_blob(x.data(), a.sizes(), kFloat64));
  }
  if (autograd::needs_grad({a}))
    autograd::record("mul", {out}, {a}, [b](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0] * b}; });
  return out;
}
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  NoGradGuard g;
  Tensor r = add(self, other, alpha);
  self.copy_(r);
  return self;
}

}  // namespace kiln
