// The mask_mod of every partial tile, evaluated once per flex_attention call and kept as bits for
// the forward and the backward (attention.h, MaskTiles). Without it the row evaluator runs for each
// tile once per q head in the forward and again in the backward: for a document mask (a captured
// tensor read at kv, whose rows AffineMask cannot take) that was a fifth of a small model's CPU step.
// Tiles are evaluated with the b / h of their BlockMask row, so a mask that reads b or h is kept
// only where the BlockMask has those dims. Rows of the tiles run over OpenMP threads; every bit is
// the row evaluator's own result, so nothing depends on the thread count.
#include <omp.h>

#include <algorithm>

#include "core/tensor_impl.h"
#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {
namespace {

bool reads(const detail::Program& prog, Op op) {
  return std::any_of(prog.code.begin(), prog.code.end(), [op](const detail::Instr& in) { return in.op == op; });
}

}  // namespace

template <typename F>
std::shared_ptr<MaskTiles> MaskTiles::build(const Problem& p, int64_t max_bytes) {
  // Index-only masks that fit AffineMask are cheaper as its runs (a mask reading a tensor at kv
  // fails its rows, so tensor-reading masks take the bits).
  if (!p.mask || p.all_full || (!p.mask->reads_tensors && AffineMask(*p.mask).ok())) return nullptr;
  if ((reads(*p.mask, Op::B) && p.mB != p.B) || (reads(*p.mask, Op::H) && p.mH != p.Hq)) return nullptr;
  auto t = std::make_shared<MaskTiles>();
  const int64_t rows = p.mB * p.mH * p.nQ;
  t->words_ = (p.KB + 63) / 64;
  t->row_slot_.assign(static_cast<size_t>(rows + 1), 0);
  for (int64_t r = 0; r < rows; ++r) t->row_slot_[r + 1] = t->row_slot_[r] + p.kv_num[r];
  const int64_t words = t->row_slot_[rows] * p.QB * t->words_;
  if (words == 0 || words * 8 > max_bytes) return nullptr;
  t->bits_ = zeros({words}, kInt64);
  uint64_t* bits = static_cast<uint64_t*>(t->bits_.data_ptr());
  bool err = false;
#pragma omp parallel reduction(|| : err) if (p.parallel())
  {
    detail::RowEval<F> eval(*p.mask, p.KB);
#pragma omp for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % p.nQ, bh = r / p.nQ, b = bh / p.mH, h = bh % p.mH;
      const int64_t r0 = i * p.QB, m = std::min(p.QB, p.L - r0);
      for (int64_t x = 0; x < p.kv_num[r]; ++x) {
        const int64_t c0 = p.kv_idx[r * p.kv_m + x] * p.KB, n = std::min(p.KB, p.S - c0);
        uint64_t* tile = bits + (t->row_slot_[r] + x) * p.QB * t->words_;
        for (int64_t q = 0; q < m; ++q) {
          eval.run(b, h, r0 + q, c0, n, nullptr);
          const uint8_t* keep = eval.bool_result();
          uint64_t* w = tile + q * t->words_;
          for (int64_t c = 0; c < n; ++c) w[c >> 6] |= static_cast<uint64_t>(keep[c] != 0) << (c & 63);
        }
      }
    }
    err = err || eval.index_error();
  }
  t->index_error_ = err;
  return t;
}

const uint64_t* MaskTiles::row(const Problem& p, int64_t b, int64_t h, int64_t q, int64_t c0) const {
  const int64_t r = p.mask_bh(b, h) * p.nQ + q / p.QB;
  const int32_t *list = p.kv_idx + r * p.kv_m, *end = list + p.kv_num[r];
  const int32_t* at = std::lower_bound(list, end, static_cast<int32_t>(c0 / p.KB));
  if (at == end || *at != c0 / p.KB) return nullptr;
  return static_cast<const uint64_t*>(bits_.data_ptr()) + ((row_slot_[r] + (at - list)) * p.QB + q % p.QB) * words_;
}

template std::shared_ptr<MaskTiles> MaskTiles::build<float>(const Problem&, int64_t);
template std::shared_ptr<MaskTiles> MaskTiles::build<double>(const Problem&, int64_t);

}  // namespace kiln::flex::cpu
