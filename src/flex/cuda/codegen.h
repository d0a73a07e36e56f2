#pragma once
// CUDA source generation for FlexAttention: the score_mod / mask_mod programs become device
// functions (mask_mod, score_mod, score_grad) between the embedded headers device_common.cuh and
// kernels.cuh, which the source #includes (NVRTC resolves them from the library, nvrtc.cpp). The source
// depends only on the IR, the dtype, the head dim and the tile configuration: lengths, captured
// tensor shapes and pointers are run-time kernel arguments (FlexParams), so a new sequence length
// never recompiles. No CUDA headers here (plain C++ callers and the CPU-side NVRTC test use it).
#include <cstdint>
#include <string>

#include "flex/cuda/flex_params.cuh"  // FlexParams, kMaxBuffers
#include "flex/ir.h"

namespace kiln::flex::cuda {

constexpr int kTileM = 64;      // q rows per CTA (4 warps x 16)
constexpr int kTileN = 64;      // kv columns per step (BlockMask blocks must be multiples of both)
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPreRows = 4;  // rows each flex_bwd_pre lane group reads, their loads in flight together

// What a generated source depends on besides the mods: the decisions kernel_config_for
// (kernel_config.h) takes for one problem, each a rule of the shapes, dtype and architecture. A field
// added here joins the kernel cache's id (attention_cuda.cpp's config_id).
struct KernelConfig {
  bool bf16 = true;  // false: fp16
  int head_dim = 128;
  // sm_90a: every kernel's products by wgmma and its tiles by TMA (the forward in two K / V stages,
  // the dQ kernel in two K / V stages, the dK/dV kernel with two Q / dO buffers, each backward
  // tile's two products issued as a pair). Else mma.sync with tiles by cp.async (sm_80 and others).
  bool wgmma = false;
  // The forward's tile: fwd_tile_m q rows per CTA (a warp of 16 rows each), fwd_tile_n kv columns
  // per step. BlockMask blocks must be multiples of both; wgmma takes 64 or 128 of each. The
  // backward's tiles are kTileM x kTileN.
  int fwd_tile_m = kTileM, fwd_tile_n = kTileN;
  // Captured-tensor loads raise the error flag when out of range (the host could not prove them
  // in range for the problem's lengths); they are clamped either way.
  bool index_check = true;
  // Loads proven in range (index_check false) whose flat offsets all fit 32 bits: no clamp, 32-bit
  // offset arithmetic. Lengths that keep the proof keep the kernel.
  bool index32 = false;
  // wgmma forward: a tile that is not interior gets its mask's keep bits while QK^T is in flight
  // (not with mask_bits).
  bool fwd_keepbits = false;
  // wgmma forward: a CTA per SM slot walks several q tiles, a producer warpgroup loading the next
  // tile's Q and first K / V during the last tiles of the one before (persist.cuh).
  bool fwd_persist = false;
  // The staged wgmma forward (not persistent) at 128-row tiles: the last warp done with a stage
  // issues its next loads, instead of a block barrier each step.
  bool fwd_last_issues = false;
  // wgmma forward: partial blocks of a mask that reads captured tensors take their keep bits from
  // flex_mask_bits, run before the forward (and the dQ kernel); needs merged_walk.
  bool mask_bits = false;
  // wgmma: masks that keep one run of kv a row and of q a column (emit_mask_range) test partial
  // tiles' elements against it instead of evaluating the mask (not with mask_bits).
  bool mask_ranges = false;
  // Every kernel walks one merged list a row (FlexParams::kv_all_* / q_all_*).
  bool merged_walk = false;
  // wgmma backward, no score_mod or one of gradient 1: each tile's P computed while its dP product
  // is still in flight, then dS.
  bool bwd_split_p = false;
  // The kernels' minimum resident CTAs an SM (__launch_bounds__' second argument, which caps their
  // registers: E = 64 dK/dV at 3 takes 168 instead of 215; the forward with 64 x 64 tiles at 5 takes
  // 93 instead of 122); 1 leaves ptxas free.
  int bwd_dkdv_min_blocks = 1, bwd_dq_min_blocks = 1, fwd_min_blocks = 1;
  // Cheaper mods: int locals the interval analysis proves within 32 bits under detail::kNarrowQKv /
  // kNarrowBH are `int` (64-bit multiplies and conversions cost several instructions each on sm_90),
  // ints within +-2^22 convert to float by kiln_i2f (two adds, not I2F), float divisions by
  // constants multiply by the reciprocal, tanh is tanh.approx.f32. The host sets it only when B, H,
  // L and S are within those bounds.
  bool fast_mods = false;
  // No score_mod and scale > 0 (the host's proof): scores stay raw through the mask and the
  // softmax's max, and the scale joins log2(e) in each exponent's FFMA.
  bool fold_scale = false;
  int fwd_threads() const { return 32 * fwd_tile_m / 16; }
  // The persistent forward's K / V stages: three with 128-row tiles (one Q buffer and three stages
  // fill the 227 KB at E = 128), else two (two or three CTAs an SM).
  int persist_stages() const { return fwd_tile_m == 128 ? 3 : 2; }
  // The staged wgmma forward (not persistent): where fwd_last_issues applies.
  bool staged_tma_forward() const { return wgmma && !fwd_persist; }
};

// score: null for the identity; mask: null for no mask_mod. Throws kiln::Error naming
// flex_attention when a program cannot run on CUDA (too many captured tensors).
std::string generate_source(const detail::Program* score, const detail::Program* mask, const KernelConfig& cfg);

// Only the mod device functions (for tests and debugging); fast_mods as KernelConfig's.
std::string generate_mod_functions(const detail::Program* score, const detail::Program* mask, bool fast_mods = false);

// Writes `fn`(b, h, q, kv, P, &lo, &hi) to `out`: the mask holds exactly on lo <= x <= hi of the free
// index `var` (Op::KvIdx: a row's run of kv; Op::QIdx: a column's run of q), the other index fixed,
// the free one's argument ignored; `forward` holds the mask's emitted locals. False (nothing written)
// when the mask is not such a run (codegen_ranges.cpp).
bool emit_mask_range(const detail::Program& mask, Op var, const char* fn, const std::string& forward,
                     std::ostream& out);

// mask_kv_range and mask_q_range of `mask` (MASK_RANGES), or "" when it is not a run both ways.
std::string mask_range_functions(const detail::Program& mask, bool fast_mods);

// The mod functions with a one-line kernel calling them: a fast NVRTC check of the codegen alone.
std::string generate_mod_check_source(const detail::Program* score, const detail::Program* mask,
                                      bool fast_mods = false);

}  // namespace kiln::flex::cuda
