// Tensor-level CUDA matmul: maps strided operands to cuda::gemm (ops/cuda/gemm.h) without copies
// where their strides allow, on the current stream of the output's device.
#include "ops/cuda/linalg.h"

#include "core/cuda/check.h"
#include "kiln/autograd.h"
#include "ops/cuda/gemm.h"
#include "ops/linalg_layout.h"

namespace kiln::cuda {

void matmul_out(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias_in, bool allow_tf32) {
  NoGradGuard no_grad;
  if (out.numel() == 0) return;
  const Tensor bias = bias_in.defined() ? bias_in.detach().contiguous() : Tensor();
  const int64_t m = out.size(-2), n = out.size(-1);
  GemmParams p;
  p.m = m;
  p.n = n;
  p.k = a.size(-1);
  p.batch = out.dim() == 3 ? out.size(0) : 1;
  linalg::GemmOperand pa, pb;
  if (p.k > 0) {  // k == 0 reads neither operand (and their pointers may be null)
    pa = linalg::gemm_operand(a);
    pb = linalg::gemm_operand(b);
    p.trans_a = pa.layout.trans;
    p.lda = pa.layout.ld;
    p.stride_a = pa.batch_stride;
    p.trans_b = pb.layout.trans;
    p.ldb = pb.layout.ld;
    p.stride_b = pb.batch_stride;
  }
  p.a = pa.ptr;
  p.b = pb.ptr;
  p.c = out.data_ptr();
  p.ldc = n;
  p.stride_c = m * n;
  p.ab_type = a.dtype();  // out may be fp32 for bf16 / fp16 inputs (a weight's gradient under autocast)
  p.c_type = out.dtype();
  p.beta = 0.0;
  if (bias.defined()) {
    p.bias = bias.data_ptr();
    p.bias_type = bias.dtype();
  }
  p.allow_tf32 = allow_tf32;
  p.device = out.device().index;
  p.stream = current_raw_stream(p.device);
  gemm(p);
}

}  // namespace kiln::cuda
