// Highway rows for the dense fp32 <-> bf16 conversions behind copy_ and to() (core/cpu/convert.h):
// autocast casts every matmul operand and gradient, so these run on most activations each step.
// fp32 -> bf16 gives BFloat16::from_float's bits: round to nearest even, NaN kept quiet
// ((u >> 16) | 0x40). Tails run the same vector code on a padded stack copy.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/cpu/convert_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>

#include "core/cpu/convert.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using CvDI = hn::ScalableTag<int32_t>;
using CvDU16 = hn::Rebind<uint16_t, CvDI>;
constexpr size_t kCvMaxLanes = HWY_MAX_BYTES / sizeof(float);

// One vector of fp32 bits (as int32) -> bf16 bits, in order.
HWY_INLINE hn::Vec<CvDU16> RoundToBf16(CvDI di, hn::Vec<CvDI> u) {
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(di, 1));
  // Logical shift of u + 0x7fff + lsb: mask off the sign bits an arithmetic shift brings in.
  const auto rounded = hn::And(hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(di, 0x7fff)), lsb)), hn::Set(di, 0xffff));
  const auto nan = hn::Gt(hn::And(u, hn::Set(di, 0x7fffffff)), hn::Set(di, 0x7f800000));
  const auto quiet = hn::Or(hn::And(hn::ShiftRight<16>(u), hn::Set(di, 0xffff)), hn::Set(di, 0x40));
  return hn::DemoteTo(CvDU16(), hn::IfThenElse(nan, quiet, rounded));  // values <= 0xffff: no saturation
}

void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  const CvDI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));
  const auto* s = reinterpret_cast<const int32_t*>(src);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(RoundToBf16(di, hn::LoadU(di, s + i)), CvDU16(), dst + i);
  if (i == n) return;
  const size_t rest = static_cast<size_t>(n - i);
  HWY_ALIGN int32_t tin[kCvMaxLanes] = {};
  HWY_ALIGN uint16_t tout[kCvMaxLanes] = {};
  std::memcpy(tin, s + i, rest * sizeof(float));
  hn::Store(RoundToBf16(di, hn::Load(di, tin)), CvDU16(), tout);
  std::memcpy(dst + i, tout, rest * sizeof(uint16_t));
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  const CvDI di;
  const CvDU16 d16;
  const hn::RebindToUnsigned<CvDI> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di));
  auto* d = reinterpret_cast<uint32_t*>(dst);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, src + i))), du, d + i);
  for (; i < n; ++i) d[i] = static_cast<uint32_t>(src[i]) << 16;
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu {
namespace simd {
HWY_EXPORT(F32ToBf16);
HWY_EXPORT(Bf16ToF32);
}  // namespace simd

void convert_f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(simd::F32ToBf16)(src, dst, n);
}
void convert_bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(simd::Bf16ToF32)(src, dst, n);
}
}  // namespace kiln::cpu
#endif
