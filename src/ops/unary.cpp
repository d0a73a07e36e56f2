// Unary elementwise ops and their autograd. A normal backward runs one fused kernel per op
// (e.g. silu_backward(g, x)); under create_graph the same gradient is built from differentiable
// kiln ops on the saved input instead, so higher-order gradients stay correct.
#include <cmath>

#include "core/tensor_impl.h"
#include "ops/elementwise_internal.h"

namespace kiln {
namespace {

// Fused backward kernel (g, saved) -> gradient, in g's dtype.
Tensor fused(BinaryOp op, const Tensor& g, const Tensor& saved, const EwParams& p = {}) {
  return ew::run_binary(op, g, saved, g.dtype(), p, "elementwise_backward");
}

using Composite = Tensor (*)(const Tensor& g, const Tensor& x, const EwParams& p);

struct UnarySpec {
  UnaryOp op;
  const char* name;
  bool float_only;       // integer inputs are read as float32
  BinaryOp backward;     // fused kernel
  bool saves_output;     // the fused kernel reads y = f(x) instead of x
  Composite composite;   // differentiable gradient in terms of x
};

Tensor unary_op(const UnarySpec& s, const Tensor& x_in, const EwParams& p = {}) {
  ew::check_defined(x_in, s.name);
  if (s.float_only && !is_floating_point(x_in.dtype())) return unary_op(s, x_in.to(kFloat32), p);
  KILN_CHECK(x_in.dtype() != kBool, s.name, "not supported for bool tensors");
  Tensor out = ew::run_unary(s.op, x_in, p, s.name);
  if (autograd::needs_grad({x_in})) {
    const SavedTensor sx(x_in);
    const SavedTensor sy = s.saves_output ? SavedTensor(out, /*is_output=*/true) : SavedTensor();
    const UnarySpec spec = s;
    autograd::record(s.name, {out}, {x_in}, [spec, sx, sy, p](const std::vector<Tensor>& g) {
      const Tensor x = sx.unpack(spec.name);
      if (is_grad_enabled()) return std::vector<Tensor>{spec.composite(g[0], x, p)};
      return std::vector<Tensor>{fused(spec.backward, g[0], spec.saves_output ? sy.unpack(spec.name) : x, p)};
    });
  }
  return out;
}

// 1 - t^2 and friends, written with differentiable ops.
Tensor one_minus(const Tensor& t) { return add(neg(t), 1.0); }

const UnarySpec kTanh{UnaryOp::Tanh, "tanh", true, BinaryOp::TanhBackward, true,
                      [](const Tensor& g, const Tensor& x, const EwParams&) {
                        const Tensor t = tanh(x);
                        return mul(g, one_minus(mul(t, t)));
                      }};
const UnarySpec kSqrt{UnaryOp::Sqrt, "sqrt", true, BinaryOp::SqrtBackward, true,
                      [](const Tensor& g, const Tensor& x, const EwParams&) { return div(mul(g, 0.5), sqrt(x)); }};
const UnarySpec kRsqrt{UnaryOp::Rsqrt, "rsqrt", true, BinaryOp::RsqrtBackward, true,
                       [](const Tensor& g, const Tensor& x, const EwParams&) {
                         return mul(mul(g, pow(x, -1.5)), -0.5);
                       }};
const UnarySpec kAbs{UnaryOp::Abs, "abs", false, BinaryOp::AbsBackward, false,
                     [](const Tensor& g, const Tensor& x, const EwParams&) {
                       const Tensor sign = sub(gt(x, 0.0).to(g.dtype()), lt(x, 0.0).to(g.dtype()));
                       return mul(g, sign);
                     }};
const UnarySpec kSigmoid{UnaryOp::Sigmoid, "sigmoid", true, BinaryOp::SigmoidBackward, true,
                         [](const Tensor& g, const Tensor& x, const EwParams&) {
                           const Tensor s = sigmoid(x);
                           return mul(g, mul(s, one_minus(s)));
                         }};
const UnarySpec kRelu{UnaryOp::Relu, "relu", false, BinaryOp::ReluBackward, true,
                      [](const Tensor& g, const Tensor& x, const EwParams&) {
                        return mul(g, gt(x, 0.0).to(g.dtype()));
                      }};
const UnarySpec kSilu{UnaryOp::Silu, "silu", true, BinaryOp::SiluBackward, false,
                      [](const Tensor& g, const Tensor& x, const EwParams&) {
                        const Tensor s = sigmoid(x);  // s * (1 + x * (1 - s))
                        return mul(g, mul(s, add(mul(x, one_minus(s)), 1.0)));
                      }};
constexpr double kInvSqrt2 = 0.70710678118654752440, kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588, kCubic = 0.044715;

const UnarySpec kGelu{UnaryOp::Gelu, "gelu", true, BinaryOp::GeluBackward, false,
                      [](const Tensor& g, const Tensor& x, const EwParams&) {
                        // Phi(x) + x * phi(x)
                        const Tensor cdf = mul(add(erf(mul(x, kInvSqrt2)), 1.0), 0.5);
                        const Tensor pdf = mul(exp(mul(mul(x, x), -0.5)), kInvSqrt2Pi);
                        return mul(g, add(cdf, mul(x, pdf)));
                      }};
const UnarySpec kGeluTanh{UnaryOp::GeluTanh, "gelu", true, BinaryOp::GeluTanhBackward, false,
                          [](const Tensor& g, const Tensor& x, const EwParams&) {
                            const Tensor x2 = mul(x, x);
                            const Tensor t = tanh(mul(add(mul(mul(x2, x), kCubic), x), kSqrt2OverPi));
                            const Tensor du = mul(add(mul(x2, 3 * kCubic), 1.0), kSqrt2OverPi);
                            const Tensor d = add(mul(add(t, 1.0), 0.5), mul(mul(mul(x, 0.5), one_minus(mul(t, t))), du));
                            return mul(g, d);
                          }};
const UnarySpec kClamp{UnaryOp::Clamp, "clamp", false, BinaryOp::ClampBackward, false,
                       [](const Tensor& g, const Tensor& x, const EwParams& p) {
                         const Tensor in = mul(ge(x, p.lo).to(g.dtype()), le(x, p.hi).to(g.dtype()));
                         return mul(g, in);
                       }};

}  // namespace

Tensor neg(const Tensor& x) {
  ew::check_defined(x, "neg");
  ew::check_not_bool(x.dtype(), "neg");
  Tensor out = ew::run_unary(UnaryOp::Neg, x, {}, "neg");
  if (autograd::needs_grad({x}))
    autograd::record("neg", {out}, {x}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  ew::check_defined(x, "exp");
  if (!is_floating_point(x.dtype())) return exp(x.to(kFloat32));
  Tensor out = ew::run_unary(UnaryOp::Exp, x, {}, "exp");
  if (autograd::needs_grad({x})) {
    const SavedTensor sx(x), sy(out, /*is_output=*/true);
    autograd::record("exp", {out}, {x}, [sx, sy](const std::vector<Tensor>& g) {
      // create_graph needs exp(x) with history; otherwise reuse the saved output.
      return std::vector<Tensor>{mul(g[0], is_grad_enabled() ? exp(sx.unpack("exp")) : sy.unpack("exp"))};
    });
  }
  return out;
}

Tensor log(const Tensor& x) {
  ew::check_defined(x, "log");
  if (!is_floating_point(x.dtype())) return log(x.to(kFloat32));
  Tensor out = ew::run_unary(UnaryOp::Log, x, {}, "log");
  if (autograd::needs_grad({x})) {
    const SavedTensor sx(x);
    autograd::record("log", {out}, {x}, [sx](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{div(g[0], sx.unpack("log"))};
    });
  }
  return out;
}

Tensor erf(const Tensor& x) {
  ew::check_defined(x, "erf");
  if (!is_floating_point(x.dtype())) return erf(x.to(kFloat32));
  Tensor out = ew::run_unary(UnaryOp::Erf, x, {}, "erf");
  if (autograd::needs_grad({x})) {
    const SavedTensor sx(x);
    autograd::record("erf", {out}, {x}, [sx](const std::vector<Tensor>& g) {
      const Tensor x_ = sx.unpack("erf");  // 2/sqrt(pi) * exp(-x^2)
      return std::vector<Tensor>{mul(g[0], mul(exp(neg(mul(x_, x_))), 1.12837916709551257390))};
    });
  }
  return out;
}

Tensor tanh(const Tensor& x) { return unary_op(kTanh, x); }
Tensor sqrt(const Tensor& x) { return unary_op(kSqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(kRsqrt, x); }
Tensor abs(const Tensor& x) { return unary_op(kAbs, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(kSigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op(kRelu, x); }
Tensor silu(const Tensor& x) { return unary_op(kSilu, x); }

Tensor gelu(const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu", "approximate must be \"none\" or \"tanh\", got \"",
             approximate, "\"");
  return unary_op(approximate == "none" ? kGelu : kGeluTanh, x);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  KILN_CHECK(min || max, "clamp", "at least one of min and max must be given");
  EwParams p;
  if (min) p.lo = *min;
  if (max) p.hi = *max;
  KILN_CHECK(!(p.lo != p.lo) && !(p.hi != p.hi), "clamp", "min and max must not be NaN");
  return unary_op(kClamp, x, p);
}

}  // namespace kiln
