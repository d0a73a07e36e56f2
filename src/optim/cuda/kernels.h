#pragma once
// CUDA kernels of the optimizers (no CUDA headers here), multi-tensor: every list is updated in a
// few launches. Tensors are contiguous and on one device.
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"
#include "optim/cpu/kernels.h"

namespace kiln::cuda {

// Every parameter's AdamW update (same contract as the CPU's multi-tensor step).
void adamw_step(const std::vector<cpu::AdamWTensors>& params);
// slots: [grads.size()] fp64 on the device; writes slots[i] = sum(grads[i]^2) (fp64, fixed order).
void grad_sumsq(const std::vector<Tensor>& grads, const Tensor& slots);
// total ([] fp32) = sqrt(sum(slots)); coef ([] fp64) = min(1, max_norm / (total + 1e-6)).
void clip_coefficient(const Tensor& slots, double max_norm, const Tensor& total, const Tensor& coef);
// grads[i] *= coef[0] (read on the device).
void scale_by(const std::vector<Tensor>& grads, const Tensor& coef);

}  // namespace kiln::cuda
