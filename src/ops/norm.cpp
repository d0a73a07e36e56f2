// rms_norm: validation, dispatch and autograd. The kernels live in ops/cpu/norm.cpp and
// ops/cuda/norm.cu; the forward saves the per-row rstd so backward never recomputes it.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/norm.h"
#include "ops/cuda/norm.h"

#include <cstdint>
#include <optional>
#include <utility>

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

#ifdef KILN_WITH_CUDA
// A tensor the fused CUDA kernels can read: contiguous and 16-byte aligned (a view at an odd
// offset is copied).
static Tensor packed(const Tensor& t, DType dtype) {
  Tensor c = t.to(dtype).contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// The one-pass CUDA kernels: h = x + residual (residual undefined: the plain norm, h = x) in x's
// dtype, y = rms_norm(h) * weight in y_dtype. x and weight share a dtype; the caller checked
// fused_rms_norm_supported. Returns {h, y} (h undefined for the plain norm).
static std::pair<Tensor, Tensor> fused_norm_cuda(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in,
                                                 double eps, DType y_dtype) {
  const bool add = r_in.defined();
  const Tensor x = packed(x_in, x_in.dtype()).detach(), r = add ? packed(r_in, r_in.dtype()).detach() : Tensor();
  const Tensor w = w_in.defined() ? packed(w_in, w_in.dtype()).detach() : Tensor();
  const DType stat = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const int64_t H = x.size(-1), rows = x.numel() / H;
  Tensor h = add ? empty(x.sizes(), x.options()) : Tensor(), y = empty(x.sizes(), x.options().dtype(y_dtype));
  Tensor rstd = empty({rows}, x.options().dtype(stat));
  cuda::fused_rms_norm_forward(x, r, w, eps, h, y, rstd);
  const char* op = add ? "add_rms_norm" : "rms_norm";
  if (autograd::needs_grad({x_in, r_in, w_in})) {
    const bool want_dw = w_in.defined() && w_in.requires_grad();
    const bool want_dr = add && r_in.requires_grad() && r_in.dtype() != x.dtype();
    std::vector<Tensor> outputs = add ? std::vector<Tensor>{h, y} : std::vector<Tensor>{y};
    // The sum's two inputs get the same gradient (the residual stream's plus the norm's), the
    // residual's written by the same kernel in its own dtype.
    autograd::record(op, outputs, {x_in, r_in, w_in},
                     [op, add, want_dw, want_dr, rdt = add ? r_in.dtype() : x.dtype(), y_dtype,
                      sx = SavedTensor(add ? h : x, add), sw = SavedTensor(w),
                      sr = SavedTensor(rstd)](const std::vector<Tensor>& g) {
                       const Tensor hs = sx.unpack(op), ws = sw.unpack(op), rs = sr.unpack(op);
                       const Tensor& gy = g[add ? 1 : 0];
                       const Tensor dres = add && g[0].defined() ? packed(g[0], hs.dtype()) : Tensor();
                       if (!gy.defined()) return std::vector<Tensor>{dres, dres.defined() ? dres.to(rdt) : dres, Tensor()};
                       Tensor dx = empty(hs.sizes(), hs.options());
                       Tensor dr = want_dr ? empty(hs.sizes(), hs.options().dtype(rdt)) : Tensor();
                       Tensor dw = want_dw ? empty(ws.sizes(), ws.options()) : Tensor();
                       cuda::fused_rms_norm_backward(packed(gy, y_dtype), hs, ws, rs, dres, dx, dr, dw);
                       return std::vector<Tensor>{dx, dr.defined() ? dr : dx, dw};
                     });
  }
  return {h, y};
}
#endif

// x, residual (or undefined), weight (or undefined): the CUDA fused path where its kernels take
// the dtypes and the row size, else the composition. Returns {h, y}.
static std::pair<Tensor, Tensor> norm_dispatch(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                               double eps, std::optional<DType> out_dtype) {
  const DType y_dtype = out_dtype.value_or(x.dtype());
#ifdef KILN_WITH_CUDA
  if (x.is_cuda() && x.numel() > 0) {
    const DType rdt = residual.defined() ? residual.dtype() : x.dtype();
    const Tensor rr = residual.defined() && rdt != x.dtype() && rdt != y_dtype ? residual.to(x.dtype()) : residual;
    if (cuda::fused_rms_norm_supported(x.dtype(), y_dtype, rr.defined() ? rr.dtype() : x.dtype(), x.size(-1)))
      return fused_norm_cuda(x, rr, weight, eps, y_dtype);
  }
#endif
  const Tensor h = residual.defined() ? x + residual : x;
  const Tensor y = rms_norm_impl(h, weight, eps);
  return {residual.defined() ? h : Tensor(), y.dtype() == y_dtype ? y : y.to(y_dtype)};
}

static void check_norm_args(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                            std::optional<DType> out_dtype) {
  KILN_CHECK(x.defined(), op, "input is undefined");
  KILN_CHECK(is_floating_point(x.dtype()), op, "expected a floating-point input, got ", dtype_name(x.dtype()));
  KILN_CHECK(x.dim() >= 1, op, "input must have at least one dim, got a 0-d tensor");
  KILN_CHECK(eps >= 0, op, "eps must be >= 0, got ", eps);
  if (out_dtype)
    KILN_CHECK(is_floating_point(*out_dtype), op, "out_dtype must be a floating-point dtype, got ",
               dtype_name(*out_dtype));
  if (residual.defined()) {
    KILN_CHECK(x.sizes() == residual.sizes(), op, "x and residual must have the same shape, got ",
               shape_str(x.sizes()), " and ", shape_str(residual.sizes()));
    KILN_CHECK(x.device() == residual.device(), op, "x is on ", x.device(), " but residual is on ",
               residual.device());
    KILN_CHECK(is_floating_point(residual.dtype()), op, "expected a floating-point residual, got ",
               dtype_name(residual.dtype()));
  }
  if (weight.defined()) {
    KILN_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, "weight must be [", x.size(-1),
               "] to match the input's last dim, got ", shape_str(weight.sizes()));
    KILN_CHECK(weight.device() == x.device(), op, "weight is on ", weight.device(), " but the input is on ",
               x.device());
  }
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in, double eps,
                                       std::optional<DType> out_dtype) {
  KILN_CHECK(x_in.defined() && r_in.defined(), "add_rms_norm", "x and residual must be defined");
  check_norm_args("add_rms_norm", x_in, r_in, w_in, eps, out_dtype);
  // Autocast: the sum and the statistics in fp32 (a bf16 residual is read as it is).
  const Tensor x = autocast::cast_fp32(x_in), w = autocast::cast_fp32(w_in);
  const DType hdt = promote_types(x.dtype(), r_in.dtype());
  KILN_CHECK(!w.defined() || w.dtype() == hdt, "add_rms_norm", "weight dtype ", dtype_name(w.dtype()),
             " differs from the sum's dtype ", dtype_name(hdt));
  const Tensor xh = x.dtype() == hdt ? x : x.to(hdt);
  const bool cpu_fused = !x.is_cuda() && r_in.dtype() == hdt && !out_dtype && !is_autocast_enabled(x.device().type);
  if (cpu_fused) return add_rms_norm_cpu(xh, r_in, w, eps);
  return norm_dispatch(xh, r_in, w, eps, out_dtype);
}

// Autocast runs norms in fp32 (the statistics need it; bf16 inputs are upcast first).
Tensor rms_norm(const Tensor& x_in, const Tensor& weight_in, double eps, std::optional<DType> out_dtype) {
  check_norm_args("rms_norm", x_in, Tensor(), weight_in, eps, out_dtype);
  const Tensor x = autocast::cast_fp32(x_in), w = autocast::cast_fp32(weight_in);
  KILN_CHECK(!w.defined() || w.dtype() == x.dtype(), "rms_norm", "weight dtype ", dtype_name(w.dtype()),
             " differs from the input dtype ", dtype_name(x.dtype()));
  return norm_dispatch(x, Tensor(), w, eps, out_dtype).second;
}

}  // namespace kiln::nn::functional
