#pragma once
// CPU kernels of rms_norm. Every tensor is contiguous; rows = x.numel() / H.
#include "kiln/tensor.h"

namespace kiln::cpu {
// x, y: [rows, H]; weight: [H] or undefined; rstd: [rows] fp32 (fp64 for fp64 x).
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
// h = x + residual, y = rms_norm(h) * weight in one pass per row; x, residual, h, y: [rows, H].
void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h,
                          const Tensor& y, const Tensor& rstd);
// dy, x, dx: [rows, H]; dweight: [H] (x's dtype) or undefined when no weight gradient is wanted.
// dpass: [rows, H] or undefined: a gradient added into dx in the same pass (the residual stream's,
// for add_rms_norm).
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight, const Tensor& dpass = Tensor());
}  // namespace kiln::cpu
