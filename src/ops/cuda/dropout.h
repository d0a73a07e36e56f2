#pragma once
// CUDA dropout mask kernel (same contract as src/ops/cpu/dropout.h).
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cuda {
void dropout_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out);
}  // namespace kiln::cuda
