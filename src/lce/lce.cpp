// linear_cross_entropy: validation, the plan (strategy, chunk sizes, streams), device dispatch, the
// autograd node (inputs x, W, bias; one node, so a tied weight simply receives a second gradient),
// and the LinearCrossEntropyLoss module.
#include "kiln/lce.h"

#include <algorithm>
#include <cmath>

#include "autograd/engine.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lce/lce_internal.h"

namespace kiln::lce {

using nn::functional::LceStrategy;
using nn::functional::LinearCrossEntropyOptions;
using nn::functional::Reduction;

namespace {
// Speed needs at least this many tokens per chunk to keep its GEMMs efficient.
constexpr int64_t kMinSpeedChunk = 256;
}  // namespace

// Memory tiles: big enough that each GEMM fills the device. CUDA: up to 8192 tokens x the widest
// slice whose logits (plus the fp32 dW slice when the tokens span several chunks) fit 88 MiB, so
// with the [N, H] fp32 dx accumulator and cuBLASLt's 32 MiB workspace working memory stays within
// N*H*4 + 128 MiB (5632 classes of 16-bit logits at N = 8192). CPU: 2048 x 1024, 16 of cpu::gemm's
// tasks. Speed: equal token chunks of logits over the whole vocabulary within the budget. CUDA 768
// MiB: three 2752-token chunks at 8192 x 128k bf16, 1771 MiB peak with the gradients against
// torch.compile's 2004 (H200: 40.13 ms against 41.35 for four 2048-token chunks). CPU 32 MiB:
// 256-token chunks at V = 32000 ran as fast as 512 in half the memory. Logit tiles hold T on CUDA
// (16-bit T: each logit rounded once, as torch's linear rounds it), the acc dtype on the CPU.
Plan plan(const Dims& d, DType t, bool cuda, const LinearCrossEntropyOptions& o, const Needs& nd) {
  const int64_t tile_bytes = static_cast<int64_t>(element_size(cuda ? t : (t == kFloat64 ? kFloat64 : kFloat32)));
  const int64_t n = std::max<int64_t>(d.n, 1);
  const int64_t budget = o.memory_budget > 0 ? o.memory_budget : (cuda ? (int64_t{768} << 20) : (int64_t{32} << 20));
  Plan p;
  p.chunk_v = o.chunk_vocab > 0 ? o.chunk_vocab : (cuda ? 2048 : 1024);
  bool speed_ok = o.reduction != Reduction::None && nd.any();
  int64_t speed_chunk = 0;
  if (speed_ok) {
    const int64_t per_token = d.v * tile_bytes;  // dz is written over the logits in place
    if (o.chunk_tokens > 0) {
      speed_chunk = std::min(o.chunk_tokens, n);
    } else {
      // The CPU sums dW of 16-bit weights over chunks in a fp32 accumulator; CUDA sums in T.
      const int64_t acc = !cuda && nd.dw && is_low_precision(t) ? d.v * d.h * 4 : 0;
      speed_chunk = std::min(n, budget / per_token);
      if (speed_chunk < n && acc > 0) speed_chunk = std::min(n, std::max<int64_t>(budget - acc, 0) / per_token);
      if (speed_chunk < n && speed_chunk >= 64) {  // equal chunks, multiples of 64 tokens
        const int64_t chunks = (n + speed_chunk - 1) / speed_chunk;
        speed_chunk = std::min(speed_chunk, ((n + chunks - 1) / chunks + 63) / 64 * 64);
      }
    }
    speed_ok = speed_chunk >= std::min(n, kMinSpeedChunk);
  }
  if (o.strategy == LceStrategy::Speed && o.reduction != Reduction::None) {
    p.strategy = LceStrategy::Speed;
    p.chunk_n = std::max<int64_t>(speed_chunk, std::min(n, kMinSpeedChunk));
  } else if (o.strategy == LceStrategy::Auto && speed_ok) {
    p.strategy = LceStrategy::Speed;
    p.chunk_n = speed_chunk;
  } else {
    p.strategy = LceStrategy::Memory;
    p.chunk_n = o.chunk_tokens > 0 ? o.chunk_tokens : (cuda ? 8192 : 2048);
    if (cuda && o.chunk_vocab <= 0) {
      const int64_t nc = std::min(p.chunk_n, n);
      const int64_t per_class = nc * tile_bytes + (nc < n ? d.h * 4 : 0);
      p.chunk_v = std::clamp<int64_t>((int64_t{88} << 20) / per_class / 128 * 128, 128, 8192);
    }
  }
  p.chunk_n = std::clamp<int64_t>(p.chunk_n, 1, n);
  p.chunk_v = std::clamp<int64_t>(p.chunk_v, 1, d.v);
  // The dW GEMMs fill the dx GEMMs' last wave; with one chunk there is nothing to overlap.
  p.side_stream = cuda && p.strategy == LceStrategy::Speed && nd.dw && p.chunk_n < d.n;
  return p;
}

}  // namespace kiln::lce

namespace kiln::nn {
namespace functional {
namespace {

constexpr const char* kOp = "linear_cross_entropy";

lce::Dims validate(const Tensor& input, const Tensor& weight, const Tensor& target,
                   const LinearCrossEntropyOptions& o) {
  KILN_CHECK(input.defined() && weight.defined() && target.defined(), kOp,
             "input, linear_weight and target must be defined");
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, kOp, "input must be [N, H] or [B, T, H], got ",
             shape_str(input.sizes()));
  KILN_CHECK(weight.dim() == 2, kOp, "linear_weight must be [V, H], got ", shape_str(weight.sizes()));
  KILN_CHECK(is_floating_point(input.dtype()), kOp, "input must be floating point, got ", dtype_name(input.dtype()));
  KILN_CHECK(weight.dtype() == input.dtype(), kOp, "input and linear_weight dtypes differ: ", dtype_name(input.dtype()),
             " vs ", dtype_name(weight.dtype()));
  KILN_CHECK(weight.device() == input.device(), kOp, "input is on ", input.device().str(), " but linear_weight is on ",
             weight.device().str());
  KILN_CHECK(target.device() == input.device(), kOp, "input is on ", input.device().str(), " but target is on ",
             target.device().str());
  KILN_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, kOp, "target must be int64 or int32, got ",
             dtype_name(target.dtype()));
  const int64_t h = input.size(-1), v = weight.size(0);
  KILN_CHECK(weight.size(1) == h, kOp, "input ", shape_str(input.sizes()), " and linear_weight ",
             shape_str(weight.sizes()), " have different hidden sizes (", h, " vs ", weight.size(1), ")");
  KILN_CHECK(v > 0, kOp, "linear_weight has no rows (V = 0)");
  Shape lead(input.sizes().begin(), input.sizes().end() - 1);
  KILN_CHECK(target.sizes() == lead, kOp, "target ", shape_str(target.sizes()), " does not match input ",
             shape_str(input.sizes()), " (expected ", shape_str(lead), ")");
  if (o.linear_bias.defined()) {
    const Tensor& b = o.linear_bias;
    KILN_CHECK(b.dim() == 1 && b.size(0) == v, kOp, "linear_bias ", shape_str(b.sizes()), " does not match linear_weight ",
               shape_str(weight.sizes()), " (expected [", v, "])");
    KILN_CHECK(b.dtype() == input.dtype(), kOp, "linear_bias dtype ", dtype_name(b.dtype()), " differs from input's ",
               dtype_name(input.dtype()));
    KILN_CHECK(b.device() == input.device(), kOp, "linear_bias is on ", b.device().str(), ", input on ",
               input.device().str());
  }
  if (o.weight.defined()) {
    const Tensor& w = o.weight;
    KILN_CHECK(w.dim() == 1 && w.size(0) == v, kOp, "class weight ", shape_str(w.sizes()), " does not match ", v,
               " classes");
    KILN_CHECK(is_floating_point(w.dtype()), kOp, "class weight must be floating point, got ", dtype_name(w.dtype()));
    KILN_CHECK(w.device() == input.device(), kOp, "class weight is on ", w.device().str(), ", input on ",
               input.device().str());
  }
  KILN_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, kOp, "label_smoothing must be in [0, 1], got ",
             o.label_smoothing);
  KILN_CHECK(o.z_loss >= 0.0 && std::isfinite(o.z_loss), kOp, "z_loss must be >= 0, got ", o.z_loss);
  KILN_CHECK(o.logit_softcap >= 0.0 && std::isfinite(o.logit_softcap), kOp, "logit_softcap must be >= 0, got ",
             o.logit_softcap);
  KILN_CHECK(o.chunk_tokens >= 0 && o.chunk_vocab >= 0 && o.memory_budget >= 0, kOp,
             "chunk sizes and memory_budget must be >= 0");
  return {shape_numel(lead), h, v};
}

lce::Red to_red(Reduction r) {
  switch (r) {
    case Reduction::Mean: return lce::Red::Mean;
    case Reduction::Sum: return lce::Red::Sum;
    default: return lce::Red::None;
  }
}

// src * g (g: one acc-dtype element); no copy on the CPU when g == 1. in_place: src is the node's
// own buffer and the node never runs again, so it is scaled where it is (no second [V, H] dW).
Tensor scale_by(const Tensor& src, const Tensor& g, bool in_place) {
  if (!src.defined()) return src;
  if (src.is_cuda()) {
    KILN_CUDA_ONLY(kOp, return cuda::lce_scale(src, g, in_place));
  }
  const double gv = g.item();
  if (gv == 1.0) return src;
  Tensor out = in_place ? src : empty(src.sizes(), src.options());
  dispatch_floating(src.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const int64_t n = src.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = cast_value<T>(cast_value<double>(in[i]) * gv);
  });
  return out;
}

// From the per-token argmax (-1 where ignored) and the [N] int64 targets: per token 1 / 0 (fp32;
// 0 where ignored) for reduction none, else the fraction of non-ignored tokens predicted right
// (NaN when every target is ignored). Small [N] ops on the tokens' device, no host sync.
Tensor token_accuracy(const Tensor& predicted, const Tensor& target, const LinearCrossEntropyOptions& o) {
  NoGradGuard ng;
  const Tensor valid = ne(target, static_cast<double>(o.ignore_index)).to(kFloat32);
  const Tensor hit = mul(eq(predicted, target).to(kFloat32), valid);
  if (o.reduction == Reduction::None) return hit;
  return div(sum(hit), sum(valid));
}

}  // namespace

LinearCrossEntropyResult linear_cross_entropy_with_stats(const Tensor& input, const Tensor& weight,
                                                         const Tensor& target, const LinearCrossEntropyOptions& o) {
  const lce::Dims s = validate(input, weight, target, o);
  const Tensor& bias = o.linear_bias;
  lce::Needs nd;
  if (autograd::needs_grad({input, weight, bias})) {
    nd.dx = input.requires_grad();
    nd.dw = weight.requires_grad();
    nd.db = bias.defined() && bias.requires_grad();
  }
  const lce::Plan pl = lce::plan(s, input.dtype(), input.is_cuda(), o, nd);

  auto prob = std::make_shared<lce::Problem>();
  {
    NoGradGuard ng;
    prob->x = input.detach().reshape({s.n, s.h}).contiguous();
    prob->w = weight.detach().contiguous();
    if (bias.defined()) prob->bias = bias.detach().contiguous();
    prob->target = target.detach().reshape({s.n}).to(kInt64).contiguous();
    if (o.weight.defined()) prob->class_weight = o.weight.detach().to(prob->acc_dtype()).contiguous();
  }
  prob->k.n = s.n;
  prob->k.h = s.h;
  prob->k.v = s.v;
  prob->k.ignore_index = o.ignore_index;
  prob->k.eps = o.label_smoothing;
  prob->k.z_coef = o.z_loss;
  prob->k.softcap = o.logit_softcap;
  prob->k.red = to_red(o.reduction);
  prob->k.argmax = o.return_token_accuracy || o.return_predicted_tokens;
  prob->k.token_scaling = o.use_token_scaling;
  prob->plan = pl;

  const bool speed = pl.strategy == LceStrategy::Speed;
  lce::Forward f;
  if (input.is_cuda()) {
    KILN_CUDA_ONLY(kOp, f = speed ? cuda::lce_forward_speed(*prob, nd) : cuda::lce_forward_memory(*prob));
  } else {
    f = speed ? cpu::lce_forward_speed(*prob, nd) : cpu::lce_forward_memory(*prob);
  }

  LinearCrossEntropyResult r;
  r.strategy = pl.strategy;
  r.chunk_tokens = pl.chunk_n;
  r.chunk_vocab = speed ? s.v : pl.chunk_v;
  const Shape tshape = target.sizes();
  r.loss = o.reduction == Reduction::None ? f.loss.reshape(tshape) : f.loss;
  r.lse = f.lse.reshape(tshape);
  r.z_loss = o.reduction == Reduction::None ? f.zterm.reshape(tshape) : f.zterm;
  if (o.return_predicted_tokens) r.predicted_tokens = f.predicted.reshape(tshape);
  if (o.return_token_accuracy) r.token_accuracy = token_accuracy(f.predicted, prob->target, o).reshape(
      o.reduction == Reduction::None ? tshape : Shape{});

  if (nd.any()) {
    const Shape xshape = input.sizes();
    const SavedTensor sx(input), sw(weight), sb(bias);  // version checks: inputs must not change before backward
    const DType acc = prob->acc_dtype();
    if (speed) {
      // Gradients for an upstream 1 were computed in the forward; backward scales them.
      Tensor dx = f.dx, dw = f.dw, db = f.db;
      autograd::record("linear_cross_entropy", {r.loss}, {input, weight, bias},
                       [dx, dw, db, xshape, acc, sx, sw, sb](const std::vector<Tensor>& g) {
                         sx.unpack(kOp), sw.unpack(kOp), sb.unpack(kOp);
                         Tensor gs;
                         {
                           NoGradGuard ng;
                           gs = g[0].detach().to(acc).contiguous();
                         }
                         const bool last_use = autograd::detail::graph_freed_after_use();
                         Tensor gx = scale_by(dx, gs, last_use);
                         return std::vector<Tensor>{gx.defined() ? gx.reshape(xshape) : gx,
                                                    scale_by(dw, gs, last_use), scale_by(db, gs, last_use)};
                       });
    } else {
      const Tensor lse = f.lse, tscale = f.tscale;
      autograd::record("linear_cross_entropy", {r.loss}, {input, weight, bias},
                       [prob, lse, tscale, nd, xshape, acc, sx, sw, sb](const std::vector<Tensor>& g) {
                         sx.unpack(kOp), sw.unpack(kOp), sb.unpack(kOp);
                         Tensor gs;
                         {
                           NoGradGuard ng;
                           gs = g[0].detach().to(acc).contiguous().reshape({-1});
                         }
                         lce::Grads gr;
                         if (gs.is_cuda()) {
                           KILN_CUDA_ONLY(kOp, gr = cuda::lce_backward_memory(*prob, lse, tscale, gs, nd));
                         } else {
                           gr = cpu::lce_backward_memory(*prob, lse, tscale, gs, nd);
                         }
                         return std::vector<Tensor>{gr.dx.defined() ? gr.dx.reshape(xshape) : gr.dx, gr.dw, gr.db};
                       });
    }
  }
  // The kernels' fp32 (fp64) loss, rounded to the input's dtype only on request (differentiably).
  if (o.loss_in_input_dtype && r.loss.dtype() != input.dtype()) r.loss = r.loss.to(input.dtype());
  return r;
}

Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& target,
                            const LinearCrossEntropyOptions& options) {
  return linear_cross_entropy_with_stats(input, weight, target, options).loss;
}

}  // namespace functional

// ---- module ----

LinearCrossEntropyLoss::LinearCrossEntropyLoss(int64_t in_features, int64_t num_classes, bool bias,
                                               functional::LinearCrossEntropyOptions options,
                                               TensorOptions tensor_options)
    : options_(std::move(options)) {
  KILN_CHECK(in_features > 0, "LinearCrossEntropyLoss", "in_features must be a positive integer, got ", in_features);
  KILN_CHECK(num_classes > 0, "LinearCrossEntropyLoss", "num_classes must be a positive integer, got ", num_classes);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  NoGradGuard ng;
  auto uniform = [&](const Shape& shape) {
    // rand in [0, 1) -> [-bound, bound), drawn in fp64 and rounded once to the parameter dtype.
    const std::vector<double> u = rand(shape, kFloat64).to_vector();
    std::vector<double> v(u.size());
    for (size_t i = 0; i < u.size(); ++i) v[i] = (2.0 * u[i] - 1.0) * bound;
    Tensor t = tensor(v, TensorOptions().dtype(tensor_options.dtype())).reshape(shape).to(tensor_options.device());
    return t.detach().requires_grad_(true);
  };
  weight_ = uniform({num_classes, in_features});
  if (bias) bias_ = uniform({num_classes});
}

LinearCrossEntropyLoss LinearCrossEntropyLoss::tied(const Tensor& weight, const Tensor& bias,
                                                    functional::LinearCrossEntropyOptions options) {
  KILN_CHECK(weight.defined() && weight.dim() == 2, "LinearCrossEntropyLoss",
             "a tied weight must be [num_classes, in_features]");
  LinearCrossEntropyLoss m;
  m.weight_ = weight;
  m.bias_ = bias;
  m.options_ = std::move(options);
  return m;
}

Tensor LinearCrossEntropyLoss::forward(const Tensor& input, const Tensor& target) const {
  return forward_with_stats(input, target).loss;
}

functional::LinearCrossEntropyResult LinearCrossEntropyLoss::forward_with_stats(const Tensor& input,
                                                                                const Tensor& target) const {
  functional::LinearCrossEntropyOptions o = options_;
  o.linear_bias = bias_;
  return functional::linear_cross_entropy_with_stats(input, weight_, target, o);
}

std::vector<Tensor> LinearCrossEntropyLoss::parameters() const {
  std::vector<Tensor> p{weight_};
  if (bias_.defined()) p.push_back(bias_);
  return p;
}

}  // namespace kiln::nn
