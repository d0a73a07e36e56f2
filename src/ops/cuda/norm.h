#pragma once
// CUDA kernels of rms_norm (same contract as src/ops/cpu/norm.h). No CUDA headers here.
#include "kiln/tensor.h"

namespace kiln::cuda {
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);
}  // namespace kiln::cuda
