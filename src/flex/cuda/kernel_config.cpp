// The FlexAttention kernels' configuration (kernel_config.h): products, forward tiles and the
// measured defaults of every switch, each with the figures that chose it.
#include "flex/cuda/kernel_config.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cuda/check.h"
#include "core/env.h"
#include "flex/cuda/attention_cuda.h"

namespace kiln::flex::cuda {

namespace {

constexpr const char* kOp = "flex_attention";

int compute_major(int device) {
  int major = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

// Measurement switches (core/env.h) whose errors name flex_attention.
const char* env_switch(const char* var, const char* a, const char* b) {
  return kiln::detail::env_switch(kOp, var, a, b);
}
bool env_flag(const char* var, bool dflt) { return kiln::detail::env_flag(kOp, var, dflt); }

// Whether the mask reads b / h no more than the BlockMask's own dims, so that what a kernel
// derives from one mask row (keep bits) holds for every (b, h) it serves.
bool per_mask_row(const cpu::Problem& p) {
  const auto uses = [&](Op op) {
    return std::any_of(p.mask->code.begin(), p.mask->code.end(), [&](const detail::Instr& in) { return in.op == op; });
  };
  return (!uses(Op::B) || p.mB == p.B) && (!uses(Op::H) || p.mH == p.Hq);
}

// Whether kernels use wgmma: on sm_90 unless KILN_FLEX_<part>_MMA=mma (part FWD or BWD).
bool use_wgmma(const char* var, int major) {
  const char* v = env_switch(var, "wgmma", "mma");
  return major == 9 && !(v && !std::strcmp(v, "mma"));
}

// The kernels' products and the forward's tile. sm_90: wgmma, forward tiles 128 x 128 at E = 128
// and 64 x 64 (64 x 128 on long rows, below) at E = 64 (H200, 2b982c6: causal 4x16x8192x128 fwd
// 5.67 ms vs 7.97 for the mma.sync 64 x 64; 4x12x4096x64 with 4 documents 0.84 vs 0.89, where
// 128-row tiles took 1.10-1.25).
// mma.sync elsewhere: 64 x 64 in 4 warps of 16 rows (128-row variants measured slower, 2317fcd).
// KILN_FLEX_FWD_TILE=MxNxMT overrides the forward's tile (for measurements); the blocks must be
// multiples of M and N (and wgmma needs 64 or 128 by 64 or 128 with MT 1), else 64 x 64 stays.
// persist_rows: short rows at E = 128 keep 128 x 128 tiles for the persistent forward
// (persistent_short_rows).
void pick_kernel_config(KernelConfig& cfg, const cpu::Problem& p, int major, bool persist_rows) {
  const bool wgmma = use_wgmma("KILN_FLEX_FWD_MMA", major);
  cfg.bwd_wgmma = use_wgmma("KILN_FLEX_BWD_MMA", major);
  cfg.fwd_wgmma = wgmma;
  int m = wgmma && p.E == 128 ? 128 : kTileM, n = m, mt = 1;
  // E = 64 rows listing 6 or more blocks: 64 x 128 (H200, session 7: training shape 4x12x4096x64
  // with 4 documents, up to 8 blocks a row, fwd 0.436 -> 0.352 ms; but window 256, 3 blocks a row,
  // 0.204 -> 0.279, so short rows keep 64 x 64).
  const int64_t row_blocks = p.all_full ? p.nKV : p.kv_m + p.fkv_m;
  if (wgmma && p.E == 64 && row_blocks >= 6) n = 128;
  // E = 128 rows listing up to 9 blocks: 64 x 64 in two stages, two CTAs an SM instead of one
  // (H200, session 12, fwd ms: window 256 0.57-0.58 -> 0.43, window 1024 0.93-0.95 -> 0.87-0.91;
  // but 16 documents, 16+ blocks a row, 1.37 -> 1.57, so long rows keep 128 x 128).
  if (wgmma && p.E == 128 && row_blocks <= 9 && !persist_rows) m = n = 64;
  if (const char* env = std::getenv("KILN_FLEX_FWD_TILE")) {
    KILN_CHECK(std::sscanf(env, "%dx%dx%d", &m, &n, &mt) == 3, kOp, "KILN_FLEX_FWD_TILE must read MxNxMT, got '",
               env, "'");
  }
  const bool wgmma_tile = (m == 64 || m == 128) && (n == 64 || n == 128) && mt == 1;
  if (m <= 0 || n <= 0 || p.QB % m != 0 || p.KB % n != 0 || (wgmma && !wgmma_tile)) return;  // 64 x 64
  cfg.fwd_tile_m = m;
  cfg.fwd_tile_n = n;
  cfg.fwd_mt = mt;
}

// Rows of at most 9 blocks at E = 128 on a 128 x 128-block mask that reads no tensors, without a
// score_mod: the persistent forward with 128 x 128 tiles (kernel_source_persist.cpp) by default, on
// the caller's blocks while the backward keeps the halved ones (forward_keeps_blocks; on 128-blocks
// the backward lost more than the forward gained: E 128 window fwd+bwd 1.27-1.30 -> 1.32 ms).
// H200, session 18, fwd / fwd+bwd ms, KILN_FLEX_FWD_PERSIST=0 -> default, two interleaved passes
// (`PARTS="tests combos" ROWS="1 2" COMBOS="- KILN_FLEX_FWD_PERSIST=0" bash scripts/device/session18_round.sh`):
// fdb2227 (two stages, two Q buffers): window 256 E 128 0.362 / 1.290, 0.349 / 1.264 -> 0.287 / 1.197,
// 0.315 / 1.202; window 1024 0.778 / 2.796, 0.783 / 2.892 -> 0.627 / 2.749, 0.664 / 2.717; e8e405a
// (three stages, one Q buffer): 0.364 / 1.283, 0.347 / 1.253 -> 0.285 / 1.202, 0.294 / 1.218; 0.775 /
// 2.808, 0.796 / 2.785 -> 0.630 / 2.647, 0.618 / 2.597. Not elsewhere (bf12a72, the persistent forward
// forced, fwd ms): causal 2.15-2.18 -> 2.18-2.21, 16 documents 1.23-1.24 -> 1.20-1.22, ALiBi 2.27 ->
// 3.57-3.60 (its captured slope reloaded every tile), window E 64 0.109 -> 0.127-0.128 (64 x 64).
bool persistent_short_rows(const cpu::Problem& p, int major) {
  const int64_t row_blocks = p.all_full ? p.nKV : p.kv_m + p.fkv_m;
  return use_wgmma("KILN_FLEX_FWD_MMA", major) && p.E == 128 && p.mask && !p.all_full && !p.score &&
         !p.mask->reads_tensors && p.QB == 128 && p.KB == 128 && row_blocks <= 9 &&
         env_flag("KILN_FLEX_FWD_PERSIST", true);
}

}  // namespace

bool forward_keeps_blocks(const cpu::Problem& p, int device) {
  return halve_blocks(p, device) && persistent_short_rows(p, compute_major(device));
}

// (H200, session 13, kiln fwd+bwd ms with a 64- against a 128-block mask, two passes: window 256
// E 64 0.532 / 0.530 -> 0.450 / 0.457, E 128 1.507 / 1.516 -> 1.352 / 1.366, window 1024 3.135 /
// 3.204 -> 2.994 / 3.051; long rows keep 128 x 128 forward tiles, which need 128-blocks.)
bool halve_blocks(const cpu::Problem& p, int device) {
  if (!p.mask || p.all_full || p.QB != 128 || p.KB != 128 || !env_flag("KILN_FLEX_HALVE_BLOCKS", true)) return false;
  KernelConfig cfg;
  pick_kernel_config(cfg, p, compute_major(device), false);
  return cfg.fwd_wgmma && cfg.fwd_tile_m == 64 && cfg.fwd_tile_n == 64;
}

// One list a row instead of merging the partial and full lists in every step of every kernel's
// walk: the window E = 64 forward was issue-bound (H200, session 15, Nsight Compute), and its walk
// took ~100-160 of a tile's ~720 instructions a warp, with a dependent global load. The default
// (H200, session 16, 2bc66ae, `PARTS="tests ab" AB_VAR=KILN_FLEX_MERGED_WALK bash
// scripts/device/session15_round.sh`, fwd / fwd+bwd ms, two interleaved passes, 0 -> 1: window E 128
// 0.394 / 1.377, 0.432 / 1.405 -> 0.368 / 1.311, 0.377 / 1.320; window 1024 2.901, 2.974 -> 2.866,
// 2.816 fwd+bwd; causal 2.265 / 10.060, 2.276 / 10.063 -> 2.160 / 9.850, 2.190 / 9.811; ALiBi 2.569 /
// 10.406, 2.567 / 10.342 -> 2.240 / 10.214, 2.310 / 10.093; window E 64 and 16 documents within
// noise); KILN_FLEX_MERGED_WALK=0 walks the two lists.
bool merged_walk(const cpu::Problem& p) { return p.mask && !p.all_full && env_flag("KILN_FLEX_MERGED_WALK", true); }

namespace {

// KILN_FLEX_<FWD|BWD>_KBUF / KILN_FLEX_BWD_QBUF (for measurements): 1 (default) or 2 buffers.
int k_buffers(const char* var) {
  const char* v = env_switch(var, "1", "2");
  return v ? v[0] - '0' : 1;
}

// KILN_FLEX_BWD_MIN_BLOCKS=<dK/dV>,<dQ> (for measurements; each 1 to 4): the backward kernels'
// minimum resident CTAs an SM (KernelConfig::bwd_dkdv_min_blocks).
void bwd_min_blocks(KernelConfig& cfg) {
  const char* v = std::getenv("KILN_FLEX_BWD_MIN_BLOCKS");
  if (!v) return;
  int a = 0, b = 0;
  KILN_CHECK(std::sscanf(v, "%d,%d", &a, &b) == 2 && a >= 1 && a <= 4 && b >= 1 && b <= 4, kOp,
             "KILN_FLEX_BWD_MIN_BLOCKS must be two counts 1-4 as dkdv,dq (e.g. 3,4), got '", v, "'");
  cfg.bwd_dkdv_min_blocks = a;
  cfg.bwd_dq_min_blocks = b;
}

}  // namespace

KernelConfig choose_kernel_config(const cpu::Problem& p, DType dtype, int device, bool check_indices, bool index32,
                                  int64_t grad_numel, int64_t* mask_bits_words) {
  return kernel_config_for(p, dtype, compute_major(device), check_indices, index32, grad_numel, mask_bits_words);
}

KernelConfig kernel_config_for(const cpu::Problem& p, DType dtype, int major, bool check_indices, bool index32,
                               int64_t grad_numel, int64_t* mask_bits_words) {
  *mask_bits_words = 0;
  KernelConfig cfg;
  cfg.bf16 = dtype == kBFloat16;
  cfg.head_dim = static_cast<int>(p.E);
  const bool persist_rows = persistent_short_rows(p, major);
  pick_kernel_config(cfg, p, major, persist_rows);
  cfg.profile = std::getenv("KILN_FLEX_PROFILE") != nullptr;
  cfg.index_check = check_indices;
  cfg.index32 = index32;
  // Cheaper mods (codegen.h), on by default (H200, session 11, kiln alone, fwd+bwd ms: softcap 30
  // 28.6 -> 11.5, ALiBi 11.2 -> 10.3, window 256 E 64 0.64 -> 0.59); KILN_FLEX_FAST_MODS=0 keeps the
  // exact mods. 32-bit int locals need b < B, h < Hq, q < L, kv < S within the analysis' bounds.
  cfg.fast_mods = env_flag("KILN_FLEX_FAST_MODS", true) && p.B <= detail::kNarrowBH && p.Hq <= detail::kNarrowBH &&
                  p.L <= detail::kNarrowQKv && p.S <= detail::kNarrowQKv;
  // kiln_i2f (codegen.h): ALiBi's SASS loses its I2Fs, its time moved within noise (H200, session 15,
  // c5e4499, fwd / fwd+bwd ms, two passes, 0 -> 1: 2.580 / 10.353, 2.578 / 10.375 -> 2.538 / 10.375,
  // 2.558 / 10.398); kept, since it costs nothing.
  cfg.magic_i2f = env_flag("KILN_FLEX_MAGIC_I2F", true);
  // The scale folded into the exponent (codegen.h): the window E = 64 forward was issue-bound
  // (H200, session 15, Nsight Compute: 69 % of scheduler cycles issued, the tensor pipe 24 % busy),
  // so an instruction an element counts. Needs the max of raw scores to be the raw score of the max.
  // H200, session 15, fb6d5c6, `AB_VAR=KILN_FLEX_FOLD_SCALE PARTS=ab bash
  // scripts/device/session15_round.sh`, fwd / fwd+bwd ms, two interleaved passes, 0 -> 1: window
  // E 64 0.113 / 0.439, 0.114 / 0.441 -> 0.113 / 0.404, 0.109 / 0.402; causal 2.339 / 10.038, 2.347 /
  // 10.022 -> 2.274 / 9.701, 2.228 / 9.871; 16 documents 1.298 / 5.156, 1.289 / 5.184 -> 1.259 /
  // 5.094, 1.268 / 5.162.
  cfg.fold_scale = env_flag("KILN_FLEX_FOLD_SCALE", true) && !p.score && p.scale > 0;
  cfg.bwd_qbuf = k_buffers("KILN_FLEX_BWD_QBUF");
  cfg.fwd_overlap = cfg.fwd_wgmma && env_flag("KILN_FLEX_FWD_OVERLAP", false);
  // TMA tiles by default in the wgmma forward (H200, session 7: causal 4x16x8192x128 fwd 3.818 ->
  // 2.806 ms, 16 documents 2.335 -> 2.072, window 256 0.195 -> 0.154, training shape 0.345 ->
  // 0.346); KILN_FLEX_FWD_TMA=0 keeps cp.async.
  cfg.fwd_tma = cfg.fwd_wgmma && !cfg.fwd_overlap && env_flag("KILN_FLEX_FWD_TMA", true);
  // With TMA two K / V stages by default (H200, session 8, fwd ms against one stage in one call:
  // causal 4x16x8192x128 2.753 -> 2.592, 16 documents 2.068 -> 1.953, window 256 0.180 -> 0.169,
  // training shape 0.393 -> 0.379); KILN_FLEX_FWD_KBUF=1 keeps one. The cp.async forward keeps
  // one K buffer unless set.
  cfg.fwd_kbuf = std::getenv("KILN_FLEX_FWD_KBUF") || !cfg.fwd_tma ? k_buffers("KILN_FLEX_FWD_KBUF") : 2;
  // A TMA forward tile that is not interior gets its keep bits while QK^T is in flight by default
  // (H200, session 9, fwd ms in one call: window 256 0.215 -> 0.154-0.164, causal 2.62 -> 2.56;
  // masks reading captured tensors take MASK_BITS below); KILN_FLEX_FWD_KEEPBITS=0 turns it off.
  cfg.fwd_keepbits = cfg.fwd_tma && env_flag("KILN_FLEX_FWD_KEEPBITS", true);
  cfg.walk_ahead = env_flag("KILN_FLEX_WALK_AHEAD", false);
  cfg.merged_walk = p.kv_all_idx != nullptr && !p.all_full;  // the caller merged the lists (merged_walk)
  // The persistent forward (kernel_source_persist.cpp) on short rows at E = 128 (persistent_short_rows);
  // KILN_FLEX_FWD_PERSIST=1 takes it everywhere, 0 nowhere.
  // Its output goes out through a V tile, so its q tile may not be taller than its kv tile (a
  // KILN_FLEX_FWD_TILE of 128 x 64 keeps the staged forward).
  cfg.fwd_persist = cfg.fwd_tma && cfg.fwd_kbuf == 2 && cfg.fwd_tile_m <= cfg.fwd_tile_n &&
                    env_flag("KILN_FLEX_FWD_PERSIST", persist_rows);
  // The two-stage forward's loads issued by the last warp done with a stage, not after a block
  // barrier, where a CTA has two warpgroups (128-row tiles): there the barrier held warps 22 % of
  // their cycles (H200, session 15, Nsight Compute, 16 documents). H200, session 15, fb6d5c6,
  // `AB_VAR=KILN_FLEX_FWD_LAST_ISSUES PARTS=ab bash scripts/device/session15_round.sh`, fwd ms, two
  // interleaved passes, 0 -> 1: 16 documents 1.321, 1.325 -> 1.257, 1.270; causal 4x16x8192x128
  // 2.364, 2.386 -> 2.266, 2.281; but the E = 128 window (64-row tiles, one warpgroup, whose wgmma
  // keeps its warps together anyway) 0.382, 0.376 -> 0.389, 0.409. KILN_FLEX_FWD_LAST_ISSUES=0|1
  // overrides the rule.
  cfg.fwd_last_issues = cfg.staged_tma_forward() && env_flag("KILN_FLEX_FWD_LAST_ISSUES", cfg.fwd_tile_m == 128);
  // Three K / V stages (KILN_FLEX_FWD_STAGES=3, a measurement switch): H200, session 15, 12a98e5, fwd
  // ms, two passes, 2 -> 3: causal and 16 documents within noise, ALiBi 2.573, 2.604 -> 2.475, 2.502
  // (fwd+bwd unchanged), the E = 128 window 0.393, 0.398 -> 0.622, 0.635 (one CTA an SM instead of two).
  if (const char* v = cfg.staged_tma_forward() ? env_switch("KILN_FLEX_FWD_STAGES", "2", "3") : nullptr)
    cfg.fwd_stages = v[0] - '0';
  // Keep bits of the partial blocks for masks that read captured tensors, evaluated per mask row
  // (so only where the mask uses b / h no more than the BlockMask's own dims), up to 256 MiB. The
  // default (H200, session 9, fwd / fwd+bwd ms in one call: 16 documents 2.08 / 6.98 -> 1.37 /
  // 5.83, training shape 0.316 / 1.056 -> 0.199 / 0.866); KILN_FLEX_MASK_BITS=0 turns it off.
  // KILN_FLEX_MASK_BITS_ALL=1 (a measurement switch) takes them for every mask: slower on the window
  // rows (H200, session 15, 3cb76ca, fwd ms: E 64 0.118, 0.114 -> 0.129, 0.121; E 128 0.389, 0.382 ->
  // 0.430, 0.404), causal within noise.
  const bool bits_for_mask = p.mask && (p.mask->reads_tensors || env_flag("KILN_FLEX_MASK_BITS_ALL", false));
  if (env_flag("KILN_FLEX_MASK_BITS", true) && cfg.fwd_tma && bits_for_mask && !p.all_full) {
    const int64_t words = p.mB * p.mH * p.nQ * p.kv_m * (p.QB * p.KB / 32);
    if (per_mask_row(p) && words <= (int64_t{64} << 20)) {
      cfg.mask_bits = true;
      *mask_bits_words = words;
      cfg.fwd_keepbits = false;  // the keep-bits forward evaluates the mask itself
    }
  }
  // Partial tiles of a mask that keeps one run a row and column test their elements against it
  // (MASK_RANGES) by default: H200, session 16, c5e44ad, `PARTS="tests ab" AB_VAR=KILN_FLEX_MASK_RANGES
  // ROWS="0 1 2 3 5" bash scripts/device/session15_round.sh`, fwd / fwd+bwd ms, two interleaved
  // passes, 0 -> 1: window E 64 0.117 / 0.407, 0.123 / 0.418 -> 0.107 / 0.381, 0.114 / 0.387; window
  // E 128 0.392 / 1.355, 0.379 / 1.335 -> 0.352 / 1.267, 0.359 / 1.295; window 1024 0.813 / 2.845,
  // 0.803 / 2.894 -> 0.800 / 2.807, 0.789 / 2.782; causal 2.174 / 9.726, 2.194 / 9.744 -> 2.122 /
  // 9.845, 2.160 / 9.658; ALiBi within noise. KILN_FLEX_MASK_RANGES=0 evaluates the mask.
  cfg.mask_ranges = env_flag("KILN_FLEX_MASK_RANGES", true) && cfg.fwd_tma && !cfg.mask_bits;
  // The two warpgroups of a 128-row tile taking turns on the tensor cores, P V of a tile and Q K^T of
  // the next in one turn (KILN_FLEX_FWD_PINGPONG=1, a measurement switch, with the keep bits: decided
  // after the mask bits, which turn them off; Nsight Compute, session 17: these forwards keep the
  // tensor pipe 43-55 % busy). Not faster (H200,
  // session 17, 5c30324, fwd ms, off -> on: causal 2.15-2.16 -> 2.27-2.29, ALiBi 2.25-2.29 -> 2.43-2.45,
  // softcap within noise; with KILN_FLEX_FWD_STAGES=3 causal 2.14-2.17 -> 2.13-2.14, ALiBi 2.26-2.27 ->
  // 2.31-2.32): without a producer warp the skew exposes the next K's load.
  cfg.fwd_pingpong = cfg.staged_tma_forward() && cfg.fwd_threads() == 256 && cfg.fwd_keepbits &&
                     env_flag("KILN_FLEX_FWD_PINGPONG", false);
  // The backward's tiles by TMA by default (same call, fwd+bwd ms: causal 12.82 -> 10.35,
  // 16 documents 8.03 -> 6.90, window 0.712 -> 0.663, training shape 1.326 -> 1.179: the dQ
  // kernel's cp.async addressing took 240 registers, 163 with TMA); KILN_FLEX_BWD_TMA=0 keeps cp.async.
  cfg.bwd_tma = cfg.bwd_wgmma && env_flag("KILN_FLEX_BWD_TMA", true);
  // With TMA the dQ kernel's two K / V stages by default (H200, session 12, fwd+bwd ms, two
  // interleaved passes: window E 128 1.72 / 1.70 -> 1.65 / 1.67, 16 documents 5.62 / 5.63 -> 5.54 /
  // 5.51, ALiBi 10.45 / 10.48 -> 10.31 / 10.34, softcap 11.54 / 11.66 -> 11.32 / 11.45, the rest
  // within noise); KILN_FLEX_BWD_KBUF=1 keeps one. The cp.async dQ keeps one K buffer unless set.
  cfg.bwd_kbuf = std::getenv("KILN_FLEX_BWD_KBUF") || !cfg.bwd_tma ? k_buffers("KILN_FLEX_BWD_KBUF") : 2;
  // With TMA each tile's two products are issued in pairs by default (H200, session 12, fwd+bwd ms,
  // two interleaved passes: window E 64 0.605 / 0.579 -> 0.571 / 0.566, causal 10.41 / 10.45 ->
  // 10.21 / 10.25, 16 documents 5.49 / 5.49 -> 5.36 / 5.38, softcap 11.38 / 11.28 -> 11.22 / 11.18,
  // the rest within noise); KILN_FLEX_BWD_PAIRED=0 waits for each product alone.
  cfg.bwd_paired = cfg.bwd_tma && env_flag("KILN_FLEX_BWD_PAIRED", true);
  // With paired products, two dQ stages and no score_mod each tile's P is computed while its dP
  // product is in flight by default (H200, session 13, 2026-12-04, a20b950, `bash
  // scripts/device/bwd_round.sh`, fwd+bwd ms, two interleaved passes: window E 128 1.642 / 1.637 ->
  // 1.562 / 1.560, the rest within noise); KILN_FLEX_BWD_SPLIT_P=0 computes P and dS together.
  // A score_mod whose gradient is the identity (ALiBi: score + slope (kv - q)) takes it too: its dS
  // is P (dP - delta) as without one.
  cfg.bwd_split_p = env_flag("KILN_FLEX_BWD_SPLIT_P", true) && cfg.bwd_paired && cfg.bwd_kbuf == 2 &&
                    (!p.score || detail::score_grad_is_one(*p.score));
  // Short rows at E = 64 (where the forward takes 64 x 64 tiles, fewer than 6 blocks a row) run more
  // CTAs an SM: the forward held to 93 registers (5 CTAs instead of 4) and the wgmma dK/dV kernel to
  // 168 (3 instead of 2; not with captured-tensor gradients, which spill ~800 bytes there); no
  // spills otherwise. H200, session 14, 2026-12-04, `bash scripts/device/session14_round.sh` (PARTS=ab,
  // AB_VAR the switch), fwd / fwd+bwd ms, two interleaved passes, window 256 E 64: dK/dV 3 (3576941)
  // fwd+bwd 0.481 / 0.455 -> 0.415 / 0.429 (the dQ kernel at 4 gained nothing); forward 5 (f2d1786)
  // 0.129 / 0.441, 0.130 / 0.430 -> 0.108 / 0.405, 0.117 / 0.416. The dK/dV cap lost on the longer
  // rows of 4x12x4096x64 with 4 documents (fwd+bwd 0.782 / 0.781 -> 0.810 / 0.803), hence the rule.
  // KILN_FLEX_FWD_MIN_BLOCKS=1|5 and KILN_FLEX_BWD_MIN_BLOCKS=dkdv,dq override it.
  const bool e64_small_tiles = p.E == 64 && cfg.fwd_tile_m == 64 && cfg.fwd_tile_n == 64;
  if (e64_small_tiles && cfg.fwd_wgmma) {
    cfg.fwd_min_blocks = 5;
    if (cfg.bwd_wgmma && grad_numel == 0) cfg.bwd_dkdv_min_blocks = 3;
  }
  bwd_min_blocks(cfg);
  if (const char* v = e64_small_tiles ? env_switch("KILN_FLEX_FWD_MIN_BLOCKS", "1", "5") : nullptr)
    cfg.fwd_min_blocks = v[0] - '0';
  return cfg;
}

}  // namespace kiln::flex::cuda
