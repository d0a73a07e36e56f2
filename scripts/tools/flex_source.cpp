// Prints the generated FlexAttention CUDA source of one configuration, to inspect registers and
// SASS without a GPU:
//   g++ -std=c++20 -O1 -Iinclude -Isrc scripts/tools/flex_source.cpp build/libkiln.a -o /tmp/flex_source \
//     -L/usr/local/cuda/lib64 -lhwy -lnvrtc -lcudart -lcublasLt -lcublas -lopenblas -fopenmp -lpthread -ldl -lcuda
//   /tmp/flex_source 128 document persist,mask_bits > /tmp/f.cu
//   (echo '#define KILN_BUILD_BWD 0'; cat /tmp/f.cu) > /tmp/fwd.cu && nvcc -arch=sm_90a -cubin -Xptxas -v /tmp/fwd.cu
// Usage: flex_source HEAD_DIM causal|document|window [switches, comma-separated]
// Switches: persist, mask_bits, keepbits, kbuf1, walk_ahead, softcap, alibi, wide, m64, n64, bkbuf1,
// unpaired, nosplitp, relbias, nofold, barrier, stages3, twolists, ranges, pingpong, fused, reducer, inplace,
// ascending, fpersist, tmasums.
// softcap: 30 tanh(s / 30); alibi: score + slopes[h] (kv - q); wide: without fast_mods
// (KILN_FLEX_FAST_MODS=0: 64-bit ints, IEEE divisions, tanhf); m64 / n64: a forward tile of 64 q
// rows / 64 kv columns instead of 128 at E = 128; bkbuf1: the dQ kernel's one K / V stage;
// unpaired: KILN_FLEX_BWD_PAIRED=0; nosplitp: KILN_FLEX_BWD_SPLIT_P=0 (else split P where make_state
// takes it: paired, two dQ stages, no score_mod or one of gradient 1, as alibi); relbias: a learned
// relative bias, its gradient; nofold: KILN_FLEX_FOLD_SCALE=0; barrier: KILN_FLEX_FWD_LAST_ISSUES=0;
// twolists: KILN_FLEX_MERGED_WALK=0; ranges: mask runs (KILN_FLEX_MASK_RANGES, default on; off here
// unless given, like keepbits); fused: KILN_FLEX_BWD_FUSED=1 (E = 128, no relbias); reducer:
// with KILN_FLEX_BWD_FUSED_REDUCER=1; inplace: and KILN_FLEX_BWD_FUSED_INPLACE=1; ascending: with
// KILN_FLEX_BWD_FUSED_ASCENDING=1; fpersist: with KILN_FLEX_BWD_FUSED_PERSIST=1;
// tmasums: with KILN_FLEX_BWD_FUSED_TMA_SUMS=1.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flex/cuda/codegen.h"
#include "flex/ir.h"
#include "kiln/kiln.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  using namespace kiln;
  const std::string mask_name = argv[2], sw = argc > 3 ? argv[3] : "";
  const auto has = [&](const char* s) { return sw.find(s) != std::string::npos; };
  std::vector<double> ids(1024);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(i / 64);
  const Tensor doc = tensor(ids, kInt64);
  const flex::MaskMod mask = mask_name == "document" ? flex::and_masks({flex::document_mask(doc), flex::causal_mask()})
                             : mask_name == "window" ? flex::sliding_window_mask(256)
                                                     : flex::causal_mask();
  const flex::detail::Program prog = flex::detail::compile(mask.expr);
  const Tensor slopes = tensor(std::vector<double>(16, 0.5), kFloat32);
  const Tensor bias = zeros({16, 2048}, kFloat32).requires_grad_();
  const flex::detail::Program score = flex::detail::compile(
      has("alibi") ? flex::alibi(slopes).expr
                   : (has("relbias") ? flex::relative_position_bias(bias, 1024).expr : flex::softcap(30.0).expr));
  flex::cuda::KernelConfig cfg;
  cfg.head_dim = std::atoi(argv[1]);
  cfg.fwd_wgmma = cfg.bwd_wgmma = true;
  if (cfg.head_dim == 128) cfg.fwd_tile_m = cfg.fwd_tile_n = 128;
  if (has("m64")) cfg.fwd_tile_m = 64;
  if (has("n64")) cfg.fwd_tile_n = 64;
  cfg.fwd_tma = cfg.bwd_tma = true;
  cfg.fwd_kbuf = has("kbuf1") ? 1 : 2;
  cfg.bwd_kbuf = has("bkbuf1") ? 1 : 2;
  cfg.bwd_paired = !has("unpaired");
  // As make_state on short E = 64 rows (its 64 x 64 forward tiles; the "causal" and "document" rows here
  // stand in for them too).
  if (cfg.head_dim == 64 && cfg.fwd_tile_m == 64 && cfg.fwd_tile_n == 64) {
    cfg.fwd_min_blocks = 5;
    if (!has("relbias")) cfg.bwd_dkdv_min_blocks = 3;
  }
  const bool scored = has("softcap") || has("alibi") || has("relbias");
  cfg.bwd_split_p = !has("nosplitp") && cfg.bwd_paired && cfg.bwd_kbuf == 2 &&
                    (!scored || flex::detail::score_grad_is_one(score));  // as make_state
  cfg.index_check = false;
  cfg.index32 = true;
  cfg.fwd_persist = has("persist");
  cfg.bwd_fused = has("fused") && cfg.bwd_paired && cfg.head_dim == 128 && !has("relbias");
  cfg.bwd_fused_reducer = cfg.bwd_fused && has("reducer");
  cfg.bwd_fused_inplace = cfg.bwd_fused_reducer && has("inplace");
  cfg.bwd_fused_ascending = cfg.bwd_fused && has("ascending");
  cfg.bwd_fused_persist = cfg.bwd_fused && has("fpersist");
  cfg.bwd_fused_tma_sums = cfg.bwd_fused && has("tmasums");
  cfg.mask_bits = has("mask_bits");
  cfg.fwd_keepbits = has("keepbits");
  cfg.walk_ahead = has("walk_ahead");
  cfg.fast_mods = !has("wide");
  cfg.fold_scale = !scored && !has("nofold");                       // as choose_kernel_config (scale > 0)
  cfg.fwd_last_issues = !cfg.fwd_persist && !has("barrier") && cfg.fwd_kbuf == 2;  // likewise
  cfg.fwd_stages = has("stages3") ? 3 : 2;
  cfg.mask_ranges = has("ranges");  // KILN_FLEX_MASK_RANGES=1
  cfg.merged_walk = !has("twolists");  // the default (KILN_FLEX_MERGED_WALK=0: twolists)
  cfg.fwd_pingpong = has("pingpong");  // KILN_FLEX_FWD_PINGPONG=1 (128-row tiles)
  std::fputs(flex::cuda::generate_source(scored ? &score : nullptr, &prog, cfg).c_str(), stdout);
}
