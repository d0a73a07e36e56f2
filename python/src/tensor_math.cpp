// kiln.Tensor operators (+ - * / ** @, comparisons, in-place forms) and the method forms of ops
// (t.sum(), t.exp(), t.softmax(dim) ...). A Python number operand is a kiln::Scalar: its kind
// (bool / int / float) takes part in type promotion as in PyTorch.
#include "bind.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

using BinT = Tensor (*)(const Tensor&, const Tensor&);
using BinS = Tensor (*)(const Tensor&, Scalar);

template <typename F>
nb::object inplace(nb::handle self, F&& f) {
  f(nb::cast<Tensor&>(self));
  return nb::borrow(self);
}

Tensor add_tt(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor sub_tt(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor add_ts(const Tensor& a, Scalar b) { return add(a, b); }
Tensor sub_ts(const Tensor& a, Scalar b) { return sub(a, b); }

nb::object reduce_max(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  if (!dim) return nb::cast(max(t));
  auto [values, indices] = max(t, *dim, keepdim);
  return nb::make_tuple(values, indices);
}

}  // namespace

void bind_tensor_math(nb::class_<Tensor>& cls) {
  const auto op = nb::is_operator();
  cls.def("__add__", &add_tt, op).def("__add__", &add_ts, op)
      .def("__radd__", [](const Tensor& a, Scalar b) { return add(a, b); }, op)
      .def("__sub__", &sub_tt, op).def("__sub__", &sub_ts, op)
      .def("__rsub__", [](const Tensor& a, Scalar b) { return sub(b, a); }, op)
      .def("__mul__", static_cast<BinT>(&mul), op).def("__mul__", static_cast<BinS>(&mul), op)
      .def("__rmul__", [](const Tensor& a, Scalar b) { return mul(a, b); }, op)
      .def("__truediv__", static_cast<BinT>(&div), op).def("__truediv__", static_cast<BinS>(&div), op)
      .def("__rtruediv__", [](const Tensor& a, Scalar b) { return div(b, a); }, op)
      .def("__pow__", static_cast<BinT>(&pow), op).def("__pow__", static_cast<BinS>(&pow), op)
      .def("__rpow__", [](const Tensor& e, Scalar base) { return pow(base, e); }, op)
      .def("__matmul__", &matmul, op)
      .def("__neg__", [](const Tensor& a) { return neg(a); }, op)
      .def("__abs__", [](const Tensor& a) { return abs(a); }, op)
      .def("__eq__", static_cast<BinT>(&eq), op).def("__eq__", static_cast<BinS>(&eq), op)
      .def("__ne__", static_cast<BinT>(&ne), op).def("__ne__", static_cast<BinS>(&ne), op)
      .def("__lt__", static_cast<BinT>(&lt), op).def("__lt__", static_cast<BinS>(&lt), op)
      .def("__le__", static_cast<BinT>(&le), op).def("__le__", static_cast<BinS>(&le), op)
      .def("__gt__", static_cast<BinT>(&gt), op).def("__gt__", static_cast<BinS>(&gt), op)
      .def("__ge__", static_cast<BinT>(&ge), op).def("__ge__", static_cast<BinS>(&ge), op)
      .def("__bool__", [](const Tensor& t) {
             KILN_CHECK(t.numel() == 1, "bool", "the truth value of a tensor with ", t.numel(),
                        " elements is ambiguous");
             return t.item() != 0;
           })
      .def("__float__", [](const Tensor& t) {
             KILN_CHECK(t.numel() == 1, "float", "only one-element tensors convert to Python scalars");
             return t.item();
           })
      .def("__int__", [](const Tensor& t) {
             KILN_CHECK(t.numel() == 1, "int", "only one-element tensors convert to Python scalars");
             return static_cast<int64_t>(t.item());
           })
      // In place: the same Python object comes back (a += b keeps identity, as in PyTorch).
      .def("__iadd__", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { add_(t, o); }); }, op)
      .def("__iadd__", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { add_(t, o); }); }, op)
      .def("__isub__", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { sub_(t, o); }); }, op)
      .def("__isub__", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { sub_(t, o); }); }, op)
      .def("__imul__", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { mul_(t, o); }); }, op)
      .def("__imul__", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { mul_(t, o); }); }, op)
      .def("__itruediv__", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { div_(t, o); }); }, op)
      .def("__itruediv__", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { div_(t, o); }); }, op)
      .def("add_", [](nb::handle s, const Tensor& o, double alpha) {
             return inplace(s, [&](Tensor& t) { add_(t, o, alpha); });
           }, "other"_a, "alpha"_a = 1.0)
      .def("add_", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { add_(t, o); }); }, "other"_a)
      .def("sub_", [](nb::handle s, const Tensor& o, double alpha) {
             return inplace(s, [&](Tensor& t) { sub_(t, o, alpha); });
           }, "other"_a, "alpha"_a = 1.0)
      .def("sub_", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { sub_(t, o); }); }, "other"_a)
      .def("mul_", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { mul_(t, o); }); }, "other"_a)
      .def("mul_", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { mul_(t, o); }); }, "other"_a)
      .def("div_", [](nb::handle s, const Tensor& o) { return inplace(s, [&](Tensor& t) { div_(t, o); }); }, "other"_a)
      .def("div_", [](nb::handle s, Scalar o) { return inplace(s, [&](Tensor& t) { div_(t, o); }); }, "other"_a);

  // Method forms of ops.
  cls.def("add", [](const Tensor& a, const Tensor& b, double alpha) { return add(a, b, alpha); }, "other"_a, "alpha"_a = 1.0)
      .def("add", &add_ts, "other"_a)
      .def("sub", [](const Tensor& a, const Tensor& b, double alpha) { return sub(a, b, alpha); }, "other"_a, "alpha"_a = 1.0)
      .def("sub", &sub_ts, "other"_a)
      .def("mul", static_cast<BinT>(&mul), "other"_a).def("mul", static_cast<BinS>(&mul), "other"_a)
      .def("div", static_cast<BinT>(&div), "other"_a).def("div", static_cast<BinS>(&div), "other"_a)
      .def("pow", static_cast<BinT>(&pow), "exponent"_a).def("pow", static_cast<BinS>(&pow), "exponent"_a)
      .def("matmul", &matmul, "other"_a)
      .def("mm", &mm, "mat2"_a)
      .def("maximum", &maximum, "other"_a)
      .def("minimum", &minimum, "other"_a)
      .def("neg", [](const Tensor& x) { return neg(x); })
      .def("exp", [](const Tensor& x) { return exp(x); })
      .def("log", [](const Tensor& x) { return log(x); })
      .def("erf", [](const Tensor& x) { return erf(x); })
      .def("tanh", [](const Tensor& x) { return tanh(x); })
      .def("sqrt", [](const Tensor& x) { return sqrt(x); })
      .def("rsqrt", [](const Tensor& x) { return rsqrt(x); })
      .def("abs", [](const Tensor& x) { return abs(x); })
      .def("sigmoid", [](const Tensor& x) { return sigmoid(x); })
      .def("relu", [](const Tensor& x) { return relu(x); })
      .def("clamp", [](const Tensor& x, std::optional<double> lo, std::optional<double> hi) { return clamp(x, lo, hi); },
           "min"_a = nb::none(), "max"_a = nb::none())
      .def("sum", [](const Tensor& x, nb::handle dim, bool keepdim) { return sum(x, dims_from(dim, "sum"), keepdim); },
           "dim"_a = nb::none(), "keepdim"_a = false)
      .def("mean", [](const Tensor& x, nb::handle dim, bool keepdim) { return mean(x, dims_from(dim, "mean"), keepdim); },
           "dim"_a = nb::none(), "keepdim"_a = false)
      .def("amax", [](const Tensor& x, nb::handle dim, bool keepdim) { return amax(x, dims_from(dim, "amax"), keepdim); },
           "dim"_a = nb::none(), "keepdim"_a = false)
      .def("amin", [](const Tensor& x, nb::handle dim, bool keepdim) { return amin(x, dims_from(dim, "amin"), keepdim); },
           "dim"_a = nb::none(), "keepdim"_a = false)
      .def("logsumexp", [](const Tensor& x, nb::handle dim, bool keepdim) {
             return logsumexp(x, dims_from(dim, "logsumexp"), keepdim);
           }, "dim"_a, "keepdim"_a = false)
      .def("max", &reduce_max, "dim"_a = nb::none(), "keepdim"_a = false,
           "max() -> [] ; max(dim, keepdim) -> (values, int64 indices)")
      .def("argmax", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return argmax(x, dim, keepdim); },
           "dim"_a = nb::none(), "keepdim"_a = false)
      .def("softmax", [](const Tensor& x, int64_t dim) { return softmax(x, dim); }, "dim"_a)
      .def("log_softmax", [](const Tensor& x, int64_t dim) { return log_softmax(x, dim); }, "dim"_a);
}

}  // namespace kiln::py
