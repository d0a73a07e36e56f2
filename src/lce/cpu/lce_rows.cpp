// SIMD row passes of the fused linear cross-entropy (fp32 tiles), compiled for every Highway
// target and picked at run time. Each function streams one tile row (a few KiB, in L1/L2) once:
// prep_max applies bias + soft-cap in place and takes the max (and the weighted logit sum for
// label smoothing), sum_exp the sum of exp(z - max), grad turns the row into dL/dz in place.
// Partial sums live in vector lanes and are combined by SumOfLanes, a fixed order; tails are
// scalar. The tail uses std::exp/std::tanh, so a row's result depends only on its length.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lce/cpu/lce_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cmath>
#include <cstdint>

#include "lce/cpu/lce_rows.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::lce::rows {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline float scap(float z, float cap) { return cap > 0 ? cap * std::tanh(z / cap) : z; }

float PrepMaxF(float* z, int64_t n, const float* bias, float cap, const float* w, float* ws) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vcap = hn::Set(d, cap), vinv = hn::Set(d, cap > 0 ? 1.0f / cap : 0.0f);
  auto vmax = hn::Set(d, -INFINITY), vws = hn::Zero(d);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    auto v = hn::LoadU(d, z + i);
    if (bias) v = hn::Add(v, hn::LoadU(d, bias + i));
    if (cap > 0) v = hn::Mul(vcap, hn::Tanh(d, hn::Mul(v, vinv)));
    hn::StoreU(v, d, z + i);
    vmax = hn::Max(vmax, v);
    if (ws) vws = w ? hn::MulAdd(hn::LoadU(d, w + i), v, vws) : hn::Add(vws, v);
  }
  float m = hn::GetLane(hn::MaxOfLanes(d, vmax));
  float acc = ws ? hn::GetLane(hn::SumOfLanes(d, vws)) : 0.0f;
  for (; i < n; ++i) {
    const float s = scap(z[i] + (bias ? bias[i] : 0.0f), cap);
    z[i] = s;
    m = s > m ? s : m;
    acc += (w ? w[i] : 1.0f) * s;
  }
  if (ws) *ws = acc;
  return m;
}

float SumExpF(const float* z, int64_t n, float m) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, m);
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {  // two chains hide the exp latency
    acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, z + i), vm)));
    acc1 = hn::Add(acc1, hn::Exp(d, hn::Sub(hn::LoadU(d, z + i + L), vm)));
  }
  for (; i + L <= n; i += L) acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, z + i), vm)));
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += std::exp(z[i] - m);
  return s;
}

void GradF(float* z, int64_t n, const float* bias, float cap, bool raw, float lse, float a, float c,
           const float* w) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vcap = hn::Set(d, cap), vinv = hn::Set(d, cap > 0 ? 1.0f / cap : 0.0f);
  const auto vlse = hn::Set(d, lse), va = hn::Set(d, a), vc = hn::Set(d, c), one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    auto s = hn::LoadU(d, z + i);
    if (raw) {
      if (bias) s = hn::Add(s, hn::LoadU(d, bias + i));
      if (cap > 0) s = hn::Mul(vcap, hn::Tanh(d, hn::Mul(s, vinv)));
    }
    auto g = hn::Mul(va, hn::Exp(d, hn::Sub(s, vlse)));
    if (c != 0.0f) g = hn::NegMulAdd(vc, w ? hn::LoadU(d, w + i) : one, g);
    if (cap > 0) {
      const auto t = hn::Mul(s, vinv);
      g = hn::Mul(g, hn::NegMulAdd(t, t, one));
    }
    hn::StoreU(g, d, z + i);
  }
  for (; i < n; ++i) {
    const float s = raw ? scap(z[i] + (bias ? bias[i] : 0.0f), cap) : z[i];
    float g = a * std::exp(s - lse);
    if (c != 0.0f) g -= c * (w ? w[i] : 1.0f);
    if (cap > 0) g *= 1.0f - (s / cap) * (s / cap);
    z[i] = g;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kiln::lce::rows
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::lce::rows {
HWY_EXPORT(PrepMaxF);
HWY_EXPORT(SumExpF);
HWY_EXPORT(GradF);

float prep_max(float* z, int64_t n, const float* bias, float cap, const float* w, float* ws) {
  return HWY_DYNAMIC_DISPATCH(PrepMaxF)(z, n, bias, cap, w, ws);
}
float sum_exp(const float* z, int64_t n, float m) { return HWY_DYNAMIC_DISPATCH(SumExpF)(z, n, m); }
void grad(float* z, int64_t n, const float* bias, float cap, bool raw, float lse, float a, float c, const float* w) {
  HWY_DYNAMIC_DISPATCH(GradF)(z, n, bias, cap, raw, lse, a, c, w);
}
}  // namespace kiln::lce::rows
#endif
