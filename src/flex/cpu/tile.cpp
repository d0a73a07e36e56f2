// Tile primitives shared by the CPU forward and backward. Defined once (never inlined into the
// two kernels separately) so a score recomputed in the backward is bit-for-bit the forward's.
// score_tile keeps a 4 x 16 block of accumulators in registers and streams the transposed K block
// (E x n, contiguous rows): every element is summed over e in order, whatever its tile position.
#include <algorithm>
#include <cmath>
#include <limits>

#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {

void Problem::kv_blocks(int64_t b, int64_t h, int64_t i, std::vector<std::pair<int32_t, bool>>& out) const {
  out.clear();
  if (all_full) {
    for (int64_t j = 0; j < nKV; ++j) out.emplace_back(static_cast<int32_t>(j), false);
    return;
  }
  const int64_t r = mask_bh(b, h) * nQ + i;
  const int32_t *pa = kv_idx + r * kv_m, *pe = pa + kv_num[r];
  const int32_t *fa = fkv_idx + r * fkv_m, *fe = fa + fkv_num[r];
  while (pa < pe || fa < fe) {
    if (fa == fe || (pa < pe && *pa < *fa)) out.emplace_back(*pa++, true);
    else out.emplace_back(*fa++, false);
  }
}

void Problem::q_blocks(int64_t b, int64_t h, int64_t j, std::vector<std::pair<int32_t, bool>>& out) const {
  out.clear();
  if (all_full) {
    for (int64_t i = 0; i < nQ; ++i) out.emplace_back(static_cast<int32_t>(i), false);
    return;
  }
  const int64_t r = mask_bh(b, h) * nKV + j;
  const int32_t *pa = q_idx + r * q_m, *pe = pa + q_num[r];
  const int32_t *fa = fq_idx + r * fq_m, *fe = fa + fq_num[r];
  while (pa < pe || fa < fe) {
    if (fa == fe || (pa < pe && *pa < *fa)) out.emplace_back(*pa++, true);
    else out.emplace_back(*fa++, false);
  }
}

template <typename F>
Mods<F>::Mods(const Problem& p) {
  if (p.score) score = std::make_unique<detail::RowEval<F>>(*p.score, p.KB);
  if (p.mask) mask = std::make_unique<detail::RowEval<F>>(*p.mask, p.KB);
}

namespace {

constexpr int64_t kR = 4, kC = 16;

template <typename F>
inline void micro(const F* a, const F* bt, int64_t n, int64_t E, F scale, F* s, int64_t ld) {
  F acc[kR][kC] = {};
  for (int64_t e = 0; e < E; ++e) {
    const F* brow = bt + e * n;
    for (int64_t i = 0; i < kR; ++i) {
      const F ai = a[i * E + e];
      for (int64_t c = 0; c < kC; ++c) acc[i][c] += ai * brow[c];
    }
  }
  for (int64_t i = 0; i < kR; ++i)
    for (int64_t c = 0; c < kC; ++c) s[i * ld + c] = acc[i][c] * scale;
}

template <typename F>
inline void edge(const F* a, const F* bt, int64_t rows, int64_t cols, int64_t n, int64_t E, F scale, F* s,
                 int64_t ld) {
  F acc[kR][kC] = {};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c) acc[i][c] += a[i * E + e] * bt[e * n + c];
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) s[i * ld + c] = acc[i][c] * scale;
}

}  // namespace

template <typename F>
void score_tile(const F* a, const F* bt, int64_t m, int64_t n, int64_t E, F scale, F* s, int64_t ld) {
  for (int64_t r = 0; r < m; r += kR) {
    const int64_t rows = std::min(kR, m - r);
    for (int64_t c = 0; c < n; c += kC) {
      const int64_t cols = std::min(kC, n - c);
      if (rows == kR && cols == kC) micro(a + r * E, bt + c, n, E, scale, s + r * ld + c, ld);
      else edge(a + r * E, bt + c, rows, cols, n, E, scale, s + r * ld + c, ld);
    }
  }
}

template <typename F>
void mod_row(Mods<F>& mods, const Problem& p, F* s, int64_t b, int64_t h, int64_t q, int64_t c0, int64_t n,
             bool partial) {
  if (mods.score) {
    mods.score->run(b, h, q, c0, n, s);
    std::copy_n(mods.score->float_result(), n, s);
  }
  if (partial && mods.mask) {
    mods.mask->run(b, h, q, c0, n, nullptr);
    const uint8_t* keep = mods.mask->bool_result();
    for (int64_t c = 0; c < n; ++c)
      if (!keep[c]) s[c] = -std::numeric_limits<F>::infinity();
  }
}

template <typename T, typename F>
void load_rows(const T* src, int64_t r0, int64_t m, int64_t D, F* dst) {
  const T* p = src + r0 * D;
  for (int64_t i = 0; i < m * D; ++i) dst[i] = cast_value<F>(p[i]);
}

template <typename T, typename F>
void load_transposed(const T* src, int64_t r0, int64_t n, int64_t D, F* dst) {
  const T* p = src + r0 * D;
  for (int64_t c = 0; c < n; ++c)
    for (int64_t d = 0; d < D; ++d) dst[d * n + c] = cast_value<F>(p[c * D + d]);
}

#define KILN_FLEX_INSTANTIATE_F(F)                                                                              \
  template struct Mods<F>;                                                                                      \
  template void score_tile<F>(const F*, const F*, int64_t, int64_t, int64_t, F, F*, int64_t);                   \
  template void mod_row<F>(Mods<F>&, const Problem&, F*, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
KILN_FLEX_INSTANTIATE_F(float)
KILN_FLEX_INSTANTIATE_F(double)
#define KILN_FLEX_INSTANTIATE_T(T)                                                           \
  template void load_rows<T, acc_t<T>>(const T*, int64_t, int64_t, int64_t, acc_t<T>*);      \
  template void load_transposed<T, acc_t<T>>(const T*, int64_t, int64_t, int64_t, acc_t<T>*);
KILN_FLEX_INSTANTIATE_T(float)
KILN_FLEX_INSTANTIATE_T(double)
KILN_FLEX_INSTANTIATE_T(BFloat16)
KILN_FLEX_INSTANTIATE_T(Half)

}  // namespace kiln::flex::cpu
