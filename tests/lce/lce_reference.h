#pragma once
// Float64 plain-loop reference of the fused linear cross-entropy: logits, soft-cap, log-softmax,
// label smoothing, class weights, ignore_index, z-loss, token scaling, reductions, the predicted
// tokens (first maximum; -1 where ignored), and the gradients of sum(cot * loss) with respect to
// x, W and b from the closed-form formula.
#include <cmath>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/lce.h"

namespace kiln::lce_test {

struct RefIn {
  int64_t n, h, v;
  std::vector<double> x, w, b, cw;  // b, cw empty when absent
  std::vector<int64_t> y;
  nn::functional::LinearCrossEntropyOptions o;
  // The type the op stores x W^T in before bias and soft-cap: bf16/fp16 for 16-bit CUDA tiles
  // (one rounding of the fp32 sum, as torch's linear makes); kFloat64 keeps the logits exact.
  DType logits = kFloat64;
};

inline double round_logit(double z, DType d) {
  const float f = static_cast<float>(z);  // the GEMM's fp32 sum, then one rounding to d
  if (d == kBFloat16) return static_cast<float>(BFloat16(f));
  if (d == kFloat16) return static_cast<float>(Half(f));
  return z;
}

struct RefOut {
  std::vector<double> loss;  // 1 element (mean/sum) or n (none)
  std::vector<double> lse;   // n
  double zterm_reduced = 0;
  std::vector<double> dx, dw, db;
  std::vector<int64_t> predicted;  // n
};

inline RefOut reference(const RefIn& in, const std::vector<double>& cot) {
  using nn::functional::Reduction;
  const int64_t N = in.n, H = in.h, V = in.v;
  const auto& o = in.o;
  const double eps = o.label_smoothing, lam = o.z_loss, cap = o.logit_softcap;
  auto wv = [&](int64_t j) { return in.cw.empty() ? 1.0 : in.cw[j]; };
  double class_sum = 0;
  for (int64_t j = 0; j < V; ++j) class_sum += wv(j);
  double wsum = 0, cnt = 0;
  for (int64_t i = 0; i < N; ++i)
    if (in.y[i] != o.ignore_index) {
      wsum += wv(in.y[i]);
      cnt += 1;
    }
  RefOut r;
  r.lse.assign(N, 0);
  r.dx.assign(N * H, 0);
  r.dw.assign(V * H, 0);
  r.db.assign(V, 0);
  std::vector<double> loss_tok(N, 0), z_tok(N, 0), scale(N, 1.0), s(V), zraw(V);
  r.predicted.assign(N, -1);
  std::vector<std::vector<double>> srows(N, std::vector<double>(V));
  for (int64_t i = 0; i < N; ++i) {
    double m = -INFINITY;
    for (int64_t j = 0; j < V; ++j) {
      double z = 0;
      for (int64_t k = 0; k < H; ++k) z += in.x[i * H + k] * in.w[j * H + k];
      z = round_logit(z, in.logits) + (in.b.empty() ? 0.0 : in.b[j]);
      srows[i][j] = cap > 0 ? cap * std::tanh(z / cap) : z;
      m = std::max(m, srows[i][j]);
    }
    double se = 0;
    for (int64_t j = 0; j < V; ++j) se += std::exp(srows[i][j] - m);
    const double lse = m + std::log(se);
    r.lse[i] = lse;
    const int64_t y = in.y[i];
    if (y == o.ignore_index) continue;
    for (int64_t j = 0; j < V; ++j)
      if (srows[i][j] == m) {
        r.predicted[i] = j;
        break;
      }
    double smooth = 0;
    for (int64_t j = 0; j < V; ++j) smooth += wv(j) * (lse - srows[i][j]);
    loss_tok[i] = (1 - eps) * wv(y) * (lse - srows[i][y]) + eps / V * smooth;
    z_tok[i] = lam * lse * lse;
    if (o.use_token_scaling) {  // a detached factor: it scales the gradient, is not differentiated
      scale[i] = std::exp(srows[i][y] - lse);
      loss_tok[i] *= scale[i];
      z_tok[i] *= scale[i];
    }
  }
  const bool none = o.reduction == Reduction::None, mean = o.reduction == Reduction::Mean;
  if (none) {
    r.loss.resize(N);
    for (int64_t i = 0; i < N; ++i) r.loss[i] = loss_tok[i] + z_tok[i];
  } else {
    double l = 0, z = 0;
    for (int64_t i = 0; i < N; ++i) {
      l += loss_tok[i];
      z += z_tok[i];
    }
    if (mean) {
      l /= wsum;
      z /= cnt;
    }
    r.loss = {l + (lam != 0 ? z : 0.0)};
    r.zterm_reduced = lam != 0 ? z : 0.0;
  }
  // Gradients of sum(cot * loss).
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = in.y[i];
    if (y == o.ignore_index) continue;
    const double gup = (none ? cot[i] : cot[0]) * scale[i];
    const double g = mean ? gup / wsum : gup, gz = mean ? gup / cnt : gup;
    std::vector<double> dz(V);
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(srows[i][j] - r.lse[i]);
      double d = g * ((1 - eps) * wv(y) * (p - (j == y ? 1.0 : 0.0)) + eps / V * (class_sum * p - wv(j))) +
                 gz * 2 * lam * r.lse[i] * p;
      if (cap > 0) d *= 1 - (srows[i][j] / cap) * (srows[i][j] / cap);
      dz[j] = d;
    }
    for (int64_t j = 0; j < V; ++j) {
      r.db[j] += dz[j];
      for (int64_t k = 0; k < H; ++k) {
        r.dx[i * H + k] += dz[j] * in.w[j * H + k];
        r.dw[j * H + k] += dz[j] * in.x[i * H + k];
      }
    }
  }
  return r;
}

}  // namespace kiln::lce_test
