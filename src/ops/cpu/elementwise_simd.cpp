// Highway SIMD rows for dense fp32/bf16 elementwise ops, compiled for every x86/ARM target
// Highway knows (foreach_target) and picked at run time. bf16 lanes are widened to fp32 by a
// 16-bit shift and rounded back to nearest even with integer ops, exactly like kiln::BFloat16,
// so SIMD and scalar results agree bit for bit on the conversion. Tails run the same vector code
// on a padded stack copy, so every element of a tensor sees the same arithmetic.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/elementwise_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cstring>

#include "ops/cpu/elementwise_simd.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

struct F32IO {
  using P = float;
  static VF Load(DF d, const float* p) { return hn::LoadU(d, p); }
  static void Store(DF d, VF v, float* p) { hn::StoreU(v, d, p); }
  static float ToFloat(float v) { return v; }
};

struct BF16IO {
  using P = uint16_t;
  static VF Load(DF d, const uint16_t* p) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  }
  static void Store(DF, VF v, uint16_t* p) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto u = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    auto r = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
    const auto nan = hn::RebindMask(du, hn::IsNaN(v));
    r = hn::IfThenElse(nan, hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u)), r);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, r)), d16, p);
  }
  static float ToFloat(uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// ---- vector math (fp32) ----
HWY_INLINE VF ExpV(DF d, VF x) {
  // hwy's Exp is valid up to +104 and fp32 overflows past 88.7, so clamping keeps inf; NaN kept.
  const VF r = hn::Exp(d, hn::Min(x, hn::Set(d, 100.0f)));
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}
HWY_INLINE VF SigmoidV(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF e = hn::Exp(d, hn::Neg(hn::Abs(x)));  // never overflows
  const VF r = hn::Div(one, hn::Add(one, e));
  return hn::IfThenElse(hn::IsNaN(x), x, hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Mul(e, r), r));
}
// 1 + erf(x) without cancellation for x < 0 (Abramowitz-Stegun 7.1.26, |error| <= 1.5e-7).
HWY_INLINE VF OnePlusErfV(DF d, VF x) {
  const VF ax = hn::Abs(x);
  const VF t = hn::Div(hn::Set(d, 1.0f), hn::MulAdd(hn::Set(d, 0.3275911f), ax, hn::Set(d, 1.0f)));
  VF p = hn::Set(d, 1.061405429f);
  p = hn::MulAdd(p, t, hn::Set(d, -1.453152027f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.421413741f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.284496736f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.254829592f));
  const VF erfc = hn::Mul(hn::Mul(p, t), hn::Exp(d, hn::Neg(hn::Mul(ax, ax))));  // erfc(|x|)
  const VF r = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), erfc, hn::Sub(hn::Set(d, 2.0f), erfc));
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}
// x86 float compares are ordered (false on NaN), so NaN is tested explicitly.
HWY_INLINE VF NanMax(VF a, VF b) { return hn::IfThenElse(hn::Or(hn::Gt(a, b), hn::IsNaN(a)), a, b); }
HWY_INLINE VF NanMin(VF a, VF b) { return hn::IfThenElse(hn::Or(hn::Lt(a, b), hn::IsNaN(a)), a, b); }

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kCubic = 0.044715f;

// ---- op functors: (d, a, b) or (d, x) -> fp32 vector ----
struct AddF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Add(a, b); } };
struct AxpyF {
  float alpha;
  HWY_INLINE VF operator()(DF d, VF a, VF b) const { return hn::MulAdd(hn::Set(d, alpha), b, a); }
};
struct MulF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Mul(a, b); } };
struct DivF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Div(a, b); } };
struct MaxF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return NanMax(a, b); } };
struct MinF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return NanMin(a, b); } };
struct SiluBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    const VF one = hn::Set(d, 1.0f);
    const VF s = SigmoidV(d, x);
    return hn::Mul(hn::Mul(g, s), hn::MulAdd(x, hn::Sub(one, s), one));
  }
};
struct GeluBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    const VF cdf = hn::Mul(hn::Set(d, 0.5f), OnePlusErfV(d, hn::Mul(x, hn::Set(d, kInvSqrt2))));
    const VF pdf = hn::Mul(hn::Set(d, kInvSqrt2Pi), hn::Exp(d, hn::Mul(hn::Set(d, -0.5f), hn::Mul(x, x))));
    return hn::Mul(g, hn::MulAdd(x, pdf, cdf));
  }
};
struct GeluTanhBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    const VF half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
    const VF x2 = hn::Mul(x, x);
    const VF t = hn::Tanh(d, hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Mul(hn::Set(d, kCubic), x2), x, x)));
    const VF du = hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Set(d, 3.0f * kCubic), x2, one));
    const VF left = hn::Mul(half, hn::Add(one, t));
    const VF right = hn::Mul(hn::Mul(hn::Mul(half, x), hn::NegMulAdd(t, t, one)), du);
    return hn::Mul(g, hn::Add(left, right));
  }
};
struct SigmoidBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::Mul(hn::Mul(g, y), hn::Sub(hn::Set(d, 1.0f), y)); }
};
struct TanhBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::Mul(g, hn::NegMulAdd(y, y, hn::Set(d, 1.0f))); }
};
struct ReluBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::IfThenElseZero(hn::Gt(y, hn::Zero(d)), g); }
};

struct NegF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Neg(x); } };
struct ExpF { HWY_INLINE VF operator()(DF d, VF x) const { return ExpV(d, x); } };
struct TanhF { HWY_INLINE VF operator()(DF d, VF x) const { return hn::Tanh(d, x); } };
struct SqrtF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Sqrt(x); } };
struct RsqrtF { HWY_INLINE VF operator()(DF d, VF x) const { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x)); } };
struct AbsF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Abs(x); } };
struct SigmoidF { HWY_INLINE VF operator()(DF d, VF x) const { return SigmoidV(d, x); } };
struct ReluF {
  HWY_INLINE VF operator()(DF d, VF x) const { return hn::IfThenZeroElse(hn::Lt(x, hn::Zero(d)), x); }
};
struct SiluF { HWY_INLINE VF operator()(DF d, VF x) const { return hn::Mul(x, SigmoidV(d, x)); } };
struct GeluF {
  HWY_INLINE VF operator()(DF d, VF x) const {
    return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), OnePlusErfV(d, hn::Mul(x, hn::Set(d, kInvSqrt2))));
  }
};
struct GeluTanhF {
  HWY_INLINE VF operator()(DF d, VF x) const {
    const VF u = hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Mul(hn::Set(d, kCubic), hn::Mul(x, x)), x, x));
    return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), hn::Add(hn::Set(d, 1.0f), hn::Tanh(d, u)));
  }
};
struct ClampF {
  float lo, hi;
  HWY_INLINE VF operator()(DF d, VF x) const {
    const VF l = hn::Set(d, lo), h = hn::Set(d, hi);
    return hn::IfThenElse(hn::Lt(x, l), l, hn::IfThenElse(hn::Gt(x, h), h, x));  // keeps NaN
  }
};

// ---- row drivers ----
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

template <class IO, class F>
HWY_INLINE void RowBinary(const typename IO::P* a, const typename IO::P* b, bool b_scalar, typename IO::P* out,
                          int64_t n, const F& f) {
  using P = typename IO::P;
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF bs = hn::Set(d, IO::ToFloat(b[0]));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    IO::Store(d, f(d, IO::Load(d, a + i), b_scalar ? bs : IO::Load(d, b + i)), out + i);
  if (i == n) return;
  HWY_ALIGN P ta[kMaxLanes] = {}, tb[kMaxLanes] = {}, to[kMaxLanes] = {};
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(ta, a + i, rest * sizeof(P));
  if (!b_scalar) std::memcpy(tb, b + i, rest * sizeof(P));
  IO::Store(d, f(d, IO::Load(d, ta), b_scalar ? bs : IO::Load(d, tb)), to);
  std::memcpy(out + i, to, rest * sizeof(P));
}

template <class IO, class F>
HWY_INLINE void RowUnary(const typename IO::P* x, typename IO::P* out, int64_t n, const F& f) {
  using P = typename IO::P;
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) IO::Store(d, f(d, IO::Load(d, x + i)), out + i);
  if (i == n) return;
  HWY_ALIGN P tx[kMaxLanes] = {}, to[kMaxLanes] = {};
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(tx, x + i, rest * sizeof(P));
  IO::Store(d, f(d, IO::Load(d, tx)), to);
  std::memcpy(out + i, to, rest * sizeof(P));
}

template <class IO>
void BinaryRowT(BinaryOp op, const typename IO::P* a, const typename IO::P* b, bool bs, typename IO::P* out,
                int64_t n, float alpha, float, float) {
  switch (op) {
    case BinaryOp::Add:
      if (alpha == 1.0f) return RowBinary<IO>(a, b, bs, out, n, AddF{});
      return RowBinary<IO>(a, b, bs, out, n, AxpyF{alpha});
    case BinaryOp::Mul: return RowBinary<IO>(a, b, bs, out, n, MulF{});
    case BinaryOp::Div: return RowBinary<IO>(a, b, bs, out, n, DivF{});
    case BinaryOp::Maximum: return RowBinary<IO>(a, b, bs, out, n, MaxF{});
    case BinaryOp::Minimum: return RowBinary<IO>(a, b, bs, out, n, MinF{});
    case BinaryOp::SiluBackward: return RowBinary<IO>(a, b, bs, out, n, SiluBwdF{});
    case BinaryOp::GeluBackward: return RowBinary<IO>(a, b, bs, out, n, GeluBwdF{});
    case BinaryOp::GeluTanhBackward: return RowBinary<IO>(a, b, bs, out, n, GeluTanhBwdF{});
    case BinaryOp::SigmoidBackward: return RowBinary<IO>(a, b, bs, out, n, SigmoidBwdF{});
    case BinaryOp::TanhBackward: return RowBinary<IO>(a, b, bs, out, n, TanhBwdF{});
    case BinaryOp::ReluBackward: return RowBinary<IO>(a, b, bs, out, n, ReluBwdF{});
    default: return;  // has_binary() keeps other ops away
  }
}

template <class IO>
void UnaryRowT(UnaryOp op, const typename IO::P* x, typename IO::P* out, int64_t n, float lo, float hi) {
  switch (op) {
    case UnaryOp::Neg: return RowUnary<IO>(x, out, n, NegF{});
    case UnaryOp::Exp: return RowUnary<IO>(x, out, n, ExpF{});
    case UnaryOp::Tanh: return RowUnary<IO>(x, out, n, TanhF{});
    case UnaryOp::Sqrt: return RowUnary<IO>(x, out, n, SqrtF{});
    case UnaryOp::Rsqrt: return RowUnary<IO>(x, out, n, RsqrtF{});
    case UnaryOp::Abs: return RowUnary<IO>(x, out, n, AbsF{});
    case UnaryOp::Sigmoid: return RowUnary<IO>(x, out, n, SigmoidF{});
    case UnaryOp::Relu: return RowUnary<IO>(x, out, n, ReluF{});
    case UnaryOp::Silu: return RowUnary<IO>(x, out, n, SiluF{});
    case UnaryOp::Gelu: return RowUnary<IO>(x, out, n, GeluF{});
    case UnaryOp::GeluTanh: return RowUnary<IO>(x, out, n, GeluTanhF{});
    case UnaryOp::Clamp: return RowUnary<IO>(x, out, n, ClampF{lo, hi});
    default: return;  // has_unary() keeps other ops away
  }
}

void BinaryF32(BinaryOp op, const float* a, const float* b, bool bs, float* out, int64_t n, float alpha, float lo,
               float hi) {
  BinaryRowT<F32IO>(op, a, b, bs, out, n, alpha, lo, hi);
}
void BinaryBF16(BinaryOp op, const uint16_t* a, const uint16_t* b, bool bs, uint16_t* out, int64_t n, float alpha,
                float lo, float hi) {
  BinaryRowT<BF16IO>(op, a, b, bs, out, n, alpha, lo, hi);
}
void UnaryF32(UnaryOp op, const float* x, float* out, int64_t n, float lo, float hi) {
  UnaryRowT<F32IO>(op, x, out, n, lo, hi);
}
void UnaryBF16(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n, float lo, float hi) {
  UnaryRowT<BF16IO>(op, x, out, n, lo, hi);
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu::simd {
HWY_EXPORT(BinaryF32);
HWY_EXPORT(BinaryBF16);
HWY_EXPORT(UnaryF32);
HWY_EXPORT(UnaryBF16);

bool has_binary(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: case BinaryOp::Mul: case BinaryOp::Div: case BinaryOp::Maximum: case BinaryOp::Minimum:
    case BinaryOp::SiluBackward: case BinaryOp::GeluBackward: case BinaryOp::GeluTanhBackward:
    case BinaryOp::SigmoidBackward: case BinaryOp::TanhBackward: case BinaryOp::ReluBackward:
      return true;
    default:
      return false;
  }
}
bool has_unary(UnaryOp op) { return op != UnaryOp::Log && op != UnaryOp::Erf; }

void binary_f32(BinaryOp op, const float* a, const float* b, bool b_scalar, float* out, int64_t n, float alpha,
                float lo, float hi) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, a, b, b_scalar, out, n, alpha, lo, hi);
}
void binary_bf16(BinaryOp op, const uint16_t* a, const uint16_t* b, bool b_scalar, uint16_t* out, int64_t n,
                 float alpha, float lo, float hi) {
  HWY_DYNAMIC_DISPATCH(BinaryBF16)(op, a, b, b_scalar, out, n, alpha, lo, hi);
}
void unary_f32(UnaryOp op, const float* x, float* out, int64_t n, float lo, float hi) {
  HWY_DYNAMIC_DISPATCH(UnaryF32)(op, x, out, n, lo, hi);
}
void unary_bf16(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n, float lo, float hi) {
  HWY_DYNAMIC_DISPATCH(UnaryBF16)(op, x, out, n, lo, hi);
}
}  // namespace kiln::cpu::simd
#endif
