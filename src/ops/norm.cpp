// rms_norm: validation, dispatch and autograd. The kernels live in ops/cpu/norm.cpp and
// ops/cuda/norm.cu; the forward saves the per-row rstd so backward never recomputes it.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/norm.h"
#include <utility>
#include "ops/cuda/norm.h"

namespace kiln::nn::functional {

static Tensor rms_norm_impl(const Tensor& x_in, const Tensor& weight_in, double eps) {
  KILN_CHECK(x_in.defined(), "rms_norm", "input is undefined");
  KILN_CHECK(is_floating_point(x_in.dtype()), "rms_norm", "expected a floating-point input, got ",
             dtype_name(x_in.dtype()));
  KILN_CHECK(x_in.dim() >= 1, "rms_norm", "input must have at least one dim, got a 0-d tensor");
  KILN_CHECK(eps >= 0, "rms_norm", "eps must be >= 0, got ", eps);
  const int64_t H = x_in.size(-1);
  if (weight_in.defined()) {
    KILN_CHECK(weight_in.dim() == 1 && weight_in.size(0) == H, "rms_norm", "weight must be [", H,
               "] to match the input's last dim, got ", shape_str(weight_in.sizes()));
    KILN_CHECK(weight_in.dtype() == x_in.dtype(), "rms_norm", "weight dtype ", dtype_name(weight_in.dtype()),
               " differs from the input dtype ", dtype_name(x_in.dtype()));
    KILN_CHECK(weight_in.device() == x_in.device(), "rms_norm", "weight is on ", weight_in.device(),
               " but the input is on ", x_in.device());
  }
  const Tensor x = x_in.contiguous().detach();
  const Tensor w = weight_in.defined() ? weight_in.contiguous().detach() : Tensor();
  const DType stat = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor y = empty(x.sizes(), x.options());
  const int64_t rows = H == 0 ? 0 : x.numel() / H;
  Tensor rstd = empty({rows}, x.options().dtype(stat));
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("rms_norm", cuda::rms_norm_forward(x, w, eps, y, rstd));
  } else {
    cpu::rms_norm_forward(x, w, eps, y, rstd);
  }
  if (autograd::needs_grad({x_in, weight_in})) {
    const bool want_dw = weight_in.defined() && weight_in.requires_grad();
    autograd::record("rms_norm", {y}, {x_in, weight_in},
                     [sx = SavedTensor(x), sw = SavedTensor(w), sr = SavedTensor(rstd), want_dw,
                      in_shape = x_in.sizes()](const std::vector<Tensor>& g) {
                       const Tensor xs = sx.unpack("rms_norm"), ws = sw.unpack("rms_norm"),
                                    rs = sr.unpack("rms_norm");
                       const Tensor dy = g[0].to(xs.dtype()).contiguous();
                       Tensor dx = empty(xs.sizes(), xs.options());
                       Tensor dw = want_dw ? empty(ws.sizes(), ws.options()) : Tensor();
                       if (xs.is_cuda()) {
                         KILN_CUDA_ONLY("rms_norm_backward", cuda::rms_norm_backward(dy, xs, ws, rs, dx, dw));
                       } else {
                         cpu::rms_norm_backward(dy, xs, ws, rs, dx, dw);
                       }
                       return std::vector<Tensor>{dx.view(in_shape), dw};
                     });
  }
  return y;
}

// add_rms_norm on the CPU with one dtype throughout: the fused kernels (ops/cpu/norm.cpp).
static std::pair<Tensor, Tensor> add_rms_norm_cpu(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in,
                                                  double eps) {
  const Tensor x = x_in.contiguous().detach(), r = r_in.contiguous().detach();
  const Tensor w = w_in.defined() ? w_in.contiguous().detach() : Tensor();
  const DType stat = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor h = empty(x.sizes(), x.options()), y = empty(x.sizes(), x.options());
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  Tensor rstd = empty({rows}, x.options().dtype(stat));
  cpu::add_rms_norm_forward(x, r, w, eps, h, y, rstd);
  if (autograd::needs_grad({x_in, r_in, w_in})) {
    const bool want_dw = w_in.defined() && w_in.requires_grad();
    // Both inputs of the sum get the same gradient: the residual stream's plus the norm's.
    autograd::record("add_rms_norm", {h, y}, {x_in, r_in, w_in},
                     [sh = SavedTensor(h, true), sw = SavedTensor(w), sr = SavedTensor(rstd), want_dw,
                      in_shape = x_in.sizes()](const std::vector<Tensor>& g) {
                       const Tensor hs = sh.unpack("add_rms_norm"), ws = sw.unpack("add_rms_norm"),
                                    rs = sr.unpack("add_rms_norm");
                       const Tensor dh = g[0].defined() ? g[0].to(hs.dtype()).contiguous() : Tensor();
                       if (!g[1].defined()) return std::vector<Tensor>{dh, dh, Tensor()};
                       const Tensor dy = g[1].to(hs.dtype()).contiguous();
                       Tensor dx = empty(hs.sizes(), hs.options());
                       Tensor dw = want_dw ? empty(ws.sizes(), ws.options()) : Tensor();
                       cpu::rms_norm_backward(dy, hs, ws, rs, dx, dw, dh);
                       const Tensor d = dx.view(in_shape);
                       return std::vector<Tensor>{d, d, dw};
                     });
  }
  return {h, y};
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  KILN_CHECK(x.defined() && residual.defined(), "add_rms_norm", "x and residual must be defined");
  KILN_CHECK(x.sizes() == residual.sizes(), "add_rms_norm", "x and residual must have the same shape, got ",
             shape_str(x.sizes()), " and ", shape_str(residual.sizes()));
  const bool one_dtype = x.dtype() == residual.dtype() && (!weight.defined() || weight.dtype() == x.dtype());
  if (x.is_cuda() || !one_dtype || is_autocast_enabled(x.device().type)) {
    Tensor h = x + residual;  // CUDA, mixed dtypes, autocast: the composition
    return {h, rms_norm(h, weight, eps)};
  }
  KILN_CHECK(is_floating_point(x.dtype()), "add_rms_norm", "expected a floating-point input, got ",
             dtype_name(x.dtype()));
  KILN_CHECK(x.dim() >= 1 && eps >= 0, "add_rms_norm", "need an input of at least one dim and eps >= 0");
  KILN_CHECK(x.device() == residual.device(), "add_rms_norm", "x is on ", x.device(), " but residual is on ",
             residual.device());
  if (weight.defined()) {
    KILN_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.device() == x.device(), "add_rms_norm",
               "weight must be [", x.size(-1), "] on ", x.device(), ", got ", shape_str(weight.sizes()), " on ",
               weight.device());
  }
  return add_rms_norm_cpu(x, residual, weight, eps);
}

// Autocast runs norms in fp32 (the statistics need it; bf16 inputs are upcast first).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return rms_norm_impl(autocast::cast_fp32(x), autocast::cast_fp32(weight), eps);
}

}  // namespace kiln::nn::functional
