// kiln.Tensor: geometry, dtype/device, views, conversions and autograd (operators and math methods
// are in tensor_math.cpp, indexing in index.cpp).
#include "bind.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

nb::tuple to_tuple(const Shape& s) {
  nb::list l;
  for (int64_t v : s) l.append(v);
  return nb::tuple(l);
}

nb::object item(const Tensor& t) {
  KILN_CHECK(t.numel() == 1, "item", "a Tensor with ", t.numel(), " elements cannot be converted to a scalar");
  if (t.dtype() == kInt64) {  // exact beyond 2^53
    Tensor c = t.cpu().contiguous();
    return nb::int_(*c.data_ptr<int64_t>());
  }
  return scalar_to_python(t.item(), t.dtype());
}

// Tensor.to(...) in PyTorch's forms: to(dtype), to(device), to(device, dtype), to(other),
// to(device=..., dtype=...).
Tensor to_impl(const Tensor& t, std::optional<Device> device, std::optional<DType> dtype) {
  if (device && dtype) return t.to(*device, *dtype);
  if (device) return t.to(*device);
  if (dtype) return t.to(*dtype);
  return t;
}

}  // namespace

void bind_tensor_math(nb::class_<Tensor>& cls);

void bind_tensor(nb::module_& m) {
  auto cls = nb::class_<Tensor>(m, "Tensor",
                                "An n-dimensional array on the CPU or a CUDA device, with autograd "
                                "(kiln::Tensor; PyTorch's names and semantics).");
  cls.def_prop_ro("shape", [](const Tensor& t) { return to_tuple(t.sizes()); }, "sizes as a tuple")
      .def("size", [](const Tensor& t, std::optional<int64_t> dim) -> nb::object {
             if (dim) return nb::int_(t.size(*dim));
             return to_tuple(t.sizes());
           }, "dim"_a = nb::none())
      .def("stride", [](const Tensor& t, std::optional<int64_t> dim) -> nb::object {
             if (dim) return nb::int_(t.stride(*dim));
             return to_tuple(t.strides());
           }, "dim"_a = nb::none(), "strides in elements")
      .def_prop_ro("ndim", &Tensor::dim)
      .def("dim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("__len__", [](const Tensor& t) {
             KILN_CHECK(t.dim() > 0, "len", "len() of a 0-d tensor");
             return t.size(0);
           })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("device", &Tensor::device)
      .def_prop_ro("is_cuda", &Tensor::is_cuda)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("element_size", &Tensor::element_size)
      .def_prop_ro("itemsize", &Tensor::element_size)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def("storage_offset", &Tensor::storage_offset)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); },
           "address of the first element")
      .def("is_floating_point", [](const Tensor& t) { return is_floating_point(t.dtype()); })
      .def_prop_ro("_version", &Tensor::version, "bumped by every in-place write kiln makes to the storage")
      .def("_bump_version", &Tensor::bump_version,
           "marks the storage written by someone else (memory shared with torch or NumPy), so kiln's "
           "caches keyed on the version (compiled flex mods, device copies) refresh")
      .def("__repr__", &Tensor::str)
      .def("__hash__", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.impl()); })
      .def("item", &item, "the value of a one-element tensor as a Python number (synchronises)")

      // ---- autograd ----
      .def_prop_rw("requires_grad", &Tensor::requires_grad,
                   [](Tensor& t, bool v) { t.requires_grad_(v); })
      .def("requires_grad_", [](nb::handle self, bool v) {
             nb::cast<Tensor&>(self).requires_grad_(v);
             return nb::borrow(self);
           }, "requires_grad"_a = true)
      .def_prop_rw("grad", [](const Tensor& t) { return tensor_or_none(t.grad()); },
                   [](const Tensor& t, std::optional<Tensor> g) { t.set_grad(g ? *g : Tensor()); },
                   nb::arg("grad").none())
      .def_prop_ro("is_leaf", &Tensor::is_leaf)
      .def_prop_ro("grad_fn", [](const Tensor& t) -> nb::object {
             auto fn = t.grad_fn();
             if (!fn) return nb::none();
             return nb::str(fn->name().c_str());
           }, "the name of the op that made this tensor, or None for a leaf")
      .def("detach", &Tensor::detach)
      .def("backward", [](const Tensor& t, std::optional<Tensor> gradient, std::optional<bool> retain_graph,
                          bool create_graph) {
             nb::gil_scoped_release release;
             t.backward(gradient ? *gradient : Tensor(), retain_graph.value_or(create_graph), create_graph);
           }, "gradient"_a = nb::none(), "retain_graph"_a = nb::none(), "create_graph"_a = false,
           "Accumulates gradients of this tensor into the leaves' .grad (gradient defaults to 1 for a scalar).")

      // ---- views ----
      .def("view", [](const Tensor& t, nb::args shape) { return t.view(shape_from_args(shape, "view")); })
      .def("reshape", [](const Tensor& t, nb::args shape) { return t.reshape(shape_from_args(shape, "reshape")); })
      .def("transpose", &Tensor::transpose, "dim0"_a, "dim1"_a)
      .def("t", &Tensor::t)
      .def_prop_ro("T", [](const Tensor& t) {
             Shape dims;
             for (int64_t d = t.dim() - 1; d >= 0; --d) dims.push_back(d);
             return t.permute(dims);
           })
      .def_prop_ro("mT", [](const Tensor& t) { return t.transpose(-2, -1); })
      .def("permute", [](const Tensor& t, nb::args dims) { return t.permute(shape_from_args(dims, "permute")); })
      .def("narrow", &Tensor::narrow, "dim"_a, "start"_a, "length"_a)
      .def("select", &Tensor::select, "dim"_a, "index"_a)
      .def("expand", [](const Tensor& t, nb::args shape) { return t.expand(shape_from_args(shape, "expand")); })
      .def("expand_as", [](const Tensor& t, const Tensor& o) { return t.expand(o.sizes()); })
      .def("squeeze", [](const Tensor& t, std::optional<int64_t> dim) { return dim ? t.squeeze(*dim) : t.squeeze(); },
           "dim"_a = nb::none())
      .def("unsqueeze", &Tensor::unsqueeze, "dim"_a)
      .def("flatten", &Tensor::flatten, "start_dim"_a = 0, "end_dim"_a = -1)
      .def("view_as", [](const Tensor& t, const Tensor& o) { return t.view(o.sizes()); })
      .def("reshape_as", [](const Tensor& t, const Tensor& o) { return t.reshape(o.sizes()); })

      // ---- copies and conversions ----
      .def("contiguous", &Tensor::contiguous)
      .def("clone", &Tensor::clone)
      .def("to", [](const Tensor& t, DType dtype) { return t.to(dtype); }, "dtype"_a)
      .def("to", [](const Tensor& t, const Tensor& other) { return t.to(other.device(), other.dtype()); }, "other"_a)
      .def("to", &to_impl, "device"_a = nb::none(), "dtype"_a = nb::none(),
           "to(dtype) / to(device) / to(device, dtype) / to(other): a converted copy, or self when nothing changes")
      .def("cpu", &Tensor::cpu)
      .def("cuda", [](const Tensor& t, std::optional<Device> device) {
             return t.to(device ? *device : Device(DeviceType::CUDA, 0));
           }, "device"_a = nb::none())
      .def("float", [](const Tensor& t) { return t.to(kFloat32); })
      .def("double", [](const Tensor& t) { return t.to(kFloat64); })
      .def("half", [](const Tensor& t) { return t.to(kFloat16); })
      .def("bfloat16", [](const Tensor& t) { return t.to(kBFloat16); })
      .def("long", [](const Tensor& t) { return t.to(kInt64); })
      .def("int", [](const Tensor& t) { return t.to(kInt32); })
      .def("bool", [](const Tensor& t) { return t.to(kBool); })
      .def("type_as", [](const Tensor& t, const Tensor& o) { return t.to(o.dtype()); })
      .def("copy_", [](nb::handle self, const Tensor& src) {
             nb::cast<Tensor&>(self).copy_(src);
             return nb::borrow(self);
           }, "src"_a)
      .def("fill_", [](nb::handle self, double v) {
             nb::cast<Tensor&>(self).fill_(v);
             return nb::borrow(self);
           }, "value"_a)
      .def("zero_", [](nb::handle self) {
             nb::cast<Tensor&>(self).zero_();
             return nb::borrow(self);
           });

  bind_tensor_math(cls);
  bind_indexing(cls);
  bind_dlpack(m, cls);
}

}  // namespace kiln::py
