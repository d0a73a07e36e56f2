#pragma once
// Matrix products. fp32 accumulation for every dtype: OpenBLAS sgemm/dgemm on the CPU (bf16 and
// fp16 panels converted to fp32), cuBLASLt on CUDA. Outputs take the input dtype.
#include "kiln/tensor.h"

namespace kiln {

// a: [M, K], b: [K, N] -> [M, N]
Tensor mm(const Tensor& a, const Tensor& b);
// a: [B, M, K], b: [B, K, N] -> [B, M, N]
Tensor bmm(const Tensor& a, const Tensor& b);
// torch.matmul semantics: 1-D vectors, 2-D matrices, batched with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// x: [..., in], weight: [out, in], bias: [out] or undefined -> [..., out]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace kiln
