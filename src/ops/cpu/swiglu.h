#pragma once
// CPU kernels of swiglu (silu(gate) * up). Every tensor is contiguous with n elements.
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {
// out = silu(gate) * up
void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
// dgate = grad * up * s (1 + gate (1 - s)), dup = grad * silu(gate), s = sigmoid(gate)
void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);

namespace simd {
// The fp32 rows (ops/cpu/swiglu_simd.cpp).
void swiglu_forward_f32(const float* gate, const float* up, float* out, int64_t n);
void swiglu_backward_f32(const float* grad, const float* gate, const float* up, float* dgate, float* dup, int64_t n);
}  // namespace simd
}  // namespace kiln::cpu
