#pragma once
// CUDA matrix products behind kiln/ops/linalg.h (no CUDA headers).
#include "kiln/tensor.h"

namespace kiln::cuda {

// Same contract as cpu::matmul_out (ops/cpu/linalg.h): out [M, N] / [B, M, N] contiguous,
// a [.., M, K], b [.., K, N], bias [N] or undefined, one dtype. Transposed operands go to
// cuBLASLt as op flags; the bias rides the cuBLASLt epilogue. allow_tf32 affects fp32 only.
void matmul_out(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool allow_tf32);

}  // namespace kiln::cuda
