// Highway SIMD rows of the binary elementwise ops (add, mul, div, pow, max, min, activation backward).
// Compiled for every x86/ARM target Highway knows (foreach_target) and picked at run time; rows
// run blocks of two vectors (elementwise_simd-inl.h). The backward rows with a fast formula on a
// range take two blocks at a time behind one range check of x (on the raw bits for bf16), so
// four independent chains interleave; a block that fails the check runs the general path, which
// gives in-range lanes the same fast formula, so a value's result never depends on its
// neighbours. bf16 gelu, silu and gelu-tanh backward and pow look up fp32 tables (f'(x),
// log2(x)) and finish in vectors; f32 pow looks up ln x in a table keyed by x's top 16 bits
// (PowF32Rows). Tails run the same vector code on a padded stack copy. The transcendental
// functions are in simd_math-inl.h, the lookup tables in elementwise_tables.cpp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/elementwise_binary_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/elementwise_simd.h"
#include "ops/cpu/elementwise_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x86 float compares are ordered (false on NaN), so NaN is tested explicitly.
HWY_INLINE VF NanMax(VF a, VF b) { return hn::IfThenElse(hn::Or(hn::Gt(a, b), hn::IsNaN(a)), a, b); }
HWY_INLINE VF NanMin(VF a, VF b) { return hn::IfThenElse(hn::Or(hn::Lt(a, b), hn::IsNaN(a)), a, b); }

constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// ---- op functors: (d, a, b) -> fp32 vector ----
struct AddF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Add(a, b); } };
struct AxpyF {
  float alpha;
  HWY_INLINE VF operator()(DF d, VF a, VF b) const { return hn::MulAdd(hn::Set(d, alpha), b, a); }
};
struct MulF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Mul(a, b); } };
struct DivF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return hn::Div(a, b); } };
struct MaxF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return NanMax(a, b); } };
struct MinF { HWY_INLINE VF operator()(DF, VF a, VF b) const { return NanMin(a, b); } };
template <bool L> struct SiluBwdF {
  static constexpr bool kApprox = true;
  static constexpr float kFastAbsMax = kExpFastMax;
  static HWY_INLINE VF Fast(DF d, VF g, VF x) {
    const VF e = ExpFast<L>(d, hn::Neg(x));
    const VF den = hn::Add(hn::Set(d, 1.0f), e);
    const VF s = L ? RecipBf(d, den) : DivFast(d, hn::Set(d, 1.0f), den);
    return hn::Mul(hn::Mul(g, s), hn::MulAdd(x, hn::Mul(e, s), hn::Set(d, 1.0f)));
  }
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    VF s, s1m;
    SigmoidPair<L>(d, x, s, s1m);
    return hn::Mul(hn::Mul(g, s), hn::MulAdd(x, s1m, hn::Set(d, 1.0f)));
  }
};
// gelu'(x) = Phi(x) + x phi(x). float32, |x| <= 4: GeluBwdF32Fast (one exp and the Mills ratio).
// bf16 (only a broadcast x: dense bf16 rows use a table, gelu_bwd_bf16_rows), |x| <= 3.5: Phi =
// s = sigmoid(f) from GeluLogitNeg2, and phi = s (1 - s) f'(x) with f' fitted on its own (even,
// degree 5 in x^2, relative error 1.3e-4) rather than differentiated from F (5.6e-4).
template <bool L> struct GeluBwdF {
  static constexpr bool kApprox = true;
  static HWY_INLINE VF BfFast(DF d, VF x) {  // |x| <= kGeluBfMax
    const VF u = hn::Mul(x, x), u2 = hn::Mul(u, u);
    const VF e = Exp2FastBf(d, GeluLogitNeg2(d, x, u));
    const VF s = RecipBf(d, hn::Add(hn::Set(d, 1.0f), e));
    const VF lo = Lin(d, u, 1.59556258f, 0.219162837f), mid = Lin(d, u, -0.00131432747f, -0.000481714553f);
    const VF hi = Lin(d, u, 3.36268495e-05f, -7.35446577e-07f);
    const VF df = hn::MulAdd(hn::MulAdd(hi, u2, mid), u2, lo);
    return hn::MulAdd(hn::Mul(hn::Mul(x, df), hn::Mul(e, s)), s, s);
  }
  static constexpr float kFastAbsMax = L ? kGeluBfMax : kGeluBwdF32FastMax;
  static HWY_INLINE VF Fast(DF d, VF g, VF x) { return hn::Mul(g, L ? BfFast(d, x) : GeluBwdF32Fast(d, x)); }
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    const auto ok = AbsLe(d, x, kFastAbsMax);
    if (HWY_LIKELY(hn::AllTrue(d, ok))) return Fast(d, g, x);
    return hn::IfThenElse(ok, Fast(d, g, x), Full(d, g, x));
  }
  static HWY_INLINE VF Full(DF d, VF g, VF x) {  // any x, through Phi's erfc form
    const VF e_arg = hn::Mul(hn::Set(d, -0.5f), hn::Mul(x, x));
    VF cdf, pdf;
    if (HWY_LIKELY(CdfFastOk(d, x))) {
      cdf = NormalCdf(d, x, false);
      pdf = hn::Mul(hn::Set(d, kInvSqrt2Pi), ExpFast(d, e_arg));
    } else {
      cdf = NormalCdf(d, hn::Min(hn::Max(x, hn::Set(d, -15.0f)), hn::Set(d, 15.0f)), true);
      cdf = hn::IfThenElse(hn::IsNaN(x), x, cdf);
      pdf = hn::Mul(hn::Set(d, kInvSqrt2Pi), ExpFull(d, e_arg));
    }
    return hn::Mul(g, hn::MulAdd(x, pdf, cdf));
  }
};
// d/dx x sigmoid(2u) with s = sigmoid(2u): s + 2 x s (1 - s) u'.
template <bool L> struct GeluTanhBwdF {
  static constexpr bool kApprox = true;
  static constexpr float kFastAbsMax = 9.5f;  // |2u| <= 77
  static HWY_INLINE VF Fast(DF d, VF g, VF x) {
    const VF e = L ? GeluTanhExpNeg2U(d, x) : ExpFast(d, hn::Neg(GeluTanh2U(d, x)));
    const VF den = hn::Add(hn::Set(d, 1.0f), e);
    const VF s = L ? RecipBf(d, den) : DivFast(d, hn::Set(d, 1.0f), den);
    return Combine(d, g, x, s, hn::Mul(e, s));
  }
  static HWY_INLINE VF Combine(DF d, VF g, VF x, VF s, VF s1m) {
    const VF one = hn::Set(d, 1.0f);
    const VF du = hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Set(d, 3.0f * kCubic), hn::Mul(x, x), one));
    const VF right = hn::Mul(hn::Mul(hn::Add(x, x), hn::Mul(s, s1m)), du);
    return hn::Mul(g, hn::Add(s, right));
  }
  HWY_INLINE VF operator()(DF d, VF g, VF x) const {
    VF fast;
    if (L) {
      fast = Fast(d, g, x);
      if (HWY_LIKELY(hn::AllTrue(d, AbsLe(d, x, kFastAbsMax)))) return fast;
    }
    VF s, s1m;
    SigmoidPair<L>(d, GeluTanh2U(d, x), s, s1m);
    // Past |x| = 1e4 s (1 - s) is 0; the clamp keeps x^2 finite there (else 0 * inf = NaN).
    const VF r = Combine(d, g, hn::Min(hn::Max(x, hn::Set(d, -1e4f)), hn::Set(d, 1e4f)), s, s1m);
    return L ? hn::IfThenElse(AbsLe(d, x, kFastAbsMax), fast, r) : r;
  }
};
// x^y with a tensor exponent, lanes the fast formula does not cover (`ok` false): std::pow, so
// each result depends on its own x and y only.
HWY_NOINLINE VF PowFixLanes(DF d, VF x, VF y, VF r, hn::Mask<DF> ok) {
  HWY_ALIGN float xs[hn::MaxLanes(d)], ys[hn::MaxLanes(d)], rs[hn::MaxLanes(d)], oks[hn::MaxLanes(d)];
  hn::Store(x, d, xs);
  hn::Store(y, d, ys);
  hn::Store(r, d, rs);
  hn::Store(hn::IfThenElseZero(ok, hn::Set(d, 1.0f)), d, oks);
  for (size_t i = 0; i < hn::Lanes(d); ++i)
    if (oks[i] == 0.0f) rs[i] = std::pow(xs[i], ys[i]);
  return hn::Load(d, rs);
}
struct SigmoidBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::Mul(hn::Mul(g, y), hn::Sub(hn::Set(d, 1.0f), y)); }
};
struct TanhBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::Mul(g, hn::NegMulAdd(y, y, hn::Set(d, 1.0f))); }
};
struct ReluBwdF {
  HWY_INLINE VF operator()(DF d, VF g, VF y) const { return hn::IfThenElseZero(hn::Gt(y, hn::Zero(d)), g); }
};

// ---- row driver ----
template <class IO, class F>
HWY_INLINE void RowBinary(const typename IO::P* a, const typename IO::P* b, bool b_scalar, typename IO::P* out,
                          int64_t n, const F& f) {
  using P = typename IO::P;
  const DF d;
  const int64_t block = 2 * static_cast<int64_t>(hn::Lanes(d));
  const VF bs = hn::Set(d, IO::ToFloat(b[0]));
  auto step = [&](const P* pa, const P* pb, P* po) {
    VF a0, a1, b0 = bs, b1 = bs;
    IO::Load(d, pa, a0, a1);
    if (!b_scalar) IO::Load(d, pb, b0, b1);
    IO::template Store<kApproxOf<F>>(d, f(d, a0, b0), f(d, a1, b1), po);
  };
  int64_t i = 0;
  if constexpr (SplitsBinary<F>) {
    if (!b_scalar) {
      for (; i + 2 * block <= n; i += 2 * block) {
        VF a0, a1, a2, a3, b0, b1, b2, b3;
        IO::Load(d, a + i, a0, a1);
        IO::Load(d, a + i + block, a2, a3);
        IO::Load(d, b + i, b0, b1);
        IO::Load(d, b + i + block, b2, b3);
        VF y0, y1, y2, y3;
        if (HWY_LIKELY(IO::AllAbsLe(d, b + i, b0, b1, b2, b3, F::kFastAbsMax))) {
          y0 = f.Fast(d, a0, b0), y1 = f.Fast(d, a1, b1), y2 = f.Fast(d, a2, b2), y3 = f.Fast(d, a3, b3);
        } else {
          y0 = f(d, a0, b0), y1 = f(d, a1, b1), y2 = f(d, a2, b2), y3 = f(d, a3, b3);
        }
        IO::template Store<kApproxOf<F>>(d, y0, y1, out + i);
        IO::template Store<kApproxOf<F>>(d, y2, y3, out + i + block);
      }
    }
  }
  for (; i + block <= n; i += block) step(a + i, b + i, out + i);
  if (i == n) return;
  HWY_ALIGN P ta[kMaxBlock] = {}, tb[kMaxBlock] = {}, to[kMaxBlock] = {};
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(ta, a + i, rest * sizeof(P));
  if (!b_scalar) std::memcpy(tb, b + i, rest * sizeof(P));
  step(ta, tb, to);
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
    case BinaryOp::Pow: return;  // binary_f32 / binary_bf16 take PowF32Rows / PowBF16Table
    case BinaryOp::Maximum: return RowBinary<IO>(a, b, bs, out, n, MaxF{});
    case BinaryOp::Minimum: return RowBinary<IO>(a, b, bs, out, n, MinF{});
    case BinaryOp::SiluBackward: return RowBinary<IO>(a, b, bs, out, n, SiluBwdF<IO::kLite>{});
    case BinaryOp::GeluBackward: return RowBinary<IO>(a, b, bs, out, n, GeluBwdF<IO::kLite>{});
    case BinaryOp::GeluTanhBackward: return RowBinary<IO>(a, b, bs, out, n, GeluTanhBwdF<IO::kLite>{});
    case BinaryOp::SigmoidBackward: return RowBinary<IO>(a, b, bs, out, n, SigmoidBwdF{});
    case BinaryOp::TanhBackward: return RowBinary<IO>(a, b, bs, out, n, TanhBwdF{});
    case BinaryOp::ReluBackward: return RowBinary<IO>(a, b, bs, out, n, ReluBwdF{});
    default: return;  // has_binary() keeps other ops away
  }
}

// The table rows' gather: buf[j..] = t[x] for a chunk of len values (a multiple of block = 2
// lanes), in the order BF16IO::Load splits a block (even elements, then odd), by scalar loads.
// Inlined: as a call, the bf16 gelu backward and pow rows ran 17-25% slower.
HWY_INLINE void GatherBF16Table(const uint16_t* x, int64_t len, int64_t lanes, const float* t, float* buf) {
  for (int64_t j = 0; j < len; j += 2 * lanes) {
    for (int64_t k = 0; k < lanes; ++k) {
      uint32_t w;
      std::memcpy(&w, x + j + 2 * k, 4);
#if defined(__GNUC__)
      asm("" : "+r"(w));  // keeps GCC from vectorising the lookups into permutes and inserts (2x slower)
#endif
      buf[j + k] = t[w & 0xffff];
      buf[j + lanes + k] = t[w >> 16];
    }
  }
}

// bf16 gelu, silu and gelu-tanh backward by table: t[x] = f'(x) in fp32 for each of the 65536
// bf16 patterns (built in HWY_ONCE below), g t[x] in fp32 rounded once to bf16. Per chunk the
// lookups fill a buffer (GatherBF16Table) before a vector pass multiplies, rounds and stores, so
// out may alias x or g.
void DerivativeBF16Table(const uint16_t* g, const uint16_t* x, uint16_t* out, int64_t n, const float* t) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), block = 2 * lanes;
  constexpr int64_t kChunk = 128;
  HWY_ALIGN float buf[kChunk + kMaxBlock];
  int64_t i = 0;
  while (i + block <= n) {
    const int64_t len = std::min<int64_t>(kChunk, (n - i) / block * block);
    GatherBF16Table(x + i, len, lanes, t, buf);
    for (int64_t j = 0; j < len; j += block) {
      VF g0, g1;
      BF16IO::Load(d, g + i + j, g0, g1);
      BF16IO::Store<false>(d, hn::Mul(g0, hn::Load(d, buf + j)), hn::Mul(g1, hn::Load(d, buf + j + lanes)), out + i + j);
    }
    i += len;
  }
  for (; i < n; ++i) {  // same product and nearest-even rounding, one value at a time
    const float v = BF16IO::ToFloat(g[i]) * t[x[i]];
    uint32_t u;
    std::memcpy(&u, &v, 4);
    out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// bf16 pow: x^y = 2^(y t[x]) with t[x] = log2(x) for each of the 65536 bf16 patterns (NaN where
// x <= 0, inf or NaN: those lanes fail the range check), so the vector pass is a multiply and
// Exp2FastBf (1.0e-4); lanes with |y log2 x| > 125 or an invalid x take std::pow (PowFixLanes).
// The lookups (GatherBF16Table) run one group of four blocks ahead of the vector pass, so that
// their scalar loads and stores can overlap the previous group's vector math: 0.53 ns/value on
// one Zen 2 core against 0.56 for a lookup pass over 128 values and then a vector pass (two or
// eight blocks per group, or an unrolled lookup loop, measured slower); 0.52 with the product
// folded into exp2's reduction (Exp2Product).
constexpr int64_t kPowBF16Blocks = 4;  // blocks per group
// 2^(y t) as Exp2FastBf with its reduction in FMAs: n = round(y t) from one FMA with the
// rounding constant, r = y t - n exact by a second, no separate product. nn = -n, for the range
// check |n| <= 125.
HWY_INLINE VF Exp2Product(DF d, VF y, VF t, VF& nn) {
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, kRoundMagic);
  const VF tt = hn::MulAdd(y, t, magic);
  nn = hn::Sub(magic, tt);
  const VF r = hn::MulAdd(y, t, nn);
  const VF q = hn::MulAdd(hn::MulAdd(hn::Set(d, 0.0550058633f), r, hn::Set(d, 0.242216378f)), r, hn::Set(d, 0.693283856f));
  const VF p = hn::MulAdd(r, q, hn::Set(d, 1.0f));
  return hn::BitCast(d, hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::BitCast(di, tt))));
}
// Blocks of values with their lookups in pb, each lane through the fast formula or std::pow.
// Out of line: the hot loop keeps its registers.
HWY_NOINLINE void PowBF16Blocks(const uint16_t* x, const uint16_t* y, bool y_scalar, const float* pb, uint16_t* out,
                                int64_t blocks) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), block = 2 * lanes;
  for (int64_t k = 0; k < blocks; ++k, x += block, pb += block, out += block) {
    VF y0, y1;
    if (y_scalar) y0 = y1 = hn::Set(d, BF16IO::ToFloat(y[0]));
    else BF16IO::Load(d, y + k * block, y0, y1);
    VF n0, n1;
    VF r0 = Exp2Product(d, y0, hn::Load(d, pb), n0), r1 = Exp2Product(d, y1, hn::Load(d, pb + lanes), n1);
    const auto ok0 = AbsLe(d, n0, 125.0f), ok1 = AbsLe(d, n1, 125.0f);
    if (!hn::AllTrue(d, hn::And(ok0, ok1))) {
      VF x0, x1;
      BF16IO::Load(d, x, x0, x1);
      r0 = hn::AllTrue(d, ok0) ? r0 : PowFixLanes(d, x0, y0, r0, ok0);
      r1 = hn::AllTrue(d, ok1) ? r1 : PowFixLanes(d, x1, y1, r1, ok1);
    }
    BF16IO::Store<true>(d, r0, r1, out);
  }
}
// Whole groups; returns the number of values done.
template <bool kYScalar>
HWY_INLINE int64_t PowBF16Groups(const uint16_t* x, const uint16_t* y, uint16_t* out, int64_t n, const float* t) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), block = 2 * lanes, group = kPowBF16Blocks * block;
  HWY_ALIGN float buf[2][kPowBF16Blocks * kMaxBlock];
  const VF ys = hn::Set(d, BF16IO::ToFloat(y[0]));
  const int64_t groups = n / group;
  if (groups > 0) GatherBF16Table(x, group, lanes, t, buf[0]);
  for (int64_t g = 0; g < groups; ++g) {
    if (g + 1 < groups) GatherBF16Table(x + (g + 1) * group, group, lanes, t, buf[(g + 1) & 1]);
    for (int64_t b = 0; b < kPowBF16Blocks; b += 2) {  // two blocks per range check
      const int64_t i = g * group + b * block;
      const float* pb = buf[g & 1] + b * block;
      VF y0 = ys, y1 = ys, y2 = ys, y3 = ys;
      if (!kYScalar) {
        BF16IO::Load(d, y + i, y0, y1);
        BF16IO::Load(d, y + i + block, y2, y3);
      }
      VF n0, n1, n2, n3;
      const VF r0 = Exp2Product(d, y0, hn::Load(d, pb), n0), r1 = Exp2Product(d, y1, hn::Load(d, pb + lanes), n1);
      const VF r2 = Exp2Product(d, y2, hn::Load(d, pb + block), n2);
      const VF r3 = Exp2Product(d, y3, hn::Load(d, pb + block + lanes), n3);
      if (HWY_UNLIKELY(!F32IO::AllAbsLe(d, nullptr, n0, n1, n2, n3, 125.0f))) {
        PowBF16Blocks(x + i, kYScalar ? y : y + i, kYScalar, pb, out + i, 2);
        continue;
      }
      BF16IO::Store<true>(d, r0, r1, out + i);
      BF16IO::Store<true>(d, r2, r3, out + i + block);
    }
  }
  return groups * group;
}
void PowBF16Table(const uint16_t* x, const uint16_t* y, bool y_scalar, uint16_t* out, int64_t n, const float* t) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), block = 2 * lanes;
  int64_t i = y_scalar ? PowBF16Groups<true>(x, y, out, n, t) : PowBF16Groups<false>(x, y, out, n, t);
  HWY_ALIGN float buf[kPowBF16Blocks * kMaxBlock];
  const int64_t len = (n - i) / block * block;  // whole blocks left, fewer than a group
  GatherBF16Table(x + i, len, lanes, t, buf);
  PowBF16Blocks(x + i, y_scalar ? y : y + i, y_scalar, buf, out + i, len / block);
  i += len;
  if (i == n) return;
  HWY_ALIGN uint16_t tx[kMaxBlock] = {}, ty[kMaxBlock] = {}, to[kMaxBlock] = {};
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(tx, x + i, rest * 2);
  if (!y_scalar) std::memcpy(ty, y + i, rest * 2);
  GatherBF16Table(tx, block, lanes, t, buf);
  PowBF16Blocks(tx, y_scalar ? y : ty, y_scalar, buf, to, 1);
  std::memcpy(out + i, to, rest * 2);
}

// float32 pow (PowF32Table): one u64 lookup per value, keyed by x's top 16 bits, into a pair
// buffer read by PowDeinterleave, one group of kPowGroup vectors ahead of the vector pass (as
// in PowBF16Table; a lookup pass per chunk first was 15% slower). Four vectors per range check
// of the combined lanes (three or six measured slower); a group with a failing lane is
// recomputed vector by vector (PowF32Vectors), so no masks stay live in the fast loop.
constexpr int64_t kPowGroup = 4;
// Buffer slot of lane l's (A, B) pair: PowDeinterleave takes even lanes from the first vector's
// pairs and odd lanes from the second's.
HWY_INLINE int64_t PowSlot(int64_t l, int64_t lanes) { return (l & 1) ? lanes / 2 + l / 2 : l / 2; }
HWY_INLINE void PowDeinterleave(DF d, const float* p, VF& a, VF& b) {
#if HWY_TARGET == HWY_SCALAR
  a = hn::Load(d, p);
  b = hn::Load(d, p + 1);
#else
  const VF v0 = hn::Load(d, p), v1 = hn::Load(d, p + hn::Lanes(d));
  a = hn::OddEven(hn::Shuffle2301(v1), v0);
  b = hn::OddEven(v1, hn::Shuffle2301(v0));
#endif
}
HWY_INLINE void PowF32Lookups(const float* x, int64_t lanes, const uint64_t* t, uint64_t* buf) {
  for (int64_t j = 0; j < kPowGroup * lanes; j += lanes) {
    for (int64_t l = 0; l < lanes; ++l) {
      uint16_t key;  // x's top 16 bits (little-endian)
      std::memcpy(&key, reinterpret_cast<const char*>(x + j + l) + 2, 2);
      uint64_t e = t[key];
#if defined(__GNUC__)
      asm("" : "+r"(e));  // keeps GCC from assembling the entries into vectors (inserts: slower)
#endif
      buf[j + PowSlot(l, lanes)] = e;
    }
  }
}
// One group, vector by vector, each lane through the fast formula or std::pow. Out of line.
HWY_NOINLINE void PowF32Vectors(const float* x, const float* y, bool y_scalar, const uint64_t* b, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* pb = reinterpret_cast<const float*>(b);
  for (int64_t k = 0; k < kPowGroup; ++k) {
    VF a, c;
    PowDeinterleave(d, pb + 2 * k * lanes, a, c);
    const VF xv = hn::LoadU(d, x + k * lanes), yv = y_scalar ? hn::Set(d, y[0]) : hn::LoadU(d, y + k * lanes);
    hn::Mask<DF> ok;
    const VF r = PowF32Table(d, xv, yv, a, c, ok);
    hn::StoreU(hn::AllTrue(d, ok) ? r : PowFixLanes(d, xv, yv, r, ok), d, out + k * lanes);
  }
}
template <bool kYScalar>
HWY_INLINE int64_t PowF32Groups(const float* x, const float* y, float* out, int64_t n, const uint64_t* t) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), group = kPowGroup * lanes;
  HWY_ALIGN uint64_t buf[2][kPowGroup * hn::MaxLanes(d)];
  const VF ys = hn::Set(d, y[0]);
  const int64_t groups = n / group;
  if (groups > 0) PowF32Lookups(x, lanes, t, buf[0]);
  for (int64_t g = 0; g < groups; ++g) {
    if (g + 1 < groups) PowF32Lookups(x + (g + 1) * group, lanes, t, buf[(g + 1) & 1]);
    const float* px = x + g * group;
    const float* py = kYScalar ? y : y + g * group;
    const float* pb = reinterpret_cast<const float*>(buf[g & 1]);
    VF a0, b0, a1, b1, a2, b2, a3, b3;
    PowDeinterleave(d, pb, a0, b0);
    PowDeinterleave(d, pb + 2 * lanes, a1, b1);
    PowDeinterleave(d, pb + 4 * lanes, a2, b2);
    PowDeinterleave(d, pb + 6 * lanes, a3, b3);
    VF y0 = ys, y1 = ys, y2 = ys, y3 = ys;
    if (!kYScalar) {
      y0 = hn::LoadU(d, py), y1 = hn::LoadU(d, py + lanes);
      y2 = hn::LoadU(d, py + 2 * lanes), y3 = hn::LoadU(d, py + 3 * lanes);
    }
    hn::Mask<DF> m0, m1, m2, m3;
    const VF r0 = PowF32Table(d, hn::LoadU(d, px), y0, a0, b0, m0);
    const VF r1 = PowF32Table(d, hn::LoadU(d, px + lanes), y1, a1, b1, m1);
    const VF r2 = PowF32Table(d, hn::LoadU(d, px + 2 * lanes), y2, a2, b2, m2);
    const VF r3 = PowF32Table(d, hn::LoadU(d, px + 3 * lanes), y3, a3, b3, m3);
    float* po = out + g * group;
    if (HWY_UNLIKELY(!hn::AllTrue(d, hn::And(hn::And(m0, m1), hn::And(m2, m3))))) {
      PowF32Vectors(px, py, kYScalar, buf[g & 1], po);
      continue;
    }
    hn::StoreU(r0, d, po);
    hn::StoreU(r1, d, po + lanes);
    hn::StoreU(r2, d, po + 2 * lanes);
    hn::StoreU(r3, d, po + 3 * lanes);
  }
  return groups * group;
}
void PowF32Rows(const float* x, const float* y, bool y_scalar, float* out, int64_t n, const uint64_t* t) {
#if !HWY_NATIVE_FMA
  // The hi + lo residuals below need a fused multiply-add; emulated (SSE4, SSSE3, EMU128) they
  // err by ~7.5e-6, so targets without one take std::pow.
  (void)t;
  for (int64_t i = 0; i < n; ++i) out[i] = std::pow(x[i], y_scalar ? y[0] : y[i]);
#else
  const DF d;
  const int64_t i = y_scalar ? PowF32Groups<true>(x, y, out, n, t) : PowF32Groups<false>(x, y, out, n, t);
  if (i == n) return;
  // Tail: a padded copy of one group (1^0 takes the fast path), same formula.
  const int64_t group = kPowGroup * static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN float tx[kPowGroup * hn::MaxLanes(d)], ty[kPowGroup * hn::MaxLanes(d)], to[kPowGroup * hn::MaxLanes(d)];
  HWY_ALIGN uint64_t buf[kPowGroup * hn::MaxLanes(d)];
  std::fill(tx, tx + group, 1.0f);
  std::fill(ty, ty + group, 0.0f);
  const size_t rest = static_cast<size_t>(n - i);
  std::memcpy(tx, x + i, rest * sizeof(float));
  if (!y_scalar) std::memcpy(ty, y + i, rest * sizeof(float));
  PowF32Lookups(tx, static_cast<int64_t>(hn::Lanes(d)), t, buf);
  PowF32Vectors(tx, y_scalar ? y : ty, y_scalar, buf, to);
  std::memcpy(out + i, to, rest * sizeof(float));
#endif
}

void BinaryF32(BinaryOp op, const float* a, const float* b, bool bs, float* out, int64_t n, float alpha, float lo,
               float hi) {
  BinaryRowT<F32IO>(op, a, b, bs, out, n, alpha, lo, hi);
}
void BinaryBF16(BinaryOp op, const uint16_t* a, const uint16_t* b, bool bs, uint16_t* out, int64_t n, float alpha,
                float lo, float hi) {
  BinaryRowT<BF16IO>(op, a, b, bs, out, n, alpha, lo, hi);
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/elementwise_tables.h"

namespace kiln::cpu::simd {
HWY_EXPORT(DerivativeBF16Table);
HWY_EXPORT(PowBF16Table);
HWY_EXPORT(PowF32Rows);

HWY_EXPORT(BinaryF32);
HWY_EXPORT(BinaryBF16);

bool has_binary(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: case BinaryOp::Mul: case BinaryOp::Div: case BinaryOp::Pow: case BinaryOp::Maximum:
    case BinaryOp::Minimum:
    case BinaryOp::SiluBackward: case BinaryOp::GeluBackward: case BinaryOp::GeluTanhBackward:
    case BinaryOp::SigmoidBackward: case BinaryOp::TanhBackward: case BinaryOp::ReluBackward:
      return true;
    default:
      return false;
  }
}

void binary_f32(BinaryOp op, const float* a, const float* b, bool b_scalar, float* out, int64_t n, float alpha,
                float lo, float hi) {
  if (op == BinaryOp::Pow) return HWY_DYNAMIC_DISPATCH(PowF32Rows)(a, b, b_scalar, out, n, ln_f32_table());
  HWY_DYNAMIC_DISPATCH(BinaryF32)(op, a, b, b_scalar, out, n, alpha, lo, hi);
}
void binary_bf16(BinaryOp op, const uint16_t* a, const uint16_t* b, bool b_scalar, uint16_t* out, int64_t n,
                 float alpha, float lo, float hi) {
  if (const float* t = b_scalar ? nullptr : derivative_bf16_table(op))
    return HWY_DYNAMIC_DISPATCH(DerivativeBF16Table)(a, b, out, n, t);
  if (op == BinaryOp::Pow) return HWY_DYNAMIC_DISPATCH(PowBF16Table)(a, b, b_scalar, out, n, log2_bf16_table());
  HWY_DYNAMIC_DISPATCH(BinaryBF16)(op, a, b, b_scalar, out, n, alpha, lo, hi);
}
}  // namespace kiln::cpu::simd
#endif
