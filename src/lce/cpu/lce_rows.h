#pragma once
// Row passes of the fused linear cross-entropy over one row of an fp32 (or fp64) logit tile, in
// place. float: Highway SIMD (lce_rows.cpp, dynamic dispatch, hwy::contrib exp/tanh); double:
// the plain loops below (gradchecks and references only). Each pass reads the row once while it
// sits in L1/L2; lane-wise partial sums are combined in a fixed order, so a row's result never
// depends on threads.
#include <cmath>
#include <cstdint>

namespace kiln::lce::rows {

// z[v] = softcap(z[v] + bias[v]) (cap > 0; bias may be null); returns max_v z[v] and, when
// `ws` is non-null, *ws = sum_v w[v] z[v] (w null: plain sum).
float prep_max(float* z, int64_t n, const float* bias, float cap, const float* w, float* ws);
// sum_v exp(z[v] - m)
float sum_exp(const float* z, int64_t n, float m);
// z[v] <- (a exp(s - lse) - c w[v]) * (cap > 0 ? 1 - (s / cap)^2 : 1), where s = z[v] when
// `raw` is false (the tile already holds soft-capped logits) and s = softcap(z[v] + bias[v])
// when it is true.
void grad(float* z, int64_t n, const float* bias, float cap, bool raw, float lse, float a, float c, const float* w);

// ---- double: plain loops ----
inline double softcap_of(double z, double cap) { return cap > 0 ? cap * std::tanh(z / cap) : z; }

inline double prep_max(double* z, int64_t n, const double* bias, double cap, const double* w, double* ws) {
  double m = -INFINITY, acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double s = softcap_of(z[i] + (bias ? bias[i] : 0.0), cap);
    z[i] = s;
    m = s > m ? s : m;
    acc += (w ? w[i] : 1.0) * s;
  }
  if (ws) *ws = acc;
  return m;
}
inline double sum_exp(const double* z, int64_t n, double m) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(z[i] - m);
  return s;
}
inline void grad(double* z, int64_t n, const double* bias, double cap, bool raw, double lse, double a, double c,
                 const double* w) {
  for (int64_t i = 0; i < n; ++i) {
    const double s = raw ? softcap_of(z[i] + (bias ? bias[i] : 0.0), cap) : z[i];
    double d = a * std::exp(s - lse) - c * (w ? w[i] : 1.0);
    if (cap > 0) d *= 1.0 - (s / cap) * (s / cap);
    z[i] = d;
  }
}

}  // namespace kiln::lce::rows
