// BOOTSTRAP (to be replaced by the reduction family): CPU-only sum via float64.
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  std::vector<bool> reduce(x.dim(), dims_in.empty());
  for (int64_t d : dims_in) reduce[wrap_dim(d, x.dim(), "sum")] = true;
  Shape kept = x.sizes();
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduce[d]) kept[d] = 1;
  const std::vector<double> v = x.contiguous().to_vector();
  std::vector<double> acc(static_cast<size_t>(shape_numel(kept)), 0.0);
  const Shape st = contiguous_strides(kept);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rem = i, o = 0;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      const int64_t idx = rem % x.sizes()[d];
      rem /= x.sizes()[d];
      if (!reduce[d]) o += idx * st[d];
    }
    acc[o] += v[i];
  }
  Shape out_shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!reduce[d] || keepdim) out_shape.push_back(kept[d]);
  Tensor out = empty(out_shape, x.options());
  {
    NoGradGuard g;
    out.copy_(from_blob(acc.data(), out_shape, kFloat64));
  }
  if (autograd::needs_grad({x})) {
    const Shape in = x.sizes();
    autograd::record("sum", {out}, {x}, [in, kept](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(kept).expand(in).contiguous()};
    });
  }
  return out;
}

Tensor sum_to_size(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  KILN_CHECK(lead >= 0, "sum_to_size", "cannot sum ", shape_str(x.sizes()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.sizes()[d] != 1)) dims.push_back(d);
  Tensor r = dims.empty() ? x : sum(x, dims, true);
  return r.reshape(shape);
}

}  // namespace kiln
