#pragma once
// CPU kernels of the optimizers. Tensors are contiguous.
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cpu {

// Scalars of one AdamW step, bias corrections already folded in (host, fp64).
struct AdamWScalars {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size;             // lr / (1 - beta1^t)
  double bias_correction2_sqrt; // sqrt(1 - beta2^t)
};

// param, grad: same dtype; exp_avg, exp_avg_sq: fp32 for 16-bit params, else param's dtype.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamWScalars& s);
// sum(grad^2) in fp64, chunked in a fixed order.
double grad_sumsq(const Tensor& grad);
void scale_(const Tensor& grad, double factor);

}  // namespace kiln::cpu
