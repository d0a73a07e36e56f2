// Built-in mods, written in the IR exactly as a user would write them.
#include "kiln/flex.h"

namespace kiln::flex {

MaskMod noop_mask() { return MaskMod(Expr(true)); }

MaskMod and_masks(const std::vector<MaskMod>& masks) {
  if (masks.empty()) return noop_mask();
  Expr e = masks[0].expr;
  for (size_t i = 1; i < masks.size(); ++i) e = e & masks[i].expr;
  return MaskMod(e);
}

MaskMod or_masks(const std::vector<MaskMod>& masks) {
  if (masks.empty()) return MaskMod(Expr(false));
  Expr e = masks[0].expr;
  for (size_t i = 1; i < masks.size(); ++i) e = e | masks[i].expr;
  return MaskMod(e);
}

MaskMod causal_mask() { return MaskMod(q_idx() >= kv_idx()); }

MaskMod sliding_window_mask(int64_t window) {
  KILN_CHECK(window >= 1, "sliding_window_mask", "window must be positive, got ", window);
  return MaskMod((q_idx() >= kv_idx()) & (q_idx() - kv_idx() < Expr(window)));
}

MaskMod document_mask(const Tensor& doc_ids) {
  KILN_CHECK(doc_ids.dim() == 1 && !is_floating_point(doc_ids.dtype()), "document_mask",
             "doc_ids must be a 1-d integer tensor, got ", shape_str(doc_ids.sizes()), " ", dtype_name(doc_ids.dtype()));
  Captured doc = capture(doc_ids);
  return MaskMod(doc[q_idx()] == doc[kv_idx()]);
}

MaskMod prefix_lm_mask(int64_t prefix) { return MaskMod((kv_idx() < Expr(prefix)) | (q_idx() >= kv_idx())); }

MaskMod chunked_mask(int64_t chunk) {
  KILN_CHECK(chunk >= 1, "chunked_mask", "chunk must be positive, got ", chunk);
  return MaskMod(q_idx() / Expr(chunk) == kv_idx() / Expr(chunk));
}

ScoreMod alibi(const Tensor& slopes) {
  KILN_CHECK(slopes.dim() == 1 && is_floating_point(slopes.dtype()), "alibi", "slopes must be a 1-d float tensor [H], got ",
             shape_str(slopes.sizes()), " ", dtype_name(slopes.dtype()));
  Captured s = capture(slopes);
  return ScoreMod(score() + s[h()] * (kv_idx() - q_idx()));
}

ScoreMod softcap(double cap) {
  KILN_CHECK(cap > 0, "softcap", "cap must be positive, got ", cap);
  return ScoreMod(Expr(cap) * tanh(score() / Expr(cap)));
}

ScoreMod relative_position_bias(const Tensor& bias, int64_t offset) {
  KILN_CHECK(bias.dim() == 2 && is_floating_point(bias.dtype()), "relative_position_bias",
             "bias must be a 2-d float tensor [H, n], got ", shape_str(bias.sizes()), " ", dtype_name(bias.dtype()));
  Captured t = capture(bias);
  return ScoreMod(score() + t[h()][q_idx() - kv_idx() + Expr(offset)]);
}

}  // namespace kiln::flex
