#pragma once
// CUDA kernels of the optimizers (no CUDA headers here). Tensors are contiguous.
#include <cstdint>

#include "kiln/tensor.h"
#include "optim/cpu/kernels.h"

namespace kiln::cuda {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const cpu::AdamWScalars& s);
// slots: [k] fp64 on the device; writes slots[index] = sum(grad^2) (fp64, fixed order).
void grad_sumsq(const Tensor& grad, const Tensor& slots, int64_t index);
// total ([] fp32) = sqrt(sum(slots)); coef ([] fp64) = min(1, max_norm / (total + 1e-6)).
void clip_coefficient(const Tensor& slots, double max_norm, const Tensor& total, const Tensor& coef);
// grad *= coef[0] (read on the device).
void scale_by(const Tensor& grad, const Tensor& coef);

}  // namespace kiln::cuda
