#pragma once
// The FlexAttention CUDA kernels, compiled at run time by NVRTC after device_common.cuh and the
// generated mod functions (codegen.cpp), and by nvcc at build time (kernel_check/flex.cu). No CUDA
// headers: bf16/fp16 travel as 16-bit patterns, tensor cores via inline PTX: on sm_90a wgmma with TMA
// tile loads (wgmma.cuh; FWD_WGMMA / BWD_WGMMA), else mma.sync m16n8k16 with cp.async.
//
// Tiles (mma.sync): a CTA is 4 warps; each warp owns 16 rows of a 64 x 64 score tile and
// accumulates in fp32 registers (mma C fragments). Q/K/V/dO tiles sit in shared memory with rows
// padded by 16 bytes (conflict-free ldmatrix: the 8 rows of a phase hit distinct banks). With
// wgmma a warpgroup owns 64 rows, tiles are swizzled and unpadded, the accumulators keep the same
// per-thread layout, so the softmax and mask code is shared. K/V (Q/dO in dK/dV) tiles arrive
// by TMA or cp.async, the next one's load issued as soon as its buffer is free, so it overlaps
// the current tile's MMAs. 64 x 64 divides the BlockMask's 128 blocks; a CTA walks the BlockMask
// lists, partial and full merged in ascending block order, so a block contributes the same bits
// whatever its classification (the mask is simply not evaluated on full blocks).
//   flex_fwd:       per (b, q head, q tile): online softmax, out in T, lse (natural log).
//   flex_bwd_pre:   delta = rowsum(dO * O) - dlse, E / 8 lanes a row (16-byte loads), PRE_ROWS rows a lane group.
//   flex_bwd_dq:    per (b, q head, q tile): dQ = scale * sum dS K over its kv list.
//   flex_bwd_dkdv:  per (b, kv head, 64-row kv tile): dV = sum P^T dO, dK = scale * sum dS^T Q over
//                   the group's q heads (fixed order) and their transposed q lists; captured-tensor
//                   gradients go to per-warp double slots, lanes taking turns (fixed order);
//                   then flex_capgrad_reduce sums the slots in order. No atomics anywhere.
// KILN_BUILD_FWD / KILN_BUILD_BWD (default 1) choose the forward's or the backward's kernels.
#include "flex/cuda/prelude.cuh"
#include "flex/cuda/wgmma.cuh"
#include "flex/cuda/walks.cuh"
#include "flex/cuda/fwd_tiles.cuh"
#include "flex/cuda/fwd.cuh"
#include "flex/cuda/persist.cuh"
#if KILN_BUILD_BWD
#include "flex/cuda/bwd_common.cuh"
#include "flex/cuda/bwd_dq.cuh"
#include "flex/cuda/bwd_dkdv.cuh"
#endif  // KILN_BUILD_BWD
