// Binary elementwise ops (add, sub, mul, div, pow, maximum, minimum), their scalar forms, the
// in-place updates and the operators. Forward: validate, promote, launch a kernel op id.
// Backward: composite kiln ops, reduced over broadcast dims by reduce_grad (sum_to_size).
#include <cmath>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cpu/elementwise.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise_internal.h"

namespace kiln {
namespace {

using ew::InputMeta;
using ew::reduce_grad;

// Checks both operands and returns the dtype the op computes in (bool only where allowed).
DType binary_dtype(const Tensor& a, const Tensor& b, const char* op, bool bool_ok = false) {
  ew::check_defined(a, op);
  ew::check_defined(b, op);
  const DType t = result_type(a, b);
  if (!bool_ok) ew::check_not_bool(t, op);
  return t;
}

// An op whose operands are both bool: computed in uint8, the result read as nonzero (add and
// maximum act as or, mul and minimum as and), as PyTorch gives bools. Not differentiable.
Tensor bool_binary(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  return ne(ew::run_binary(op, a, b, kUInt8, {}, name), 0);
}

Tensor add_impl(const Tensor& a, const Tensor& b, double alpha, const char* op) {
  const bool is_sub = op[0] == 's';
  KILN_CHECK(!is_sub || (a.dtype() != kBool && b.dtype() != kBool), op,
             "subtraction with a bool operand is not supported; to invert a mask use logical_not, or "
             "convert the bools with .to() first");
  const DType dt = binary_dtype(a, b, op, /*bool_ok=*/true);
  if (dt == kBool) {
    KILN_CHECK(alpha == 1.0, op, "alpha must be 1 for bool tensors");
    return bool_binary(BinaryOp::Add, a, b, op);
  }
  Tensor out = ew::run_binary(BinaryOp::Add, a, b, dt, EwParams{ew::wrap_integer(dt, alpha)}, op);
  if (autograd::needs_grad({a, b})) {
    const InputMeta ma(a), mb(b);
    autograd::record(op, {out}, {a, b}, [ma, mb, alpha](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{reduce_grad(g[0], ma), reduce_grad(alpha == 1.0 ? g[0] : mul(g[0], alpha), mb)};
    });
  }
  return out;
}

// Gradient of the input that needs one (undefined otherwise), computed lazily.
template <typename F>
Tensor grad_if(bool needed, F&& f) {
  return needed ? f() : Tensor();
}

// out = a op b for maximum/minimum; the gradient goes to the winner, split evenly on ties.
Tensor extremum(const Tensor& a, const Tensor& b, bool is_max, const char* op) {
  const DType dt = binary_dtype(a, b, op, /*bool_ok=*/true);
  if (dt == kBool) return bool_binary(is_max ? BinaryOp::Maximum : BinaryOp::Minimum, a, b, op);
  Tensor out = ew::run_binary(is_max ? BinaryOp::Maximum : BinaryOp::Minimum, a, b, dt, {}, op);
  if (autograd::needs_grad({a, b})) {
    const InputMeta ma(a), mb(b);
    const SavedTensor sa(a), sb(b);
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    autograd::record(op, {out}, {a, b}, [=](const std::vector<Tensor>& g) {
      const Tensor x = sa.unpack(op), y = sb.unpack(op);
      const DType gdt = g[0].dtype();
      const Tensor win = is_max ? gt(x, y) : lt(x, y);
      // weight of a: 1 where it wins, 0.5 on ties, 0 where b wins.
      const Tensor w = add(win.to(gdt), eq(x, y).to(gdt), 0.5);
      return std::vector<Tensor>{grad_if(ra, [&] { return reduce_grad(mul(g[0], w), ma); }),
                                 grad_if(rb, [&] { return reduce_grad(sub(g[0], mul(g[0], w)), mb); })};
    });
  }
  return out;
}

// In-place updates may not touch graph tensors (the same rules as Tensor::copy_).
void check_inplace(const Tensor& self, const Tensor* other, const char* op) {
  ew::check_defined(self, op);
  if (is_grad_enabled() && self.requires_grad()) {
    KILN_CHECK(!self.is_leaf(), op, "a leaf tensor that requires grad is used in an in-place operation; "
               "wrap the update in kiln::NoGradGuard");
    KILN_FAIL(op, "in-place operations on tensors that are part of a graph are not differentiable in kiln; "
              "use the out-of-place op");
  }
  if (other) {
    ew::check_defined(*other, op);
    KILN_CHECK(!(is_grad_enabled() && other->requires_grad()), op,
               "in-place operations are not differentiable in kiln and the other operand requires grad; "
               "use the out-of-place op or kiln::NoGradGuard");
    KILN_CHECK(broadcast_shapes(self.sizes(), other->sizes(), op) == self.sizes(), op, "other of shape ",
               shape_str(other->sizes()), " cannot be broadcast to self of shape ", shape_str(self.sizes()));
  }
  ew::check_not_bool(self.dtype(), op);
  for (int64_t d = 0; d < self.dim(); ++d)
    KILN_CHECK(self.strides()[d] != 0 || self.sizes()[d] <= 1, op,
               "self is an expanded view whose elements share memory; clone() it first");
}

// self = self op other, written in place. Same dtype: the kernel writes self directly (an
// output aliasing an input with identical strides is safe elementwise); otherwise the result is
// computed in the promoted dtype and copied back.
Tensor& inplace_binary(Tensor& self, const Tensor& other, BinaryOp op, double alpha, const char* name) {
  check_inplace(self, &other, name);
  NoGradGuard no_grad;
  const DType dt = result_type(self, other);
  KILN_CHECK(ew::category(dt) <= ew::category(self.dtype()), name, "result type ", dtype_name(dt),
             " cannot be written into a ", dtype_name(self.dtype()), " tensor");
  alpha = ew::wrap_integer(dt, alpha);
  if (dt != self.dtype()) {
    self.copy_(ew::run_binary(op, self, other, dt, EwParams{alpha}, name));
    return self;
  }
  const Device device = ew::common_device({&self, &other}, name);
  KILN_CHECK(device == self.device(), name, "self is on ", self.device(), " but other is on ", other.device());
  Tensor o = other.device() == device ? other.detach() : other.to(device);
  if (o.dtype() != dt) o = o.to(dt);
  o = o.expand(self.sizes());
  if (self.numel() == 0) return self;
  if (device.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::binary(op, self, self, o, EwParams{alpha}));
  } else {
    cpu::binary(op, self, self, o, EwParams{alpha});
  }
  self.bump_version();
  return self;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return add_impl(a, b, alpha, "add"); }
Tensor sub(const Tensor& a, const Tensor& b, double alpha) { return add_impl(a, b, -alpha, "sub"); }

Tensor mul(const Tensor& a, const Tensor& b) {
  const DType dt = binary_dtype(a, b, "mul", /*bool_ok=*/true);
  if (dt == kBool) return bool_binary(BinaryOp::Mul, a, b, "mul");
  Tensor out = ew::run_binary(BinaryOp::Mul, a, b, dt, {}, "mul");
  if (autograd::needs_grad({a, b})) {
    const InputMeta ma(a), mb(b);
    const SavedTensor sa(a), sb(b);
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    autograd::record("mul", {out}, {a, b}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{grad_if(ra, [&] { return reduce_grad(mul(g[0], sb.unpack("mul")), ma); }),
                                 grad_if(rb, [&] { return reduce_grad(mul(g[0], sa.unpack("mul")), mb); })};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  DType dt = binary_dtype(a, b, "div", /*bool_ok=*/true);
  if (!is_floating_point(dt)) dt = kFloat32;  // true division, as in PyTorch (bools too)
  Tensor out = ew::run_binary(BinaryOp::Div, a, b, dt, {}, "div");
  if (autograd::needs_grad({a, b})) {
    const InputMeta ma(a), mb(b);
    const SavedTensor sa(a), sb(b);
    const bool rb = b.requires_grad();
    autograd::record("div", {out}, {a, b}, [=](const std::vector<Tensor>& g) {
      const Tensor y = sb.unpack("div");
      const Tensor ga = div(g[0], y);  // also the first factor of b's gradient
      // d(a/b)/db = -a/b^2 = -(g/b) * (a/b)
      return std::vector<Tensor>{reduce_grad(ga, ma),
                                 grad_if(rb, [&] { return reduce_grad(neg(mul(ga, div(sa.unpack("div"), y))), mb); })};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& exponent) {
  KILN_CHECK(a.dtype() != kBool || exponent.dtype() != kBool, "pow", "pow of two bool tensors is not supported");
  const DType dt = binary_dtype(a, exponent, "pow");
  Tensor out = ew::run_binary(BinaryOp::Pow, a, exponent, dt, {}, "pow");
  if (autograd::needs_grad({a, exponent})) {
    const InputMeta ma(a), mb(exponent);
    const SavedTensor sa(a), sb(exponent);
    const bool ra = a.requires_grad(), rb = exponent.requires_grad();
    autograd::record("pow", {out}, {a, exponent}, [=](const std::vector<Tensor>& g) {
      const Tensor x = sa.unpack("pow"), e = sb.unpack("pow");
      // d/dx x^e = e * x^(e-1);  d/de x^e = x^e * log(x), taken as 0 where x == 0 and e >= 0.
      return std::vector<Tensor>{
          grad_if(ra, [&] { return reduce_grad(mul(g[0], mul(e, pow(x, sub(e, 1.0)))), ma); }),
          grad_if(rb, [&] {
            const Tensor ge_ = mul(g[0], mul(pow(x, e), log(x)));
            const Tensor zero = zeros({}, ge_.options());
            return reduce_grad(where(kiln::eq(x, 0.0), where(kiln::ge(e, 0.0), zero, ge_), ge_), mb);
          })};
    });
  }
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(a, b, true, "maximum"); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(a, b, false, "minimum"); }

// ---- a number operand: the tensor is converted to result_type(a, s) first ----

namespace {

// a in the dtype it meets s in (int64 [N] * 0.5 runs in f32). Only a non-float a ever converts,
// so no autograd is lost.
Tensor promoted(const Tensor& a, Scalar s, const char* op) {
  ew::check_defined(a, op);
  const DType dt = result_type(a, s);
  return dt == a.dtype() ? a : a.to(dt);
}

void check_no_bool_sub(DType a, bool b_is_bool, const char* op) {
  KILN_CHECK(a != kBool && !b_is_bool, op, "subtraction with a bool operand is not supported; "
             "to invert a mask use logical_not, or convert the bools with .to() first");
}

}  // namespace

Tensor add(const Tensor& a, Scalar b) {
  ew::check_defined(a, "add");
  if (result_type(a, b) == kBool) return bool_binary(BinaryOp::Add, a, ew::scalar_operand(a, b), "add");
  const Tensor x = promoted(a, b, "add");
  Tensor out = ew::run_binary_scalar(BinaryOp::Add, x, ew::wrap_integer(x.dtype(), b.to_double()), {}, "add");
  if (autograd::needs_grad({x}))
    autograd::record("add", {out}, {x}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor sub(const Tensor& a, Scalar b) {
  ew::check_defined(a, "sub");
  check_no_bool_sub(a.dtype(), b.is_bool(), "sub");
  const Tensor x = promoted(a, b, "sub");
  Tensor out = ew::run_binary_scalar(BinaryOp::Add, x, ew::wrap_integer(x.dtype(), -b.to_double()), {}, "sub");
  if (autograd::needs_grad({x}))
    autograd::record("sub", {out}, {x}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, Scalar b) {
  ew::check_defined(a, "mul");
  if (result_type(a, b) == kBool) return bool_binary(BinaryOp::Mul, a, ew::scalar_operand(a, b), "mul");
  const Tensor x = promoted(a, b, "mul");
  Tensor out = ew::run_binary_scalar(BinaryOp::Mul, x, ew::wrap_integer(x.dtype(), b.to_double()), {}, "mul");
  if (autograd::needs_grad({x}))
    autograd::record("mul", {out}, {x}, [b](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], b)}; });
  return out;
}

Tensor div(const Tensor& a, Scalar b) {
  ew::check_defined(a, "div");
  const DType dt = result_type(a, b);
  if (!is_floating_point(dt)) return div(a.to(kFloat32), b);  // true division
  const Tensor x = promoted(a, b, "div");
  Tensor out = ew::run_binary_scalar(BinaryOp::Div, x, b.to_double(), {}, "div");
  if (autograd::needs_grad({x}))
    autograd::record("div", {out}, {x}, [b](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(g[0], b)}; });
  return out;
}

Tensor pow(const Tensor& a, Scalar exponent_scalar) {
  ew::check_defined(a, "pow");
  if (result_type(a, exponent_scalar) == kBool)
    return bool_binary(BinaryOp::Pow, a, ew::scalar_operand(a, exponent_scalar), "pow");
  const Tensor x0 = promoted(a, exponent_scalar, "pow");
  const double exponent = exponent_scalar.to_double();
  Tensor out = ew::run_binary_scalar(BinaryOp::Pow, x0, exponent, {}, "pow");
  if (autograd::needs_grad({x0})) {
    const SavedTensor sa(x0);
    autograd::record("pow", {out}, {x0}, [sa, exponent](const std::vector<Tensor>& g) {
      const Tensor x = sa.unpack("pow");
      if (exponent == 0.0) return std::vector<Tensor>{zeros_like(x)};
      if (is_grad_enabled())  // create_graph: stay differentiable
        return std::vector<Tensor>{mul(g[0], mul(pow(x, exponent - 1.0), exponent))};
      return std::vector<Tensor>{ew::run_binary(BinaryOp::PowScalarBackward, g[0], x, g[0].dtype(),
                                                EwParams{exponent}, "pow_backward")};
    });
  }
  return out;
}

Tensor sub(Scalar a, const Tensor& b) {
  ew::check_defined(b, "sub");
  check_no_bool_sub(b.dtype(), a.is_bool(), "sub");
  return sub(ew::scalar_operand(b, a), b);
}
Tensor div(Scalar a, const Tensor& b) {
  ew::check_defined(b, "div");
  return div(ew::scalar_operand(b, a), b);
}
Tensor pow(Scalar self, const Tensor& exponent) {
  ew::check_defined(exponent, "pow");
  return pow(ew::scalar_operand(exponent, self), exponent);
}

// ---- in place ----

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  return inplace_binary(self, other, BinaryOp::Add, alpha, "add_");
}
Tensor& sub_(Tensor& self, const Tensor& other, double alpha) {
  return inplace_binary(self, other, BinaryOp::Add, -alpha, "sub_");
}
Tensor& mul_(Tensor& self, const Tensor& other) { return inplace_binary(self, other, BinaryOp::Mul, 1.0, "mul_"); }
Tensor& div_(Tensor& self, const Tensor& other) {
  KILN_CHECK(is_floating_point(self.dtype()), "div_", "true division cannot write into a ", dtype_name(self.dtype()),
             " tensor");
  return inplace_binary(self, other, BinaryOp::Div, 1.0, "div_");
}

namespace {
Tensor& inplace_scalar(Tensor& self, BinaryOp op, Scalar scalar, double value, const char* name) {
  check_inplace(self, nullptr, name);
  const DType dt = result_type(self, scalar);
  KILN_CHECK(dt == self.dtype(), name, "result type ", dtype_name(dt), " cannot be written into a ",
             dtype_name(self.dtype()), " tensor");
  if (self.numel() == 0) return self;
  NoGradGuard no_grad;
  if (op != BinaryOp::Div) value = ew::wrap_integer(self.dtype(), value);
  if (self.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::binary_scalar(op, self, self, value, {}));
  } else {
    cpu::binary_scalar(op, self, self, value, {});
  }
  self.bump_version();
  return self;
}
}  // namespace

Tensor& add_(Tensor& self, Scalar v) { return inplace_scalar(self, BinaryOp::Add, v, v.to_double(), "add_"); }
Tensor& sub_(Tensor& self, Scalar v) { return inplace_scalar(self, BinaryOp::Add, v, -v.to_double(), "sub_"); }
Tensor& mul_(Tensor& self, Scalar v) { return inplace_scalar(self, BinaryOp::Mul, v, v.to_double(), "mul_"); }
Tensor& div_(Tensor& self, Scalar v) {
  KILN_CHECK(!self.defined() || is_floating_point(self.dtype()), "div_", "true division cannot write into a ",
             dtype_name(self.dtype()), " tensor");
  return inplace_scalar(self, BinaryOp::Div, v, v.to_double(), "div_");
}

// ---- operators ----

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(a, b); }
Tensor operator/(Scalar a, const Tensor& b) { return div(a, b); }

}  // namespace kiln
