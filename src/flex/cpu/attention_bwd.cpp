// CPU FlexAttention backward, deterministic without atomics, in two passes that recompute the
// scores with the forward's own tile functions (score_tile, mod_row) and P = exp(S - lse):
//   pass 1, per (b, q head, q block): dQ = scale * sum over its kv blocks of dS K, blocks ascending;
//   pass 2, per (b, kv head, kv block): dV = sum P^T dO and dK = scale * sum dS^T Q over the
//           group's q heads and the block's q blocks (the BlockMask's transposed q_* lists), in
//           ascending order; gradients of captured score_mod tensors are summed here, per fixed
//           slot of consecutive units, and the slots are added in order: the same bits for any
//           thread count.
// Fused (the default where the pairs are few, e.g. a sliding window): pass 2 also writes each
// (q block, kv block) pair's dS K to its own slot and dQ sums a q block's slots in pass 1's order,
// so P and dS are recomputed once per tile instead of twice, with the same bits.
// dS = P * (dP - delta) with dP = dO V^T and delta = rowsum(dO * O) - dlse; a score_mod's own
// derivative is applied row by row by its reverse pass. Memory: a few tiles per thread, plus
// delta [B, Hq, L], the fused path's dQ slots (at most max(32 MB, 8 x dQ)) and the captured-gradient
// slot buffers (bounded to 256 MB, not yet counted in kiln's memory statistics).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "core/tensor_impl.h"
#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {
namespace {

// One thread's tiles, carved from a kiln allocation (so memory statistics see them); `extra`
// holds dQ (pass 1) or dK and dV (pass 2).
template <typename F>
struct Tiles {
  F *qt, *dot, *kt, *vt, *kr, *st, *dp, *dsc, *extra;
  // Kept-column bounds per q row, kept-row bounds per kv column (partial blocks of affine masks).
  std::vector<int32_t> lo, hi, rlo, rhi;
  bool ranged = false;
  static int64_t size(const Problem& p) {
    return p.QB * p.E + p.QB * p.Ev + p.E * p.KB + p.Ev * p.KB + p.KB * p.E + 2 * p.QB * p.KB + p.KB +
           std::max(p.QB * p.E, p.KB * (p.E + p.Ev));
  }
  Tiles(const Problem& p, F* base) {
    auto take = [&base](int64_t count) { F* r = base; base += count; return r; };
    qt = take(p.QB * p.E);
    dot = take(p.QB * p.Ev);
    kt = take(p.E * p.KB);
    vt = take(p.Ev * p.KB);
    kr = take(p.KB * p.E);
    st = take(p.QB * p.KB);
    dp = take(p.QB * p.KB);
    dsc = take(p.KB);
    extra = base;
    lo.resize(static_cast<size_t>(p.QB));
    hi.resize(static_cast<size_t>(p.QB));
    rlo.resize(static_cast<size_t>(p.KB));
    rhi.resize(static_cast<size_t>(p.KB));
  }
  const int32_t* klo() const { return ranged ? lo.data() : nullptr; }
  const int32_t* khi() const { return ranged ? hi.data() : nullptr; }
  const int32_t* kvlo() const { return ranged ? rlo.data() : nullptr; }
  const int32_t* kvhi() const { return ranged ? rhi.data() : nullptr; }
};

// Recomputes P (in st) and dS (in dp) for a q block x kv block tile whose q rows / dO rows are in
// t.qt / t.dot and K^T / V^T in t.kt / t.vt. When `grads` is given, score_mod gradients of captured
// tensors are added to it (row order).
template <typename F>
void recompute_tile(const Problem& p, Mods<F>& mods, Tiles<F>& t, int64_t b, int64_t h, int64_t r0, int64_t m,
                    int64_t c0, int64_t n, bool partial, const F* lse, const F* delta,
                    std::vector<std::vector<double>>* grads) {
  const F kNegInf = -std::numeric_limits<F>::infinity();
  // Skipped columns would reach a score_mod's derivative as 0 * f'(0): only without a score_mod.
  t.ranged = !mods.score && kept_columns(mods, b, h, r0, m, c0, n, partial, t.lo.data(), t.hi.data());
  if (t.ranged) kept_rows(t.lo.data(), t.hi.data(), m, n, t.rlo.data(), t.rhi.data());
  score_tile(t.qt, t.kt, m, n, p.E, static_cast<F>(p.scale), t.st, p.KB, t.klo(), t.khi());
  score_tile(t.dot, t.vt, m, n, p.Ev, F(1), t.dp, p.KB, t.klo(), t.khi());
  static std::vector<std::vector<double>> no_grads;
  for (int64_t r = 0; r < m; ++r) {
    F* s = t.st + r * p.KB;
    F* d = t.dp + r * p.KB;
    mod_row(mods, p, s, b, h, r0 + r, c0, n, partial);
    const F l = lse[r], dl = delta[r];
    if (l == kNegInf) std::fill_n(s, n, F(0));  // fully masked row
    else if (t.ranged) exp_sum_range(s, n, l, t.lo[r], t.hi[r]);
    else exp_sum(s, n, l);
    for (int64_t c = 0; c < n; ++c) d[c] = s[c] * (d[c] - dl);
    if (mods.score) {  // chain through score_mod: d raw score = dS * d(mod)/d(score)
      mods.score->backward(d, t.dsc, grads ? *grads : no_grads);
      std::copy_n(t.dsc, n, d);
    }
  }
}

std::atomic<int64_t> g_fused_limit{int64_t{32} << 20};

}  // namespace

void set_fused_backward_limit(int64_t bytes) { g_fused_limit = bytes; }

template <typename T>
void flex_backward(const Problem& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                   const acc_t<T>* lse, const acc_t<T>* dlse, T* dq, T* dk, T* dv,
                   std::vector<std::vector<double>>& grads, bool* index_error) {
  using F = acc_t<T>;
  const int64_t G = p.group(), rows = p.B * p.Hq * p.L;
  const F scale = static_cast<F>(p.scale);
  // delta = rowsum(dO * O) - dlse
  Tensor delta_t = empty({rows}, dtype_of<F>::value);
  F* delta = delta_t.data_ptr<F>();
  Tensor scratch = empty({omp_get_max_threads() * Tiles<F>::size(p)}, dtype_of<F>::value);
#pragma omp parallel for schedule(static) if (p.parallel())
  for (int64_t r = 0; r < rows; ++r) {
    F s = 0;
    if (dout)
      for (int64_t e = 0; e < p.Ev; ++e) s += cast_value<F>(dout[r * p.Ev + e]) * cast_value<F>(out[r * p.Ev + e]);
    delta[r] = s - (dlse ? dlse[r] : F(0));
  }
  bool err = false;

  // Fused backward: where the (q block, kv block) pairs are few (a sparse BlockMask), pass 2 also
  // writes each pair's dS K into its own slot, and dQ sums a q block's slots in ascending kv
  // order: the additions of pass 1, in its order, so the same bits, without recomputing P and dS.
  const int64_t units1 = p.B * p.Hq * p.nQ;
  std::vector<int64_t> pair_off(static_cast<size_t>(units1 + 1), 0);
  for (int64_t u = 0; u < units1; ++u) {
    const int64_t i = u % p.nQ, bh = u / p.nQ, r = p.mask_bh(bh / p.Hq, bh % p.Hq) * p.nQ + i;
    pair_off[u + 1] = pair_off[u] + (p.all_full ? p.nKV : p.kv_num[r] + p.fkv_num[r]);
  }
  const int64_t pair_elems = pair_off[units1] * p.QB * p.E, dq_elems = rows * p.E;
  const int64_t limit = g_fused_limit;
  const bool fused = limit >= 0 && pair_elems <= std::max<int64_t>(8 * dq_elems, limit / int64_t(sizeof(F)));
  Tensor pairs_t = fused ? empty({pair_elems}, dtype_of<F>::value) : Tensor();
  F* pairs = fused ? pairs_t.data_ptr<F>() : nullptr;

  // Pass 1: dQ per (b, h, q block).
#pragma omp parallel reduction(|| : err) if (p.parallel() && !fused)
  if (!fused) {
    Mods<F> mods(p);
    Tiles<F> t(p, scratch.data_ptr<F>() + omp_get_thread_num() * Tiles<F>::size(p));
    F* dqa = t.extra;
    std::vector<std::pair<int32_t, bool>> blocks;
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units1; ++u) {
      const int64_t i = u % p.nQ, bh = u / p.nQ, b = bh / p.Hq, h = bh % p.Hq, hk = h / G;
      const int64_t r0 = i * p.QB, m = std::min(p.QB, p.L - r0), row0 = bh * p.L + r0;
      load_rows(q + bh * p.L * p.E, r0, m, p.E, t.qt);
      if (dout) load_rows(dout + bh * p.L * p.Ev, r0, m, p.Ev, t.dot);
      else std::fill_n(t.dot, m * p.Ev, F(0));
      std::fill_n(dqa, m * p.E, F(0));
      const T* kb = k + (b * p.Hkv + hk) * p.S * p.E;
      const T* vb = v + (b * p.Hkv + hk) * p.S * p.Ev;
      p.kv_blocks(b, h, i, blocks);
      for (const auto& [j, partial] : blocks) {
        const int64_t c0 = j * p.KB, n = std::min(p.KB, p.S - c0);
        load_transposed(kb, c0, n, p.E, t.kt);
        load_transposed(vb, c0, n, p.Ev, t.vt);
        load_rows(kb, c0, n, p.E, t.kr);
        recompute_tile(p, mods, t, b, h, r0, m, c0, n, partial, lse + row0, delta + row0, nullptr);
        gemm<F>(t.dp, p.KB, 1, t.kr, p.E, m, p.E, n, F(1), dqa, p.E, true, t.klo(), t.khi());  // dQ += dS K
      }
      T* dqb = dq + (bh * p.L + r0) * p.E;
      for (int64_t x = 0; x < m * p.E; ++x) dqb[x] = cast_value<T>(dqa[x] * scale);
    }
    err = err || mods.error();
  }

  // Pass 2: dK, dV per (b, kv head, kv block); units split into fixed slots for captured grads.
  const int64_t units2 = p.B * p.Hkv * p.nKV;
  int64_t grad_numel = 0;
  for (const auto& g : grads) grad_numel += static_cast<int64_t>(g.size());
  const int64_t slots =
      grad_numel == 0 ? units2 : std::clamp<int64_t>((int64_t{32} << 20) / grad_numel, 1, std::min<int64_t>(64, units2));
  std::vector<std::vector<std::vector<double>>> slot_grads(grad_numel == 0 ? 0 : static_cast<size_t>(slots));
  for (auto& sg : slot_grads) {
    sg.resize(grads.size());
    for (size_t x = 0; x < grads.size(); ++x) sg[x].assign(grads[x].size(), 0.0);
  }
#pragma omp parallel reduction(|| : err) if (p.parallel())
  {
    Mods<F> mods(p);
    Tiles<F> t(p, scratch.data_ptr<F>() + omp_get_thread_num() * Tiles<F>::size(p));
    F *dka = t.extra, *dva = t.extra + p.KB * p.E;
    std::vector<std::pair<int32_t, bool>> blocks, kv_list;
#pragma omp for schedule(dynamic, 1)
    for (int64_t slot = 0; slot < slots; ++slot) {
      std::vector<std::vector<double>>* sg = slot_grads.empty() ? nullptr : &slot_grads[slot];
      for (int64_t u = slot * units2 / slots; u < (slot + 1) * units2 / slots; ++u) {
        const int64_t j = u % p.nKV, bhk = u / p.nKV, b = bhk / p.Hkv, hk = bhk % p.Hkv;
        const int64_t c0 = j * p.KB, n = std::min(p.KB, p.S - c0);
        load_transposed(k + bhk * p.S * p.E, c0, n, p.E, t.kt);
        load_transposed(v + bhk * p.S * p.Ev, c0, n, p.Ev, t.vt);
        if (fused) load_rows(k + bhk * p.S * p.E, c0, n, p.E, t.kr);
        std::fill_n(dka, n * p.E, F(0));
        std::fill_n(dva, n * p.Ev, F(0));
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = hk * G + g, bh = b * p.Hq + h;
          p.q_blocks(b, h, j, blocks);
          for (const auto& [i, partial] : blocks) {
            const int64_t r0 = i * p.QB, m = std::min(p.QB, p.L - r0), row0 = bh * p.L + r0;
            load_rows(q + bh * p.L * p.E, r0, m, p.E, t.qt);
            if (dout) load_rows(dout + bh * p.L * p.Ev, r0, m, p.Ev, t.dot);
            else std::fill_n(t.dot, m * p.Ev, F(0));
            recompute_tile(p, mods, t, b, h, r0, m, c0, n, partial, lse + row0, delta + row0, sg);
            gemm<F>(t.st, 1, p.KB, t.dot, p.Ev, n, p.Ev, m, F(1), dva, p.Ev, true, t.kvlo(), t.kvhi());  // dV += P^T dO
            gemm<F>(t.dp, 1, p.KB, t.qt, p.E, n, p.E, m, F(1), dka, p.E, true, t.kvlo(), t.kvhi());   // dK += dS^T Q
            if (fused) {  // this pair's dS K, in its slot (the kv block's rank in q block i's list)
              p.kv_blocks(b, h, i, kv_list);
              const auto at = std::lower_bound(kv_list.begin(), kv_list.end(), std::pair<int32_t, bool>(
                                                   static_cast<int32_t>(j), false));
              F* dst = pairs + (pair_off[bh * p.nQ + i] + (at - kv_list.begin())) * p.QB * p.E;
              gemm<F>(t.dp, p.KB, 1, t.kr, p.E, m, p.E, n, F(1), dst, p.E, false, t.klo(), t.khi());
            }
          }
        }
        T* dkb = dk + (bhk * p.S + c0) * p.E;
        T* dvb = dv + (bhk * p.S + c0) * p.Ev;
        for (int64_t x = 0; x < n * p.E; ++x) dkb[x] = cast_value<T>(dka[x] * scale);
        for (int64_t x = 0; x < n * p.Ev; ++x) dvb[x] = cast_value<T>(dva[x]);
      }
    }
    err = err || mods.error();
  }
  if (fused) {  // dQ = scale * sum of the pair slots, kv blocks ascending (pass 1's order)
#pragma omp parallel for schedule(static) if (p.parallel())
    for (int64_t u = 0; u < units1; ++u) {
      const int64_t i = u % p.nQ, bh = u / p.nQ, r0 = i * p.QB, m = std::min(p.QB, p.L - r0);
      T* dqb = dq + (bh * p.L + r0) * p.E;
      const F* first = pairs + pair_off[u] * p.QB * p.E;
      const int64_t count = pair_off[u + 1] - pair_off[u];
      for (int64_t x = 0; x < m * p.E; ++x) {
        F acc = 0;
        for (int64_t c = 0; c < count; ++c) acc += first[c * p.QB * p.E + x];
        dqb[x] = cast_value<T>(acc * scale);
      }
    }
  }
  for (size_t x = 0; x < grads.size(); ++x)
    for (const auto& sg : slot_grads)
      for (size_t y = 0; y < grads[x].size(); ++y) grads[x][y] += sg[x][y];
  *index_error = err;
}

#define KILN_FLEX_BWD(T)                                                                                         \
  template void flex_backward<T>(const Problem&, const T*, const T*, const T*, const T*, const T*,               \
                                 const acc_t<T>*, const acc_t<T>*, T*, T*, T*, std::vector<std::vector<double>>&, \
                                 bool*);
KILN_FLEX_BWD(float)
KILN_FLEX_BWD(double)
KILN_FLEX_BWD(BFloat16)
KILN_FLEX_BWD(Half)

}  // namespace kiln::flex::cpu
