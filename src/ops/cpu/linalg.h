#pragma once
// CPU matrix products behind kiln/ops/linalg.h.
#include "kiln/tensor.h"

namespace kiln::cpu {

// out: [M, N] or [B, M, N], contiguous; a: [M, K] / [B, M, K] (or batch 1); b: [K, N] / [B, K, N];
// bias: [N] or undefined. All share out's dtype; K may be 0 (out = bias or zeros).
// Computes out = a @ b (+ bias) with fp32 accumulation (fp64 for fp64).
void matmul_out(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);

}  // namespace kiln::cpu
