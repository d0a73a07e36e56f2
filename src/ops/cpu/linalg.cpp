// CPU matmul: strided operands go to OpenBLAS in place when one of their two matrix dims is
// unit-stride (a transpose is a BLAS flag, not a copy); other layouts are copied contiguous.
// bf16/fp16 operands are converted to fp32 once, multiplied with sgemm (fp32 accumulation) into
// an fp32 buffer, and rounded to the output dtype once at the end. A bias is written into C
// first and the gemm accumulates onto it (beta = 1), so it is added in fp32 too.
#include "ops/cpu/linalg.h"

#include "kiln/autograd.h"
#include "ops/cpu/gemm.h"
#include "ops/linalg_layout.h"

namespace kiln::cpu {
namespace {

template <typename T>
void run(const Tensor& c, const Tensor& a, const Tensor& b, bool accumulate) {
  const int64_t batch = c.dim() == 3 ? c.size(0) : 1;
  const int64_t m = c.size(-2), n = c.size(-1), k = a.size(-1);
  const linalg::GemmOperand pa = linalg::gemm_operand(a), pb = linalg::gemm_operand(b);
  gemm_batched(pa.layout.trans, pb.layout.trans, batch, m, n, k, T(1), static_cast<const T*>(pa.ptr),
               pa.layout.ld, pa.batch_stride, static_cast<const T*>(pb.ptr), pb.layout.ld, pb.batch_stride,
               accumulate ? T(1) : T(0), c.data_ptr<T>(), n, m * n);
}

// A 16-bit operand widened to fp32 in its own layout: a transposed matrix (a weight in linear, an
// operand of a backward product) stays transposed, read by the gemm with a flag, so the conversion
// runs over dense rows instead of gathering columns.
Tensor widen(const Tensor& x) {
  const Tensor xt = x.transpose(-2, -1);
  if (!x.is_contiguous() && xt.is_contiguous()) return xt.to(kFloat32).transpose(-2, -1);
  return x.to(kFloat32);
}

}  // namespace

void matmul_out(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in) {
  NoGradGuard no_grad;
  if (out.numel() == 0) return;
  const Tensor a = a_in.detach(), b = b_in.detach();
  const bool low = is_low_precision(out.dtype());
  // C: the output itself, or an fp32 staging buffer for 16-bit outputs.
  Tensor c = low ? empty(out.sizes(), out.options().dtype(kFloat32)) : out;
  const bool has_bias = bias_in.defined();
  if (has_bias) c.copy_(bias_in.detach().expand(out.sizes()));
  if (a.size(-1) == 0) {
    if (!has_bias) c.zero_();
  } else if (out.dtype() == kFloat64) {
    run<double>(c, a, b, has_bias);
  } else {
    run<float>(c, low ? widen(a) : a, low ? widen(b) : b, has_bias);
  }
  if (low) Tensor(out).copy_(c);
}

}  // namespace kiln::cpu
