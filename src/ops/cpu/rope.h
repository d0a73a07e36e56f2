#pragma once
// CPU kernel of the rotary embedding (half-split convention). Contiguous tensors only.
#include "kiln/tensor.h"

namespace kiln::cpu {
// x, out: [B, T, H, D]; cos, sin: [T, D/2] in fp32 (fp64 for fp64 x). sign = +1 rotates by
// +theta (forward), -1 by -theta (the backward: the transpose of a rotation).
void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out);
}  // namespace kiln::cpu
