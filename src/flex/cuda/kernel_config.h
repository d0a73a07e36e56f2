#pragma once
// The FlexAttention kernels' configuration for one problem on one device: the measured defaults
// (each with the H200 figures that chose it) and the KILN_FLEX_* measurement switches that override
// them. No CUDA headers (attention_cuda.cpp includes this).
#include <cstdint>

#include "flex/cpu/attention.h"
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

// The KernelConfig of p (bf16 or fp16, as dtype) on `device`. check_indices: a mod's loads could
// not be proven in range; index32: they were, and every captured tensor's offsets fit 31 bits;
// grad_numel: the captured-tensor gradients' total size. *mask_bits_words gets the keep bits' size
// when cfg.mask_bits, else 0. Throws kiln::Error naming flex_attention on a bad switch value.
KernelConfig choose_kernel_config(const cpu::Problem& p, DType dtype, int device, bool check_indices, bool index32,
                                  int64_t grad_numel, int64_t* mask_bits_words);

// choose_kernel_config for a device of compute capability `major` (no device needed: the tests).
KernelConfig kernel_config_for(const cpu::Problem& p, DType dtype, int major, bool check_indices, bool index32,
                               int64_t grad_numel, int64_t* mask_bits_words);

}  // namespace kiln::flex::cuda
