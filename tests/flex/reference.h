#pragma once
// Float64 dense FlexAttention reference for the tests: scores materialised, score/mask functions
// written as plain C++ (independent of the IR), softmax, @ v, in plain loops.
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::flex::testing {

using ScoreFn = std::function<double(double, int64_t, int64_t, int64_t, int64_t)>;
using MaskFn = std::function<bool(int64_t, int64_t, int64_t, int64_t)>;

// -> (out [B, Hq, L, Ev] f64, lse [B, Hq, L] f64)
inline std::pair<Tensor, Tensor> reference(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreFn& score,
                                           const MaskFn& mask, double scale = 0) {
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), E = q.size(3), Hkv = k.size(1), S = k.size(2),
                Ev = v.size(3), G = Hq / Hkv;
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(E));
  const std::vector<double> Q = q.contiguous().to_vector(), K = k.contiguous().to_vector(),
                            V = v.contiguous().to_vector();
  std::vector<double> out(static_cast<size_t>(B * Hq * L * Ev), 0.0), lse(static_cast<size_t>(B * Hq * L));
  std::vector<double> s(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t hk = h / G;
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          double d = 0;
          for (int64_t e = 0; e < E; ++e) d += Q[((b * Hq + h) * L + i) * E + e] * K[((b * Hkv + hk) * S + j) * E + e];
          d *= scale;
          if (score) d = score(d, b, h, i, j);
          if (mask && !mask(b, h, i, j)) d = -INFINITY;
          s[j] = d;
          mx = std::max(mx, d);
        }
        const int64_t row = (b * Hq + h) * L + i;
        if (mx == -INFINITY) {
          lse[row] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - mx);
        lse[row] = mx + std::log(sum);
        for (int64_t j = 0; j < S; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          for (int64_t e = 0; e < Ev; ++e) out[row * Ev + e] += p * V[((b * Hkv + hk) * S + j) * Ev + e];
        }
      }
  return {tensor(out, kFloat64).view({B, Hq, L, Ev}), tensor(lse, kFloat64).view({B, Hq, L})};
}

// A one-batch, one-head BlockMask listing the same blocks as `bm`, every one as partial (no full
// lists): results must not depend on the classification.
inline BlockMask all_partial(const BlockMask& bm, int64_t block_size) {
  const int64_t nQ = bm.num_q_blocks(), nKV = bm.num_kv_blocks();
  const Tensor dense = bm.to_dense();
  Tensor num = zeros({1, 1, nQ}, kInt32), idx = zeros({1, 1, nQ, nKV}, kInt32);
  const int32_t* d = dense.data_ptr<int32_t>();
  for (int64_t i = 0; i < nQ; ++i) {
    int32_t n = 0;
    for (int64_t j = 0; j < nKV; ++j)
      if (d[i * nKV + j]) idx.data_ptr<int32_t>()[i * nKV + n++] = static_cast<int32_t>(j);
    num.data_ptr<int32_t>()[i] = n;
  }
  return BlockMask::from_kv_blocks(num, idx, Tensor(), Tensor(), bm.q_len, bm.kv_len, block_size, bm.mask_mod);
}

}  // namespace kiln::flex::testing
