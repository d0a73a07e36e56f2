#pragma once
// CPU softmax / log_softmax kernels. All tensors contiguous, viewed as [outer, n, inner] with
// the softmax taken along n.
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {

void softmax_forward(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log);
// softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g)
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& gx, int64_t outer, int64_t n, int64_t inner,
                      bool log);

}  // namespace kiln::cpu
