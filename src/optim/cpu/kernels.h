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

// One parameter's AdamW update. param, grad: same dtype; exp_avg, exp_avg_sq: fp32 for 16-bit
// params, else param's dtype.
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  AdamWScalars s;
};
// Every parameter's update in one parallel loop over fixed chunks of all of them (multi-tensor: a
// model of many small parameters keeps every thread busy, where a loop per parameter ran each
// small one on one thread).
void adamw_step(const std::vector<AdamWTensors>& params);
// sum(grad^2) in fp64, chunked in a fixed order.
double grad_sumsq(const Tensor& grad);
void scale_(const Tensor& grad, double factor);

}  // namespace kiln::cpu
