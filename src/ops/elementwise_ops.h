#pragma once
// The elementwise op set shared by the CPU and CUDA kernels: op ids, their scalar parameters,
// and one functor per op written once for the host and the device (KILN_HD). Functors take and
// return the compute type (fp32 for 16-bit floats, fp64 for fp64, the integer type for ints).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/dispatch.h"
#include <math.h>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln {

// out = f(a, b). The *Backward ops are fused gradients: (grad, saved) -> grad of the input,
// where saved is the op's input x or its output y as named.
enum class BinaryOp : uint8_t {
  Add,  // a + alpha * b
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  SiluBackward,      // (g, x)
  GeluBackward,      // (g, x), erf form
  GeluTanhBackward,  // (g, x)
  SigmoidBackward,   // (g, y)
  TanhBackward,      // (g, y)
  ReluBackward,      // (g, y)
  AbsBackward,       // (g, x)
  SqrtBackward,      // (g, y)
  RsqrtBackward,     // (g, y)
  ClampBackward,     // (g, x): g where lo <= x <= hi
  PowScalarBackward, // (g, x): g * alpha * x^(alpha - 1)
};

enum class UnaryOp : uint8_t { Neg, Exp, Log, Erf, Tanh, Sqrt, Rsqrt, Abs, Sigmoid, Relu, Silu, Gelu, GeluTanh, Clamp };

enum class CompareOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };

// Scalars an op may need: alpha (add, pow-scalar backward), lo/hi (clamp).
struct EwParams {
  double alpha = 1.0;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
};

namespace ew {

// Math on float/double through the C names, which exist on the host and on the device.
KILN_HD float m_exp(float x) { return ::expf(x); }
KILN_HD double m_exp(double x) { return ::exp(x); }
KILN_HD float m_log(float x) { return ::logf(x); }
KILN_HD double m_log(double x) { return ::log(x); }
KILN_HD float m_tanh(float x) { return ::tanhf(x); }
KILN_HD double m_tanh(double x) { return ::tanh(x); }
KILN_HD float m_sqrt(float x) { return ::sqrtf(x); }
KILN_HD double m_sqrt(double x) { return ::sqrt(x); }
KILN_HD float m_erf(float x) { return ::erff(x); }
KILN_HD double m_erf(double x) { return ::erf(x); }
KILN_HD float m_pow(float x, float y) { return ::powf(x, y); }
KILN_HD double m_pow(double x, double y) { return ::pow(x, y); }
template <typename T> KILN_HD T m_pow(T x, T y) {  // integers: exact repeated squaring
  if constexpr (std::is_signed_v<T>) {
    if (y < 0) return x == 1 ? T(1) : (x == T(-1) ? (y % 2 ? T(-1) : T(1)) : T(0));
  }
  T r = 1;
  while (y) {
    if (y & 1) r *= x;
    x *= x;
    y >>= 1;
  }
  return r;
}
KILN_HD float m_rsqrt(float x) {
#ifdef __CUDA_ARCH__
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}
KILN_HD double m_rsqrt(double x) { return 1.0 / ::sqrt(x); }

template <typename T> KILN_HD T sigmoid(T x) {
  // exp of -|x| never overflows; the two branches mirror each other.
  const T e = m_exp(x < T(0) ? x : -x);
  return x < T(0) ? e / (T(1) + e) : T(1) / (T(1) + e);
}

template <typename T> struct GeluConst {
  static constexpr T kInvSqrt2 = T(0.70710678118654752440);
  static constexpr T kInvSqrt2Pi = T(0.39894228040143267794);
  static constexpr T kSqrt2OverPi = T(0.79788456080286535588);
  static constexpr T kCubic = T(0.044715);
};

template <typename T> KILN_HD T gelu(T x) { return T(0.5) * x * (T(1) + m_erf(x * GeluConst<T>::kInvSqrt2)); }
template <typename T> KILN_HD T gelu_tanh(T x) {
  const T u = GeluConst<T>::kSqrt2OverPi * (x + GeluConst<T>::kCubic * x * x * x);
  // 0.5·x·(1 + tanh(u)) == x·sigmoid(2u): one exp and one divide instead of a tanh, which
  // kept bf16 gelu compute-bound on the H200 (78% of copy bandwidth).
  return x / (T(1) + m_exp(T(-2) * u));
}

// NaN-propagating max/min (torch.maximum semantics).
template <typename T> KILN_HD T nan_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> KILN_HD T nan_min(T a, T b) { return (a < b || a != a) ? a : b; }

// One functor per op, templated on the compute type; `p` carries alpha/lo/hi in that type.
template <BinaryOp Op, typename T>
struct Binary {
  T alpha, lo, hi;
  KILN_HD T operator()(T a, T b) const {
    if constexpr (Op == BinaryOp::Add) return a + alpha * b;
    if constexpr (Op == BinaryOp::Mul) return a * b;
    if constexpr (Op == BinaryOp::Div) return a / b;
    if constexpr (Op == BinaryOp::Pow) return m_pow(a, b);
    if constexpr (Op == BinaryOp::Maximum) return nan_max(a, b);
    if constexpr (Op == BinaryOp::Minimum) return nan_min(a, b);
    if constexpr (Op == BinaryOp::SiluBackward) {
      const T s = sigmoid(b);
      return a * s * (T(1) + b * (T(1) - s));
    }
    if constexpr (Op == BinaryOp::GeluBackward) {
      const T cdf = T(0.5) * (T(1) + m_erf(b * GeluConst<T>::kInvSqrt2));
      const T pdf = GeluConst<T>::kInvSqrt2Pi * m_exp(T(-0.5) * b * b);
      return a * (cdf + b * pdf);
    }
    if constexpr (Op == BinaryOp::GeluTanhBackward) {
      const T x2 = b * b;
      const T t = m_tanh(GeluConst<T>::kSqrt2OverPi * (b + GeluConst<T>::kCubic * x2 * b));
      const T du = GeluConst<T>::kSqrt2OverPi * (T(1) + T(3) * GeluConst<T>::kCubic * x2);
      return a * (T(0.5) * (T(1) + t) + T(0.5) * b * (T(1) - t * t) * du);
    }
    if constexpr (Op == BinaryOp::SigmoidBackward) return a * b * (T(1) - b);
    if constexpr (Op == BinaryOp::TanhBackward) return a * (T(1) - b * b);
    if constexpr (Op == BinaryOp::ReluBackward) return b > T(0) ? a : T(0);
    if constexpr (Op == BinaryOp::AbsBackward) return b > T(0) ? a : (b < T(0) ? -a : T(0));
    if constexpr (Op == BinaryOp::SqrtBackward) return a / (T(2) * b);
    if constexpr (Op == BinaryOp::RsqrtBackward) return T(-0.5) * a * b * b * b;
    if constexpr (Op == BinaryOp::ClampBackward) return (b >= lo && b <= hi) ? a : T(0);
    if constexpr (Op == BinaryOp::PowScalarBackward) return a * alpha * m_pow(b, alpha - T(1));
  }
};

template <UnaryOp Op, typename T>
struct Unary {
  T lo, hi;
  KILN_HD T operator()(T x) const {
    if constexpr (Op == UnaryOp::Neg) return -x;
    if constexpr (Op == UnaryOp::Exp) return m_exp(x);
    if constexpr (Op == UnaryOp::Log) return m_log(x);
    if constexpr (Op == UnaryOp::Erf) return m_erf(x);
    if constexpr (Op == UnaryOp::Tanh) return m_tanh(x);
    if constexpr (Op == UnaryOp::Sqrt) return m_sqrt(x);
    if constexpr (Op == UnaryOp::Rsqrt) return m_rsqrt(x);
    if constexpr (Op == UnaryOp::Abs) {
      if constexpr (std::is_unsigned_v<T>) return x;
      else return x < T(0) ? -x : x;
    }
    if constexpr (Op == UnaryOp::Sigmoid) return sigmoid(x);
    if constexpr (Op == UnaryOp::Relu) {
      if constexpr (std::is_unsigned_v<T>) return x;
      else return x < T(0) ? T(0) : x;  // keeps NaN
    }
    if constexpr (Op == UnaryOp::Silu) return x * sigmoid(x);
    if constexpr (Op == UnaryOp::Gelu) return gelu(x);
    if constexpr (Op == UnaryOp::GeluTanh) return gelu_tanh(x);
    if constexpr (Op == UnaryOp::Clamp) return x < lo ? lo : (x > hi ? hi : x);  // keeps NaN
  }
};

// a op b with b fixed: scalar operands travel by value, never as tensors.
template <typename F, typename T>
struct BindRight {
  F f;
  T b;
  KILN_HD T operator()(T a) const { return f(a, b); }
};

template <CompareOp Op>
struct Compare {
  template <typename T> KILN_HD bool operator()(T a, T b) const {
    if constexpr (Op == CompareOp::Eq) return a == b;
    if constexpr (Op == CompareOp::Ne) return a != b;
    if constexpr (Op == CompareOp::Lt) return a < b;
    if constexpr (Op == CompareOp::Le) return a <= b;
    if constexpr (Op == CompareOp::Gt) return a > b;
    if constexpr (Op == CompareOp::Ge) return a >= b;
  }
};

template <CompareOp Op, typename T>
struct CompareRight {
  T b;
  KILN_HD bool operator()(T a) const { return Compare<Op>{}(a, b); }
};

template <typename T>
struct Select {
  KILN_HD T operator()(bool c, T a, T b) const { return c ? a : b; }
};

// Floating ops only make sense on floating compute types; integer tensors get these ops.
inline constexpr bool integer_ok(BinaryOp op) {
  return op == BinaryOp::Add || op == BinaryOp::Mul || op == BinaryOp::Pow || op == BinaryOp::Maximum ||
         op == BinaryOp::Minimum;
}
// Ops that have a scalar-operand form (binary_scalar).
inline constexpr bool scalar_ok(BinaryOp op) {
  return op == BinaryOp::Add || op == BinaryOp::Mul || op == BinaryOp::Div || op == BinaryOp::Pow ||
         op == BinaryOp::Maximum || op == BinaryOp::Minimum;
}
inline constexpr bool integer_ok(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Clamp;
}

// A double scalar in compute type A (host side); integer types saturate (clamp bounds may be +-inf).
template <typename A>
A scalar_as(double v) {
  if constexpr (std::is_floating_point_v<A>) {
    return static_cast<A>(v);
  } else {
    if (v != v) return A(0);
    if (v <= static_cast<double>(std::numeric_limits<A>::lowest())) return std::numeric_limits<A>::lowest();
    if (v >= static_cast<double>(std::numeric_limits<A>::max())) return std::numeric_limits<A>::max();
    return static_cast<A>(v);
  }
}

// alpha, and the scalar operand of add / mul, in an integer type: wraps modulo 2^bits as C++ and
// PyTorch do (uint8 x - 1 is x + 255, not x - 0); bounds such as clamp's saturate (scalar_as).
template <typename A>
A wrapping_as(double v) {
  if constexpr (std::is_floating_point_v<A>) {
    return static_cast<A>(v);
  } else {
    if (!(v > -9.2e18 && v < 9.2e18)) return scalar_as<A>(v);
    return static_cast<A>(static_cast<int64_t>(v));
  }
}

// A double scalar rounded to the tensor's dtype T (host type), then widened to its compute type.
template <typename T>
acc_t<T> scalar_of(double v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
    return static_cast<float>(T(static_cast<float>(v)));
  } else {
    return scalar_as<acc_t<T>>(v);
  }
}

// The scalar operand of op in T's compute type (wrapping for integer add / mul).
template <BinaryOp kOp, typename T>
acc_t<T> operand_of(double v) {
  if constexpr (std::is_integral_v<acc_t<T>> && (kOp == BinaryOp::Add || kOp == BinaryOp::Mul)) {
    return wrapping_as<acc_t<T>>(v);
  } else {
    return scalar_of<T>(v);
  }
}

// Turns a runtime op id into a compile-time constant for f (a generic lambda).
template <typename F>
void visit(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add: return f(std::integral_constant<BinaryOp, BinaryOp::Add>{});
    case BinaryOp::Mul: return f(std::integral_constant<BinaryOp, BinaryOp::Mul>{});
    case BinaryOp::Div: return f(std::integral_constant<BinaryOp, BinaryOp::Div>{});
    case BinaryOp::Pow: return f(std::integral_constant<BinaryOp, BinaryOp::Pow>{});
    case BinaryOp::Maximum: return f(std::integral_constant<BinaryOp, BinaryOp::Maximum>{});
    case BinaryOp::Minimum: return f(std::integral_constant<BinaryOp, BinaryOp::Minimum>{});
    case BinaryOp::SiluBackward: return f(std::integral_constant<BinaryOp, BinaryOp::SiluBackward>{});
    case BinaryOp::GeluBackward: return f(std::integral_constant<BinaryOp, BinaryOp::GeluBackward>{});
    case BinaryOp::GeluTanhBackward: return f(std::integral_constant<BinaryOp, BinaryOp::GeluTanhBackward>{});
    case BinaryOp::SigmoidBackward: return f(std::integral_constant<BinaryOp, BinaryOp::SigmoidBackward>{});
    case BinaryOp::TanhBackward: return f(std::integral_constant<BinaryOp, BinaryOp::TanhBackward>{});
    case BinaryOp::ReluBackward: return f(std::integral_constant<BinaryOp, BinaryOp::ReluBackward>{});
    case BinaryOp::AbsBackward: return f(std::integral_constant<BinaryOp, BinaryOp::AbsBackward>{});
    case BinaryOp::SqrtBackward: return f(std::integral_constant<BinaryOp, BinaryOp::SqrtBackward>{});
    case BinaryOp::RsqrtBackward: return f(std::integral_constant<BinaryOp, BinaryOp::RsqrtBackward>{});
    case BinaryOp::ClampBackward: return f(std::integral_constant<BinaryOp, BinaryOp::ClampBackward>{});
    case BinaryOp::PowScalarBackward: return f(std::integral_constant<BinaryOp, BinaryOp::PowScalarBackward>{});
  }
}

template <typename F>
void visit(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::Neg: return f(std::integral_constant<UnaryOp, UnaryOp::Neg>{});
    case UnaryOp::Exp: return f(std::integral_constant<UnaryOp, UnaryOp::Exp>{});
    case UnaryOp::Log: return f(std::integral_constant<UnaryOp, UnaryOp::Log>{});
    case UnaryOp::Erf: return f(std::integral_constant<UnaryOp, UnaryOp::Erf>{});
    case UnaryOp::Tanh: return f(std::integral_constant<UnaryOp, UnaryOp::Tanh>{});
    case UnaryOp::Sqrt: return f(std::integral_constant<UnaryOp, UnaryOp::Sqrt>{});
    case UnaryOp::Rsqrt: return f(std::integral_constant<UnaryOp, UnaryOp::Rsqrt>{});
    case UnaryOp::Abs: return f(std::integral_constant<UnaryOp, UnaryOp::Abs>{});
    case UnaryOp::Sigmoid: return f(std::integral_constant<UnaryOp, UnaryOp::Sigmoid>{});
    case UnaryOp::Relu: return f(std::integral_constant<UnaryOp, UnaryOp::Relu>{});
    case UnaryOp::Silu: return f(std::integral_constant<UnaryOp, UnaryOp::Silu>{});
    case UnaryOp::Gelu: return f(std::integral_constant<UnaryOp, UnaryOp::Gelu>{});
    case UnaryOp::GeluTanh: return f(std::integral_constant<UnaryOp, UnaryOp::GeluTanh>{});
    case UnaryOp::Clamp: return f(std::integral_constant<UnaryOp, UnaryOp::Clamp>{});
  }
}

template <typename F>
void visit(CompareOp op, F&& f) {
  switch (op) {
    case CompareOp::Eq: return f(std::integral_constant<CompareOp, CompareOp::Eq>{});
    case CompareOp::Ne: return f(std::integral_constant<CompareOp, CompareOp::Ne>{});
    case CompareOp::Lt: return f(std::integral_constant<CompareOp, CompareOp::Lt>{});
    case CompareOp::Le: return f(std::integral_constant<CompareOp, CompareOp::Le>{});
    case CompareOp::Gt: return f(std::integral_constant<CompareOp, CompareOp::Gt>{});
    case CompareOp::Ge: return f(std::integral_constant<CompareOp, CompareOp::Ge>{});
  }
}

}  // namespace ew
}  // namespace kiln
