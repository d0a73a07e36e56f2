#pragma once
// CPU FlexAttention kernels: the problem description shared by forward and backward, and the tile
// primitives both call (one definition each, in tile.cpp, so the backward recomputes every score
// with exactly the forward's instructions).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "flex/ir.h"
#include "kiln/tensor.h"

namespace kiln::flex::cpu {

class MaskTiles;

struct Problem {
  int64_t B = 0, Hq = 0, Hkv = 0, L = 0, S = 0, E = 0, Ev = 0;
  double scale = 1;
  int64_t QB = 128, KB = 128, nQ = 0, nKV = 0;
  // BlockMask lists (int32); all_full: no BlockMask, every block is full.
  bool all_full = false;
  int64_t mB = 1, mH = 1;
  const int32_t *kv_num = nullptr, *kv_idx = nullptr, *fkv_num = nullptr, *fkv_idx = nullptr;
  const int32_t *q_num = nullptr, *q_idx = nullptr, *fq_num = nullptr, *fq_idx = nullptr;
  int64_t kv_m = 1, fkv_m = 1, q_m = 1, fq_m = 1;
  // CUDA's one-list walk (a BlockMask with a mask_mod, cuda::BlockPlan::merge): the partial and full
  // lists merged as 2 * block + (1 if partial), ascending (detail::merge_block_lists); null otherwise.
  const int32_t *kv_all_num = nullptr, *kv_all_idx = nullptr, *q_all_num = nullptr, *q_all_idx = nullptr;
  int64_t kv_all_m = 1, q_all_m = 1;
  const detail::Program* score = nullptr;  // null: identity
  const detail::Program* mask = nullptr;   // null: no mask_mod (partial blocks never listed)
  const MaskTiles* tiles = nullptr;        // the partial tiles' mask bits, when evaluated up front

  int64_t group() const { return Hq / Hkv; }
  // Small problems run on one thread: waking a team costs more than it saves (results are the
  // same for any thread count).
  bool parallel() const { return B * Hq * L * S * (E + Ev) > (int64_t{1} << 22); }
  int64_t mask_bh(int64_t b, int64_t h) const { return (mB == 1 ? 0 : b) * mH + (mH == 1 ? 0 : h); }
  // kv blocks of q-block i for (b, h), ascending, with "partial" flags (full and partial merged so
  // the order never depends on the classification).
  void kv_blocks(int64_t b, int64_t h, int64_t i, std::vector<std::pair<int32_t, bool>>& out) const;
  // q blocks of kv-block j for (b, h), ascending.
  void q_blocks(int64_t b, int64_t h, int64_t j, std::vector<std::pair<int32_t, bool>>& out) const;
};

// A mask_mod row as runs of kept / masked kv positions, for masks made of integer affine
// comparisons of the indices (row_mask.cpp). Exact: the same result as the row evaluator.
class AffineMask {
 public:
  explicit AffineMask(const detail::Program& p);
  bool ok() const { return ok_; }
  // Sets masked entries of s[0, n) (kv positions c0..c0+n-1) to -inf; false: this row does not
  // fit (nothing written), evaluate it the general way.
  template <typename F>
  bool apply(int64_t b, int64_t h, int64_t q, int64_t c0, int64_t n, F* s);
  // For rows q0..q0+m-1: the smallest [lo[r], hi[r]) (relative to c0, within [0, n)) holding every
  // kept position. The rows are kept for the apply calls that follow (a row depends on b, h, q only).
  bool bounds(int64_t b, int64_t h, int64_t q0, int64_t m, int64_t c0, int64_t n, int32_t* lo, int32_t* hi);
  bool index_error() const { return index_error_; }

 private:
  static constexpr int kMaxFlips = 8;
  struct Lin { int64_t a = 0, c = 0; };  // a * kv + c
  struct Step {  // value at kv = -inf, then flips at at[0..n)
    bool v0 = false;
    int n = 0;
    int64_t at[kMaxFlips] = {};
  };
  template <typename Op2>
  static bool combine(const Step& x, const Step& y, Op2 f, Step& out);
  bool eval(int64_t b, int64_t h, int64_t q);
  const Step* row(int64_t b, int64_t h, int64_t q);  // null: does not fit
  static void row_bounds(const Step& r, int64_t c0, int64_t n, int32_t& lo, int32_t& hi);
  const detail::Program* prog_;
  bool ok_ = false, index_error_ = false;
  std::vector<Lin> ints_;
  std::vector<Step> bools_;
  std::vector<Step> rows_;  // results of rows rq0_.. for (rb_, rh_), from bounds()
  int64_t rb_ = -1, rh_ = -1, rq0_ = 0;
};

// The mask_mod's results on every partial tile (mask_tiles.cpp), evaluated once per flex_attention
// call for its forward and backward: one bit per element, a row of a tile in (KB + 63) / 64 words.
class MaskTiles {
 public:
  // Null where the rows are better evaluated in the kernels (no mask_mod, an AffineMask one, a mask
  // reading b or h that the BlockMask broadcasts) or the bits would pass max_bytes. F: the kernels'
  // accumulation type (the row evaluator's float type).
  template <typename F>
  static std::shared_ptr<MaskTiles> build(const Problem& p, int64_t max_bytes);
  // Bit c of the result: kv position c0 + c is kept in row q. Null when the tile is not partial.
  const uint64_t* row(const Problem& p, int64_t b, int64_t h, int64_t q, int64_t c0) const;
  bool index_error() const { return index_error_; }

 private:
  std::vector<int64_t> row_slot_;  // per BlockMask row: its first tile's slot
  int64_t words_ = 0;
  Tensor bits_;  // int64 words, through kiln's allocator
  bool index_error_ = false;
};

// Per-thread evaluators of the score and mask programs.
template <typename F>
struct Mods {
  std::unique_ptr<detail::RowEval<F>> score, mask;
  std::unique_ptr<AffineMask> affine;  // set when the mask fits AffineMask
  bool index_error = false;
  explicit Mods(const Problem& p);
  bool error() const {
    return (score && score->index_error()) || (mask && mask->index_error()) || (affine && affine->index_error());
  }
};

// c[i][j] = (accumulate ? c[i][j] : 0) + scale * sum_k a(i, k) * b[k][j] for i < M, j < N, with
// a(i, k) = a[i * ars + k * acs] (so a may be read transposed), b and c row-major (strides ldb, ldc).
// klo / khi (optional): per row i of c, a range [klo[i], khi[i]) outside which a(i, k) is zero
// (those terms are skipped: the same bits, as acc + 0 * b == acc for finite b).
template <typename F>
void gemm(const F* a, int64_t ars, int64_t acs, const F* b, int64_t ldb, int64_t M, int64_t N, int64_t K, F scale,
          F* c, int64_t ldc, bool accumulate, const int32_t* klo = nullptr, const int32_t* khi = nullptr);

// s[r][c] = scale * sum_e a[r][e] * bt[e][c] for r < m, c < n; a: [m, E] (row stride E), bt: [E, n]
// (row stride n), s: row stride ld. The sum runs e = 0..E-1 in order for every element.
// clo / chi (optional): per row, the columns [clo[r], chi[r]) wanted; the rest may be computed or
// written as 0 (a computed element has the same bits either way).
template <typename F>
void score_tile(const F* a, const F* bt, int64_t m, int64_t n, int64_t E, F scale, F* s, int64_t ld,
                const int32_t* clo = nullptr, const int32_t* chi = nullptr);

// For a partial block whose mask fits AffineMask: per row r < m, the kv columns [lo[r], hi[r]) of
// the tile (relative to c0) outside which every entry is masked (lo == hi: none kept). False:
// no such bounds (full block, or a general mask); the tile is then computed whole.
template <typename F>
bool kept_columns(Mods<F>& mods, int64_t b, int64_t h, int64_t q0, int64_t m, int64_t c0, int64_t n, bool partial,
                  int32_t* lo, int32_t* hi);
// From per-row column bounds: per column c < n, the rows [rlo[c], rhi[c]) that keep it.
void kept_rows(const int32_t* lo, const int32_t* hi, int64_t m, int64_t n, int32_t* rlo, int32_t* rhi);

// Largest of s[0, n) (-inf when n == 0 or all are -inf).
template <typename F>
F row_max(const F* s, int64_t n);
// s[c] = exp(s[c] - m), 0 where s[c] is -inf (m finite); returns the sum, in a fixed order.
// float: a vectorised exp (under 1 ulp from the exact value, measured; 0 below e^-87).
template <typename F>
F exp_sum(F* s, int64_t n, F m);
// exp_sum where s[c] is -inf outside [lo, hi): exp runs on [lo, hi) widened to whole 8-lane
// groups, the rest is set to 0; the same bits as exp_sum (each lane adds the same values).
template <typename F>
F exp_sum_range(F* s, int64_t n, F m, int64_t lo, int64_t hi) {
  const int64_t a = lo / 8 * 8, e = std::min(n, (hi + 7) / 8 * 8);
  if (a >= e) {
    std::fill_n(s, n, F(0));
    return exp_sum(s, int64_t{0}, m);
  }
  std::fill_n(s, a, F(0));
  std::fill(s + e, s + n, F(0));
  return exp_sum(s + a, e - a, m);
}

// Applies score_mod then (on partial blocks) mask_mod to one row of n raw scores in place:
// masked entries become -inf. Leaves the score evaluator holding this row (for its backward).
template <typename F>
void mod_row(Mods<F>& mods, const Problem& p, F* s, int64_t b, int64_t h, int64_t q, int64_t c0, int64_t n,
             bool partial);

// Gathers rows [r0, r0 + m) of a [rows, D] matrix of T into F (row stride D).
template <typename T, typename F>
void load_rows(const T* src, int64_t r0, int64_t m, int64_t D, F* dst);
// Gathers rows [r0, r0 + n) of a [rows, D] matrix of T transposed into F: dst[d][c] (row stride n).
template <typename T, typename F>
void load_transposed(const T* src, int64_t r0, int64_t n, int64_t D, F* dst);

// q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] contiguous -> out [B, Hq, L, Ev], lse [B, Hq, L].
template <typename T>
void flex_forward(const Problem& p, const T* q, const T* k, const T* v, T* out, acc_t<T>* lse, bool* index_error);

// The backward fuses its two passes (one recompute of P and dS per tile) when the per-(q block,
// kv block) dQ slots take at most max(this many bytes, 8 x dQ); default 32 MB. Negative: never
// fuse (tests compare both paths, which give the same bits).
void set_fused_backward_limit(int64_t bytes);

// dout / dlse may be null (no gradient flowed). grads: one vector per score_mod buffer, sized to the
// buffer where its gradient is wanted (filled, in a fixed order), empty otherwise.
template <typename T>
void flex_backward(const Problem& p, const T* q, const T* k, const T* v, const T* out, const T* dout,
                   const acc_t<T>* lse, const acc_t<T>* dlse, T* dq, T* dk, T* dv,
                   std::vector<std::vector<double>>& grads, bool* index_error);

}  // namespace kiln::flex::cpu
