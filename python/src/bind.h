#pragma once
// Shared pieces of the kiln._C bindings: type casters for kiln::DType / kiln::Device (to and from
// the Python objects kiln.float32, kiln.device("cuda:0"), their strings, and torch's equivalents)
// and the per-file registration functions. The bindings only convert arguments; semantics live in
// the C++ library.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "scalar_caster.h"

namespace nb = nanobind;

namespace kiln::py {

using namespace nanobind::literals;

// The Python dtype objects (kiln.float32, ...) indexed by DType's value, and the kiln.device class;
// registered once by kiln/__init__.py (kept alive for the process: never freed at exit).
PyObject* dtype_object(DType dtype);
std::optional<DType> dtype_from_python(PyObject* obj);  // kiln dtype, "float32", torch.float32
std::optional<Device> device_from_python(PyObject* obj);  // "cuda:0", kiln.device, torch.device, int
PyObject* device_object(const Device& device);          // new reference

// Shapes given PyTorch's ways: f(2, 3), f((2, 3)), f([2, 3]), f() -> [].
Shape shape_from_args(const nb::args& args, const char* op);
// None / int / sequence of ints -> dims (empty = all).
std::vector<int64_t> dims_from(nb::handle dims, const char* op);
nb::object tensor_or_none(const Tensor& t);
// A Python number as the value it means in `dtype`'s kind (float / int / bool).
nb::object scalar_to_python(double v, DType dtype);

// file:line of the innermost Python frame (the traced mod, for flex errors).
std::string python_location();

void bind_tensor(nb::module_& m);
void bind_indexing(nb::class_<Tensor>& cls);
void bind_dlpack(nb::module_& m, nb::class_<Tensor>& cls);
void bind_ops(nb::module_& m);
void bind_nn(nb::module_& m);
void bind_flex(nb::module_& m);
void bind_io(nb::module_& m);
void bind_dist(nb::module_& m);
void bind_nn_modules(nb::module_& m);  // nn_modules.cpp
void bind_optim(nb::module_& m);       // optim.cpp
void bind_parallel(nb::module_& m);
void bind_errors(nb::module_& m);  // registered last
// A C++ message with Python's spellings (kiln::NoGradGuard -> `with kiln.no_grad():`, true -> True).
std::string python_wording(std::string message);
void bind_tensor_ops(nb::module_& m);
// t[mask] / t[mask] = v for a single bool tensor index (tensor_ops.cpp); nullopt / false otherwise.
std::optional<nb::object> getitem_by_mask(const Tensor& t, nb::handle idx);
bool setitem_by_mask(const Tensor& t, nb::handle idx, nb::handle value);

}  // namespace kiln::py

namespace nanobind::detail {

template <> struct type_caster<kiln::DType> {
  NB_TYPE_CASTER(kiln::DType, const_name("kiln.dtype"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    auto d = kiln::py::dtype_from_python(src.ptr());
    if (!d) return false;
    value = *d;
    return true;
  }
  static handle from_cpp(kiln::DType v, rv_policy, cleanup_list*) noexcept {
    PyObject* o = kiln::py::dtype_object(v);
    Py_XINCREF(o);
    return o;
  }
};

template <> struct type_caster<kiln::Device> {
  NB_TYPE_CASTER(kiln::Device, const_name("kiln.device | str"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    auto d = kiln::py::device_from_python(src.ptr());
    if (!d) return false;
    value = *d;
    return true;
  }
  static handle from_cpp(const kiln::Device& v, rv_policy, cleanup_list*) noexcept {
    return kiln::py::device_object(v);
  }
};

}  // namespace nanobind::detail
