#pragma once
// Matrix products. fp32 accumulation for every dtype: OpenBLAS sgemm/dgemm on the CPU (bf16 and
// fp16 panels converted to fp32), cuBLASLt on CUDA. Outputs take the input dtype. Both operands
// share one floating dtype and one device. Transposed/sliced operands are read in place when one
// of their two matrix dims is unit-stride (a transpose is a BLAS flag, not a copy).
#include <string>

#include "kiln/tensor.h"

namespace kiln {

// a: [M, K], b: [K, N] -> [M, N]
Tensor mm(const Tensor& a, const Tensor& b);
// a: [B, M, K], b: [B, K, N] -> [B, M, N]
Tensor bmm(const Tensor& a, const Tensor& b);
// torch.matmul semantics: 1-D vectors, 2-D matrices, batched with broadcast batch dims.
//   [K] @ [K] -> [];  [M, K] @ [K] -> [M];  [K] @ [K, N] -> [N];  [M, K] @ [K, N] -> [M, N];
//   [..., M, K] @ [..., K, N] -> [broadcast(...), M, N] (a 1-D side gains, then loses, its matrix dim).
// [..., M, K] @ [K, N] folds the batch into M: one gemm, no reduction in backward.
Tensor matmul(const Tensor& a, const Tensor& b);
// x: [..., in], weight: [out, in], bias: [out] or undefined -> [..., out]
// (x @ weight^T + bias; on CUDA the bias is fused into the gemm's epilogue).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// torch.set_float32_matmul_precision: "highest" (default) keeps fp32 matmuls exact fp32 on CUDA;
// "high" lets them use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation). The CPU
// always computes in fp32. Other dtypes are unaffected.
void set_float32_matmul_precision(const std::string& precision);
std::string get_float32_matmul_precision();

}  // namespace kiln
