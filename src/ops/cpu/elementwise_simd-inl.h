// Per-target pieces shared by the elementwise SIMD rows: fp32/bf16 blocks, functor traits, gelu-tanh math.
// A block is two vectors: fp32 loads two vectors; bf16 loads 2N values as N u32 pairs and splits
// them into the even and odd elements (a 16-bit shift or a mask widens bf16 to fp32, in order,
// without shuffles), then rounds both back with integer ops and merges them with one blend.
// Used by elementwise_unary_simd.cpp and elementwise_binary_simd.cpp.
//
// Usage: include inside a file compiled with foreach_target, after hwy/highway.h.
#if defined(KILN_OPS_CPU_ELEMENTWISE_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_OPS_CPU_ELEMENTWISE_SIMD_INL_H_
#undef KILN_OPS_CPU_ELEMENTWISE_SIMD_INL_H_
#else
#define KILN_OPS_CPU_ELEMENTWISE_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <concepts>
#include <cstdint>
#include <cstring>

#include "ops/cpu/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;

// A block is two fp32 vectors: 2N floats, or 2N bf16 values.
struct F32IO {
  using P = float;
  static constexpr bool kLite = false;
  static void Load(DF d, const float* p, VF& v0, VF& v1) {
    v0 = hn::LoadU(d, p);
    v1 = hn::LoadU(d, p + hn::Lanes(d));
  }
  template <bool kApprox = false>
  static void Store(DF d, VF v0, VF v1, float* p) {
    hn::StoreU(v0, d, p);
    hn::StoreU(v1, d, p + hn::Lanes(d));
  }
  // Every |x| <= lim in two blocks (x0..x3 loaded from p); false on NaN.
  static bool AllAbsLe(DF d, const float*, VF x0, VF x1, VF x2, VF x3, float lim) {
    const VF l = hn::Set(d, lim);
    const auto m01 = hn::And(hn::Le(hn::Abs(x0), l), hn::Le(hn::Abs(x1), l));
    const auto m23 = hn::And(hn::Le(hn::Abs(x2), l), hn::Le(hn::Abs(x3), l));
    return hn::AllTrue(d, hn::And(m01, m23));
  }
  static float ToFloat(float v) { return v; }
};

struct BF16IO {
  using P = uint16_t;
  static constexpr bool kLite = true;  // results keep 8 bits: the cheaper math variants suffice
  // v0 = elements 0, 2, 4, ... and v1 = elements 1, 3, 5, ... (little-endian pairs in u32 lanes).
  static void Load(DF d, const uint16_t* p, VF& v0, VF& v1) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no 16-bit view of a u32 vector
    v0 = hn::Set(d, ToFloat(p[0]));
    v1 = hn::Set(d, ToFloat(p[1]));
#else
    const DU du;
    const hn::Repartition<uint16_t, DU> d16;
    const auto w = hn::BitCast(du, hn::LoadU(d16, p));
    v0 = hn::BitCast(d, hn::ShiftLeft<16>(w));
    v1 = hn::BitCast(d, hn::And(w, hn::Set(du, 0xffff0000u)));
#endif
  }
  // Round to nearest even in the top 16 bits: u + 0x7fff + lsb. No NaN fix-up is needed: every
  // NaN here is a bf16 input's (low 16 bits zero) or the hardware default NaN (0x7fc00000 up to
  // sign), and adding at most 0x8000 to zero low bits never carries into the top half.
  // kApprox: ties away from zero (u + 0x8000), two ops fewer; only exact ties differ.
  template <bool kApprox>
  static hn::Vec<DU> Round(DF, VF v) {
    const DU du;
    const auto u = hn::BitCast(du, v);
    if (kApprox) return hn::Add(u, hn::Set(du, 0x8000u));
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    return hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), lsb);
  }
  template <bool kApprox = false>
  static void Store(DF d, VF v0, VF v1, uint16_t* p) {
#if HWY_TARGET == HWY_SCALAR
    p[0] = static_cast<uint16_t>(hn::GetLane(Round<kApprox>(d, v0)) >> 16);
    p[1] = static_cast<uint16_t>(hn::GetLane(Round<kApprox>(d, v1)) >> 16);
#else
    const hn::Repartition<uint16_t, DU> d16;
    // Odd u16 lanes (high halves) from v1, even (low) from v0 shifted down: one blend.
    const auto w = hn::OddEven(hn::BitCast(d16, Round<kApprox>(d, v1)),
                               hn::BitCast(d16, hn::ShiftRight<16>(Round<kApprox>(d, v0))));
    hn::StoreU(w, d16, p);
#endif
  }
  // Every |x| <= lim in the two blocks at p, tested on the bf16 bits (lim truncated to bf16,
  // which only narrows it): |bits| <= lim's bits as int16, false on NaN.
  static bool AllAbsLe(DF d, const uint16_t* p, VF x0, VF x1, VF x2, VF x3, float lim) {
#if HWY_TARGET == HWY_SCALAR
    return F32IO::AllAbsLe(d, nullptr, x0, x1, x2, x3, lim);
#else
    (void)d, (void)x0, (void)x1, (void)x2, (void)x3;
    const hn::Repartition<int16_t, DF> d16;
    uint32_t lb;
    std::memcpy(&lb, &lim, 4);
    const auto l = hn::Set(d16, static_cast<int16_t>(lb >> 16)), m = hn::Set(d16, int16_t{0x7fff});
    const auto a = hn::And(hn::BitCast(d16, hn::LoadU(hn::Repartition<uint16_t, DF>(), p)), m);
    const auto b = hn::And(hn::BitCast(d16, hn::LoadU(hn::Repartition<uint16_t, DF>(), p + hn::Lanes(d16))), m);
    return hn::AllFalse(d16, hn::Or(hn::Gt(a, l), hn::Gt(b, l)));
#endif
  }
  static float ToFloat(uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kCubic = 0.044715f;

// 2u for gelu-tanh: gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u).
HWY_INLINE VF GeluTanh2U(DF d, VF x) {
  return hn::Mul(x, hn::MulAdd(hn::Set(d, 2.0f * kSqrt2OverPi * kCubic), hn::Mul(x, x), hn::Set(d, 2.0f * kSqrt2OverPi)));
}
// bf16 rows, |x| <= 9.5: e^-2u as 2^(x (a + b x^2)), log2(e) folded into a and b.
HWY_INLINE VF GeluTanhExpNeg2U(DF d, VF x) {
  constexpr float kA = -2.0f * kSqrt2OverPi * 1.44269504088896341f;
  return Exp2FastBf(d, hn::Mul(x, hn::MulAdd(hn::Set(d, kA * kCubic), hn::Mul(x, x), hn::Set(d, kA))));
}

// ---- op functors: (d, a, b) or (d, x) -> fp32 vector ----
// Unary functors with a fast formula for |x| <= kFastAbsMax (Fast; operator() handles any x and
// gives the same results on those lanes) let the row take one branch per four vectors, whose
// chains then interleave. Functors marked kApprox (the transcendental ones) may round bf16
// ties away from zero, as their fp32 values are approximations anyway.
template <class F>
concept Splits = requires(const F& f, DF d, VF v) {
  f.Fast(d, v);
  requires F::kFastAbsMax > 0.0f;
};
template <class F>
concept SplitsBinary = requires(const F& f, DF d, VF v) {  // the range is on b
  f.Fast(d, v, v);
  requires F::kFastAbsMax > 0.0f;
};
template <class F>
constexpr bool kApproxOf = requires { requires F::kApprox; };
// Functors whose fast formula is one long dependency chain (~85 cycles for f32 gelu) run eight
// vectors per branch: four chains leave Zen 2's two FMA pipes mostly idle.
template <class F>
constexpr bool kWideOf = requires { requires F::kWide; };

// Stack room for one block of the widest target: the padded copy that tails run through.
constexpr size_t kMaxBlock = 2 * HWY_MAX_BYTES / sizeof(float);

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#endif  // KILN_OPS_CPU_ELEMENTWISE_SIMD_INL_H_
