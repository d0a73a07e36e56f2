// The FlexAttention kernels' plan (kernel_config.h): each rule with the H200 figures (ms, by commit
// where one was recorded) that chose it. Measured and rejected, so no longer in the kernels: the
// mma.sync forward on sm_90 (2b982c6: causal 4x16x8192x128 fwd 7.97 vs 5.67 by wgmma), the wgmma
// forward by cp.async or with one K / V stage (below), its softmax overlapping the previous P V,
// its warpgroups taking turns on the tensor cores (5c30324: causal fwd 2.15 -> 2.27, ALiBi 2.27 ->
// 2.44), three K / V stages (12a98e5: the E = 128 window 0.39 -> 0.63), the mask bits for every mask
// (3cb76ca: window E 64 0.116 -> 0.125), the lists read a step ahead, second Q / dO buffers in the
// cp.async dK/dV kernel, and a fused backward forming dQ in the dK/dV kernel (slower than the two
// kernels, docs/benchmarks.md).
#include "flex/cuda/kernel_config.h"

#include <algorithm>
#include <cstdlib>

namespace kiln::flex::cuda {

namespace {

// Blocks a q row of p lists.
int64_t row_blocks(const cpu::Problem& p) { return p.all_full ? p.nKV : p.kv_m + p.fkv_m; }

// Whether the mask reads b / h no more than the BlockMask's own dims, so that what a kernel
// derives from one mask row (keep bits) holds for every (b, h) it serves.
bool per_mask_row(const cpu::Problem& p) {
  const auto uses = [&](Op op) {
    return std::any_of(p.mask->code.begin(), p.mask->code.end(), [&](const detail::Instr& in) { return in.op == op; });
  };
  return (!uses(Op::B) || p.mB == p.B) && (!uses(Op::H) || p.mH == p.Hq);
}

// Rows of at most 9 blocks at E = 128 on a 128 x 128-block mask that reads no tensors, without a
// score_mod, take the persistent forward with 128 x 128 tiles (persist.cuh) on the
// caller's blocks (BlockPlan::forward_keeps). Fwd / fwd+bwd, staged -> persistent (fdb2227, e8e405a):
// window 256 E 128 0.35-0.36 / 1.25-1.29 -> 0.29-0.32 / 1.20-1.22, window 1024 0.78-0.80 / 2.79-2.89 ->
// 0.62-0.66 / 2.60-2.75. Not elsewhere (bf12a72, the persistent forward forced, fwd): causal 2.15-2.18
// -> 2.18-2.21, ALiBi 2.27 -> 3.57 (its captured slope reloaded every tile), window E 64 0.109 -> 0.127.
bool persistent_short_rows(const cpu::Problem& p, int major) {
  return major == 9 && p.E == 128 && p.mask && !p.all_full && !p.score && !p.mask->reads_tensors && p.QB == 128 &&
         p.KB == 128 && row_blocks(p) <= 9;
}

struct Tile {
  int m = kTileM, n = kTileN;
};

// The forward's tile. sm_90 (wgmma): 128 x 128 at E = 128 and 64 x 64 at E = 64 (2b982c6: causal
// 4x16x8192x128 fwd 5.67 vs 7.97 for the mma.sync 64 x 64; 4x12x4096x64 with 4 documents 0.84 vs 0.89,
// where 128-row tiles took 1.10-1.25). E = 64 rows listing 6 or more blocks: 64 x 128 (4x12x4096x64
// with 4 documents, up to 8 blocks a row, 0.436 -> 0.352; a window of 3 blocks a row 0.204 -> 0.279).
// E = 128 rows of up to 9 blocks: 64 x 64, two CTAs an SM instead of one (window 256 0.57 -> 0.43,
// window 1024 0.93 -> 0.87-0.91; but 16 documents, 16+ blocks a row, 1.37 -> 1.57), unless
// persist_rows. Elsewhere (mma.sync) 64 x 64 in 4 warps of 16 rows (128-row variants slower, 2317fcd).
// A tuning tile replaces the rule's where it is valid (wgmma: 64 or 128 of each); the blocks must be
// multiples of the tile, else 64 x 64.
Tile forward_tile(const cpu::Problem& p, int major, bool persist_rows, const FlexTuning& tuning) {
  const bool wgmma = major == 9;
  Tile t;
  if (wgmma && p.E == 128) t.m = t.n = 128;
  if (wgmma && p.E == 64 && row_blocks(p) >= 6) t.n = 128;
  if (wgmma && p.E == 128 && row_blocks(p) <= 9 && !persist_rows) t.m = t.n = 64;
  const auto wgmma_size = [](int x) { return x == 64 || x == 128; };
  const bool tuned = tuning.fwd_tile_m > 0 && tuning.fwd_tile_n > 0 && tuning.fwd_tile_m % 16 == 0 &&
                     tuning.fwd_tile_n % 16 == 0 && tuning.fwd_tile_m <= 256 &&
                     (!wgmma || (wgmma_size(tuning.fwd_tile_m) && wgmma_size(tuning.fwd_tile_n)));
  if (tuned) t = Tile{tuning.fwd_tile_m, tuning.fwd_tile_n};
  if (p.QB % t.m != 0 || p.KB % t.n != 0) t = Tile{};
  return t;
}

// Every captured tensor's largest flat offset below 2^31 (the kernels' 32-bit load offsets).
bool offsets_fit(const detail::Program* prog) {
  if (!prog) return true;
  for (const detail::Buffer& buf : prog->buffers) {
    int64_t last = 0;
    for (int d = 0; d < 3; ++d) last += std::max<int64_t>(buf.sizes[d] - 1, 0) * std::abs(buf.strides[d]);
    if (last >= (int64_t{1} << 31)) return false;
  }
  return true;
}

}  // namespace

// Merged lists: the window E = 64 forward was issue-bound (Nsight Compute), and its two-list walk took
// ~100-160 of a tile's ~720 instructions a warp, with a dependent global load (2bc66ae, fwd / fwd+bwd:
// window E 128 0.39-0.43 / 1.38-1.41 -> 0.37-0.38 / 1.31-1.32, causal 2.27 / 10.06 -> 2.16-2.19 /
// 9.81-9.85, ALiBi 2.57 / 10.34-10.41 -> 2.24-2.31 / 10.09-10.21).
// Halved blocks (fwd+bwd, a 128- against a 64-block mask): window 256 E 64 0.53 -> 0.45-0.46, E 128
// 1.51 -> 1.35-1.37, window 1024 3.14-3.20 -> 2.99-3.05. The forward keeps the 128-blocks where it
// runs persistent: on them the backward lost more than the forward gained (E 128 window fwd+bwd
// 1.27-1.30 -> 1.32).
BlockPlan block_plan_for(const cpu::Problem& p, int major, bool can_halve, const FlexTuning& tuning) {
  BlockPlan plan;
  plan.merge = p.mask && !p.all_full;
  const Tile t = forward_tile(p, major, false, tuning);
  plan.halve = can_halve && plan.merge && major == 9 && p.QB == 128 && p.KB == 128 && t.m == 64 && t.n == 64;
  plan.forward_keeps = plan.halve && persistent_short_rows(p, major);
  return plan;
}

KernelConfig kernel_config_for(const cpu::Problem& p, DType dtype, int major, bool check_indices, bool index32,
                               int64_t grad_numel, const FlexTuning& tuning, int64_t* mask_bits_words) {
  *mask_bits_words = 0;
  KernelConfig cfg;
  cfg.bf16 = dtype == kBFloat16;
  cfg.head_dim = static_cast<int>(p.E);
  // wgmma and TMA on sm_90. The TMA forward (causal 4x16x8192x128 fwd 3.82 -> 2.81, 16 documents
  // 2.34 -> 2.07, window 256 0.195 -> 0.154) in two K / V stages (causal 2.75 -> 2.59, 16 documents
  // 2.07 -> 1.95, window 0.180 -> 0.169); the TMA backward (fwd+bwd: causal 12.82 -> 10.35, 16
  // documents 8.03 -> 6.90, window 0.712 -> 0.663; the cp.async dQ kernel's addressing took 240
  // registers, 163 with TMA), the dQ kernel's two K / V stages (window E 128 1.70-1.72 -> 1.65-1.67,
  // 16 documents 5.62 -> 5.51-5.54) and each tile's products in pairs (window E 64 0.58-0.61 -> 0.57,
  // causal 10.41-10.45 -> 10.21-10.25).
  cfg.wgmma = major == 9;
  const bool persist_rows = persistent_short_rows(p, major);
  const Tile t = forward_tile(p, major, persist_rows, tuning);
  cfg.fwd_tile_m = t.m;
  cfg.fwd_tile_n = t.n;
  cfg.index_check = check_indices;
  cfg.index32 = index32;
  // Cheaper mods (codegen.h; fwd+bwd: softcap 30 28.6 -> 11.5, ALiBi 11.2 -> 10.3, window 256 E 64
  // 0.64 -> 0.59; kiln_i2f took ALiBi's I2Fs out of its SASS at no cost, c5e4499). 32-bit int locals
  // need b < B, h < Hq, q < L, kv < S within the analysis' bounds.
  cfg.fast_mods = p.B <= detail::kNarrowBH && p.Hq <= detail::kNarrowBH && p.L <= detail::kNarrowQKv &&
                  p.S <= detail::kNarrowQKv;
  // The scale folded into the exponent: the window E = 64 forward was issue-bound (69 % of scheduler
  // cycles issued, the tensor pipe 24 % busy), so an instruction an element counts (fb6d5c6, fwd+bwd:
  // window E 64 0.44 -> 0.40, causal 10.02-10.04 -> 9.70-9.87). Needs the max of raw scores to be the
  // raw score of the max.
  cfg.fold_scale = !p.score && p.scale > 0;
  // A tile that is not interior gets its keep bits while QK^T is in flight (fwd: window 256 0.215 ->
  // 0.154-0.164, causal 2.62 -> 2.56); masks reading captured tensors take the mask bits below.
  cfg.fwd_keepbits = cfg.wgmma;
  cfg.merged_walk = p.kv_all_idx != nullptr && !p.all_full;  // the caller merged the lists (BlockPlan::merge)
  // The persistent forward stages its output in a V tile, so its q tile is no taller than its kv tile.
  cfg.fwd_persist = cfg.wgmma && persist_rows && cfg.fwd_tile_m <= cfg.fwd_tile_n;
  // The last warp done with a stage issues its next loads, instead of a block barrier, where a CTA
  // has two warpgroups (128-row tiles), whose barrier held warps 22 % of their cycles (fb6d5c6, fwd:
  // 16 documents 1.32 -> 1.26, causal 2.36-2.39 -> 2.27-2.28; but the E = 128 window's one warpgroup,
  // 64-row tiles, 0.38 -> 0.39-0.41).
  cfg.fwd_last_issues = cfg.staged_tma_forward() && cfg.fwd_tile_m == 128;
  // Keep bits of the partial blocks of masks that read captured tensors, evaluated per mask row (so
  // only where the mask uses b / h no more than the BlockMask's own dims), up to 256 MiB (fwd /
  // fwd+bwd: 16 documents 2.08 / 6.98 -> 1.37 / 5.83, 4x12x4096x64 with 4 documents 0.316 / 1.056 ->
  // 0.199 / 0.866). Their slots come from the merged walk.
  if (cfg.wgmma && cfg.merged_walk && p.mask && p.mask->reads_tensors) {
    const int64_t words = p.mB * p.mH * p.nQ * p.kv_m * (p.QB * p.KB / 32);
    if (per_mask_row(p) && words <= (int64_t{64} << 20)) {
      cfg.mask_bits = true;
      *mask_bits_words = words;
      cfg.fwd_keepbits = false;  // the keep-bits forward evaluates the mask itself
    }
  }
  // Partial tiles of a mask that keeps one run a row and column test their elements against it
  // (c5e44ad, fwd / fwd+bwd: window E 64 0.117-0.123 / 0.41-0.42 -> 0.107-0.114 / 0.38-0.39, window
  // E 128 0.38-0.39 / 1.34-1.36 -> 0.35-0.36 / 1.27-1.30, causal within noise).
  cfg.mask_ranges = cfg.wgmma && !cfg.mask_bits;
  // Each backward tile's P while its dP product is in flight (a20b950, fwd+bwd: window E 128 1.64 ->
  // 1.56); a score_mod whose gradient is the identity (ALiBi) takes it too: its dS is P (dP - delta).
  cfg.bwd_split_p = cfg.wgmma && (!p.score || detail::score_grad_is_one(*p.score));
  // Short rows at E = 64 (64 x 64 forward tiles) run more CTAs an SM: the forward held to 93
  // registers (5 CTAs instead of 4; f2d1786, fwd window 256 E 64 0.129-0.130 -> 0.108-0.117) and the
  // dK/dV kernel to 168 (3 instead of 2; 3576941, fwd+bwd 0.455-0.481 -> 0.415-0.429), not with
  // captured-tensor gradients, which spill ~800 bytes there. The dK/dV cap lost on the longer rows of
  // 4x12x4096x64 with 4 documents (fwd+bwd 0.78 -> 0.81), hence the rule.
  if (cfg.wgmma && p.E == 64 && cfg.fwd_tile_m == 64 && cfg.fwd_tile_n == 64) {
    cfg.fwd_min_blocks = 5;
    if (grad_numel == 0) cfg.bwd_dkdv_min_blocks = 3;
  }
  if (tuning.fwd_min_blocks > 0) cfg.fwd_min_blocks = tuning.fwd_min_blocks;
  if (tuning.bwd_dkdv_min_blocks > 0) cfg.bwd_dkdv_min_blocks = tuning.bwd_dkdv_min_blocks;
  if (tuning.bwd_dq_min_blocks > 0) cfg.bwd_dq_min_blocks = tuning.bwd_dq_min_blocks;
  return cfg;
}

Plan plan_for(const cpu::Problem& p, const cpu::Problem* fwd_p, DType dtype, int major, const FlexTuning& tuning) {
  Plan plan;
  auto unproven = [&](const detail::Program* prog) {
    return prog && !detail::loads_in_bounds(*prog, p.B, p.Hq, p.L, p.S);
  };
  plan.check_indices = unproven(p.score) || unproven(p.mask);
  const bool index32 = !plan.check_indices && offsets_fit(p.score) && offsets_fit(p.mask);
  if (p.score)
    for (const detail::Buffer& buf : p.score->buffers)
      if (buf.needs_grad) plan.grad_numel += buf.numel;
  plan.bwd = kernel_config_for(p, dtype, major, plan.check_indices, index32, plan.grad_numel, tuning,
                               &plan.bwd_mask_bits_words);
  plan.fwd = plan.bwd;
  plan.fwd_mask_bits_words = plan.bwd_mask_bits_words;
  if (fwd_p) {
    plan.separate_forward = true;
    plan.fwd = kernel_config_for(*fwd_p, dtype, major, plan.check_indices, index32, plan.grad_numel, tuning,
                                 &plan.fwd_mask_bits_words);
  }
  return plan;
}

}  // namespace kiln::flex::cuda
