#pragma once
// Per-token math of the fused linear cross-entropy, shared by the CPU and CUDA backends (plain
// C++, usable in device code): the loss of one token from its row statistics, and the three
// per-row coefficients that turn a row of probabilities into the logit gradient:
//
//   dL/ds_v = A * p_v - C * w_v - B * [v == y]
//     A = g (((1 - eps) w_y) + (eps / V) sum_u w_u) + g_z 2 lambda lse
//     B = g (1 - eps) w_y,   C = g eps / V
//   (g: the token's share of the upstream gradient of the loss, g_z: of the z-loss term), then
//   times (1 - (s_v / c)^2) under a soft-cap c.
#include <cstdint>

#ifdef __CUDACC__
#define KILN_LCE_HD __host__ __device__ __forceinline__
#else
#define KILN_LCE_HD inline
#endif

namespace kiln::lce {

enum class Red : int { Mean = 0, Sum = 1, None = 2 };

// Scalars of one call, copied by value into kernels.
struct Consts {
  int64_t n = 0, h = 0, v = 0;
  int64_t ignore_index = -100;
  double eps = 0.0;       // label smoothing
  double z_coef = 0.0;    // z-loss lambda
  double softcap = 0.0;   // 0: off
  Red red = Red::Mean;
  bool argmax = false;         // record each token's argmax (predicted tokens, accuracy)
  bool token_scaling = false;  // loss_n, z_n and the row's gradient times detached p(target)
};

// Token totals the reductions need: the class-weight sum of the targets, the number of
// non-ignored tokens, and the class-weight sum over the vocabulary (V without weights).
template <typename A>
struct Totals {
  A weight_sum = 0;   // sum over non-ignored tokens of w_{y_n}
  A count = 0;        // number of non-ignored tokens
  A class_sum = 0;    // sum_v w_v
  A invalid = 0;      // targets outside [0, V) that are not ignore_index (CUDA: makes the loss NaN)
};

KILN_LCE_HD bool is_ignored(int64_t y, const Consts& k) { return y == k.ignore_index; }

// loss_n without the z-loss: (1 - eps) w_y (lse - s_y) + (eps / V) (W lse - sum_v w_v s_v).
template <typename A>
KILN_LCE_HD A token_loss(A lse, A s_y, A w_y, A ws, A class_sum, const Consts& k) {
  const A eps = static_cast<A>(k.eps);
  A loss = (A(1) - eps) * w_y * (lse - s_y);
  if (k.eps != 0.0) loss += eps / static_cast<A>(k.v) * (class_sum * lse - ws);
  return loss;
}

// Upstream scale of one non-ignored token for the loss (g) and the z-loss (gz). `g_up` is the
// gradient of the reduced output (mean/sum) or of this token's entry (none).
template <typename A>
KILN_LCE_HD void token_scales(A g_up, const Totals<A>& t, const Consts& k, A& g, A& gz) {
  if (k.red == Red::Mean) {
    g = g_up / t.weight_sum;
    gz = g_up / t.count;
  } else {
    g = g_up;
    gz = g_up;
  }
}

template <typename A>
struct CoefT {
  A a = 0, b = 0, c = 0;
};

template <typename A>
KILN_LCE_HD CoefT<A> row_coef(A g, A gz, A lse, A w_y, A class_sum, const Consts& k) {
  const A eps = static_cast<A>(k.eps);
  CoefT<A> r;
  r.b = g * (A(1) - eps) * w_y;
  r.c = k.eps != 0.0 ? g * eps / static_cast<A>(k.v) : A(0);
  r.a = r.b + r.c * class_sum;
  if (k.z_coef != 0.0) r.a += gz * A(2) * static_cast<A>(k.z_coef) * lse;
  return r;
}

// Online logsumexp: merges (m2, s2) into (m, s), where s = sum exp(x - m).
template <typename A, typename ExpF>
KILN_LCE_HD void lse_merge(A& m, A& s, A m2, A s2, ExpF expf) {
  if (s2 == A(0)) return;
  if (s == A(0)) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

}  // namespace kiln::lce
