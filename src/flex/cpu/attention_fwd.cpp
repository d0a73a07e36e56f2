// CPU FlexAttention forward: flash-style online softmax, one work unit per (b, q head, q block),
// OpenMP over units. A unit visits only the kv blocks its BlockMask row lists, in ascending order
// (partial and full merged, so the result never depends on the classification), applies
// score_mod everywhere and mask_mod on partial blocks only. Partial blocks of masks made of affine
// index comparisons (causal, sliding window, prefix...) evaluate the mask as runs (AffineMask) and
// compute only the panels of S and the terms of P V that hold kept entries (the same bits).
// Reads q, k, v; writes out and lse. Never materialises more than one QB x KB score tile per
// thread (fp32, fp64 for fp64 inputs): memory O(threads * tile), not O(L * S).
// Tiles are the BlockMask's blocks (128 x 128 by default): K^T (E x 128) and the score tile stay
// in L1/L2 for E <= 128.
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/tensor_impl.h"
#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {
namespace {

template <typename F>
bool has_nan(const F* s, int64_t n) {
  bool nan = false;
  for (int64_t c = 0; c < n; ++c) nan |= s[c] != s[c];
  return nan;
}

}  // namespace

template <typename T>
void flex_forward(const Problem& p, const T* q, const T* k, const T* v, T* out, acc_t<T>* lse, bool* index_error) {
  using F = acc_t<T>;
  const int64_t units = p.B * p.Hq * p.nQ, G = p.group();
  const F scale = static_cast<F>(p.scale);
  const F kNegInf = -std::numeric_limits<F>::infinity();
  bool err = false;
  // Per-thread tiles come from one kiln allocation, so memory statistics see them.
  const int64_t per_thread = p.QB * p.E + p.E * p.KB + p.KB * p.Ev + p.QB * p.KB + p.QB * p.Ev + 2 * p.QB;
  Tensor scratch = empty({omp_get_max_threads() * per_thread}, dtype_of<F>::value);
#pragma omp parallel reduction(|| : err) if (p.parallel())
  {
    Mods<F> mods(p);
    F* base = scratch.data_ptr<F>() + omp_get_thread_num() * per_thread;
    auto take = [&base](int64_t count) { F* r = base; base += count; return r; };
    F *qt = take(p.QB * p.E), *kt = take(p.E * p.KB), *vb = take(p.KB * p.Ev), *st = take(p.QB * p.KB),
      *acc = take(p.QB * p.Ev), *mrow = take(p.QB), *lrow = take(p.QB);
    std::vector<std::pair<int32_t, bool>> blocks;
    std::vector<int32_t> lo(static_cast<size_t>(p.QB)), hi(static_cast<size_t>(p.QB));
    std::vector<uint8_t> nan_row(static_cast<size_t>(p.QB));
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t i = u % p.nQ, bh = u / p.nQ, b = bh / p.Hq, h = bh % p.Hq, hk = h / G;
      const int64_t r0 = i * p.QB, m = std::min(p.QB, p.L - r0);
      const T* qb = q + (b * p.Hq + h) * p.L * p.E;
      const T* kb = k + (b * p.Hkv + hk) * p.S * p.E;
      const T* vbp = v + (b * p.Hkv + hk) * p.S * p.Ev;
      load_rows(qb, r0, m, p.E, qt);
      std::fill_n(acc, m * p.Ev, F(0));
      std::fill_n(mrow, m, kNegInf);
      std::fill_n(lrow, m, F(0));
      std::fill_n(nan_row.begin(), m, uint8_t{0});
      p.kv_blocks(b, h, i, blocks);
      for (const auto& [j, partial] : blocks) {
        const int64_t c0 = j * p.KB, n = std::min(p.KB, p.S - c0);
        load_transposed(kb, c0, n, p.E, kt);
        load_rows(vbp, c0, n, p.Ev, vb);
        // Partial blocks of affine masks: only the kept columns' panels and terms are computed.
        const bool ranged = kept_columns(mods, b, h, r0, m, c0, n, partial, lo.data(), hi.data());
        const int32_t *clo = ranged ? lo.data() : nullptr, *chi = ranged ? hi.data() : nullptr;
        score_tile(qt, kt, m, n, p.E, scale, st, p.KB, clo, chi);
        for (int64_t r = 0; r < m; ++r) {
          F* s = st + r * p.KB;
          mod_row(mods, p, s, b, h, r0 + r, c0, n, partial);
          // A NaN score makes the row's softmax NaN (as PyTorch's): the row is written as NaN at
          // the end and contributes nothing meanwhile (row_max and the exp would drop or garble it).
          if (nan_row[r] || has_nan(s, n)) {
            nan_row[r] = 1;
            std::fill_n(s, n, F(0));
            continue;
          }
          const F mx = row_max(s, n);
          const F m_new = mx > mrow[r] ? mx : mrow[r];
          if (m_new == kNegInf) {  // nothing attended yet in this row: contributes nothing
            std::fill_n(s, n, F(0));
            continue;
          }
          const F alpha = mrow[r] == kNegInf ? F(0) : std::exp(mrow[r] - m_new);
          const F sum = ranged ? exp_sum_range(s, n, m_new, lo[r], hi[r]) : exp_sum(s, n, m_new);
          lrow[r] = lrow[r] * alpha + sum;
          mrow[r] = m_new;
          if (alpha != F(1))
            for (int64_t e = 0; e < p.Ev; ++e) acc[r * p.Ev + e] *= alpha;
        }
        gemm<F>(st, p.KB, 1, vb, p.Ev, m, p.Ev, n, F(1), acc, p.Ev, true, clo, chi);  // acc += P V
      }
      T* ob = out + ((b * p.Hq + h) * p.L + r0) * p.Ev;
      F* lb = lse + (b * p.Hq + h) * p.L + r0;
      for (int64_t r = 0; r < m; ++r) {
        if (nan_row[r]) {
          std::fill_n(ob + r * p.Ev, p.Ev, cast_value<T>(std::numeric_limits<F>::quiet_NaN()));
          lb[r] = std::numeric_limits<F>::quiet_NaN();
          continue;
        }
        const F l = lrow[r];
        const F inv = l > F(0) ? F(1) / l : F(0);  // fully masked rows: output 0, lse -inf
        for (int64_t e = 0; e < p.Ev; ++e) ob[r * p.Ev + e] = cast_value<T>(acc[r * p.Ev + e] * inv);
        lb[r] = l > F(0) ? mrow[r] + std::log(l) : kNegInf;
      }
    }
    err = err || mods.error();
  }
  *index_error = err;
}

template void flex_forward<float>(const Problem&, const float*, const float*, const float*, float*, float*, bool*);
template void flex_forward<double>(const Problem&, const double*, const double*, const double*, double*, double*,
                                   bool*);
template void flex_forward<BFloat16>(const Problem&, const BFloat16*, const BFloat16*, const BFloat16*, BFloat16*,
                                     float*, bool*);
template void flex_forward<Half>(const Problem&, const Half*, const Half*, const Half*, Half*, float*, bool*);

}  // namespace kiln::flex::cpu
