// Rotary position embedding (half-split / rotate_half convention) and its cos/sin tables.
// The backward is the same kernel rotating by -theta. cos/sin are treated as constants.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/rope.h"

namespace kiln::nn::functional {
namespace {

void run_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out) {
  if (x.is_cuda()) {
    KILN_CUDA_ONLY("apply_rotary_emb", cuda::rotary(x, cos, sin, sign, out));
  } else {
    cpu::rotary(x, cos, sin, sign, out);
  }
}

void run_qkv_rotary(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                    const Tensor& sin, bool split) {
  if (qkv.is_cuda()) {
    KILN_CUDA_ONLY("qkv_rotary_split", cuda::qkv_rotary(qkv, q, k, v, cos, sin, split));
  } else {
    cpu::qkv_rotary(qkv, q, k, v, cos, sin, split);
  }
}

// The checks both ops make on the head dim and the [T, D/2] tables (constants on x's device);
// returns the tables in the accumulation dtype, contiguous.
std::pair<Tensor, Tensor> checked_tables(const char* op, const Tensor& x, int64_t T, int64_t D, const Tensor& cos_in,
                                         const Tensor& sin_in) {
  KILN_CHECK(D % 2 == 0, op, "head dim D must be even, got ", D);
  const Shape table{T, D / 2};
  KILN_CHECK(cos_in.sizes() == table && sin_in.sizes() == table, op, "cos and sin must be [T, D/2] = ",
             shape_str(table), ", got ", shape_str(cos_in.sizes()), " and ", shape_str(sin_in.sizes()));
  KILN_CHECK(is_floating_point(cos_in.dtype()) && is_floating_point(sin_in.dtype()), op,
             "cos and sin must be floating point");
  KILN_CHECK(cos_in.device() == x.device() && sin_in.device() == x.device(), op, "input is on ", x.device(),
             " but cos/sin are on ", cos_in.device(), " and ", sin_in.device());
  KILN_CHECK(!(autograd::needs_grad({cos_in, sin_in})), op,
             "gradients w.r.t. cos/sin are not supported; pass tables that do not require grad");
  const DType acc = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  return {cos_in.detach().to(acc).contiguous(), sin_in.detach().to(acc).contiguous()};
}

}  // namespace

Tensor apply_rotary_emb(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in) {
  const char* op = "apply_rotary_emb";
  KILN_CHECK(x_in.defined() && cos_in.defined() && sin_in.defined(), op, "x, cos and sin must be defined");
  KILN_CHECK(x_in.dim() == 4, op, "x must be [B, T, H, D], got ", shape_str(x_in.sizes()));
  KILN_CHECK(is_floating_point(x_in.dtype()), op, "expected a floating-point x, got ", dtype_name(x_in.dtype()));
  // Plain variables, not structured bindings: the lambda below captures them (clang < 16 cannot).
  Tensor cos, sin;
  std::tie(cos, sin) = checked_tables(op, x_in, x_in.size(1), x_in.size(3), cos_in, sin_in);
  const Tensor x = x_in.contiguous().detach();
  Tensor out = empty(x.sizes(), x.options());
  run_rotary(x, cos, sin, +1, out);
  if (autograd::needs_grad({x_in})) {
    autograd::record(op, {out}, {x_in}, [cos, sin, dt = x.dtype()](const std::vector<Tensor>& g) {
      const Tensor dy = g[0].to(dt).contiguous();
      Tensor dx = empty(dy.sizes(), dy.options());
      run_rotary(dy, cos, sin, -1, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

std::tuple<Tensor, Tensor, Tensor> qkv_rotary_split(const Tensor& qkv_in, const Tensor& cos_in, const Tensor& sin_in) {
  const char* op = "qkv_rotary_split";
  KILN_CHECK(qkv_in.defined() && cos_in.defined() && sin_in.defined(), op, "qkv, cos and sin must be defined");
  KILN_CHECK(qkv_in.dim() == 5 && qkv_in.size(2) == 3, op, "qkv must be [B, T, 3, H, D], got ",
             shape_str(qkv_in.sizes()));
  KILN_CHECK(is_floating_point(qkv_in.dtype()), op, "expected a floating-point qkv, got ", dtype_name(qkv_in.dtype()));
  const int64_t B = qkv_in.size(0), T = qkv_in.size(1), H = qkv_in.size(3), D = qkv_in.size(4);
  Tensor cos, sin;
  std::tie(cos, sin) = checked_tables(op, qkv_in, T, D, cos_in, sin_in);
  const Tensor qkv = qkv_in.contiguous().detach();
  const Shape heads{B, H, T, D};
  Tensor q = empty(heads, qkv.options()), k = empty(heads, qkv.options()), v = empty(heads, qkv.options());
  run_qkv_rotary(qkv, q, k, v, cos, sin, true);
  if (autograd::needs_grad({qkv_in})) {
    autograd::record(op, {q, k, v}, {qkv_in}, [cos, sin, shape = qkv.sizes(), dt = qkv.dtype()](const std::vector<Tensor>& g) {
      const Tensor dq = g[0].to(dt).contiguous(), dk = g[1].to(dt).contiguous(), dv = g[2].to(dt).contiguous();
      Tensor dqkv = empty(shape, dq.options());
      run_qkv_rotary(dqkv, dq, dk, dv, cos, sin, false);
      return std::vector<Tensor>{dqkv};
    });
  }
  return {q, k, v};
}

std::pair<Tensor, Tensor> rotary_tables(int64_t T, int64_t D, double theta, Device device) {
  KILN_CHECK(T >= 0, "rotary_tables", "T must be >= 0, got ", T);
  KILN_CHECK(D > 0 && D % 2 == 0, "rotary_tables", "D must be positive and even, got ", D);
  KILN_CHECK(theta > 0, "rotary_tables", "theta must be positive, got ", theta);
  const int64_t half = D / 2;
  std::vector<float> c(static_cast<size_t>(T * half)), s(c.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    for (int64_t t = 0; t < T; ++t) {
      const double angle = static_cast<double>(t) * inv_freq;
      c[t * half + i] = static_cast<float>(std::cos(angle));
      s[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  Tensor cos = empty({T, half}), sin = empty({T, half});
  if (!c.empty()) {
    std::copy(c.begin(), c.end(), cos.data_ptr<float>());
    std::copy(s.begin(), s.end(), sin.data_ptr<float>());
  }
  if (device.is_cuda()) return {cos.to(device), sin.to(device)};
  return {cos, sin};
}

}  // namespace kiln::nn::functional
