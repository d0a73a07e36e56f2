#pragma once
// CPU kernels of rms_norm. Every tensor is contiguous; rows = x.numel() / H.
#include "kiln/tensor.h"

namespace kiln::cpu {
// x, y: [rows, H]; weight: [H] or undefined; rstd: [rows] fp32 (fp64 for fp64 x).
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
// dy, x, dx: [rows, H]; dweight: [H] (x's dtype) or undefined when no weight gradient is wanted.
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);
}  // namespace kiln::cpu
