// Reductions (sum, mean, amax, amin, logsumexp, max/min, argmax/argmin, sum_to_size): validation, output
// shapes, the [outer, r, inner] geometry handed to the kernels, and the backward formulas.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/reduce.h"
#include "ops/cuda/reduce.h"
#include "ops/reduce_geom.h"

namespace kiln {
namespace {

struct Plan {
  std::vector<bool> reduced;  // per input dim
  std::vector<int64_t> dims;  // sorted, wrapped
  Shape kept;                 // keepdim shape
  Shape out_shape;            // shape returned to the user
  int64_t r = 1;              // number of elements folded into each output
};

Plan make_plan(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  Plan p;
  const int64_t nd = x.dim();
  p.reduced.assign(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    KILN_CHECK(!p.reduced[w], op, "dim ", d, " appears more than once in the list of dims");
    p.reduced[w] = true;
  }
  p.kept = x.sizes();
  for (int64_t d = 0; d < nd; ++d) {
    if (!p.reduced[d]) continue;
    p.dims.push_back(d);
    p.r *= x.sizes()[d];
    p.kept[d] = 1;
  }
  for (int64_t d = 0; d < nd; ++d)
    if (!p.reduced[d] || keepdim) p.out_shape.push_back(p.kept[d]);
  return p;
}

// Fits x into [outer, r, inner] without copying: sort dims by input stride (largest first), merge
// neighbours that walk as one run in both input and output, and accept K? R? K? shapes.
bool fit_geom(const Tensor& x, const std::vector<bool>& reduced, const Shape& kept, ReduceGeom& g) {
  struct Dim {
    int64_t size, xs, os;
    bool red;
  };
  const Shape ost = contiguous_strides(kept);
  std::vector<Dim> ds;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.sizes()[d] != 1) ds.push_back({x.sizes()[d], x.strides()[d], reduced[d] ? 0 : ost[d], reduced[d]});
  std::stable_sort(ds.begin(), ds.end(), [](const Dim& a, const Dim& b) { return a.xs > b.xs; });
  std::vector<Dim> runs;
  for (const Dim& d : ds) {
    if (!runs.empty()) {
      Dim& a = runs.back();
      if (a.red == d.red && a.xs == d.xs * d.size && (a.red || a.os == d.os * d.size)) {
        a.size *= d.size;
        a.xs = d.xs;
        a.os = d.os;
        continue;
      }
    }
    runs.push_back(d);
  }
  g = ReduceGeom{};
  size_t i = 0;
  if (i < runs.size() && !runs[i].red) {
    g.outer = runs[i].size, g.so = runs[i].xs, g.oo = runs[i].os;
    ++i;
  }
  if (i < runs.size() && runs[i].red) {
    g.r = runs[i].size, g.sr = runs[i].xs;
    ++i;
  }
  if (i < runs.size() && !runs[i].red) {
    g.inner = runs[i].size, g.si = runs[i].xs, g.oi = runs[i].os;
    ++i;
  }
  return i == runs.size();
}

// Returns the tensor the kernels read (x itself, or a (kept..., reduced...) contiguous copy).
Tensor prepare(const Tensor& x, const Plan& p, ReduceGeom& g) {
  if (fit_geom(x, p.reduced, p.kept, g)) return x;
  Shape perm;
  std::vector<bool> red;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!p.reduced[d]) perm.push_back(d), red.push_back(false);
  for (int64_t d : p.dims) perm.push_back(d), red.push_back(true);
  Tensor xc;
  {
    NoGradGuard ng;
    xc = x.permute(perm).contiguous();
  }
  Shape kept;
  for (int64_t d : perm) kept.push_back(p.reduced[d] ? 1 : x.sizes()[d]);
  const bool ok = fit_geom(xc, red, kept, g);
  KILN_CHECK(ok, "reduce", "internal error: no reduction geometry for ", shape_str(x.sizes()));
  return xc;
}

// Runs `kind` over the plan; out/indices are contiguous in the keepdim shape.
void run_reduce(ReduceKind kind, const Tensor& x, const Plan& p, const Tensor& out, const Tensor& indices,
                const char* op) {
  const Tensor& any = out.defined() ? out : indices;
  if (any.numel() == 0) return;
  if (p.r == 0) {
    KILN_CHECK(kind == ReduceKind::Sum || kind == ReduceKind::Mean || kind == ReduceKind::LogSumExp, op,
               "cannot reduce over a zero-size dimension (input ", shape_str(x.sizes()), ")");
    NoGradGuard ng;
    Tensor o = out;
    o.fill_(kind == ReduceKind::Sum ? 0.0
            : kind == ReduceKind::Mean ? std::numeric_limits<double>::quiet_NaN()
                                        : -std::numeric_limits<double>::infinity());
    return;
  }
  ReduceGeom g;
  const Tensor xs = prepare(x, p, g);
  if (x.is_cuda()) {
    KILN_CUDA_ONLY(op, cuda::reduce(kind, xs, g, out, indices));
  } else {
    cpu::reduce(kind, xs, g, out, indices);
  }
}

Tensor expand_kept(const Tensor& g, const Plan& p, const Shape& in) { return g.reshape(p.kept).expand(in); }

// Gradient of amax/amin/max(): split evenly among the elements equal to the result.
Tensor ties_backward(const Tensor& x, const Tensor& y, const Tensor& g, const Plan& p) {
  NoGradGuard ng;
  const Shape in = x.sizes();
  const DType acc = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor mask = empty(in, x.options().dtype(acc));
  Tensor gx = empty(in, x.options());
  const Tensor ye = expand_kept(y, p, in), ge = expand_kept(g, p, in);
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("amax", cuda::ties_mask(mask, x, ye));
  } else {
    cpu::ties_mask(mask, x, ye);
  }
  const Tensor cnt = sum(mask, p.dims, true).expand(in);
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("amax", cuda::ties_grad(gx, mask, ge, cnt));
  } else {
    cpu::ties_grad(gx, mask, ge, cnt);
  }
  return gx;
}

Tensor extreme(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
  const char* op = is_max ? "amax" : "amin";
  const Plan p = make_plan(x, dims, keepdim, op);
  Tensor out = empty(p.kept, x.options());
  run_reduce(is_max ? ReduceKind::Max : ReduceKind::Min, x, p, out, Tensor(), op);
  out = make_view(out, p.out_shape, contiguous_strides(p.out_shape), 0);
  if (is_floating_point(x.dtype()) && autograd::needs_grad({x})) {
    autograd::record(op, {out}, {x},
                     [sx = SavedTensor(x), sy = SavedTensor(out, true), p, op](const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{ties_backward(sx.unpack(op), sy.unpack(op), g[0], p)};
                     });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Plan p = make_plan(x, dims, keepdim, "sum");
  const DType dt = is_floating_point(x.dtype()) ? x.dtype() : kInt64;  // integers sum in int64 (PyTorch)
  Tensor out = empty(p.kept, x.options().dtype(dt));
  run_reduce(ReduceKind::Sum, x, p, out, Tensor(), "sum");
  out = make_view(out, p.out_shape, contiguous_strides(p.out_shape), 0);
  if (autograd::needs_grad({x})) {
    const Shape in = x.sizes();
    autograd::record("sum", {out}, {x}, [in, p](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{expand_kept(g[0], p, in).contiguous()};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  KILN_CHECK(is_floating_point(x.dtype()), "mean", "expected a floating-point tensor, got ", dtype_name(x.dtype()));
  const Plan p = make_plan(x, dims, keepdim, "mean");
  Tensor out = empty(p.kept, x.options());
  run_reduce(ReduceKind::Mean, x, p, out, Tensor(), "mean");
  out = make_view(out, p.out_shape, contiguous_strides(p.out_shape), 0);
  if (autograd::needs_grad({x})) {
    const Shape in = x.sizes();
    autograd::record("mean", {out}, {x}, [in, p](const std::vector<Tensor>& g) {
      NoGradGuard ng;
      Tensor gx = empty(in, g[0].options());
      const Tensor ge = expand_kept(g[0], p, in);
      const double scale = 1.0 / static_cast<double>(p.r);
      if (gx.is_cuda()) {
        KILN_CUDA_ONLY("mean", cuda::scale_broadcast(gx, ge, scale));
      } else {
        cpu::scale_broadcast(gx, ge, scale);
      }
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return extreme(x, dims, keepdim, true); }
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return extreme(x, dims, keepdim, false); }

Tensor max(const Tensor& x) {
  KILN_CHECK(x.numel() > 0, "max", "cannot take the max of an empty tensor");
  return extreme(x, {}, false, true);
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  KILN_CHECK(is_floating_point(x.dtype()), "logsumexp", "expected a floating-point tensor, got ",
             dtype_name(x.dtype()));
  const Plan p = make_plan(x, dims, keepdim, "logsumexp");
  // The statistic is computed and kept in fp32 (fp64 for fp64); 16-bit outputs are a rounded copy,
  // and backward uses the unrounded statistic.
  const DType stat_dtype = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor stat = empty(p.kept, x.options().dtype(stat_dtype));
  run_reduce(ReduceKind::LogSumExp, x, p, stat, Tensor(), "logsumexp");
  Tensor out;
  {
    NoGradGuard ng;
    out = stat_dtype == x.dtype() ? stat : stat.to(x.dtype());
  }
  out = make_view(out, p.out_shape, contiguous_strides(p.out_shape), 0);
  if (autograd::needs_grad({x})) {
    autograd::record("logsumexp", {out}, {x},
                     [sx = SavedTensor(x), sy = SavedTensor(stat), p](const std::vector<Tensor>& g) {
                       NoGradGuard ng;
                       const Tensor xv = sx.unpack("logsumexp");
                       const Shape in = xv.sizes();
                       Tensor gx = empty(in, xv.options());
                       const Tensor ye = expand_kept(sy.unpack("logsumexp"), p, in);
                       const Tensor ge = expand_kept(g[0].to(xv.dtype()), p, in);
                       if (gx.is_cuda()) {
                         KILN_CUDA_ONLY("logsumexp", cuda::lse_grad(gx, xv, ye, ge));
                       } else {
                         cpu::lse_grad(gx, xv, ye, ge);
                       }
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

namespace {

// max/min over one dim: (values, int64 indices of the first extreme); the gradient goes to that index.
std::pair<Tensor, Tensor> extreme_with_index(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  const int64_t d = x.dim() == 0 ? wrap_dim(dim, 1, op) : wrap_dim(dim, x.dim(), op);
  const std::vector<int64_t> dims = x.dim() == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{d};
  const Plan p = make_plan(x, dims, keepdim, op);
  KILN_CHECK(p.r > 0 || shape_numel(p.kept) == 0, op, "cannot reduce over a zero-size dimension (input ",
             shape_str(x.sizes()), ")");
  Tensor values = empty(p.kept, x.options());
  Tensor indices = empty(p.kept, x.options().dtype(kInt64));
  run_reduce(is_max ? ReduceKind::ArgMax : ReduceKind::ArgMin, x, p, values, indices, op);
  const Shape os = contiguous_strides(p.out_shape);
  values = make_view(values, p.out_shape, os, 0);
  indices = make_view(indices, p.out_shape, os, 0);
  if (is_floating_point(x.dtype()) && autograd::needs_grad({x})) {
    const Shape in = x.sizes();
    autograd::record(op, {values, indices}, {x},
                     [in, p, d, op, si = SavedTensor(indices, true)](const std::vector<Tensor>& g) {
                       NoGradGuard ng;
                       Tensor gx = empty(in, g[0].options());
                       Shape iota_shape(in.size(), 1);
                       if (!in.empty()) iota_shape[d] = in[d];
                       const Tensor iota =
                           arange(static_cast<double>(in.empty() ? 1 : in[d]), g[0].options().dtype(kInt64))
                               .reshape(iota_shape)
                               .expand(in);
                       const Tensor ie = expand_kept(si.unpack(op), p, in), ge = expand_kept(g[0], p, in);
                       if (gx.is_cuda()) {
                         KILN_CUDA_ONLY(op, cuda::argmax_grad(gx, ie, iota, ge));
                       } else {
                         cpu::argmax_grad(gx, ie, iota, ge);
                       }
                       return std::vector<Tensor>{gx};
                     });
  }
  return {values, indices};
}

Tensor arg_extreme(const Tensor& x, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "argmax" : "argmin";
  KILN_CHECK(x.numel() > 0 || dim.has_value(), op, "cannot take the ", op, " of an empty tensor");
  if (!dim.has_value()) {
    Tensor flat = x.reshape({-1});
    Tensor idx = arg_extreme(flat, 0, false, is_max);
    if (keepdim) idx = idx.reshape(Shape(static_cast<size_t>(x.dim()), 1));
    return idx;
  }
  const int64_t d = wrap_dim(*dim, std::max<int64_t>(x.dim(), 1), op);
  const Plan p = make_plan(x, x.dim() == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{d}, keepdim, op);
  KILN_CHECK(p.r > 0 || shape_numel(p.kept) == 0, op, "cannot take the ", op, " over a zero-size dimension (input ",
             shape_str(x.sizes()), ")");
  Tensor indices = empty(p.kept, x.options().dtype(kInt64));
  run_reduce(is_max ? ReduceKind::ArgMax : ReduceKind::ArgMin, x, p, Tensor(), indices, op);
  return make_view(indices, p.out_shape, contiguous_strides(p.out_shape), 0);
}

}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_with_index(x, dim, keepdim, true);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_with_index(x, dim, keepdim, false);
}
Tensor min(const Tensor& x) {
  KILN_CHECK(x.numel() > 0, "min", "cannot take the min of an empty tensor");
  return extreme(x, {}, false, false);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(x, dim, keepdim, true); }
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return arg_extreme(x, dim, keepdim, false); }

Tensor sum_to_size(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  KILN_CHECK(lead >= 0, "sum_to_size", "cannot sum ", shape_str(x.sizes()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
      continue;
    }
    const int64_t want = shape[d - lead], have = x.sizes()[d];
    KILN_CHECK(want == have || want == 1, "sum_to_size", "cannot sum ", shape_str(x.sizes()), " to ",
               shape_str(shape), " (dim ", d, ": ", have, " vs ", want, ")");
    if (want == 1 && have != 1) dims.push_back(d);
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace kiln
