// kiln._C: the module, kiln.KilnError, and the dtype/device conversions every binding uses.
#include <cstring>

#include "bind.h"
#include "kiln/error.h"

namespace kiln::py {
namespace {

constexpr int kNumDTypes = 11;
PyObject* g_dtypes[kNumDTypes] = {};  // borrowed forever (registered once at import)
PyObject* g_device_cls = nullptr;

struct NamedDType {
  const char* name;
  DType dtype;
};
constexpr NamedDType kNames[] = {
    {"float32", kFloat32}, {"float", kFloat32},  {"float64", kFloat64}, {"double", kFloat64},
    {"bfloat16", kBFloat16}, {"float16", kFloat16}, {"half", kFloat16},  {"int64", kInt64},
    {"long", kInt64},      {"int32", kInt32},    {"int", kInt32},       {"int8", kInt8},
    {"uint8", kUInt8},     {"bool", kBool},       {"uint16", kUInt16},   {"uint32", kUInt32},
};

std::optional<DType> dtype_from_name(const char* s) {
  if (std::strncmp(s, "torch.", 6) == 0) s += 6;
  else if (std::strncmp(s, "kiln.", 5) == 0) s += 5;
  for (const auto& n : kNames)
    if (std::strcmp(n.name, s) == 0) return n.dtype;
  return std::nullopt;
}

bool type_named(PyObject* obj, const char* name) {
  return std::strcmp(Py_TYPE(obj)->tp_name, name) == 0 ||
         std::strstr(Py_TYPE(obj)->tp_name, (std::string(".") + name).c_str()) != nullptr;
}

}  // namespace

PyObject* dtype_object(DType dtype) {
  const int i = static_cast<int>(dtype);
  if (i < kNumDTypes && g_dtypes[i]) return g_dtypes[i];
  return nullptr;
}

std::optional<DType> dtype_from_python(PyObject* obj) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (g_dtypes[i] == obj) return static_cast<DType>(i);
  if (PyUnicode_Check(obj)) {
    const char* s = PyUnicode_AsUTF8(obj);
    if (!s) { PyErr_Clear(); return std::nullopt; }
    return dtype_from_name(s);
  }
  // torch.dtype and numpy.dtype print their names ("torch.float32", "float32").
  if (type_named(obj, "dtype")) {
    PyObject* s = PyObject_Str(obj);
    if (!s) { PyErr_Clear(); return std::nullopt; }
    const char* c = PyUnicode_AsUTF8(s);
    std::optional<DType> d = c ? dtype_from_name(c) : std::nullopt;
    if (!c) PyErr_Clear();
    Py_DECREF(s);
    return d;
  }
  return std::nullopt;
}

std::optional<Device> device_from_python(PyObject* obj) {
  std::string spec;
  if (PyUnicode_Check(obj)) {
    const char* s = PyUnicode_AsUTF8(obj);
    if (!s) { PyErr_Clear(); return std::nullopt; }
    spec = s;
  } else if (PyLong_Check(obj) && !PyBool_Check(obj)) {
    spec = "cuda:" + std::to_string(PyLong_AsLong(obj));  // torch: an int means a CUDA ordinal
  } else if ((g_device_cls && PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(g_device_cls))) ||
             type_named(obj, "device")) {
    PyObject* s = PyObject_Str(obj);  // kiln.device and torch.device print "cuda:0" / "cpu"
    if (!s) { PyErr_Clear(); return std::nullopt; }
    const char* c = PyUnicode_AsUTF8(s);
    if (c) spec = c; else PyErr_Clear();
    Py_DECREF(s);
  } else {
    return std::nullopt;
  }
  try {
    return Device(spec);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

PyObject* device_object(const Device& device) {
  const std::string s = device.str();
  if (g_device_cls) {
    PyObject* r = PyObject_CallFunction(g_device_cls, "s", s.c_str());
    if (r) return r;
    PyErr_Clear();
  }
  return PyUnicode_FromString(s.c_str());
}

Shape shape_from_args(const nb::args& args, const char* op) {
  nb::handle src = args;
  if (args.size() == 1 && !PyLong_Check(args[0].ptr())) src = args[0];
  Shape shape;
  try {
    for (nb::handle h : src) shape.push_back(nb::cast<int64_t>(h));
  } catch (const std::exception&) {
    KILN_FAIL(op, "sizes must be ints or one sequence of ints");
  }
  return shape;
}

std::vector<int64_t> dims_from(nb::handle dims, const char* op) {
  if (dims.is_none()) return {};
  if (PyLong_Check(dims.ptr())) return {nb::cast<int64_t>(dims)};
  std::vector<int64_t> out;
  try {
    for (nb::handle h : dims) out.push_back(nb::cast<int64_t>(h));
  } catch (const std::exception&) {
    KILN_FAIL(op, "dim must be None, an int or a sequence of ints");
  }
  KILN_CHECK(!out.empty(), op, "an empty dim list is ambiguous; pass dim=None to reduce every dim");
  return out;
}

nb::object tensor_or_none(const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }

nb::object scalar_to_python(double v, DType dtype) {
  if (dtype == kBool) return nb::bool_(v != 0);
  if (!is_floating_point(dtype)) return nb::int_(static_cast<int64_t>(v));
  return nb::float_(v);
}

}  // namespace kiln::py

NB_MODULE(_C, m) {
  using namespace kiln::py;
  m.doc() = "kiln's C++ engine (use the `kiln` package, not this module directly)";
  static nb::exception<kiln::Error> kiln_error(m, "KilnError", PyExc_RuntimeError);

  m.def(
      "_register_types",
      [](nb::list dtypes, nb::handle device_cls) {
        for (size_t i = 0; i < dtypes.size() && i < kNumDTypes; ++i) {
          PyObject* o = dtypes[i].ptr();
          Py_INCREF(o);  // kept for the process (the module's globals hold them too)
          g_dtypes[i] = o;
        }
        Py_INCREF(device_cls.ptr());
        g_device_cls = device_cls.ptr();
      },
      "dtypes"_a, "device_cls"_a);
  m.def("_parse_device", [](const std::string& spec) {
    kiln::Device d(spec);
    return std::make_pair(std::string(d.is_cuda() ? "cuda" : "cpu"), d.index);
  });
  m.def("_dtype_info", [](int code) {
    auto d = static_cast<kiln::DType>(code);
    return std::make_tuple(std::string(kiln::dtype_name(d)), kiln::element_size(d), kiln::is_floating_point(d));
  });

  bind_tensor(m);
  bind_ops(m);
  bind_nn(m);
  bind_flex(m);
  bind_io(m);
  bind_dist(m);
  bind_nn_modules(m);
  bind_optim(m);
  bind_parallel(m);
  bind_tensor_ops(m);
  bind_errors(m);
}
