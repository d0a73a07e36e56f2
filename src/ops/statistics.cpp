// var / std / norm, composed from reductions and elementwise ops (so CUDA and autograd come from
// those); the p-norm has its own backward so that a zero norm gets a zero gradient, not nan.
#include <cmath>
#include <limits>

#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

// 16-bit floats are reduced in fp32 (a differentiable cast); other floats as they are.
Tensor widened(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined(), op, "input is undefined");
  KILN_CHECK(is_floating_point(x.dtype()), op, "expected a floating-point tensor, got ", dtype_name(x.dtype()));
  return is_low_precision(x.dtype()) ? x.to(kFloat32) : x;
}

Tensor narrowed(const Tensor& y, DType dtype) { return y.dtype() == dtype ? y : y.to(dtype); }

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  if (dims.empty()) return x.numel();
  int64_t n = 1;
  for (int64_t d : dims) n *= x.size(wrap_dim(d, x.dim(), op));
  return n;
}

Shape reduced_shape(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  std::vector<bool> red(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) red[static_cast<size_t>(wrap_dim(d, x.dim(), op))] = true;
  Shape out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!red[static_cast<size_t>(d)]) out.push_back(x.sizes()[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Tensor sign_of(const Tensor& x) { return gt(x, 0.0).to(x.dtype()) - lt(x, 0.0).to(x.dtype()); }

// (sum |x|^p)^(1/p) for finite p other than 0 and 1.
Tensor p_norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor kept;
  {
    NoGradGuard ng;
    const Tensor s = p == 2.0 ? sum(x * x, dims, true) : sum(pow(abs(x), p), dims, true);
    kept = p == 2.0 ? sqrt(s) : pow(s, 1.0 / p);
  }
  Tensor out = keepdim ? kept : kept.reshape(reduced_shape(x, dims, false, "norm"));
  if (autograd::needs_grad({x})) {
    const Shape kept_shape = kept.sizes();
    autograd::record("norm", {out}, {x},
                     [sx = SavedTensor(x), sk = SavedTensor(kept), p, kept_shape](const std::vector<Tensor>& g) {
                       const Tensor xv = sx.unpack("norm"), nk = sk.unpack("norm");
                       const Tensor gk = g[0].reshape(kept_shape);
                       const Tensor zero = zeros({}, nk.options());
                       // d|x|_p / dx = sign(x) |x|^(p-1) / |x|_p^(p-1); zero where the norm is zero.
                       const Tensor scale = where(eq(nk, 0.0), zero, div(gk, p == 2.0 ? nk : pow(nk, p - 1.0)));
                       Tensor dir;
                       if (p == 2.0) {
                         dir = xv;
                       } else {
                         dir = where(eq(xv, 0.0), zero, sign_of(xv) * pow(abs(xv), p - 1.0));
                       }
                       return std::vector<Tensor>{dir * scale};
                     });
  }
  return out;
}

}  // namespace

Tensor var(const Tensor& x_in, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  const Tensor x = widened(x_in, "var");
  const int64_t n = reduced_count(x, dims, "var");
  const Tensor centred = x - mean(x, dims, true);
  const Tensor s = sum(centred * centred, dims, keepdim);
  return narrowed(div(s, std::max(0.0, static_cast<double>(n) - correction)), x_in.dtype());
}

Tensor std(const Tensor& x_in, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  const Tensor x = widened(x_in, "std");
  return narrowed(sqrt(var(x, dims, correction, keepdim)), x_in.dtype());
}

Tensor norm(const Tensor& x_in, double p, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = widened(x_in, "norm");
  KILN_CHECK(!std::isnan(p), "norm", "p must not be nan");
  Tensor out;
  if (p == std::numeric_limits<double>::infinity()) {
    out = amax(abs(x), dims, keepdim);
  } else if (p == -std::numeric_limits<double>::infinity()) {
    out = amin(abs(x), dims, keepdim);
  } else if (p == 0.0) {
    out = sum(ne(x, 0.0).to(x.dtype()), dims, keepdim);  // a count: no gradient
  } else if (p == 1.0) {
    out = sum(abs(x), dims, keepdim);
  } else {
    out = p_norm(x, p, dims, keepdim);
  }
  return narrowed(out, x_in.dtype());
}

}  // namespace kiln
