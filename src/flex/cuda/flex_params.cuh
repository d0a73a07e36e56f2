#pragma once
// FlexAttention's kernel argument block, defined once for the host (codegen.h; attention_cuda.cpp fills it) and
// every device compile (the NVRTC source includes this embedded file; so do the nvcc checks). Every
// field is 8 bytes (pointers, 64-bit ints, doubles) or a 64-byte aligned tensor map, so g++, nvcc and
// NVRTC lay it out alike. The device compiles see the kernels' own int types and no standard headers
// (NVRTC has none): host code that fills the block is plain C++ (.cpp), not nvcc's.
#if defined(__CUDACC__)
namespace kiln::flex::cuda {
using params_i32 = int;
using params_u32 = unsigned;
using params_i64 = long long;
}  // namespace kiln::flex::cuda
#else
#include <cstdint>
namespace kiln::flex::cuda {
using params_i32 = std::int32_t;
using params_u32 = std::uint32_t;
using params_i64 = std::int64_t;
}  // namespace kiln::flex::cuda
#endif

namespace kiln::flex::cuda {

// Captured tensors per mod on CUDA. An enumerator: a constexpr int would become a global of every
// device compile.
enum : int { kMaxBuffers = 8 };

// The kernels' argument block, filled by the host (attention_cuda.cpp) and passed by value.
struct FlexParams {
  const void *q, *k, *v;
  void* out;
  float* lse;
  const void* dout;
  const float* dlse;
  float* delta;
  float* lse2;  // backward: lse * log2(e) per row (+inf for fully masked rows), from flex_bwd_pre
  void *dq, *dk, *dv;
  const params_i32 *kv_num, *kv_idx, *fkv_num, *fkv_idx;
  const params_i32 *q_num, *q_idx, *fq_num, *fq_idx;
  // KernelConfig::merged_walk: the partial and full lists merged (detail::merge_block_lists), else null.
  const params_i32 *kv_all_num, *kv_all_idx, *q_all_num, *q_all_idx;
  params_i32* err;
  double* slots;    // [nslots][kWarps][grad_numel] per-warp captured-gradient slots
  double* capgrad;  // [grad_numel] the fixed-order sum of the slots
  params_u32* mbits;  // KernelConfig::mask_bits: keep bits of the kv lists' partial blocks (flex_mask_bits), else null
  params_i64 B, Hq, Hkv, L, S, G;
  params_i64 QB, KB, nQB, nKVB, mB, mH, kv_m, fkv_m, q_m, fq_m, all_full;
  params_i64 q_tiles, kv_tiles, units, nslots, grad_numel;
  params_i64 kv_all_m, q_all_m;
  double scale;
  float scale_f;      // (float)scale
  float scale_log2e;  // scale log2(e) rounded once from double: FOLD_SCALE's exponent factor
  const void* sptr[kMaxBuffers];
  params_i64 ssize[kMaxBuffers][3], sstride[kMaxBuffers][3], sgoff[kMaxBuffers];
  const void* mptr[kMaxBuffers];
  params_i64 msize[kMaxBuffers][3], mstride[kMaxBuffers][3];
  // KernelConfig::wgmma: CUtensorMaps of q and dout [B*Hq, L, E], k and v [B*Hkv, S, E] (64-column
  // boxes, 128-byte swizzle; the forward's rows per box, then the backward's), read by bulk tensor
  // copies; omap: out's, written by the persistent forward's bulk tensor stores; unused otherwise.
  alignas(64) unsigned char qmap[128], kmap[128], vmap[128], domap[128], omap[128];
};

}  // namespace kiln::flex::cuda

#if defined(__CUDACC__)
using kiln::flex::cuda::FlexParams;  // the kernels' signatures name it plainly
#endif
