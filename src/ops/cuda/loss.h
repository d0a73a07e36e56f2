#pragma once
// CUDA kernels of the unfused cross-entropy. logits [N, C] and target [N] are contiguous; weight
// is [C] in the statistics dtype (fp32, fp64 for fp64 logits) or undefined.
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cuda {
// Per row: lse = logsumexp(logits), row_loss = (1 - eps) w_t (lse - x_t) + eps/C sum_c w_c (lse - x_c),
// row_weight = w_t (0 on ignored rows, which also get row_loss 0). Raises on a target outside
// [0, C) that is not ignore_index (checked on the device; reading the flag synchronises).
void cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                        double smoothing, const Tensor& lse, const Tensor& row_loss, const Tensor& row_weight);
// out ([] in the logits dtype) = sum(row_loss), divided by sum(row_weight) when mean;
// total_weight ([] statistics dtype) receives sum(row_weight) when defined.
void cross_entropy_reduce(const Tensor& row_loss, const Tensor& row_weight, bool mean, const Tensor& out,
                          const Tensor& total_weight);
// grad: [] (mean, sum) or [N] (none), logits dtype; total_weight defined for mean.
void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& weight,
                            const Tensor& lse, const Tensor& total_weight, int64_t ignore_index, double smoothing,
                            const Tensor& dlogits);
}  // namespace kiln::cuda
