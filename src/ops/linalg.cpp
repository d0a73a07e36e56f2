// mm, bmm, matmul, linear: validation, output allocation, device dispatch and autograd.
// matmul is a composition of views and mm/bmm, so its backward (including the sum over
// broadcast batch dims, via expand's sum_to_size) comes from theirs.
#include <atomic>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/linalg.h"
#include "ops/cuda/linalg.h"

namespace kiln {
namespace {

std::atomic<bool> g_allow_tf32{false};

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.defined() && b.defined(), op, "got an undefined tensor");
  KILN_CHECK(a.dtype() == b.dtype(), op, "dtypes differ: ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  KILN_CHECK(is_floating_point(a.dtype()), op, "expected floating-point tensors, got ", dtype_name(a.dtype()));
  KILN_CHECK(a.device() == b.device(), op, "tensors are on different devices: ", a.device().str(), " and ",
             b.device().str());
}

void check_inner(const Tensor& a, const Tensor& b, int64_t ka, int64_t kb, const char* op) {
  KILN_CHECK(ka == kb, op, "inner dimensions differ: a is ", shape_str(a.sizes()), ", b is ", shape_str(b.sizes()),
             " (", ka, " vs ", kb, ")");
}

// out = a @ b (+ bias) on out's device; out contiguous [M, N] or [B, M, N].
void compute(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const char* op) {
  if (out.is_cuda()) {
    KILN_CUDA_ONLY(op, cuda::matmul_out(out, a, b, bias, g_allow_tf32.load(std::memory_order_relaxed)));
  } else {
    cpu::matmul_out(out, a, b, bias);
  }
}

// Records the backward of out = a @ b for 2-D or 3-D operands (mT transposes the last two dims).
void record_product(const char* op, const Tensor& out, const Tensor& a, const Tensor& b) {
  const bool ra = a.requires_grad(), rb = b.requires_grad();
  // grad_a needs b and grad_b needs a: save only what the requested gradients read.
  SavedTensor sa = rb ? SavedTensor(a) : SavedTensor(), sb = ra ? SavedTensor(b) : SavedTensor();
  autograd::record(op, {out}, {a, b}, [op, ra, rb, sa, sb](const std::vector<Tensor>& g) {
    auto mt = [](const Tensor& t) { return t.transpose(-2, -1); };
    auto product = [op](const Tensor& x, const Tensor& y) { return x.dim() == 3 ? bmm(x, y) : mm(x, y); };
    Tensor ga, gb;
    if (ra) ga = product(g[0], mt(sb.unpack(op)));
    if (rb) gb = product(mt(sa.unpack(op)), g[0]);
    return std::vector<Tensor>{ga, gb};
  });
}

}  // namespace

void set_float32_matmul_precision(const std::string& precision) {
  KILN_CHECK(precision == "highest" || precision == "high", "set_float32_matmul_precision",
             "expected \"highest\" or \"high\", got \"", precision, "\"");
  g_allow_tf32.store(precision == "high");
}

std::string get_float32_matmul_precision() { return g_allow_tf32.load() ? "high" : "highest"; }

Tensor mm(const Tensor& a_in, const Tensor& b_in) {
  // Autocast: matrix products run in the autocast dtype (no-op outside a region).
  const Tensor a = autocast::cast_lower(a_in), b = autocast::cast_lower(b_in);
  check_pair(a, b, "mm");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm", "expected 2-D tensors, got a ", shape_str(a.sizes()), " and b ",
             shape_str(b.sizes()));
  check_inner(a, b, a.size(1), b.size(0), "mm");
  Tensor out = empty({a.size(0), b.size(1)}, a.options());
  compute(out, a, b, Tensor(), "mm");
  if (autograd::needs_grad({a, b})) record_product("mm", out, a, b);
  return out;
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  // Autocast: matrix products run in the autocast dtype (no-op outside a region).
  const Tensor a = autocast::cast_lower(a_in), b = autocast::cast_lower(b_in);
  check_pair(a, b, "bmm");
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm", "expected 3-D tensors, got a ", shape_str(a.sizes()), " and b ",
             shape_str(b.sizes()));
  KILN_CHECK(a.size(0) == b.size(0), "bmm", "batch sizes differ: a is ", shape_str(a.sizes()), ", b is ",
             shape_str(b.sizes()));
  check_inner(a, b, a.size(2), b.size(1), "bmm");
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.options());
  compute(out, a, b, Tensor(), "bmm");
  if (autograd::needs_grad({a, b})) record_product("bmm", out, a, b);
  return out;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  // Autocast: matrix products run in the autocast dtype (no-op outside a region).
  const Tensor a = autocast::cast_lower(a_in), b = autocast::cast_lower(b_in);
  check_pair(a, b, "matmul");
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul", "both arguments need at least 1 dimension, got ",
             shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  const int64_t da = a.dim(), db = b.dim();
  check_inner(a, b, a.size(-1), db == 1 ? b.size(0) : b.size(-2), "matmul");
  if (da <= 2 && db <= 2) {
    const Tensor a2 = da == 1 ? a.unsqueeze(0) : a, b2 = db == 1 ? b.unsqueeze(1) : b;
    Tensor out = mm(a2, b2);
    if (db == 1) out = out.squeeze(1);
    if (da == 1) out = out.squeeze(0);
    return out;
  }
  if (db <= 2) {  // [..., M, K] @ [K, N] or [K]: fold the batch into M, one gemm
    Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
    if (db == 2) out_shape.push_back(b.size(1));
    const int64_t rows = shape_numel(Shape(a.sizes().begin(), a.sizes().end() - 1));  // not -1: K may be 0
    const Tensor out = mm(a.reshape({rows, a.size(-1)}), db == 1 ? b.unsqueeze(1) : b);
    return out.view(out_shape);
  }
  // General case: broadcast the batch dims, flatten them and run one strided-batch product. A side
  // whose batch dims are all broadcast keeps batch stride 0 (no copy); others may be copied.
  const Tensor a3 = da == 1 ? a.unsqueeze(0) : a, b3 = db == 1 ? b.unsqueeze(1) : b;
  const Shape ba(a3.sizes().begin(), a3.sizes().end() - 2), bb(b3.sizes().begin(), b3.sizes().end() - 2);
  const Shape batch = broadcast_shapes(ba, bb, "matmul");
  const int64_t m = a3.size(-2), k = a3.size(-1), n = b3.size(-1);
  Shape ea = batch, eb = batch, out_shape = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  const int64_t nb = shape_numel(batch);
  Tensor out = bmm(a3.expand(ea).reshape({nb, m, k}), b3.expand(eb).reshape({nb, k, n})).view(out_shape);
  if (da == 1) out = out.squeeze(-2);
  if (db == 1) out = out.squeeze(-1);
  return out;
}

// Under CUDA autocast an fp32 weight that needs a gradient is cast outside the graph and its
// gradient is the GEMM's fp32 output: one product written in fp32 instead of a bf16 product and a
// cast pass (the ToCopy backward) per weight per step.
static bool fold_weight_cast(const Tensor& x, const Tensor& weight_in) {
  return weight_in.defined() && weight_in.is_cuda() && weight_in.dtype() == kFloat32 && weight_in.requires_grad() &&
         is_grad_enabled() && is_autocast_enabled(DeviceType::CUDA) && x.is_cuda() &&
         x.dtype() == get_autocast_dtype(DeviceType::CUDA) && is_low_precision(x.dtype());
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast::cast_lower(x_in), bias = autocast::cast_lower(bias_in);
  const bool fold = fold_weight_cast(x, weight_in);
  const Tensor weight = fold ? weight_in.detach().to(x.dtype()) : autocast::cast_lower(weight_in);
  check_pair(x, weight, "linear");
  KILN_CHECK(x.dim() >= 1, "linear", "input must have at least 1 dimension, got ", shape_str(x.sizes()));
  KILN_CHECK(weight.dim() == 2, "linear", "weight must be 2-D [out, in], got ", shape_str(weight.sizes()));
  KILN_CHECK(x.size(-1) == weight.size(1), "linear", "input features differ: input is ", shape_str(x.sizes()),
             ", weight is ", shape_str(weight.sizes()), " (", x.size(-1), " vs ", weight.size(1), ")");
  const int64_t in_f = weight.size(1), out_f = weight.size(0);
  if (bias.defined()) {
    check_pair(x, bias, "linear");
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear", "bias must be [", out_f, "] for weight ",
               shape_str(weight.sizes()), ", got ", shape_str(bias.sizes()));
  }
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(out_f);
  const int64_t rows = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));  // not -1: in may be 0
  const Tensor x2 = x.dim() == 2 ? x : x.reshape({rows, in_f});
  Tensor out = empty({x2.size(0), out_f}, x.options());
  compute(out, x2, weight.detach().t(), bias, "linear");
  const Tensor& w_input = fold ? weight_in : weight;  // the graph's weight: the fp32 one when folded
  if (autograd::needs_grad({x2, w_input, bias})) {
    const bool rx = x2.requires_grad(), rw = w_input.requires_grad(), rb = bias.defined() && bias.requires_grad();
    SavedTensor sx = rw ? SavedTensor(x2) : SavedTensor(), sw = rx ? SavedTensor(weight) : SavedTensor();
    autograd::record("linear", {out}, {x2, w_input, bias}, [rx, rw, rb, sx, sw, fold](const std::vector<Tensor>& g) {
      const Tensor& go = g[0];  // [N, out]
      Tensor gx, gw, gb;
      if (rx) gx = mm(go, sw.unpack("linear"));
      if (rw && fold) {
        const Tensor xs = sx.unpack("linear");
        gw = empty({go.size(1), xs.size(1)}, go.options().dtype(kFloat32));
        compute(gw, go.t(), xs, Tensor(), "linear");
      } else if (rw) {
        gw = mm(go.t(), sx.unpack("linear"));
      }
      // Bias grad = column sums of go, as a GEMV against ones: deterministic on both backends,
      // fp32 accumulation, no dedicated reduction kernel.
      if (rb) gb = mm(go.t(), ones({go.size(0), 1}, go.options())).view({go.size(1)});
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return out.view(out_shape);
}

}  // namespace kiln
