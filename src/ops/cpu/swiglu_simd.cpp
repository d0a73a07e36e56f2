// Highway SIMD rows of swiglu on fp32 (ops/cpu/swiglu.h): one read of gate and up and one write
// each way, with sigmoid and 1 - sigmoid from one exp (SigmoidPair). Tails run the same vector code
// on a padded stack copy, so an element's result never depends on where it sits.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/swiglu_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>

#include "ops/cpu/swiglu.h"
#include "ops/cpu/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using SwDF = hn::ScalableTag<float>;
using SwVF = hn::Vec<SwDF>;
constexpr size_t kSwMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Runs step(d, inputs, outputs) on each whole vector, then once on zero-padded copies for the tail
// (pointers, not vector arrays: sizeless SVE vectors cannot form arrays).
template <int kIn, int kOut, class Step>
HWY_INLINE void Rows(const float* const (&in)[kIn], float* const (&out)[kOut], int64_t n, const Step& step) {
  const SwDF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const float* pi[kIn];
    float* po[kOut];
    for (int k = 0; k < kIn; ++k) pi[k] = in[k] + i;
    for (int k = 0; k < kOut; ++k) po[k] = out[k] + i;
    step(d, pi, po);
  }
  if (i == n) return;
  const size_t rest = static_cast<size_t>(n - i);
  HWY_ALIGN float tin[kIn][kSwMaxLanes] = {};
  HWY_ALIGN float tout[kOut][kSwMaxLanes] = {};
  const float* pi[kIn];
  float* po[kOut];
  for (int k = 0; k < kIn; ++k) std::memcpy(tin[k], in[k] + i, rest * sizeof(float)), pi[k] = tin[k];
  for (int k = 0; k < kOut; ++k) po[k] = tout[k];
  step(d, pi, po);
  for (int k = 0; k < kOut; ++k) std::memcpy(out[k] + i, tout[k], rest * sizeof(float));
}

void SwigluForwardF32(const float* gate, const float* up, float* out, int64_t n) {
  Rows<2, 1>({gate, up}, {out}, n, [](SwDF d, const float* const* in, float* const* o) {
    const SwVF g = hn::LoadU(d, in[0]);
    SwVF s, s1m;
    SigmoidPair(d, g, s, s1m);
    hn::StoreU(hn::Mul(hn::Mul(g, s), hn::LoadU(d, in[1])), d, o[0]);
  });
}

// d/dg silu(g) u = u s (1 + g (1 - s)); d/du = silu(g).
void SwigluBackwardF32(const float* grad, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
  Rows<3, 2>({grad, gate, up}, {dgate, dup}, n, [](SwDF d, const float* const* in, float* const* o) {
    const SwVF dy = hn::LoadU(d, in[0]), g = hn::LoadU(d, in[1]), u = hn::LoadU(d, in[2]);
    SwVF s, s1m;
    SigmoidPair(d, g, s, s1m);
    const SwVF dys = hn::Mul(dy, s);
    hn::StoreU(hn::Mul(hn::Mul(dys, u), hn::MulAdd(g, s1m, hn::Set(d, 1.0f))), d, o[0]);
    hn::StoreU(hn::Mul(dys, g), d, o[1]);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu::simd {
HWY_EXPORT(SwigluForwardF32);
HWY_EXPORT(SwigluBackwardF32);

void swiglu_forward_f32(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluForwardF32)(gate, up, out, n);
}
void swiglu_backward_f32(const float* grad, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluBackwardF32)(grad, gate, up, dgate, dup, n);
}
}  // namespace kiln::cpu::simd
#endif
