#pragma once
// CUDA kernels of rms_norm (same contract as src/ops/cpu/norm.h). No CUDA headers here.
#include "kiln/tensor.h"

namespace kiln::cuda {
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);

// The one-pass kernels (norm_fused.cu) with the residual add and the output cast folded in.
// x, residual, h, y: [rows, H]; h (= x + residual, written when residual is given), x, weight [H]
// and dx in dtype X; y and dy in Y; residual and dr in R; rstd [rows] fp32 (fp64 for fp64). Taken
// where fused_rms_norm_supported: X = Y = R, or X fp32 with Y a float type other than fp64 and R in
// {X, Y}; H a multiple of 16 bytes of X and at most 2048 such packs. Every tensor must be contiguous
// and 16-byte aligned (the caller copies one that is not).
bool fused_rms_norm_supported(DType x, DType y, DType residual, int64_t H);
void fused_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h,
                            const Tensor& y, const Tensor& rstd);
// dres: the gradient h gets from its other uses (added to dx) or undefined; dr: dx again in R, or
// undefined; dweight: [H] or undefined.
void fused_rms_norm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                             const Tensor& dres, const Tensor& dx, const Tensor& dr, const Tensor& dweight);
}  // namespace kiln::cuda
