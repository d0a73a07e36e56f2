// Optimizer kernels on CUDA. AdamW: one grid-stride kernel per parameter that reads p, g, m, v
// once and writes p, m, v in place (fp32 moments for bf16/fp16 params). Gradient norm: a fixed
// grid (a function of numel only) writes fp64 block partials, one block adds them in order, so
// the norm is bitwise reproducible without atomics; the clip coefficient stays on the device
// and the scale kernel reads it there (no host sync).
#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/warp.cuh"
#include "optim/cuda/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxPartials = 1024;

template <typename P, typename S>
__global__ void adamw_kernel(P* __restrict__ p, const P* __restrict__ g, S* __restrict__ m, S* __restrict__ v,
                             int64_t n, S decay, S b1c, S b2, S b2c, S step_size, S bc2, S eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const S gi = convert<S>(g[i]);
    const S mi = m[i] + b1c * (gi - m[i]);
    const S vi = b2 * v[i] + b2c * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const S denom = sqrt(vi) / bc2 + eps;
    p[i] = convert<P>(convert<S>(p[i]) * decay - step_size * mi / denom);
  }
}

template <typename T>
__global__ void sumsq_partial_kernel(const T* __restrict__ g, int64_t n, double* __restrict__ partial) {
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const double x = static_cast<double>(convert<dacc_t<T>>(g[i]));
    acc += x * x;
  }
  acc = block_sum<kThreads>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_in_order_kernel(const double* __restrict__ partial, int64_t count, double* __restrict__ out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc += partial[i];
  acc = block_sum<kThreads>(acc);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void clip_coef_kernel(const double* __restrict__ slots, int64_t k, double max_norm, float* __restrict__ total,
                                 double* __restrict__ coef) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < k; i += kThreads) acc += slots[i];
  acc = block_sum<kThreads>(acc);
  if (threadIdx.x != 0) return;
  const double norm = sqrt(acc);
  *total = static_cast<float>(norm);
  const double c = max_norm / (norm + 1e-6);
  *coef = c < 1.0 ? c : 1.0;
}

template <typename T>
__global__ void scale_kernel(T* __restrict__ g, int64_t n, const double* __restrict__ coef) {
  const double c = *coef;
  if (c >= 1.0) return;
  using A = dacc_t<T>;
  const A f = static_cast<A>(c);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[i] = convert<T>(convert<A>(g[i]) * f);
}

cudaStream_t stream_of(const Tensor& t) { return current_raw_stream(t.device().index); }

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const cpu::AdamWScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  DeviceGuard guard(param.device().index);
  dispatch_floating(param.dtype(), "adamw", [&](auto tag) {
    using P = device_t<typename decltype(tag)::type>;
    using S = dacc_t<P>;
    adamw_kernel<P, S><<<blocks_for(n, kThreads), kThreads, 0, stream_of(param)>>>(
        static_cast<P*>(param.data_ptr()), static_cast<const P*>(grad.data_ptr()),
        static_cast<S*>(exp_avg.data_ptr()), static_cast<S*>(exp_avg_sq.data_ptr()), n,
        static_cast<S>(1.0 - s.lr * s.weight_decay), static_cast<S>(1.0 - s.beta1), static_cast<S>(s.beta2),
        static_cast<S>(1.0 - s.beta2), static_cast<S>(s.step_size), static_cast<S>(s.bias_correction2_sqrt),
        static_cast<S>(s.eps));
    KILN_CUDA_CHECK_LAUNCH("adamw");
  });
}

void grad_sumsq(const Tensor& grad, const Tensor& slots, int64_t index) {
  const int64_t n = grad.numel();
  DeviceGuard guard(grad.device().index);
  const int64_t blocks = std::min<int64_t>(kMaxPartials, std::max<int64_t>(1, (n + kThreads * 8 - 1) / (kThreads * 8)));
  Tensor partial = empty({blocks}, grad.options().dtype(kFloat64));
  dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    sumsq_partial_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream_of(grad)>>>(
        static_cast<const T*>(grad.data_ptr()), n, static_cast<double*>(partial.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
  });
  sum_in_order_kernel<<<1, kThreads, 0, stream_of(grad)>>>(static_cast<const double*>(partial.data_ptr()), blocks,
                                                           static_cast<double*>(slots.data_ptr()) + index);
  KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
}

void clip_coefficient(const Tensor& slots, double max_norm, const Tensor& total, const Tensor& coef) {
  DeviceGuard guard(slots.device().index);
  clip_coef_kernel<<<1, kThreads, 0, stream_of(slots)>>>(static_cast<const double*>(slots.data_ptr()), slots.numel(),
                                                         max_norm, static_cast<float*>(total.data_ptr()),
                                                         static_cast<double*>(coef.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
}

void scale_by(const Tensor& grad, const Tensor& coef) {
  const int64_t n = grad.numel();
  if (n == 0) return;
  DeviceGuard guard(grad.device().index);
  dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    scale_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream_of(grad)>>>(
        static_cast<T*>(grad.data_ptr()), n, static_cast<const double*>(coef.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
  });
}

}  // namespace kiln::cuda
