// kiln.Tensor.__getitem__ / __setitem__: ints, slices (step > 0), None, Ellipsis and one 1-D integer
// index tensor (index_select), as in PyTorch. Basic indexing returns views. Indexing a tensor with
// a flex expression (inside a traced score_mod / mask_mod) captures the tensor into the mod's IR.
#include "bind.h"
#include "kiln/flex.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

constexpr const char* kOp = "getitem";

std::vector<nb::handle> index_items(nb::handle idx) {
  std::vector<nb::handle> items;
  if (PyTuple_Check(idx.ptr())) {
    for (nb::handle h : nb::borrow<nb::tuple>(idx)) items.push_back(h);
  } else {
    items.push_back(idx);
  }
  return items;
}

bool is_expr_index(const std::vector<nb::handle>& items) {
  for (nb::handle h : items)
    if (nb::isinstance<flex::Expr>(h)) return true;
  return false;
}

// t[expr][...]: a load from t in a mod's IR (ints become int constants).
nb::object capture_index(const Tensor& t, const std::vector<nb::handle>& items) {
  flex::Captured c;
  try {
    c = flex::capture(t);
  } catch (const Error& e) {
    KILN_FAIL("flex", "cannot capture a tensor (", e.what(), ") at ", python_location());
  }
  auto as_expr = [](nb::handle h) {
    if (nb::isinstance<flex::Expr>(h)) return nb::cast<flex::Expr>(h);
    KILN_CHECK(PyLong_Check(h.ptr()), "flex", "a captured tensor is indexed by ints or index expressions");
    return flex::Expr(nb::cast<int64_t>(h));
  };
  flex::Expr e = c[as_expr(items[0])];
  for (size_t i = 1; i < items.size(); ++i) e = e[as_expr(items[i])];
  return nb::cast(e);
}

Tensor basic_index(const Tensor& t, const std::vector<nb::handle>& items) {
  int64_t consumed = 0;  // dims of t the index uses
  for (nb::handle h : items)
    if (!h.is_none() && h.ptr() != Py_Ellipsis) ++consumed;
  KILN_CHECK(consumed <= t.dim(), kOp, "too many indices for a ", t.dim(), "-d tensor: ", consumed);
  Tensor out = t;
  int64_t dim = 0;          // the current dim of `out`
  bool seen_ellipsis = false;
  bool seen_tensor = false;
  for (nb::handle h : items) {
    if (h.is_none()) {
      out = out.unsqueeze(dim++);
    } else if (h.ptr() == Py_Ellipsis) {
      KILN_CHECK(!seen_ellipsis, kOp, "an index can only have a single ellipsis");
      seen_ellipsis = true;
      dim += t.dim() - consumed;
    } else if (PySlice_Check(h.ptr())) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      KILN_CHECK(step > 0, kOp, "slice step must be positive, got ", step);
      const Py_ssize_t n = static_cast<Py_ssize_t>(out.size(dim));
      PySlice_AdjustIndices(n, &start, &stop, step);
      if (stop < start) stop = start;
      if (start != 0 || stop != n || step != 1) out = out.slice(dim, start, stop, step);
      ++dim;
    } else if (nb::isinstance<Tensor>(h)) {
      KILN_CHECK(!seen_tensor, kOp, "only one tensor index is supported");
      seen_tensor = true;
      Tensor index = nb::cast<Tensor>(h);
      KILN_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, kOp,
                 "tensor indices must be int64 or int32 (a bool mask is supported as the whole index, t[mask]), got ", index.dtype());
      KILN_CHECK(index.dim() <= 1, kOp, "tensor indices must be 0-d or 1-d, got shape ", shape_str(index.sizes()));
      if (index.dim() == 0) {
        out = out.select(dim, index.item<int64_t>());
      } else {
        out = index_select(out, dim, index);
        ++dim;
      }
    } else if (PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr())) {
      const int64_t i = nb::cast<int64_t>(nb::int_(h));
      const int64_t n = out.size(dim);
      if (i < -n || i >= n)  // IndexError, so that iteration by __getitem__ stops as in Python
        throw nb::index_error(("index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(dim) +
                               " with size " + std::to_string(n)).c_str());
      out = out.select(dim, i < 0 ? i + n : i);
    } else {
      KILN_FAIL(kOp, "unsupported index of type ", Py_TYPE(h.ptr())->tp_name,
                " (ints, slices, None, ..., and integer tensors are supported)");
    }
  }
  return out;
}

}  // namespace

void bind_indexing(nb::class_<Tensor>& cls) {
  cls.def("__getitem__", [](const Tensor& t, nb::handle idx) -> nb::object {
    if (auto r = getitem_by_mask(t, idx)) return *r;
    auto items = index_items(idx);
    if (is_expr_index(items)) return capture_index(t, items);
    return nb::cast(basic_index(t, items));
  }, nb::arg("index").none());
  cls.def("__setitem__", [](const Tensor& t, nb::handle idx, nb::handle value) {
    if (setitem_by_mask(t, idx, value)) return;
    auto items = index_items(idx);
    for (nb::handle h : items)
      KILN_CHECK(!nb::isinstance<Tensor>(h), "setitem", "assignment through a tensor index is not supported");
    Tensor view = basic_index(t, items);
    if (nb::isinstance<Tensor>(value)) {
      view.copy_(nb::cast<Tensor>(value));
    } else {
      double v;
      if (!nb::try_cast<double>(value, v)) KILN_FAIL("setitem", "value must be a Tensor or a Python number");
      view.fill_(v);
    }
  }, nb::arg("index").none(), nb::arg("value"));
}

}  // namespace kiln::py
