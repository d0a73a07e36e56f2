#pragma once
// CPU kernel of the rotary embedding (half-split convention). Contiguous tensors only.
#include "kiln/tensor.h"

namespace kiln::cpu {
// x, out: [B, T, H, D]; cos, sin: [T, D/2] in fp32 (fp64 for fp64 x). sign = +1 rotates by
// +theta (forward), -1 by -theta (the backward: the transpose of a rotation).
void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out);
// qkv [B, T, 3, H, D] <-> q, k, v [B, H, T, D], all contiguous. split: q, k = rotary(+theta) of
// qkv's slots 0, 1 and v = slot 2; otherwise the backward: qkv's slots = rotary(-theta) of q, k
// (the gradients) and v.
void qkv_rotary(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                const Tensor& sin, bool split);
}  // namespace kiln::cpu
