// Highway SIMD rows of the unary elementwise ops (neg, exp, log, erf, tanh, sqrt, rsqrt, abs, activations, clamp).
// Compiled for every x86/ARM target Highway knows (foreach_target) and picked at run time; rows
// run blocks of two vectors (elementwise_simd-inl.h). Ops with a fast formula on a range (exp,
// sigmoid, silu, gelu) take two blocks at a time behind one range check (on the raw bits for
// bf16), so four independent chains interleave; a block that fails the check runs the general
// path, which gives in-range lanes the same fast formula, so a value's result never depends on
// its neighbours; f32 gelu (kWide) takes four blocks per check. bf16 gelu, silu, gelu-tanh,
// log, tanh, sigmoid and erf are table lookups (unary_bf16_by_table, elementwise_tables.cpp).
// Tails run the same vector code on a padded stack copy. The transcendental functions are in
// simd_math-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/elementwise_unary_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>

#include "ops/cpu/elementwise_simd.h"
#include "ops/cpu/elementwise_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x / (1 + e^-y), the shared shape of silu (y = x) and gelu-tanh (y = 2u).
template <bool L>
HWY_INLINE VF TimesSigmoid(DF d, VF x, VF y) {
  if (HWY_LIKELY(ExpFastOk(d, y))) return TimesSigmoidFast<L>(d, x, y);
  if (!L) return TimesSigmoidFull(d, x, y);
  return hn::IfThenElse(AbsLe(d, y, kExpFastMax), TimesSigmoidFast<L>(d, x, y), TimesSigmoidFull(d, x, y));
}

// ---- op functors: (d, x) -> fp32 vector ----
struct NegF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Neg(x); } };
template <bool L> struct ExpF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return Exp<L>(d, x); }
  static constexpr float kFastAbsMax = kExpFastMax;
  static HWY_INLINE VF Fast(DF d, VF x) { return ExpFast<L>(d, x); }
};
template <bool L> struct LogF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return L ? LogBf(d, x) : Log(d, x); }
};
template <bool L> struct ErfF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return Erf<L>(d, x); }
};
template <bool L> struct TanhF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return Tanh<L>(d, x); }
};
struct SqrtF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Sqrt(x); } };
struct RsqrtF { HWY_INLINE VF operator()(DF d, VF x) const { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x)); } };
struct AbsF { HWY_INLINE VF operator()(DF, VF x) const { return hn::Abs(x); } };
template <bool L> struct SigmoidF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return Sigmoid<L>(d, x); }
  static constexpr float kFastAbsMax = kExpFastMax;
  static HWY_INLINE VF Fast(DF d, VF x) { return TimesSigmoidFast<L>(d, hn::Set(d, 1.0f), x); }
};
struct ReluF {
  HWY_INLINE VF operator()(DF d, VF x) const { return hn::IfThenZeroElse(hn::Lt(x, hn::Zero(d)), x); }
};
template <bool L> struct SiluF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return TimesSigmoid<L>(d, x, x); }
  static constexpr float kFastAbsMax = kExpFastMax;
  static HWY_INLINE VF Fast(DF d, VF x) { return TimesSigmoidFast<L>(d, x, x); }
};
struct GeluF {  // float32; bf16 gelu is a table (table_bf16_rows)
  static constexpr bool kApprox = true;
  static constexpr bool kWide = true;
  HWY_INLINE VF operator()(DF d, VF x) const { return Gelu(d, x); }
  static constexpr float kFastAbsMax = kGeluF32FastMax;
  static HWY_INLINE VF Fast(DF d, VF x) { return GeluF32Fast(d, x); }
};
template <bool L> struct GeluTanhF {
  static constexpr bool kApprox = true;
  HWY_INLINE VF operator()(DF d, VF x) const {
    if (!L) return TimesSigmoid<L>(d, x, GeluTanh2U(d, x));
    const VF fast = Fast(d, x);
    const auto ok = AbsLe(d, x, kFastAbsMax);
    if (HWY_LIKELY(hn::AllTrue(d, ok))) return fast;
    return hn::IfThenElse(ok, fast, TimesSigmoidFull(d, x, GeluTanh2U(d, x)));
  }
  // |x| <= 9.5 keeps |2u| <= 77, inside exp's fast range.
  static constexpr float kFastAbsMax = 9.5f;
  static HWY_INLINE VF Fast(DF d, VF x) {
    if (L) return hn::Mul(x, RecipBf(d, hn::Add(hn::Set(d, 1.0f), GeluTanhExpNeg2U(d, x))));
    return TimesSigmoidFast<L>(d, x, GeluTanh2U(d, x));
  }
};
struct ClampF {
  float lo, hi;
  HWY_INLINE VF operator()(DF d, VF x) const {
    const VF l = hn::Set(d, lo), h = hn::Set(d, hi);
    return hn::IfThenElse(hn::Lt(x, l), l, hn::IfThenElse(hn::Gt(x, h), h, x));  // keeps NaN
  }
};

// ---- row driver ----
template <class IO, class F>
HWY_INLINE void RowUnary(const typename IO::P* x, typename IO::P* out, int64_t n, const F& f) {
  using P = typename IO::P;
  const DF d;
  const int64_t block = 2 * static_cast<int64_t>(hn::Lanes(d));
  auto step = [&](const P* px, P* po) {
    VF x0, x1;
    IO::Load(d, px, x0, x1);
    IO::template Store<kApproxOf<F>>(d, f(d, x0), f(d, x1), po);
  };
  int64_t i = 0;
  if constexpr (Splits<F> && kWideOf<F>) {
    for (; i + 4 * block <= n; i += 4 * block) {  // no arrays: sizeless vectors (SVE) forbid them
      VF x0, x1, x2, x3, x4, x5, x6, x7, y0, y1, y2, y3, y4, y5, y6, y7;
      IO::Load(d, x + i, x0, x1);
      IO::Load(d, x + i + block, x2, x3);
      IO::Load(d, x + i + 2 * block, x4, x5);
      IO::Load(d, x + i + 3 * block, x6, x7);
      if (HWY_LIKELY(IO::AllAbsLe(d, x + i, x0, x1, x2, x3, F::kFastAbsMax) &&
                     IO::AllAbsLe(d, x + i + 2 * block, x4, x5, x6, x7, F::kFastAbsMax))) {
        y0 = f.Fast(d, x0), y1 = f.Fast(d, x1), y2 = f.Fast(d, x2), y3 = f.Fast(d, x3);
        y4 = f.Fast(d, x4), y5 = f.Fast(d, x5), y6 = f.Fast(d, x6), y7 = f.Fast(d, x7);
      } else {
        y0 = f(d, x0), y1 = f(d, x1), y2 = f(d, x2), y3 = f(d, x3);
        y4 = f(d, x4), y5 = f(d, x5), y6 = f(d, x6), y7 = f(d, x7);
      }
      IO::template Store<kApproxOf<F>>(d, y0, y1, out + i);
      IO::template Store<kApproxOf<F>>(d, y2, y3, out + i + block);
      IO::template Store<kApproxOf<F>>(d, y4, y5, out + i + 2 * block);
      IO::template Store<kApproxOf<F>>(d, y6, y7, out + i + 3 * block);
    }
  }
  for (; i + 2 * block <= n; i += 2 * block) {
    VF x0, x1, x2, x3;
    IO::Load(d, x + i, x0, x1);
    IO::Load(d, x + i + block, x2, x3);
    VF y0, y1, y2, y3;
    if constexpr (Splits<F>) {
      if (HWY_LIKELY(IO::AllAbsLe(d, x + i, x0, x1, x2, x3, F::kFastAbsMax))) {
        y0 = f.Fast(d, x0), y1 = f.Fast(d, x1), y2 = f.Fast(d, x2), y3 = f.Fast(d, x3);
      } else {
        y0 = f(d, x0), y1 = f(d, x1), y2 = f(d, x2), y3 = f(d, x3);
      }
    } else {
      y0 = f(d, x0), y1 = f(d, x1), y2 = f(d, x2), y3 = f(d, x3);
    }
    IO::template Store<kApproxOf<F>>(d, y0, y1, out + i);
    IO::template Store<kApproxOf<F>>(d, y2, y3, out + i + block);
  }
  for (; i + block <= n; i += block) step(x + i, out + i);
  if (i == n) return;
  HWY_ALIGN P tx[kMaxBlock] = {}, to[kMaxBlock] = {};
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(tx, x + i, rest * sizeof(P));
  step(tx, to);
  std::memcpy(out + i, to, rest * sizeof(P));
}

template <class IO>
void UnaryRowT(UnaryOp op, const typename IO::P* x, typename IO::P* out, int64_t n, float lo, float hi) {
  switch (op) {
    case UnaryOp::Neg: return RowUnary<IO>(x, out, n, NegF{});
    case UnaryOp::Exp: return RowUnary<IO>(x, out, n, ExpF<IO::kLite>{});
    case UnaryOp::Log: return RowUnary<IO>(x, out, n, LogF<IO::kLite>{});
    case UnaryOp::Erf: return RowUnary<IO>(x, out, n, ErfF<IO::kLite>{});
    case UnaryOp::Tanh: return RowUnary<IO>(x, out, n, TanhF<IO::kLite>{});
    case UnaryOp::Sqrt: return RowUnary<IO>(x, out, n, SqrtF{});
    case UnaryOp::Rsqrt: return RowUnary<IO>(x, out, n, RsqrtF{});
    case UnaryOp::Abs: return RowUnary<IO>(x, out, n, AbsF{});
    case UnaryOp::Sigmoid: return RowUnary<IO>(x, out, n, SigmoidF<IO::kLite>{});
    case UnaryOp::Relu: return RowUnary<IO>(x, out, n, ReluF{});
    case UnaryOp::Silu: return RowUnary<IO>(x, out, n, SiluF<IO::kLite>{});
    case UnaryOp::Gelu:
      if constexpr (!IO::kLite) return RowUnary<IO>(x, out, n, GeluF{});
      return;  // bf16: unary_bf16 looks it up in a table
    case UnaryOp::GeluTanh: return RowUnary<IO>(x, out, n, GeluTanhF<IO::kLite>{});
    case UnaryOp::Clamp: return RowUnary<IO>(x, out, n, ClampF{lo, hi});
    default: return;  // has_unary() keeps other ops away
  }
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
#include "ops/cpu/elementwise_tables.h"

namespace kiln::cpu::simd {
HWY_EXPORT(UnaryF32);
HWY_EXPORT(UnaryBF16);

bool has_unary(UnaryOp) { return true; }

void unary_f32(UnaryOp op, const float* x, float* out, int64_t n, float lo, float hi) {
  HWY_DYNAMIC_DISPATCH(UnaryF32)(op, x, out, n, lo, hi);
}
void unary_bf16(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n, float lo, float hi) {
  if (unary_bf16_by_table(op, x, out, n)) return;
  HWY_DYNAMIC_DISPATCH(UnaryBF16)(op, x, out, n, lo, hi);
}
}  // namespace kiln::cpu::simd
#endif
