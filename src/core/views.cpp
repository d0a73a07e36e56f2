// View ops: new geometry over the same storage; each records a backward that maps the
// gradient back to the base's shape.
#include <algorithm>

#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

Tensor view_with_grad(const Tensor& self, Shape sizes, Shape strides, int64_t offset, const char* op,
                      autograd::BackwardFn backward) {
  Tensor out = make_view(self, std::move(sizes), std::move(strides), offset);
  if (autograd::needs_grad({self})) autograd::record(op, {out}, {self}, std::move(backward));
  return out;
}

// Resolves one -1 in `shape` against numel.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KILN_CHECK(infer_at < 0, op, "only one dimension can be -1 in ", shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(out[i] >= 0, op, "invalid size in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, op, "shape ", shape_str(shape), " is invalid for ", numel,
               " elements");
    out[infer_at] = numel / known;
  }
  KILN_CHECK(shape_numel(out) == numel, op, "shape ", shape_str(shape), " is invalid for input of size ", numel);
  return out;
}

// Strides for viewing (sizes, strides) as `shape` without a copy, if possible (PyTorch's rule:
// each group of old dims that maps onto a group of new dims must be contiguous within itself).
bool view_strides(const Shape& sizes, const Shape& strides, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 0);
  if (shape_numel(sizes) == 0 || sizes.empty()) {
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "view");
  Shape st;
  KILN_CHECK(view_strides(sizes(), strides(), target, st), "view", "size ", shape_str(target),
             " is not compatible with the input's strides ", shape_str(strides()), "; use reshape()");
  const Shape in = sizes();
  return view_with_grad(*this, target, st, storage_offset(), "view",
                        [in](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(in)}; });
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "reshape");
  Shape st;
  if (view_strides(sizes(), strides(), target, st)) return view(target);
  return contiguous().view(target);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  KILN_CHECK(s <= e, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape target(sizes().begin(), sizes().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= sizes()[d];
  target.push_back(merged);
  target.insert(target.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(target);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  if (dim() == 0) return *this;
  const int64_t a = wrap_dim(dim0, dim(), "transpose"), b = wrap_dim(dim1, dim(), "transpose");
  Shape sz = sizes(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  return view_with_grad(*this, sz, st, storage_offset(), "transpose", [a, b](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].transpose(a, b)};
  });
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t", "expects a tensor with <= 2 dims, got ", dim());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  KILN_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute", "got ", dims.size(), " dims for a ", dim(),
             "-d tensor");
  Shape sz(dims.size()), st(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    KILN_CHECK(!seen[d], "permute", "repeated dim ", dims[i], " in ", shape_str(dims));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
    inverse[d] = static_cast<int64_t>(i);
  }
  return view_with_grad(*this, sz, st, storage_offset(), "permute", [inverse](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].permute(inverse)};
  });
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  KILN_CHECK(dim() > 0, "slice", "cannot slice a 0-d tensor");
  KILN_CHECK(step > 0, "slice", "step must be positive, got ", step);
  d = wrap_dim(d, dim(), "slice");
  const int64_t n = sizes()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sz = sizes(), st = strides();
  sz[d] = (end - start + step - 1) / step;
  st[d] *= step;
  const Shape in = sizes();
  return view_with_grad(*this, sz, st, storage_offset() + start * strides()[d], "slice",
                        [in, d, start, end, step](const std::vector<Tensor>& g) {
                          Tensor grad_in = zeros(in, g[0].options());
                          NoGradGuard no_grad;
                          grad_in.slice(d, start, end, step).copy_(g[0]);
                          return std::vector<Tensor>{grad_in};
                        });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  KILN_CHECK(dim() > 0, "narrow", "cannot narrow a 0-d tensor");
  const int64_t n = size(d);
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow", "start ", start, " + length ", length,
             " exceeds dimension size ", n);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  KILN_CHECK(dim() > 0, "select", "cannot select on a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[d];
  KILN_CHECK(index >= -n && index < n, "select", "index ", index, " out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  KILN_CHECK(static_cast<int64_t>(shape.size()) >= dim(), "expand", "cannot expand ", shape_str(sizes()), " to ",
             shape_str(shape));
  if (shape == sizes()) return *this;
  const int64_t lead = static_cast<int64_t>(shape.size()) - dim();
  Shape sz(shape.size()), st(shape.size());
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    const int64_t j = i - lead;
    if (j < 0) {
      KILN_CHECK(shape[i] >= 0, "expand", "size -1 not allowed in a new leading dim of ", shape_str(shape));
      sz[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t target = shape[i] == -1 ? sizes()[j] : shape[i];
    KILN_CHECK(sizes()[j] == target || sizes()[j] == 1, "expand", "cannot expand ", shape_str(sizes()), " to ",
               shape_str(shape), ": dim ", i, " has size ", sizes()[j]);
    sz[i] = target;
    st[i] = sizes()[j] == target ? strides()[j] : 0;
  }
  const Shape in = sizes();
  return view_with_grad(*this, sz, st, storage_offset(), "expand", [in](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to_size(g[0], in)};
  });
}

Tensor Tensor::squeeze() const {
  Shape sz;
  for (int64_t s : sizes())
    if (s != 1) sz.push_back(s);
  return sz.size() == sizes().size() ? *this : reshape(sz);
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (sizes()[d] != 1) return *this;
  Shape sz = sizes();
  sz.erase(sz.begin() + d);
  return reshape(sz);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sz = sizes();
  sz.insert(sz.begin() + d, 1);
  return reshape(sz);
}

}  // namespace kiln
