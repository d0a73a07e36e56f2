// Module-level functions with PyTorch's names: factories, elementwise math, reductions, matmul,
// joining/indexing, grad mode, seeding and determinism. The kiln package re-exports them.
#include "bind.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

using BinT = Tensor (*)(const Tensor&, const Tensor&);
using BinS = Tensor (*)(const Tensor&, Scalar);
using Unary = Tensor (*)(const Tensor&);

TensorOptions opts(std::optional<DType> dtype, std::optional<Device> device, bool requires_grad,
                   DType default_dtype = kFloat32) {
  return TensorOptions().dtype(dtype.value_or(default_dtype)).device(device.value_or(kCPU)).requires_grad(requires_grad);
}

// dtype a Python number implies (torch.full / torch.arange inference).
DType dtype_of_number(nb::handle v) {
  if (PyBool_Check(v.ptr())) return kBool;
  if (PyLong_Check(v.ptr())) return kInt64;
  return kFloat32;
}

template <typename F>
void def_factory(nb::module_& m, const char* name, F f, const char* doc) {
  m.def(name, [f](nb::args size, std::optional<DType> dtype, std::optional<Device> device, bool requires_grad) {
    return f(shape_from_args(size, "factory"), opts(dtype, device, requires_grad));
  }, "size"_a, "dtype"_a = nb::none(), "device"_a = nb::none(), "requires_grad"_a = false, doc);
}

template <typename F>
void def_like(nb::module_& m, const char* name, F f) {
  m.def(name, [f](const Tensor& t, std::optional<DType> dtype, std::optional<Device> device, bool requires_grad) {
    return f(t.sizes(), opts(dtype.value_or(t.dtype()), device.value_or(t.device()), requires_grad));
  }, "input"_a, "dtype"_a = nb::none(), "device"_a = nb::none(), "requires_grad"_a = false);
}

// b * alpha for torch.add(t, b, alpha=...), an integer while both are.
Scalar scaled(Scalar b, double alpha) {
  if (alpha == 1.0) return b;
  const double v = b.to_double() * alpha;
  if (b.is_floating_point() || alpha != static_cast<double>(static_cast<int64_t>(alpha))) return Scalar(v);
  return Scalar(static_cast<int64_t>(v));
}

}  // namespace

void bind_ops(nb::module_& m) {
  // ---- factories ----
  def_factory(m, "empty", [](const Shape& s, TensorOptions o) { return empty(s, o); }, "uninitialised tensor of `size`");
  def_factory(m, "zeros", [](const Shape& s, TensorOptions o) { return zeros(s, o); }, "zeros of `size`");
  def_factory(m, "ones", [](const Shape& s, TensorOptions o) { return ones(s, o); }, "ones of `size`");
  def_factory(m, "rand", [](const Shape& s, TensorOptions o) { return rand(s, o); },
              "uniform in [0, 1) (Philox: one seed gives the same numbers on the CPU and CUDA)");
  def_factory(m, "randn", [](const Shape& s, TensorOptions o) { return randn(s, o); }, "standard normal");
  def_like(m, "empty_like", [](const Shape& s, TensorOptions o) { return empty(s, o); });
  def_like(m, "zeros_like", [](const Shape& s, TensorOptions o) { return zeros(s, o); });
  def_like(m, "ones_like", [](const Shape& s, TensorOptions o) { return ones(s, o); });
  def_like(m, "rand_like", [](const Shape& s, TensorOptions o) { return rand(s, o); });
  def_like(m, "randn_like", [](const Shape& s, TensorOptions o) { return randn(s, o); });
  m.def("full", [](const Shape& size, nb::handle fill_value, std::optional<DType> dtype, std::optional<Device> device,
                   bool requires_grad) {
    return full(size, nb::cast<double>(fill_value), opts(dtype, device, requires_grad, dtype_of_number(fill_value)));
  }, "size"_a, "fill_value"_a, "dtype"_a = nb::none(), "device"_a = nb::none(), "requires_grad"_a = false,
  "a tensor of `size` filled with fill_value (dtype inferred from it: bool, int64 or float32)");
  m.def("full_like", [](const Tensor& t, double v, std::optional<DType> dtype, std::optional<Device> device) {
    return full(t.sizes(), v, opts(dtype.value_or(t.dtype()), device.value_or(t.device()), false));
  }, "input"_a, "fill_value"_a, "dtype"_a = nb::none(), "device"_a = nb::none());
  m.def("arange", [](nb::handle start, nb::handle end, nb::handle step, std::optional<DType> dtype,
                     std::optional<Device> device, bool requires_grad) {
    nb::object lo = end.is_none() ? nb::object(nb::int_(0)) : nb::borrow(start);
    nb::object hi = end.is_none() ? nb::borrow(start) : nb::borrow(end);
    const bool ints = PyLong_Check(lo.ptr()) && PyLong_Check(hi.ptr()) && PyLong_Check(step.ptr());
    return arange(nb::cast<double>(lo), nb::cast<double>(hi), nb::cast<double>(step),
                  opts(dtype, device, requires_grad, ints ? kInt64 : kFloat32));
  }, "start"_a, "end"_a = nb::none(), "step"_a = 1, "dtype"_a = nb::none(), "device"_a = nb::none(),
  "requires_grad"_a = false, "arange(end) / arange(start, end, step): [ceil((end - start) / step)]; int64 for int arguments");
  m.def("randint", [](nb::args args, std::optional<DType> dtype, std::optional<Device> device, bool requires_grad) {
    KILN_CHECK(args.size() == 2 || args.size() == 3, "randint", "expected randint(high, size) or randint(low, high, size)");
    const int64_t low = args.size() == 3 ? nb::cast<int64_t>(args[0]) : 0;
    const int64_t high = nb::cast<int64_t>(args[args.size() - 2]);
    nb::args size = nb::borrow<nb::args>(nb::make_tuple(args[args.size() - 1]));
    return randint(low, high, shape_from_args(size, "randint"), opts(dtype, device, requires_grad, kInt64));
  }, "args"_a, "dtype"_a = nb::none(), "device"_a = nb::none(), "requires_grad"_a = false,
  "integers uniform in [low, high)");
  m.def("manual_seed", [](uint64_t seed) { manual_seed(seed); }, "seed"_a);

  // ---- elementwise ----
  m.def("add", [](const Tensor& a, const Tensor& b, double alpha) { return add(a, b, alpha); }, "input"_a, "other"_a, "alpha"_a = 1.0)
      .def("add", [](const Tensor& a, Scalar b, double alpha) { return add(a, scaled(b, alpha)); }, "input"_a, "other"_a, "alpha"_a = 1.0)
      .def("sub", [](const Tensor& a, const Tensor& b, double alpha) { return sub(a, b, alpha); }, "input"_a, "other"_a, "alpha"_a = 1.0)
      .def("sub", [](const Tensor& a, Scalar b, double alpha) { return sub(a, scaled(b, alpha)); }, "input"_a, "other"_a, "alpha"_a = 1.0)
      .def("sub", [](Scalar a, const Tensor& b) { return sub(a, b); }, "input"_a, "other"_a);
  for (auto [name, ft, fs] : {std::tuple{"mul", static_cast<BinT>(&mul), static_cast<BinS>(&mul)},
                              std::tuple{"div", static_cast<BinT>(&div), static_cast<BinS>(&div)},
                              std::tuple{"pow", static_cast<BinT>(&pow), static_cast<BinS>(&pow)},
                              std::tuple{"eq", static_cast<BinT>(&eq), static_cast<BinS>(&eq)},
                              std::tuple{"ne", static_cast<BinT>(&ne), static_cast<BinS>(&ne)},
                              std::tuple{"lt", static_cast<BinT>(&lt), static_cast<BinS>(&lt)},
                              std::tuple{"le", static_cast<BinT>(&le), static_cast<BinS>(&le)},
                              std::tuple{"gt", static_cast<BinT>(&gt), static_cast<BinS>(&gt)},
                              std::tuple{"ge", static_cast<BinT>(&ge), static_cast<BinS>(&ge)}}) {
    m.def(name, ft, "input"_a, "other"_a).def(name, fs, "input"_a, "other"_a);
  }
  m.def("mul", [](Scalar a, const Tensor& b) { return mul(b, a); }, "input"_a, "other"_a)
      .def("div", [](Scalar a, const Tensor& b) { return div(a, b); }, "input"_a, "other"_a)
      .def("pow", [](Scalar self, const Tensor& e) { return pow(self, e); }, "input"_a, "exponent"_a)
      .def("result_type", [](const Tensor& a, const Tensor& b) { return result_type(a, b); }, "tensor1"_a, "tensor2"_a)
      .def("result_type", [](const Tensor& a, Scalar b) { return result_type(a, b); }, "tensor1"_a, "tensor2"_a)
      .def("result_type", [](Scalar a, const Tensor& b) { return result_type(b, a); }, "tensor1"_a, "tensor2"_a,
           "the dtype a binary op on these operands computes in (PyTorch's type promotion)");
  m.def("maximum", &maximum, "input"_a, "other"_a).def("minimum", &minimum, "input"_a, "other"_a);
  for (auto [name, f] : {std::pair{"neg", static_cast<Unary>(&neg)}, std::pair{"exp", static_cast<Unary>(&exp)},
                         std::pair{"log", static_cast<Unary>(&log)}, std::pair{"erf", static_cast<Unary>(&erf)},
                         std::pair{"tanh", static_cast<Unary>(&tanh)}, std::pair{"sqrt", static_cast<Unary>(&sqrt)},
                         std::pair{"rsqrt", static_cast<Unary>(&rsqrt)}, std::pair{"abs", static_cast<Unary>(&abs)},
                         std::pair{"sigmoid", static_cast<Unary>(&sigmoid)}, std::pair{"relu", static_cast<Unary>(&relu)},
                         std::pair{"silu", static_cast<Unary>(&silu)}}) {
    m.def(name, f, "input"_a);
  }
  m.def("gelu", [](const Tensor& x, const std::string& approximate) { return gelu(x, approximate); }, "input"_a,
        "approximate"_a = "none");
  m.def("clamp", [](const Tensor& x, std::optional<double> lo, std::optional<double> hi) { return clamp(x, lo, hi); },
        "input"_a, "min"_a = nb::none(), "max"_a = nb::none());
  m.def("where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); }, "condition"_a, "input"_a, "other"_a)
      .def("where", [](const Tensor& c, const Tensor& a, Scalar b) { return where(c, a, b); },
           "condition"_a, "input"_a, "other"_a)
      .def("where", [](const Tensor& c, Scalar a, const Tensor& b) { return where(c, a, b); },
           "condition"_a, "input"_a, "other"_a);

  // ---- reductions ----
  m.def("sum", [](const Tensor& x, nb::handle dim, bool keepdim) { return sum(x, dims_from(dim, "sum"), keepdim); },
        "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("mean", [](const Tensor& x, nb::handle dim, bool keepdim) { return mean(x, dims_from(dim, "mean"), keepdim); },
           "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("amax", [](const Tensor& x, nb::handle dim, bool keepdim) { return amax(x, dims_from(dim, "amax"), keepdim); },
           "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("amin", [](const Tensor& x, nb::handle dim, bool keepdim) { return amin(x, dims_from(dim, "amin"), keepdim); },
           "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("logsumexp", [](const Tensor& x, nb::handle dim, bool keepdim) {
             return logsumexp(x, dims_from(dim, "logsumexp"), keepdim);
           }, "input"_a, "dim"_a, "keepdim"_a = false)
      .def("max", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) -> nb::object {
             if (!dim) return nb::cast(max(x));
             auto [v, i] = max(x, *dim, keepdim);
             return nb::make_tuple(v, i);
           }, "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("argmax", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return argmax(x, dim, keepdim); },
           "input"_a, "dim"_a = nb::none(), "keepdim"_a = false)
      .def("softmax", [](const Tensor& x, int64_t dim) { return softmax(x, dim); }, "input"_a, "dim"_a)
      .def("log_softmax", [](const Tensor& x, int64_t dim) { return log_softmax(x, dim); }, "input"_a, "dim"_a);

  // ---- matrix products ----
  const auto nogil = nb::call_guard<nb::gil_scoped_release>();
  m.def("mm", &mm, "input"_a, "mat2"_a, nogil, "[M, K] @ [K, N] -> [M, N]")
      .def("bmm", &bmm, "input"_a, "mat2"_a, nogil, "[B, M, K] @ [B, K, N] -> [B, M, N]")
      .def("matmul", &matmul, "input"_a, "other"_a, nogil, "torch.matmul semantics (1-D, 2-D, batched with broadcast)")
      .def("set_float32_matmul_precision", &set_float32_matmul_precision, "precision"_a)
      .def("get_float32_matmul_precision", &get_float32_matmul_precision);

  // ---- joining and indexing ----
  m.def("cat", &cat, "tensors"_a, "dim"_a = 0)
      .def("stack", &stack, "tensors"_a, "dim"_a = 0)
      .def("index_select", &index_select, "input"_a, "dim"_a, "index"_a)
      .def("gather", &gather, "input"_a, "dim"_a, "index"_a)
      .def("scatter_add", &scatter_add, "input"_a, "dim"_a, "index"_a, "src"_a);

  // ---- autograd, determinism ----
  m.def("is_grad_enabled", &is_grad_enabled)
      .def("set_grad_enabled", &set_grad_enabled, "mode"_a)
      .def("use_deterministic_algorithms", &use_deterministic_algorithms, "mode"_a)
      .def("are_deterministic_algorithms_enabled", &are_deterministic_algorithms_enabled)
      .def("_autograd_grad", [](const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph) {
             nb::gil_scoped_release release;
             return autograd::grad(outputs, inputs, grad_outputs, retain_graph, create_graph);
           }, "outputs"_a, "inputs"_a, "grad_outputs"_a, "retain_graph"_a, "create_graph"_a);
}

}  // namespace kiln::py
