#pragma once
// CUDA source generation for FlexAttention: the score_mod / mask_mod programs become device
// functions (mask_mod, score_mod, score_grad) pasted in front of the kernel templates. The source
// depends only on the IR, the dtype, the head dim and the tile configuration: lengths, captured
// tensor shapes and pointers are run-time kernel arguments (FlexParams), so a new sequence length
// never recompiles. No CUDA headers here (plain C++ callers and the CPU-side NVRTC test use it).
#include <cstdint>
#include <string>

#include "flex/ir.h"

namespace kiln::flex::cuda {

constexpr int kMaxBuffers = 8;  // captured tensors per mod on CUDA
constexpr int kTileM = 64;      // q rows per CTA (4 warps x 16)
constexpr int kTileN = 64;      // kv columns per step (BlockMask blocks must be multiples of both)
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPreRows = 4;  // rows each flex_bwd_pre lane group reads, their loads in flight together

// The kernels' argument block. Every field is 8 bytes (pointers, int64, double), so the host and
// the generated device struct (same field list, in kernel_source.cpp) have one layout; the device
// side static_asserts the size the host emits.
struct FlexParams {
  const void *q, *k, *v;
  void* out;
  float* lse;
  const void* dout;
  const float* dlse;
  float* delta;
  float* lse2;  // backward: lse * log2(e) per row (+inf for fully masked rows), from flex_bwd_pre
  void *dq, *dk, *dv;
  const int32_t *kv_num, *kv_idx, *fkv_num, *fkv_idx;
  const int32_t *q_num, *q_idx, *fq_num, *fq_idx;
  // KernelConfig::merged_walk: the partial and full lists merged (detail::merge_block_lists), else null.
  const int32_t *kv_all_num, *kv_all_idx, *q_all_num, *q_all_idx;
  int32_t* err;
  double* slots;    // [nslots][kWarps][grad_numel] per-warp captured-gradient slots
  double* capgrad;  // [grad_numel] the fixed-order sum of the slots
  uint32_t* mbits;  // KernelConfig::mask_bits: keep bits of the kv lists' partial blocks (flex_mask_bits), else null
  int64_t B, Hq, Hkv, L, S, G;
  int64_t QB, KB, nQB, nKVB, mB, mH, kv_m, fkv_m, q_m, fq_m, all_full;
  int64_t q_tiles, kv_tiles, units, nslots, grad_numel;
  int64_t kv_all_m, q_all_m;
  double scale;
  float scale_f;      // (float)scale
  float scale_log2e;  // scale log2(e) rounded once from double: FOLD_SCALE's exponent factor
  const void* sptr[kMaxBuffers];
  int64_t ssize[kMaxBuffers][3], sstride[kMaxBuffers][3], sgoff[kMaxBuffers];
  const void* mptr[kMaxBuffers];
  int64_t msize[kMaxBuffers][3], mstride[kMaxBuffers][3];
  // KernelConfig::wgmma: CUtensorMaps of q and dout [B*Hq, L, E], k and v [B*Hkv, S, E] (64-column
  // boxes, 128-byte swizzle; the forward's rows per box, then the backward's), read by bulk tensor
  // copies; omap: out's, written by the persistent forward's bulk tensor stores; unused otherwise.
  alignas(64) unsigned char qmap[128], kmap[128], vmap[128], domap[128], omap[128];
};

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
  // tile's Q and first K / V during the last tiles of the one before (kernel_source_persist.cpp).
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

// The kernel templates, concatenated once by kernel_template() (kernel_source.cpp) in this order:
// prelude, wgmma helpers (kernel_source_wgmma.cpp), walks and mod_score (kernel_source_walks.cpp),
// the forward's tiles and kernel (kernel_source_fwd.cpp), the persistent forward
// (kernel_source_persist.cpp) and the backward: its shared part and flex_bwd_pre (kernel_source_bwd.cpp),
// the dQ kernel (kernel_source_bwd_dq.cpp) and the dK/dV kernel (kernel_source_bwd_dkdv.cpp).
const std::string& kernel_template();
const char* params_struct_source();
const char* kernel_prelude();
const char* wgmma_helpers_source();
const char* kernel_walks();
const char* kernel_forward_tiles();
const char* kernel_forward();
const char* kernel_forward_persist();
const char* kernel_backward_common();
const char* kernel_backward_dq();
const char* kernel_backward_dkdv();

}  // namespace kiln::flex::cuda
