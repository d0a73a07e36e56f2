#pragma once
// The plan of one FlexAttention call on CUDA, decided once, at the top of the call, from the
// problem's shapes, its dtype, the device's compute capability and the tuning values
// (kiln/tuning.h): which BlockMask the kernels walk (BlockPlan) and each kernel's configuration
// (KernelConfig, codegen.h). Every rule is a measured default (kernel_config.cpp gives the figures).
// No CUDA headers and no device: the tests check the rules on the CPU.
#include <cstdint>

#include "flex/cpu/attention.h"
#include "flex/cuda/codegen.h"
#include "kiln/tuning.h"

namespace kiln::flex::cuda {

// Which BlockMask each kernel walks, decided from the caller's problem before any is derived.
struct BlockPlan {
  // Every kernel walks one merged list a row (detail::merge_block_lists): a BlockMask with a mask_mod.
  bool merge = false;
  // The backward (and the forward unless forward_keeps) walks the mask at 64-blocks
  // (detail::halve_blocks): a 128-block mask on rows short enough that the forward takes 64 x 64
  // tiles anyway, whose partial blocks' empty halves drop out of every walk.
  bool halve = false;
  // With halve: the forward walks the caller's 128-blocks, with the persistent forward's 128 x 128
  // tiles (short rows at E = 128, a mask that reads no tensors, no score_mod).
  bool forward_keeps = false;
};

// can_halve: p's BlockMask may be halved (its mask uses b / h only where the BlockMask has those dims).
BlockPlan block_plan_for(const cpu::Problem& p, int major, bool can_halve, const FlexTuning& tuning);

// The KernelConfig of p (bf16 or fp16, as dtype) on a device of compute capability `major`.
// check_indices: a mod's loads could not be proven in range; index32: they were, and every captured
// tensor's offsets fit 31 bits; grad_numel: the captured-tensor gradients' total size.
// *mask_bits_words gets the keep bits' size when cfg.mask_bits, else 0.
KernelConfig kernel_config_for(const cpu::Problem& p, DType dtype, int major, bool check_indices, bool index32,
                               int64_t grad_numel, const FlexTuning& tuning, int64_t* mask_bits_words);

// Everything the kernels of one call are generated and launched for.
struct Plan {
  KernelConfig fwd, bwd;  // the forward's and the backward's (the same unless the forward keeps the blocks)
  bool separate_forward = false;  // the forward runs on its own problem and configuration (forward_keeps)
  int64_t fwd_mask_bits_words = 0, bwd_mask_bits_words = 0;  // flex_mask_bits' output sizes, else 0
  bool check_indices = false;  // a mod's loads may go out of range: the kernels raise a flag to read back
  int64_t grad_numel = 0;      // the captured-tensor gradients' total size
};

// p: the backward's problem, its BlockMask merged and halved as block_plan_for said; fwd_p: the
// forward's where it walks the caller's blocks (BlockPlan::forward_keeps), else null.
Plan plan_for(const cpu::Problem& p, const cpu::Problem* fwd_p, DType dtype, int major, const FlexTuning& tuning);

}  // namespace kiln::flex::cuda
