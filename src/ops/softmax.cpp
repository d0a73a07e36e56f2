// softmax / log_softmax along one dim: validation, the [outer, n, inner] view of a contiguous
// input, and a fused backward that needs only the saved output.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/softmax.h"
#include "ops/cuda/softmax.h"

namespace kiln {
namespace {

struct RowGeom {
  int64_t outer = 1, n = 1, inner = 1;
};

RowGeom row_geom(const Shape& s, int64_t d) {
  RowGeom g;
  if (s.empty()) return g;
  for (int64_t k = 0; k < d; ++k) g.outer *= s[k];
  g.n = s[d];
  for (size_t k = static_cast<size_t>(d) + 1; k < s.size(); ++k) g.inner *= s[k];
  return g;
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  KILN_CHECK(x.defined(), op, "input is undefined");
  KILN_CHECK(is_floating_point(x.dtype()), op, "expected a floating-point tensor, got ", dtype_name(x.dtype()));
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op);
  Tensor xc;
  {
    NoGradGuard ng;
    xc = x.contiguous();
  }
  Tensor y = empty(x.sizes(), x.options());
  const RowGeom g = row_geom(x.sizes(), d);
  if (x.numel() > 0) {
    if (x.is_cuda()) {
      KILN_CUDA_ONLY(op, cuda::softmax_forward(xc, y, g.outer, g.n, g.inner, log));
    } else {
      cpu::softmax_forward(xc, y, g.outer, g.n, g.inner, log);
    }
  }
  if (autograd::needs_grad({x})) {
    autograd::record(op, {y}, {x}, [sy = SavedTensor(y, true), g, log, op](const std::vector<Tensor>& grads) {
      NoGradGuard ng;
      const Tensor yv = sy.unpack(op);
      const Tensor gy = grads[0].to(yv.dtype()).contiguous();
      Tensor gx = empty(yv.sizes(), yv.options());
      if (yv.numel() > 0) {
        if (yv.is_cuda()) {
          KILN_CUDA_ONLY(op, cuda::softmax_backward(yv, gy, gx, g.outer, g.n, g.inner, log));
        } else {
          cpu::softmax_backward(yv, gy, gx, g.outer, g.n, g.inner, log);
        }
      }
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

}  // namespace

// Autocast: fp32 (as torch.autocast's fp32 list).
Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(autocast::cast_fp32(x), dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(autocast::cast_fp32(x), dim, true); }

}  // namespace kiln
