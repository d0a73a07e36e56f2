#pragma once
// CUDA kernel of the rotary embedding (same contract as src/ops/cpu/rope.h).
#include "kiln/tensor.h"

namespace kiln::cuda {
void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out);
void qkv_rotary(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                const Tensor& sin, bool split);
}  // namespace kiln::cuda
