// Joining and indexing ops: cat, stack, index_select, gather, scatter_add. Validation, output
// allocation, device dispatch and autograd live here; kernels in ops/cpu and ops/cuda.
// Index policy: int64 or int32, values in [0, size) (negative indices are errors, as in
// PyTorch's index_select/gather/scatter); checked before any kernel runs (on CUDA by a device
// pass that sets a flag word the host reads back: no kernel ever traps).
// Every accumulating path (index_select / gather backward, scatter_add) is deterministic.
#include <algorithm>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/indexing.h"
#include "ops/indexing_internal.h"
#ifdef KILN_WITH_CUDA
#include "ops/cuda/indexing.h"
#endif

namespace kiln {
namespace indexing {

void check_index_tensor(const Tensor& index, const Tensor& x, const char* op, const char* index_name) {
  KILN_CHECK(index.defined(), op, index_name, " is undefined");
  KILN_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, op, index_name, " must be int64 or int32, got ",
             dtype_name(index.dtype()));
  KILN_CHECK(index.device() == x.device(), op, index_name, " is on ", index.device().str(), " but the input is on ",
             x.device().str());
}

void check_indices(const Tensor& index, int64_t bound, const char* op, int64_t dim) {
  int64_t pos = -1;
  if (index.is_cuda()) {
    KILN_CUDA_ONLY(op, pos = cuda::find_bad_index(index, bound));
  } else {
    pos = cpu::find_bad_index(index, bound);
  }
  if (pos < 0) return;
  const Tensor flat = make_view(index, {index.numel()}, {1}, index.storage_offset());
  const int64_t value = make_view(flat, {}, {}, index.storage_offset() + pos).item<int64_t>();
  KILN_FAIL(op, "index ", value, " at position ", pos, " is out of range for dim ", dim, " with size ", bound,
            " (valid range [0, ", bound, "))");
}

Tensor index_select_raw(const Tensor& x, int64_t dim, const Tensor& index, const Shape& out_shape) {
  Tensor out = make_tensor(out_shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const int64_t n = x.sizes()[dim];
  if (x.is_contiguous()) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.sizes()[d];
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.sizes()[d];
    if (x.is_cuda()) {
      KILN_CUDA_ONLY("index_select", cuda::index_select_rows(out, x, index, outer, n, inner));
    } else {
      cpu::index_select_rows(out, x, index, outer, n, inner);
    }
    return out;
  }
  // Strided input: walk out's elements; x with stride 0 along dim, index broadcast along the rest.
  Shape xs = x.strides(), is(out_shape.size(), 0);
  xs[dim] = 0;
  is[dim] = 1;
  const Tensor x_r = make_view(x, out_shape, xs, x.storage_offset());
  const Tensor i_r = make_view(index, out_shape, is, index.storage_offset());
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("index_select", cuda::index_gather(out, x_r, i_r, x.strides()[dim], n));
  } else {
    cpu::index_gather(out, x_r, i_r, x.strides()[dim], n);
  }
  return out;
}

Tensor index_select_impl(const Tensor& x, int64_t dim, const Tensor& index) {
  Shape shape = x.sizes();
  shape[dim] = index.numel();
  Tensor out = index_select_raw(x, dim, index, shape);
  if (autograd::needs_grad({x})) {
    const SavedTensor saved(index);
    const int64_t n = x.sizes()[dim];
    autograd::record("index_select", {out}, {x}, [saved, dim, n](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{index_add_zeros(g[0], dim, saved.unpack("index_select"), n)};
    });
  }
  return out;
}

Tensor index_add_zeros(const Tensor& g_in, int64_t dim, const Tensor& index, int64_t n) {
  const Tensor g = g_in.contiguous();
  Shape shape = g.sizes();
  const int64_t k = shape[dim];
  shape[dim] = n;
  Tensor out = make_tensor(shape, g.dtype(), g.device());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
  if (out.numel() > 0) {
    if (g.is_cuda()) {
      KILN_CUDA_ONLY("index_add", cuda::index_add_rows(out, g, index, outer, n, k, inner));
    } else {
      cpu::index_add_rows(out, g, index, outer, n, k, inner);
    }
  }
  if (autograd::needs_grad({g_in})) {
    const SavedTensor saved(index);
    autograd::record("index_add_backward", {out}, {g_in}, [saved, dim](const std::vector<Tensor>& gg) {
      return std::vector<Tensor>{index_select_impl(gg[0], dim, saved.unpack("index_add_backward"))};
    });
  }
  return out;
}

}  // namespace indexing

namespace {

// 1-D tensors with zero elements are skipped by cat (PyTorch's legacy rule), whatever dim says.
bool legacy_empty(const Tensor& t) { return t.dim() == 1 && t.numel() == 0; }

Shape drop_dim(const Shape& s, int64_t dim) {
  Shape r = s;
  r.erase(r.begin() + dim);
  return r;
}

// gather without validation (indices known good): used by scatter_add's backward.
Tensor gather_impl(const Tensor& x, int64_t d, const Tensor& idx);
// scatter_add without validation: used by gather's backward.
Tensor scatter_add_impl(const Tensor& x, int64_t d, const Tensor& idx, const Tensor& src);

Tensor gather_impl(const Tensor& x, int64_t d, const Tensor& idx) {
  Tensor out = make_tensor(idx.sizes(), x.dtype(), x.device());
  Shape xs = x.strides();
  xs[d] = 0;
  const Tensor x_r = make_view(x, idx.sizes(), xs, x.storage_offset());
  const int64_t n = x.sizes()[d];
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("gather", cuda::index_gather(out, x_r, idx, x.strides()[d], n));
  } else {
    cpu::index_gather(out, x_r, idx, x.strides()[d], n);
  }
  if (autograd::needs_grad({x})) {
    const SavedTensor saved(idx);
    autograd::record("gather", {out}, {x}, [saved, d, xsizes = x.sizes()](const std::vector<Tensor>& g) {
      const Tensor index = saved.unpack("gather");
      return std::vector<Tensor>{scatter_add_impl(zeros(xsizes, g[0].options()), d, index, g[0])};
    });
  }
  return out;
}

Tensor scatter_add_impl(const Tensor& x, int64_t d, const Tensor& idx, const Tensor& src) {
  // 16-bit floats accumulate in an fp32 copy of x; the rest in place in a clone.
  const DType acc_dtype = is_low_precision(x.dtype()) ? kFloat32 : x.dtype();
  Tensor acc = make_tensor(x.sizes(), acc_dtype, x.device());
  {
    NoGradGuard no_grad;
    acc.copy_(x);
  }
  const Shape lines = drop_dim(idx.sizes(), d);
  const Tensor out_l = make_view(acc, lines, drop_dim(acc.strides(), d), acc.storage_offset());
  const Tensor idx_l = make_view(idx, lines, drop_dim(idx.strides(), d), idx.storage_offset());
  const Tensor src_l = make_view(src, lines, drop_dim(src.strides(), d), src.storage_offset());
  const int64_t m = idx.sizes()[d], n = x.sizes()[d];
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("scatter_add", cuda::scatter_add_lines(out_l, idx_l, src_l, m, acc.strides()[d],
                                                          idx.strides()[d], src.strides()[d], n));
  } else {
    cpu::scatter_add_lines(out_l, idx_l, src_l, m, acc.strides()[d], idx.strides()[d], src.strides()[d], n);
  }
  Tensor out = acc;
  if (acc_dtype != x.dtype()) {
    out = make_tensor(x.sizes(), x.dtype(), x.device());
    NoGradGuard no_grad;
    out.copy_(acc);
  }
  if (autograd::needs_grad({x, src})) {
    const SavedTensor saved(idx);
    autograd::record("scatter_add", {out}, {x, src}, [saved, d, src_sizes = src.sizes()](const std::vector<Tensor>& g) {
      const Tensor index = saved.unpack("scatter_add");
      Tensor grad_src = gather_impl(g[0], d, index);
      // src may extend past index; those elements were never read: zero gradient (cat keeps it
      // differentiable).
      for (int64_t k = 0; k < grad_src.dim(); ++k) {
        if (grad_src.sizes()[k] == src_sizes[k]) continue;
        Shape pad = grad_src.sizes();
        pad[k] = src_sizes[k] - pad[k];
        grad_src = cat({grad_src, zeros(pad, grad_src.options())}, k);
      }
      return std::vector<Tensor>{g[0], grad_src};
    });
  }
  return out;
}

// Shared checks for gather / scatter_add: same rank, index no larger than x off dim.
void check_gather_shapes(const Tensor& x, const Tensor& index, int64_t d, const char* op) {
  KILN_CHECK(index.dim() == x.dim(), op, "index must have the input's rank: index is ", shape_str(index.sizes()),
             ", input is ", shape_str(x.sizes()));
  for (int64_t k = 0; k < x.dim(); ++k)
    KILN_CHECK(k == d || index.sizes()[k] <= x.sizes()[k], op, "index has size ", index.sizes()[k], " at dim ", k,
               " but the input has only ", x.sizes()[k], " (index ", shape_str(index.sizes()), ", input ",
               shape_str(x.sizes()), ")");
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat", "expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) KILN_CHECK(tensors[i].defined(), "cat", "tensor ", i, " is undefined");
  size_t ref = 0;
  while (ref + 1 < tensors.size() && legacy_empty(tensors[ref])) ++ref;
  const Tensor& r = tensors[ref];
  KILN_CHECK(r.dim() > 0, "cat", "zero-dimensional tensor (tensor ", ref, ") cannot be concatenated");
  const int64_t d = wrap_dim(dim, r.dim(), "cat");
  DType dtype = r.dtype();
  Shape shape = r.sizes();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.device() == r.device(), "cat", "tensor ", i, " is on ", t.device().str(), " but tensor ", ref,
               " is on ", r.device().str());
    dtype = promote_types(dtype, t.dtype());
    if (legacy_empty(t)) continue;
    KILN_CHECK(t.dim() == r.dim(), "cat", "tensor ", i, " has ", t.dim(), " dims but tensor ", ref, " has ", r.dim(),
               " (sizes ", shape_str(t.sizes()), " vs ", shape_str(r.sizes()), ")");
    for (int64_t k = 0; k < r.dim(); ++k)
      KILN_CHECK(k == d || t.sizes()[k] == r.sizes()[k], "cat", "tensor ", i, " has size ", t.sizes()[k], " at dim ",
                 k, " but tensor ", ref, " has ", r.sizes()[k], " (sizes ", shape_str(t.sizes()), " vs ",
                 shape_str(r.sizes()), "; only dim ", d, " may differ)");
    shape[d] += t.sizes()[d];
  }
  Tensor out = make_tensor(shape, dtype, r.device());
  std::vector<int64_t> offsets(tensors.size(), -1);
  {
    NoGradGuard no_grad;
    int64_t off = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (legacy_empty(tensors[i])) continue;
      offsets[i] = off;
      const int64_t len = tensors[i].sizes()[d];
      if (len > 0) out.narrow(d, off, len).copy_(tensors[i]);
      off += len;
    }
  }
  if (autograd::needs_grad(tensors)) {
    std::vector<int64_t> lengths;
    std::vector<DType> dtypes;
    for (const Tensor& t : tensors) {
      lengths.push_back(legacy_empty(t) ? 0 : t.sizes()[d]);
      dtypes.push_back(t.dtype());
    }
    autograd::record("cat", {out}, tensors, [d, offsets, lengths, dtypes](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads(offsets.size());
      for (size_t i = 0; i < offsets.size(); ++i) {
        if (offsets[i] < 0 || !is_floating_point(dtypes[i])) continue;
        grads[i] = g[0].narrow(d, offsets[i], lengths[i]).to(dtypes[i]);
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack", "expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i)
    KILN_CHECK(tensors[i].defined(), "stack", "tensor ", i, " is undefined");
  const Tensor& r = tensors[0];
  const int64_t d = wrap_dim(dim, r.dim() + 1, "stack");
  DType dtype = r.dtype();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.device() == r.device(), "stack", "tensor ", i, " is on ", t.device().str(), " but tensor 0 is on ",
               r.device().str());
    KILN_CHECK(t.sizes() == r.sizes(), "stack", "expects tensors of equal shape, but tensor ", i, " is ",
               shape_str(t.sizes()), " and tensor 0 is ", shape_str(r.sizes()));
    dtype = promote_types(dtype, t.dtype());
  }
  Shape shape = r.sizes();
  shape.insert(shape.begin() + d, static_cast<int64_t>(tensors.size()));
  Tensor out = make_tensor(shape, dtype, r.device());
  if (out.numel() > 0) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) out.select(d, static_cast<int64_t>(i)).copy_(tensors[i]);
  }
  if (autograd::needs_grad(tensors)) {
    std::vector<DType> dtypes;
    for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
    autograd::record("stack", {out}, tensors, [d, dtypes](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads(dtypes.size());
      for (size_t i = 0; i < dtypes.size(); ++i)
        if (is_floating_point(dtypes[i])) grads[i] = g[0].select(d, static_cast<int64_t>(i)).to(dtypes[i]);
      return grads;
    });
  }
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  KILN_CHECK(x.defined(), "index_select", "input is undefined");
  indexing::check_index_tensor(index, x, "index_select");
  KILN_CHECK(index.dim() <= 1, "index_select", "index must be 0-d or 1-d, got ", shape_str(index.sizes()));
  if (x.dim() == 0) {
    const Tensor r = index_select(x.reshape({1}), 0, index);
    return index.dim() == 0 ? r.reshape({}) : r;
  }
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  const int64_t n = x.sizes()[d];
  const Tensor idx = index.contiguous().reshape({-1});
  indexing::check_indices(idx, n, "index_select", d);
  return indexing::index_select_impl(x, d, idx);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  KILN_CHECK(x.defined(), "gather", "input is undefined");
  indexing::check_index_tensor(index, x, "gather");
  if (x.dim() == 0) {
    KILN_CHECK(index.dim() == 0, "gather", "index must be 0-d for a 0-d input, got ", shape_str(index.sizes()));
    return gather(x.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  check_gather_shapes(x, index, d, "gather");
  const Tensor idx = index.contiguous();
  indexing::check_indices(idx, x.sizes()[d], "gather", d);
  return gather_impl(x, d, idx);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  KILN_CHECK(x.defined() && src.defined(), "scatter_add", "input or src is undefined");
  indexing::check_index_tensor(index, x, "scatter_add");
  KILN_CHECK(src.device() == x.device(), "scatter_add", "src is on ", src.device().str(), " but the input is on ",
             x.device().str());
  KILN_CHECK(src.dtype() == x.dtype(), "scatter_add", "src dtype ", dtype_name(src.dtype()),
             " differs from the input's ", dtype_name(x.dtype()));
  if (x.dim() == 0) {
    KILN_CHECK(index.dim() == 0 && src.dim() == 0, "scatter_add", "index and src must be 0-d for a 0-d input");
    return scatter_add(x.reshape({1}), 0, index.reshape({1}), src.reshape({1})).reshape({});
  }
  const int64_t d = wrap_dim(dim, x.dim(), "scatter_add");
  check_gather_shapes(x, index, d, "scatter_add");
  KILN_CHECK(src.dim() == x.dim(), "scatter_add", "src must have the input's rank: src is ", shape_str(src.sizes()),
             ", input is ", shape_str(x.sizes()));
  for (int64_t k = 0; k < x.dim(); ++k)
    KILN_CHECK(index.sizes()[k] <= src.sizes()[k], "scatter_add", "index has size ", index.sizes()[k], " at dim ", k,
               " but src has only ", src.sizes()[k]);
  const Tensor idx = index.contiguous();
  indexing::check_indices(idx, x.sizes()[d], "scatter_add", d);
  return scatter_add_impl(x, d, idx, src);
}

}  // namespace kiln
