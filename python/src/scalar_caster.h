#pragma once
// kiln::Scalar from a Python number, keeping its kind (bool / int / float) for type promotion:
// t * 2 stays in t's integer dtype, t * 0.5 promotes an integer t to float32, as in PyTorch.
// Exact Python bool / int / float match first; NumPy scalars (np.float32(1), np.int64(2), np.bool_)
// join in nanobind's second, converting pass. Tensors never match (their overloads come first).
#include <nanobind/nanobind.h>

#include <cstring>

#include "kiln/scalar.h"

namespace nanobind::detail {

template <> struct type_caster<kiln::Scalar> {
  NB_TYPE_CASTER(kiln::Scalar, const_name("int | float | bool"))
  type_caster() : value(0.0) {}

  bool from_python(handle src, uint8_t flags, cleanup_list*) noexcept {
    PyObject* o = src.ptr();
    const bool convert = flags & static_cast<uint8_t>(cast_flags::convert);
    const char* type = Py_TYPE(o)->tp_name;
    if (PyBool_Check(o) || (convert && std::strcmp(type, "numpy.bool_") == 0)) {
      value = kiln::Scalar(PyObject_IsTrue(o) == 1);
      return true;
    }
    if (PyLong_Check(o) || (convert && PyIndex_Check(o) && !PyFloat_Check(o) && std::strncmp(type, "numpy.", 6) == 0)) {
      PyObject* as_int = PyNumber_Index(o);
      if (!as_int) { PyErr_Clear(); return false; }
      const long long v = PyLong_AsLongLong(as_int);
      Py_DECREF(as_int);
      if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return false; }  // beyond int64
      value = kiln::Scalar(static_cast<int64_t>(v));
      return true;
    }
    if (PyFloat_Check(o) || (convert && std::strncmp(type, "numpy.float", 11) == 0)) {
      const double v = PyFloat_AsDouble(o);
      if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return false; }
      value = kiln::Scalar(v);
      return true;
    }
    return false;
  }
  static handle from_cpp(const kiln::Scalar& v, rv_policy, cleanup_list*) noexcept {
    if (v.is_bool()) return PyBool_FromLong(v.to_double() != 0);
    if (v.is_floating_point()) return PyFloat_FromDouble(v.to_double());
    return PyLong_FromLongLong(static_cast<long long>(v.to_double()));
  }
};

}  // namespace nanobind::detail
