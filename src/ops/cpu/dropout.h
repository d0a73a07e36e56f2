#pragma once
// Dropout mask kernels. Element i (row-major in contiguous x) is kept when the Philox uniform
// of (seed, offset, i) is below 1 - p; kept elements are scaled by 1/(1-p). The CPU and CUDA
// kernels share philox.h, so one (seed, offset) gives the same mask on both.
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {
// x, out: contiguous, same shape and dtype. Also the backward (applied to the gradient).
void dropout_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out);
}  // namespace kiln::cpu
