#pragma once
// CUDA kernels of swiglu (same contract as src/ops/cpu/swiglu.h: contiguous tensors of n
// elements and one dtype). No CUDA headers here.
#include "kiln/tensor.h"

namespace kiln::cuda {
// out = silu(gate) * up
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
// dgate = grad * up * s (1 + gate (1 - s)), dup = grad * silu(gate), s = sigmoid(gate)
void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);
}  // namespace kiln::cuda
