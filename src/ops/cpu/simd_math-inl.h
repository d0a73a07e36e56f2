// Float32 vector math for the Highway rows (exp, expm1, log, reciprocal, sigmoid, tanh, erf,
// Phi, pow), shared by every CPU kernel that includes it inside its HWY_NAMESPACE. Each function has
// a fast core for ordinary inputs (no NaN/inf, no overflow or denormal result) and a full path
// for the rest; the check is one compare per vector, so typical data never pays for specials.
// Polynomials are our own minimax fits (Lawson-weighted least squares against mpmath); the
// relative errors quoted below are the fits', before float32 rounding. Measured errors of the
// finished functions are in tests/ops/test_elementwise_accuracy.cpp. The bf16 variants (flag L)
// work to a looser budget, see RecipBf.
//
// Usage: include inside a file compiled with foreach_target, after hwy/highway.h.
#if defined(KILN_OPS_CPU_SIMD_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_CPU_SIMD_MATH_INL_H_
#undef KILN_OPS_CPU_SIMD_MATH_INL_H_
#else
#define KILN_OPS_CPU_SIMD_MATH_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Polynomials by Estrin's scheme (pairs a + b x, then powers x^2, x^4). The kernels are bound
// by dependency chains as much as by op count (an out-of-order window of a few dozen vector ops
// holds only a few vectors), and Estrin's chains are half as long as Horner's: measured 20%
// faster for gelu despite the extra multiplies.
template <class D, class V>
HWY_INLINE V Lin(D d, V x, float a, float b) {
  return hn::MulAdd(hn::Set(d, b), x, hn::Set(d, a));
}
template <class D, class V>
HWY_INLINE V Poly2(D d, V x, V x2, float c0, float c1, float c2) {
  return hn::MulAdd(hn::Set(d, c2), x2, Lin(d, x, c0, c1));
}
template <class D, class V>
HWY_INLINE V Poly3(D d, V x, V x2, float c0, float c1, float c2, float c3) {
  return hn::MulAdd(Lin(d, x, c2, c3), x2, Lin(d, x, c0, c1));
}
template <class D, class V>
HWY_INLINE V Poly5(D d, V x, V x2, float c0, float c1, float c2, float c3, float c4, float c5) {
  return hn::MulAdd(hn::MulAdd(Lin(d, x, c4, c5), x2, Lin(d, x, c2, c3)), x2, Lin(d, x, c0, c1));
}
template <class D, class V>
HWY_INLINE V Poly6(D d, V x, V x2, float c0, float c1, float c2, float c3, float c4, float c5, float c6) {
  const V x4 = hn::Mul(x2, x2);
  return hn::MulAdd(Poly2(d, x, x2, c4, c5, c6), x4, Poly3(d, x, x2, c0, c1, c2, c3));
}
template <class D, class V>
HWY_INLINE V Poly8(D d, V x, V x2, float c0, float c1, float c2, float c3, float c4, float c5, float c6,
                   float c7, float c8) {
  const V x4 = hn::Mul(x2, x2);
  const V hi = hn::MulAdd(hn::Set(d, c8), x4, Poly3(d, x, x2, c4, c5, c6, c7));
  return hn::MulAdd(hi, x4, Poly3(d, x, x2, c0, c1, c2, c3));
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLn2Lo = -1.90465429995776805e-9f;  // ln2 - float(ln2)
constexpr float kRoundMagic = 12582912.0f;          // 1.5 * 2^23: adding it rounds to an integer
// |x| <= kExpFastMax keeps 2^n * p normal (n in [-126, 126], p in [0.7, 1.42]).
constexpr float kExpFastMax = 87.0f;

// 1/a: approximate reciprocal refined by Newton steps to ~1-2 ulp (x86 starts from 12 bits,
// ARM from 8, hence the second step there). Needs a normal, finite a.
template <class D, class V>
HWY_INLINE V RecipFast(D d, V a) {
  const V one = hn::Set(d, 1.0f);
  V y = hn::ApproximateReciprocal(a);
  y = hn::MulAdd(y, hn::NegMulAdd(a, y, one), y);
#if !HWY_ARCH_X86
  y = hn::MulAdd(y, hn::NegMulAdd(a, y, one), y);
#endif
  return y;
}

// Template flag L selects the bf16 variants. A bf16 result keeps 8 significant bits (half an
// ulp is 2^-9 relative or more): any fp32 error below 2^-9 keeps the bf16 result the correctly
// rounded one or its neighbour, and ~2^-11 makes the neighbour rare (<= 0.3% of all inputs).
// Budget: polynomials and rationals <= 1.3e-4 relative (or absolute in an exponent), the bare
// reciprocal estimate (RecipBf), exp reductions without the low part of ln2.

// num / den, correctly rounded. x86's vdivps (Zen 2: one per ~3.5 cycles for 8 floats, off the
// FMA pipes) replaced a reciprocal estimate with a Newton step and a corrected quotient (six ops
// on the FMA pipes in one 31-cycle chain): the f32 tanh, silu and gelu-tanh rows ran 7-12% faster.
template <class D, class V>
HWY_INLINE V DivFast(D, V num, V den) {
  return hn::Div(num, den);
}

// 1/a for the bf16 budget: the hardware estimate alone, 1.5 * 2^-12 relative at worst (Intel's
// bound; 2^-11.6 measured on Zen 2; AVX-512's 2^-14). A Newton step (two FMAs, ~2^-22) costs
// 15-19% of the sigmoid-type rows, and with the polynomials' <= 1.3e-4 the total stays near
// 2^-11, a quarter of the 2^-9 that keeps the bf16 result within one ulp of correct rounding.
template <class D, class V>
HWY_INLINE V RecipBf(D d, V a) {
  V y = hn::ApproximateReciprocal(a);
#if !HWY_ARCH_X86  // ARM's estimate has 8 bits
  y = hn::MulAdd(y, hn::NegMulAdd(a, y, hn::Set(d, 1.0f)), y);
#endif
  (void)d;
  return y;
}

// Cody-Waite reduction of x = n*ln2 + r with |r| <= ln2/2. t holds n in its low mantissa bits,
// so t's bits shifted left by 23 are n << 23, the exponent increment of 2^n. Lite drops the
// low part of ln2 (error n * 1.9e-9, at most 2.4e-7).
template <bool L = false, class D, class V>
HWY_INLINE V ExpReduce(D d, V x, V& t) {
  t = hn::MulAdd(x, hn::Set(d, kLog2e), hn::Set(d, kRoundMagic));
  const V n = hn::Sub(t, hn::Set(d, kRoundMagic));
  const V r = hn::NegMulAdd(n, hn::Set(d, kLn2), x);
  return L ? r : hn::NegMulAdd(n, hn::Set(d, kLn2Lo), r);
}
// e^r = 1 + r q(r) on |r| <= ln2/2: q of degree 5 (relative error 2.1e-9) or, bf16, degree 2
// by Horner (1.0e-4; Horner's chain is as short as Estrin's at this degree, with one op less).
// ExpQ returns q.
template <bool L = false, class D, class V>
HWY_INLINE V ExpQ(D d, V r) {
  if (L) return hn::MulAdd(hn::MulAdd(hn::Set(d, 0.165167734f), r, hn::Set(d, 0.504149556f)), r, hn::Set(d, 1.00019789f));
  const V r2 = hn::Mul(r, r);
  return Poly5(d, r, r2, 1.0f, 0.49999994f, 0.166664213f, 0.0416680574f, 0.00837496575f, 0.00138427049f);
}

// e^x for |x| <= kExpFastMax (NaN excluded): the exponent is added as an integer.
template <bool L = false, class D, class V>
HWY_INLINE V ExpFast(D d, V x) {
  const hn::RebindToSigned<D> di;
  V t;
  const V r = ExpReduce<L>(d, x, t);
  const V p = hn::MulAdd(r, ExpQ<L>(d, r), hn::Set(d, 1.0f));
  return hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t))));
}
// e^x * 2^k for every x: 2^(n+k) is applied as two factors so that overflow gives inf and
// results in the denormal range are rounded once; below -104 e^x is 0 (and e^x 2^64 too below
// -150, where x is clamped); NaN stays NaN. k > 0
// lets callers keep a tiny e^x normal and scale down after their last multiply.
// lo: a small addend carried into r after the reduction (x = hi + lo beyond float precision).
template <class D, class V, class VI>
HWY_INLINE V ExpFull(D d, V x, VI k, V lo) {
  const hn::RebindToSigned<D> di;
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -150.0f)), hn::Set(d, 89.0f));  // 0 even times 2^64
  V t;
  const V r = hn::Add(ExpReduce(d, xc, t), hn::IfThenElseZero(hn::Eq(x, xc), lo));
  const V p = hn::MulAdd(r, ExpQ(d, r), hn::Set(d, 1.0f));
  const auto n = hn::Add(hn::Sub(hn::BitCast(di, t), hn::BitCast(di, hn::Set(d, kRoundMagic))), k);
  const auto n1 = hn::ShiftRight<1>(n);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::Sub(n, n1), bias)));
  return hn::IfThenElse(hn::IsNaN(x), x, hn::Mul(hn::Mul(p, s1), s2));
}
template <class D, class V>
HWY_INLINE V ExpFull(D d, V x) {
  return ExpFull(d, x, hn::Zero(hn::RebindToSigned<D>()), hn::Zero(d));
}
// Where a result's exponent would fall below -80 (tiny, possibly denormal), ExpFull(e, k) with
// k = 64 there keeps it normal; Unscale multiplies by 2^-k after the caller's last multiply, so
// precision is lost only in that final rounding.
template <class D, class V>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> TinyScale(D d, V arg) {
  const hn::RebindToSigned<D> di;
  return hn::IfThenElseZero(hn::RebindMask(di, hn::Lt(arg, hn::Set(d, -80.0f))), hn::Set(di, 64));
}
template <class D, class V, class VI>
HWY_INLINE V Unscale(D d, V v, VI k) {
  const hn::RebindToSigned<D> di;
  return hn::IfThenElse(hn::RebindMask(d, hn::Eq(k, hn::Zero(di))), v, hn::Mul(v, hn::Set(d, 5.42101086e-20f)));
}

template <class D, class V>
HWY_INLINE bool ExpFastOk(D d, V x) {
  return hn::AllTrue(d, hn::Le(hn::Abs(x), hn::Set(d, kExpFastMax)));  // false on NaN
}
// bf16 rows: where a vector leaves the fast range, its in-range lanes still take the fast
// formula, so that a value's result never depends on its neighbours.
template <class D, class V>
HWY_INLINE hn::Mask<D> AbsLe(D d, V x, float lim) {
  return hn::Le(hn::Abs(x), hn::Set(d, lim));  // false on NaN
}
template <bool L = false, class D, class V>
HWY_INLINE V Exp(D d, V x) {
  if (HWY_LIKELY(ExpFastOk(d, x))) return ExpFast<L>(d, x);
  return L ? hn::IfThenElse(AbsLe(d, x, kExpFastMax), ExpFast<L>(d, x), ExpFull(d, x)) : ExpFull(d, x);
}

// e^y - 1 for |y| <= kExpFastMax: 2^n (1 + r q) - 1 = (2^n - 1) + 2^n r q keeps small results
// exact to a few ulp where e^y - 1 would cancel.
template <bool L = false, class D, class V>
HWY_INLINE V ExpM1Fast(D d, V y) {
  const hn::RebindToSigned<D> di;
  V t;
  const V r = ExpReduce<L>(d, y, t);
  const V one = hn::Set(d, 1.0f);
  const V s = hn::BitCast(d, hn::Add(hn::ShiftLeft<23>(hn::BitCast(di, t)), hn::BitCast(di, one)));
  return hn::MulAdd(s, hn::Mul(r, ExpQ<L>(d, r)), hn::Sub(s, one));
}

// log(x) = e ln2 + log(m), m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m-1)/(m+1):
// 2s + s^3 Q(s^2) with Q of degree 2 (relative error 8.7e-10). Needs a normal positive finite x.
template <class D, class V>
HWY_INLINE V LogCore(D d, V x, V e_add) {
  const hn::RebindToSigned<D> di;
  const auto sqrt_half = hn::Set(di, 0x3f3504f3);
  const auto u = hn::Sub(hn::BitCast(di, x), sqrt_half);
  const V e = hn::Add(hn::ConvertTo(d, hn::ShiftRight<23>(u)), e_add);
  const V m = hn::BitCast(d, hn::Add(hn::And(u, hn::Set(di, 0x007fffff)), sqrt_half));
  const V f = hn::Sub(m, hn::Set(d, 1.0f));
  const V s = hn::Mul(f, RecipFast(d, hn::Add(f, hn::Set(d, 2.0f))));
  const V s2 = hn::Mul(s, s);
  const V q = Poly2(d, s2, hn::Mul(s2, s2), 0.666667819f, 0.399766266f, 0.298983961f);
  const V lm = hn::MulAdd(hn::Mul(s, s2), q, hn::Add(s, s));
  return hn::MulAdd(e, hn::Set(d, kLn2), hn::MulAdd(e, hn::Set(d, kLn2Lo), lm));
}
template <class D, class V>
HWY_INLINE V Log(D d, V x) {
  const V min_normal = hn::Set(d, 1.17549435e-38f), max_finite = hn::Set(d, 3.40282347e38f);
  if (HWY_LIKELY(hn::AllTrue(d, hn::And(hn::Ge(x, min_normal), hn::Le(x, max_finite)))))
    return LogCore(d, x, hn::Zero(d));
  // Denormals are scaled by 2^23 first; then 0 -> -inf, x < 0 -> NaN, inf -> inf, NaN -> NaN.
  const auto tiny = hn::Lt(x, min_normal);
  const V xs = hn::IfThenElse(tiny, hn::Mul(x, hn::Set(d, 8388608.0f)), x);
  V r = LogCore(d, xs, hn::IfThenElseZero(tiny, hn::Set(d, -23.0f)));
  const V inf = hn::Set(d, HUGE_VALF);
  r = hn::IfThenElse(hn::Eq(x, inf), inf, r);
  r = hn::IfThenElse(hn::Eq(x, hn::Zero(d)), hn::Neg(inf), r);
  r = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Set(d, NAN), r);
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}

// bf16: log(m) = f P(f), f = m - 1, P of degree 4 (relative error 5.1e-5), no division.
template <class D, class V>
HWY_INLINE V LogBf(D d, V x) {
  const V min_normal = hn::Set(d, 1.17549435e-38f), max_finite = hn::Set(d, 3.40282347e38f);
  const auto ok = hn::And(hn::Ge(x, min_normal), hn::Le(x, max_finite));
  const hn::RebindToSigned<D> di;
  const auto sqrt_half = hn::Set(di, 0x3f3504f3);
  const auto u = hn::Sub(hn::BitCast(di, x), sqrt_half);
  const V e = hn::ConvertTo(d, hn::ShiftRight<23>(u));
  const V f = hn::Sub(hn::BitCast(d, hn::Add(hn::And(u, hn::Set(di, 0x007fffff)), sqrt_half)), hn::Set(d, 1.0f));
  const V f2 = hn::Mul(f, f);
  const V p = hn::MulAdd(hn::MulAdd(hn::Set(d, 0.176579461f), f2, Lin(d, f, 0.336388767f, -0.270943969f)), f2,
                         Lin(d, f, 0.999966204f, -0.499450833f));
  const V r = hn::MulAdd(e, hn::Set(d, kLn2), hn::Mul(f, p));
  if (HWY_LIKELY(hn::AllTrue(d, ok))) return r;
  return hn::IfThenElse(ok, r, Log(d, x));
}

// sigmoid(x) = 1 / (1 + e^-x); the full path uses e^-|x| so that large negative x keep their
// tiny (even denormal) values instead of 1/inf.
template <class D, class V>
HWY_INLINE V SigmoidFull(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V e = ExpFull(d, hn::Neg(hn::Abs(x)));
  const V r = hn::Div(one, hn::Add(one, e));
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Mul(e, r), r);  // NaN: r is NaN
}
// x sigmoid(y) for any x, y. For y < 0 the exp is taken times 2^64 and the product scaled
// by 2^-64 last, so a result that is normal keeps full precision even where e^y alone is
// denormal (gelu-tanh near x = -10, silu below x = -87), and a denormal result rounds once.
template <class D, class V>
HWY_INLINE V TimesSigmoidFull(D d, V x, V y) {
  const V one = hn::Set(d, 1.0f);
  const V neg = hn::Neg(hn::Abs(y));
  const auto is_neg = hn::Lt(y, hn::Zero(d));
  const auto k = TinyScale(d, neg);
  const V es = ExpFull(d, neg, k, hn::Zero(d));  // e^-|y| * 2^k
  const V e = Unscale(d, es, k);
  const V r = hn::Div(one, hn::Add(one, e));
  const V left = Unscale(d, hn::Mul(hn::Mul(x, es), r), k);
  return hn::IfThenElse(is_neg, left, hn::Mul(x, r));  // NaN in x or y stays NaN
}

// x / (1 + e^-y) for |y| <= kExpFastMax: a corrected division (exactly x at saturation) or,
// bf16, x times RecipBf.
template <bool L = false, class D, class V>
HWY_INLINE V TimesSigmoidFast(D d, V x, V y) {
  const V den = hn::Add(hn::Set(d, 1.0f), ExpFast<L>(d, hn::Neg(y)));
  return L ? hn::Mul(x, RecipBf(d, den)) : DivFast(d, x, den);
}
template <bool L = false, class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  if (HWY_LIKELY(ExpFastOk(d, x))) return TimesSigmoidFast<L>(d, hn::Set(d, 1.0f), x);
  if (!L) return SigmoidFull(d, x);
  return hn::IfThenElse(AbsLe(d, x, kExpFastMax), TimesSigmoidFast<L>(d, hn::Set(d, 1.0f), x), SigmoidFull(d, x));
}
// sigmoid(y) and 1 - sigmoid(y) = e^-y sigmoid(y), without the cancellation of 1 - s.
template <bool L = false, class D, class V>
HWY_INLINE void SigmoidPair(D d, V y, V& s, V& s1m) {
  if (HWY_LIKELY(ExpFastOk(d, y))) {
    const V e = ExpFast<L>(d, hn::Neg(y));
    const V den = hn::Add(hn::Set(d, 1.0f), e);
    s = L ? RecipBf(d, den) : DivFast(d, hn::Set(d, 1.0f), den);
    s1m = hn::Mul(e, s);
    return;
  }
  s = SigmoidFull(d, y);
  s1m = SigmoidFull(d, hn::Neg(y));
  if (L) {
    const auto ok = AbsLe(d, y, kExpFastMax);
    const V e = ExpFast<L>(d, hn::Neg(y));
    const V sf = RecipBf(d, hn::Add(hn::Set(d, 1.0f), e));
    s = hn::IfThenElse(ok, sf, s);
    s1m = hn::IfThenElse(ok, hn::Mul(e, sf), s1m);
  }
}

// Odd rational x P(x^2) / Q(x^2) for the bf16 budget, Q(0) = 1, x clamped to [-c, c] (where
// the function rounds to +-1 in bf16); NaN kept.
template <class D, class V>
HWY_INLINE V OddRationalBf(D d, V x, float c, float p0, float p1, float p2, float q1, float q2) {
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -c)), hn::Set(d, c));
  const V u = hn::Mul(xc, xc);
  const V p = hn::MulAdd(hn::MulAdd(hn::Set(d, p2), u, hn::Set(d, p1)), u, hn::Set(d, p0));
  const V q = hn::MulAdd(hn::MulAdd(hn::Set(d, q2), u, hn::Set(d, q1)), u, hn::Set(d, 1.0f));
  return hn::IfThenElse(hn::IsNaN(x), x, hn::Mul(hn::Mul(xc, p), RecipBf(d, q)));
}

// tanh(x) = m / (-2 - m) with m = expm1(-2|x|), sign restored; |x| is capped at 9.5, past which
// tanh rounds to 1 in float32 (the division returns exactly 1 there). m is ExpM1Fast(-2a) with
// the factor -2 moved into the reduction and the coefficients (r = -2 r', r q(r) = r' q~(r'),
// q~(r') = -2 q(-2 r'); every scaling is by a power of two, so the roundings are the same), which
// takes a multiply off the head of the chain. On x86 min(9.5, NaN) returns the NaN (the second
// operand), which then runs through unchanged, so no NaN test is needed. bf16: a rational of
// degrees 5/4 on [-4.5, 4.5] (relative error 2.8e-5; tanh(4.5) rounds to 1).
template <bool L = false, class D, class V>
HWY_INLINE V Tanh(D d, V x) {
  if (L) return OddRationalBf(d, x, 4.5f, 0.999971688f, 0.103911608f, 0.000719365315f, 0.437055528f, 0.0132887503f);
  const hn::RebindToSigned<D> di;
  const V one = hn::Set(d, 1.0f), magic = hn::Set(d, kRoundMagic);
  const V a = hn::Min(hn::Set(d, 9.5f), hn::Abs(x));
  const V t = hn::MulAdd(a, hn::Set(d, -2.0f * kLog2e), magic);
  const V n = hn::Sub(t, magic);
  const V rp = hn::MulAdd(n, hn::Set(d, 0.5f * kLn2Lo), hn::MulAdd(n, hn::Set(d, 0.5f * kLn2), a));
  const V q = Poly5(d, rp, hn::Mul(rp, rp), -2.0f, 4.0f * 0.49999994f, -8.0f * 0.166664213f, 16.0f * 0.0416680574f,
                    -32.0f * 0.00837496575f, 64.0f * 0.00138427049f);
  const V s = hn::BitCast(d, hn::Add(hn::ShiftLeft<23>(hn::BitCast(di, t)), hn::BitCast(di, one)));
  const V m = hn::MulAdd(s, hn::Mul(rp, q), hn::Sub(s, one));
  const V r = hn::CopySignToAbs(hn::Div(m, hn::Sub(hn::Set(d, -2.0f), m)), x);
#if HWY_ARCH_X86
  return r;
#else
  return hn::IfThenElse(hn::IsNaN(x), x, r);
#endif
}

// 0.5 erfc(z) for z >= 0 as t exp(-z^2 + P(t)), t = 1/(1 + 0.55 z): P of degree 8 fitted on
// z in [0, 10.7] (relative error 1.5e-7). -z^2 is carried as hi + lo (an exact FMA residual)
// into the exp reduction, as rounding it would cost 2 z^2 ulp where z^2 reaches 80.
// `full`: any z (large z underflow through ExpFull); otherwise z <= kErfcFastMax.
constexpr float kErfcFastMax = 8.8f;
// from_x: the argument is |x| with z = |x|/sqrt2, and -z^2 is formed as (-|x|/2)|x|, exact
// before its rounding (z^2 from a rounded z would cost 2 z^2 ulp). k: as in ExpFull.
template <class D, class V, class VI>
HWY_INLINE V HalfErfc(D d, V z_or_x, bool full, bool from_x, VI k) {
  const hn::RebindToSigned<D> di;
  const V z = from_x ? hn::Mul(z_or_x, hn::Set(d, kInvSqrt2)) : z_or_x;
  const V t = full ? hn::Div(hn::Set(d, 1.0f), hn::MulAdd(z, hn::Set(d, 0.55f), hn::Set(d, 1.0f)))
                   : RecipFast(d, hn::MulAdd(z, hn::Set(d, 0.55f), hn::Set(d, 1.0f)));
  const V p = Poly8(d, t, hn::Mul(t, t), -1.86320078f, 0.996258795f, 0.388227075f, -0.196951315f, 0.638581336f, -1.81610858f,
                   1.89147568f, -0.898529172f, 0.16709967f);
  const V nz = from_x ? hn::Mul(z_or_x, hn::Set(d, -0.5f)) : hn::Neg(z);
  const V hi = hn::Mul(nz, z_or_x);
  const V lo = hn::MulAdd(nz, z_or_x, hn::Neg(hi));  // exact: -z^2 = hi + lo
  const V arg = hn::Add(hi, p);
  // Full path: |hi| > |p| there, so p - (arg - hi) is arg's exact rounding error (Fast2Sum).
  if (full) return hn::Mul(t, ExpFull(d, arg, k, hn::Add(hn::Sub(p, hn::Sub(arg, hi)), lo)));  // times 2^k
  (void)k;
  // Exp of (hi + p) + lo: reduce the large hi part first, then add p and lo to r.
  const V tt = hn::MulAdd(arg, hn::Set(d, kLog2e), hn::Set(d, kRoundMagic));
  const V n = hn::Sub(tt, hn::Set(d, kRoundMagic));
  V r = hn::Add(hn::NegMulAdd(n, hn::Set(d, kLn2), hi), p);
  r = hn::Add(hn::NegMulAdd(n, hn::Set(d, kLn2Lo), r), lo);
  const V e = hn::MulAdd(r, ExpQ(d, r), hn::Set(d, 1.0f));
  return hn::Mul(t, hn::BitCast(d, hn::Add(hn::BitCast(di, e), hn::ShiftLeft<23>(hn::BitCast(di, tt)))));
}

// Phi(x) = P(X <= x) for X ~ N(0, 1): 0.5 erfc(|x|/sqrt2) on the left, 1 - that on the right.
template <class D, class V>
HWY_INLINE V NormalCdf(D d, V x, bool full) {
  const V h = HalfErfc(d, hn::Abs(x), full, true, hn::Zero(hn::RebindToSigned<D>()));
  return hn::IfNegativeThenElse(x, h, hn::Sub(hn::Set(d, 1.0f), h));
}
template <class D, class V>
HWY_INLINE bool CdfFastOk(D d, V x) {
  return hn::AllTrue(d, hn::Le(hn::Abs(x), hn::Set(d, kErfcFastMax / kInvSqrt2)));  // false on NaN
}
// 2^y for |y| <= 126, bf16 budget: y = n + r, |r| <= 1/2, 2^r = 1 + r q(r) with q of degree 2
// (relative error 1.0e-4). For callers whose y comes from a polynomial with log2(e) folded into
// its coefficients: the reduction is then adds only (the FMA pipes are the busy ones).
template <class D, class V>
HWY_INLINE V Exp2FastBf(D d, V y) {
  const hn::RebindToSigned<D> di;
  const V t = hn::Add(y, hn::Set(d, kRoundMagic));
  const V r = hn::Sub(y, hn::Sub(t, hn::Set(d, kRoundMagic)));
  const V q = hn::MulAdd(hn::MulAdd(hn::Set(d, 0.0550058633f), r, hn::Set(d, 0.242216378f)), r, hn::Set(d, 0.693283856f));
  const V p = hn::MulAdd(r, q, hn::Set(d, 1.0f));
  return hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t))));
}
// bf16 gelu backward, |x| <= 3.5: Phi(x) = sigmoid(f(x)) with f = logit(Phi) = x F(x^2), F of
// degree 4 (absolute error 1.2e-4 in f, so relative in Phi's left tail), by Estrin.
// GeluLogitNeg2 returns -f log2(e), for Exp2FastBf. (bf16 gelu itself is a table.)
constexpr float kGeluBfMax = 3.5f;
template <class D, class V>
HWY_INLINE V GeluLogitNeg2(D d, V x, V u) {
  const V u2 = hn::Mul(u, u);
  const V lo = Lin(d, u, -2.30166745f, -0.105779499f), mid = Lin(d, u, 0.000558992557f, 6.40103681e-05f);
  return hn::Mul(x, hn::MulAdd(hn::MulAdd(hn::Set(d, -2.33216588e-06f), u2, mid), u2, lo));
}
// float32, |x| <= 4 (eight vectors of random normal values have a lane beyond 4 with
// probability 4e-3; beyond 3, 16%): Phi(-|x|) = exp(w + G(a)), a = |x|, w = -a^2/2, G a
// polynomial of degree 9 in a (error 6.7e-8, 3.7e-7 evaluated in float32). w comes from the exact
// a (0.5 ulp of w, at most 4.8e-7); e^(w + G) is reduced by n ln2 against w alone (exact,
// Cody-Waite) and then G added, without ln2's low part (n >= -15: 2.9e-8). Measured 6.2e-7 at
// most (7.0e-7 over every float with 2 <= |x| <= 4); AVX2 (G + ln2 and quarter steps, below):
// 6.6e-7 over those floats.
// Horner-type chains: the row runs eight of these, and Estrin's extra ops and live registers
// measured slower; G's split below (same op count, shorter chains) 9% faster. The row is bound
// by the FMA pipes and register pressure: one FMA-pipe op more (e.g. ln2/4 as hi + lo) costs 8%.
constexpr float kGeluF32FastMax = 4.0f;
template <class D, class V>
HWY_INLINE V GeluF32Fast(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V a = hn::Abs(x);
  const V u = hn::Mul(a, a);
  const V w = hn::Mul(u, hn::Set(d, -0.5f));  // exact halving: -a^2/2 rounded once, as before
#if HWY_TARGET == HWY_AVX2
  // G' = G + ln2 = c1 a + u (E(u) + a O(u)), refitted with c0 = -ln2 = G(0) (fit 7.3e-8), the
  // factor 1/2 this takes out of e^G folded into the table T below: the sums now stay below
  // ~3.2 in magnitude instead of ~3.9 with c0 + c1 a. Same op count; max error 6.6e-7 over every
  // float with 2 <= |x| <= 4 (7.0e-7 before this row's changes; 8.3e-7 with the old G and
  // quarter steps). c1 a inside the last FMA's exact product: 6.1e-7, but its longer chain lost
  // the speed-up.
  V ge = Lin(d, u, -0.000142248129f, -4.09630047e-06f), go = Lin(d, u, 3.58153338e-05f, 1.92553458e-07f);
  for (float c : {0.00492478954f, 0.181714058f}) ge = hn::MulAdd(ge, u, hn::Set(d, c));
  for (float c : {-9.65831205e-05f, -0.0364195034f}) go = hn::MulAdd(go, u, hn::Set(d, c));
  const V g = hn::MulAdd(hn::MulAdd(go, a, ge), u, hn::Mul(hn::Set(d, -0.797886908f), a));
  // Quarter steps: e^(w + G) = 2^(n/4) e^r / 2, |r| <= ln2/8, T = 2^(k/4) / 2 (k = n mod 4, t's
  // low bits) from a 4-entry vpermilps table (one cheap in-lane shuffle), so e^r = 1 + r q needs q
  // of degree 3 only (5.2e-9): T + (T r) q, one FMA-pipe op less than degree 6; 4% faster.
  const V t = hn::MulAdd(hn::Add(w, g), hn::Set(d, 4.0f * kLog2e), hn::Set(d, kRoundMagic));
  const V n = hn::Sub(t, hn::Set(d, kRoundMagic));
  const V r = hn::Add(hn::NegMulAdd(n, hn::Set(d, 0.25f * kLn2), w), g);
  const V tab{_mm256_permutevar_ps(_mm256_setr_ps(0.5f, 0.594603539f, 0.707106769f, 0.840896428f, 0.5f, 0.594603539f,
                                                  0.707106769f, 0.840896428f),
                                   _mm256_castps_si256(t.raw))};
  V q = Lin(d, r, 0.166747361f, 0.0416579247f);
  q = hn::MulAdd(q, r, hn::Set(d, 0.500000119f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.999999821f));
  const V p = hn::MulAdd(hn::Mul(tab, r), q, tab);
  const V h = hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::ShiftRight<2>(hn::BitCast(di, t)))));
  return hn::Mul(x, hn::IfNegativeThenElse(x, h, hn::Sub(hn::Set(d, 1.0f), h)));
#else
  // G = (c0 + c1 a) + u (E(u) + a O(u)), E = c2 + c4 u + c6 u^2 + c8 u^3 and O likewise from c3:
  // the nine FMAs of Horner in a as chains of about half the length. Splitting c0 + c1 a off
  // keeps the large terms out of the cancelling sum (E + a O over all terms erred 9.2e-7).
  V ge = Lin(d, u, -0.00013955684f, -4.01828538e-06f), go = Lin(d, u, 3.51953458e-05f, 1.88423925e-07f);
  for (float c : {0.00493555749f, 0.181718856f}) ge = hn::MulAdd(ge, u, hn::Set(d, c));
  for (float c : {-0.000103515027f, -0.0364292972f}) go = hn::MulAdd(go, u, hn::Set(d, c));
  const V g = hn::MulAdd(hn::MulAdd(go, a, ge), u, Lin(d, a, -0.693147123f, -0.797887981f));
  const V t = hn::MulAdd(hn::Add(w, g), hn::Set(d, kLog2e), hn::Set(d, kRoundMagic));
  const V n = hn::Sub(t, hn::Set(d, kRoundMagic));
  const V r = hn::Add(hn::NegMulAdd(n, hn::Set(d, kLn2), w), g);
  V p = Lin(d, r, 0.00837496575f, 0.00138427049f);  // ExpQ's coefficients, then 1 + r q
  for (float c : {0.0416680574f, 0.166664213f, 0.49999994f, 1.0f, 1.0f}) p = hn::MulAdd(p, r, hn::Set(d, c));
  const V h = hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, t))));
  return hn::Mul(x, hn::IfNegativeThenElse(x, h, hn::Sub(hn::Set(d, 1.0f), h)));
#endif
}
// gelu(x) = x Phi(x), float32 (bf16 gelu is a table, elementwise_tables.cpp). Vectors with every
// |x| <= 4 (almost all of them for activations) skip the reciprocal, see GeluF32Fast; the others
// take 0.5 erfc through HalfErfc. Past |x| = 15 Phi is 1 or underflows, so x is clamped there.
template <class D, class V>
HWY_INLINE V Gelu(D d, V x) {
  const V ax = hn::Abs(x);
  if (HWY_LIKELY(hn::AllTrue(d, hn::Le(ax, hn::Set(d, kGeluF32FastMax))))) return GeluF32Fast(d, x);
  if (HWY_LIKELY(CdfFastOk(d, x))) return hn::Mul(x, NormalCdf(d, x, false));
  // Left tail: h * 2^64 keeps Phi normal until x * Phi is formed, then one rounding.
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -15.0f)), hn::Set(d, 15.0f));
  const V axc = hn::Abs(xc);
  const auto k = TinyScale(d, hn::Mul(hn::Mul(axc, axc), hn::Set(d, -0.5f)));
  const V hs = hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -15.0f)), HalfErfc(d, axc, true, true, k));
  const V left = Unscale(d, hn::Mul(x, hs), k);
  const V right = hn::Mul(x, hn::Sub(hn::Set(d, 1.0f), Unscale(d, hs, k)));
  return hn::IfThenElse(hn::IsNaN(x), x, hn::IfNegativeThenElse(x, left, right));
}

// erf(z): z E(z^2) for |z| <= 0.75 (E of degree 5, relative error 1.4e-9), else
// sign(z) (1 - 2 h(|z|)); |z| is capped at 4.5, where erf rounds to 1. bf16: a rational of
// degrees 5/6 on [-2.5, 2.5] (relative error 2.4e-5; erf(2.5) rounds to 1) written as
// z (2/sqrt(pi) + u R(u) / Q(u)), u = z^2: the reciprocal's error then vanishes for small z
// (z P/Q would put 2.4e-4 on every tiny result, 2% of all bf16 results off the nearest) and
// reaches 5.8e-4 only near z = 2, where erf is within a few bf16 ulps of 1.
template <bool L = false, class D, class V>
HWY_INLINE V Erf(D d, V z) {
  if (L) {
    const V zc = hn::Min(hn::Max(z, hn::Set(d, -2.5f)), hn::Set(d, 2.5f));
    const V u = hn::Mul(zc, zc);
    const V r = hn::MulAdd(hn::MulAdd(hn::Set(d, -0.00442491984f), u, hn::Set(d, -0.0623295158f)), u,
                           hn::Set(d, -0.375870198f));
    const V q = hn::MulAdd(hn::MulAdd(hn::MulAdd(hn::Set(d, 0.00392148318f), u, hn::Set(d, 0.0817606673f)), u,
                                      hn::Set(d, 0.463691920f)),
                           u, hn::Set(d, 1.0f));
    const V e = hn::Mul(zc, hn::MulAdd(hn::Mul(u, r), RecipBf(d, q), hn::Set(d, 1.12837923f)));
    return hn::IfThenElse(hn::IsNaN(z), z, e);
  }
  const V a = hn::Min(hn::Abs(z), hn::Set(d, 4.5f));
  const V z2 = hn::Mul(z, z);
  const V small = hn::Mul(z, Poly5(d, z2, hn::Mul(z2, z2), 1.12837911f, -0.3761262f, 0.112833768f, -0.0268346239f,
                                   0.00511434348f, -0.000674949668f));
  const V big = hn::CopySignToAbs(hn::NegMulAdd(hn::Set(d, 2.0f), HalfErfc(d, a, false, false, hn::Zero(hn::RebindToSigned<D>())), hn::Set(d, 1.0f)), z);
  const V r = hn::IfThenElse(hn::Le(a, hn::Set(d, 0.75f)), small, big);
  return hn::IfThenElse(hn::IsNaN(z), z, r);
}

// float32 gelu backward, |x| <= 4: with a = |x| and E = e^(-a^2/2), Phi(-a) = phi(a) R(a) (R the
// Mills ratio, entire), so gelu'(x) = Phi(x) + x phi(x) is D = E (R(a) - a) / sqrt(2 pi) for
// x < 0 and 1 - D for x >= 0: one exp and one polynomial, K(a) = (R(a) - a) / sqrt(2 pi) of
// degree 12 (weighted fit error 4e-8; 6e-7 of max(|gelu'|, 0.01) evaluated in float32).
// e^w takes w = -a^2/2 rounded (at most 4.8e-7 relative at a = 4, on results below 5e-4).
constexpr float kGeluBwdF32FastMax = 4.0f;
template <class D, class V>
HWY_INLINE V GeluBwdF32Fast(D d, V x) {
  const V a = hn::Abs(x);
  const V e = ExpFast(d, hn::Mul(hn::Mul(a, hn::Set(d, -0.5f)), a));
  V k = Lin(d, a, -1.46473099e-06f, 5.371448e-08f);
  for (float c : {1.82583244e-05f, -0.000139252355f, 0.000738039264f, -0.00294939964f, 0.00948302075f,
                  -0.0258768462f, 0.0621298626f, -0.132862538f, 0.249979362f, -0.797883034f, 0.49999997f})
    k = hn::MulAdd(k, a, hn::Set(d, c));
  const V dd = hn::Mul(e, k);
  return hn::IfNegativeThenElse(x, dd, hn::Sub(hn::Set(d, 1.0f), dd));
}

// x^y = e^(y ln x) for float32, ln x from a table over the top 16 bits of x (sign, exponent and
// 7 mantissa bits; built in elementwise_tables.cpp, looked up by the row into A and B): x = 2^E m,
// c' = c 2^-E with c an 8-bit number near 1/m (1 on [1, 1 + 2^-7), 1/2 on [2 - 2^-7, 2), so
// that ln x = r + ... exactly around x = 1), r = x c' - 1 exact by one FMA (|r| <= 2^-7 and c'
// has 8 bits), and ln x = K + ln(1 + r) with K = -ln c' as K_hi (float, A) + K_lo (bf16, the low
// half of B; c' is B's high half). ln(1 + r) = r + r^2 (-1/2 + a3 r + a4 r^2) (fit error 2^-33
// relative). An error d in y ln x is a relative error d in the result, and y ln x reaches 87,
// so ln x is carried as hi + lo (~2^-32 relative): hi = K_hi + r (Fast2Sum: the table keeps
// |K_hi| >= |r| or K_hi = 0), y (hi + lo) keeps its FMA residual, and the exp reduction removes
// n ln2 from the high part before adding the low parts. Lanes outside |y ln x| <= 87 (and every
// x <= 0, denormal, inf, NaN or >= 2^125, whose table entries are NaN) fail `ok`; the caller
// takes std::pow there.
constexpr float kPowFastMax = 87.0f;
template <class D, class V>
HWY_INLINE V PowF32Table(D d, V x, V y, V A, V B, hn::Mask<D>& ok) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const V one = hn::Set(d, 1.0f);
  const V c = hn::BitCast(d, hn::And(hn::BitCast(du, B), hn::Set(du, 0xffff0000u)));
  const V k_lo = hn::BitCast(d, hn::ShiftLeft<16>(hn::BitCast(du, B)));
  const V r = hn::MulSub(x, c, one);  // exact
  const V r2 = hn::Mul(r, r);
  const V poly = hn::MulAdd(hn::Set(d, -0.249560878f), r2, Lin(d, r, -0.5f, 0.333340496f));
  const V hi = hn::Add(A, r);
  const V hi_err = hn::Sub(r, hn::Sub(hi, A));  // exact (Fast2Sum)
  const V lo = hn::MulAdd(r2, poly, hn::Add(k_lo, hi_err));
  const V p = hn::MulAdd(y, hi, hn::Mul(y, lo));
  const V p_lo = hn::MulAdd(y, lo, hn::MulSub(y, hi, p));  // y ln x = p + p_lo
  ok = hn::Le(hn::Abs(p), hn::Set(d, kPowFastMax));  // false on NaN
  const V t = hn::MulAdd(p, hn::Set(d, kLog2e), hn::Set(d, kRoundMagic));
  const V n = hn::Sub(t, hn::Set(d, kRoundMagic));
  const V re = hn::Add(hn::NegMulAdd(n, hn::Set(d, kLn2), p), hn::NegMulAdd(n, hn::Set(d, kLn2Lo), p_lo));
  const V ep = hn::MulAdd(re, ExpQ(d, re), one);
  return hn::BitCast(d, hn::Add(hn::BitCast(di, ep), hn::ShiftLeft<23>(hn::BitCast(di, t))));
}
}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#endif  // KILN_OPS_CPU_SIMD_MATH_INL_H_
