// Optimizer kernels on CUDA, multi-tensor: one launch covers up to kListMax tensors, each cut into
// fixed chunks of kChunk elements, a block per chunk (the block finds its tensor in a prefix table
// passed by value). A GPT's ~100 parameters take a handful of launches instead of one (or three,
// for the gradient norm) per parameter, most of them for tensors too small to fill the GPU.
// Gradient norm: one fp64 partial per chunk, then one block per tensor adds its chunks in order,
// so the result is bitwise reproducible (no atomics); the clip coefficient is computed and read on
// the device (no host sync). AdamW keeps fp32 moments for bf16/fp16 parameters.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/warp.cuh"
#include "optim/cuda/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block
constexpr int kListMax = 32;

struct TensorList {
  int count = 0;
  int64_t numel[kListMax];
  int block_start[kListMax + 1];  // first block of each tensor; block_start[count] = blocks
  void* ptr[4][kListMax];
};

// AdamW's per-tensor scalars in the compute type (step counts and groups may differ).
template <typename S>
struct AdamWList {
  S decay[kListMax], b1c[kListMax], b2[kListMax], b2c[kListMax], step_size[kListMax], bc2[kListMax], eps[kListMax];
};

__device__ __forceinline__ int tensor_of_block(const TensorList& l) {
  int t = 0;
  while (t + 1 < l.count && static_cast<int>(blockIdx.x) >= l.block_start[t + 1]) ++t;
  return t;
}

template <typename P, typename S>
__global__ void __launch_bounds__(kThreads) adamw_multi_kernel(TensorList l, AdamWList<S> s) {
  const int t = tensor_of_block(l);
  const int64_t begin = static_cast<int64_t>(blockIdx.x - l.block_start[t]) * kChunk;
  const int64_t end = min(l.numel[t], begin + kChunk);
  P* p = static_cast<P*>(l.ptr[0][t]);
  const P* g = static_cast<const P*>(l.ptr[1][t]);
  S* m = static_cast<S*>(l.ptr[2][t]);
  S* v = static_cast<S*>(l.ptr[3][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const S gi = convert<S>(g[i]);
    const S mi = m[i] + s.b1c[t] * (gi - m[i]);
    const S vi = s.b2[t] * v[i] + s.b2c[t] * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const S denom = sqrt(vi) / s.bc2[t] + s.eps[t];
    p[i] = convert<P>(convert<S>(p[i]) * s.decay[t] - s.step_size[t] * mi / denom);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sumsq_multi_kernel(TensorList l, double* __restrict__ partial) {
  const int t = tensor_of_block(l);
  const int64_t begin = static_cast<int64_t>(blockIdx.x - l.block_start[t]) * kChunk;
  const int64_t end = min(l.numel[t], begin + kChunk);
  const T* g = static_cast<const T*>(l.ptr[0][t]);
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double x = static_cast<double>(convert<dacc_t<T>>(g[i]));
    acc += x * x;
  }
  acc = block_sum<kThreads>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

struct SlotList {
  int64_t index[kListMax];  // where each tensor's sum goes
};

// One block per tensor: slots[index[t]] = its chunks' partials added in order.
__global__ void __launch_bounds__(kThreads) sum_partials_per_tensor(TensorList l, SlotList where,
                                                                    const double* __restrict__ partial,
                                                                    double* __restrict__ slots) {
  const int t = blockIdx.x;
  double acc = 0;
  for (int b = l.block_start[t] + threadIdx.x; b < l.block_start[t + 1]; b += kThreads) acc += partial[b];
  acc = block_sum<kThreads>(acc);
  if (threadIdx.x == 0) slots[where.index[t]] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_multi_kernel(TensorList l, const double* __restrict__ coef) {
  const double c = *coef;
  if (c >= 1.0) return;
  const int t = tensor_of_block(l);
  const int64_t begin = static_cast<int64_t>(blockIdx.x - l.block_start[t]) * kChunk;
  const int64_t end = min(l.numel[t], begin + kChunk);
  T* g = static_cast<T*>(l.ptr[0][t]);
  using A = dacc_t<T>;
  const A f = static_cast<A>(c);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) g[i] = convert<T>(convert<A>(g[i]) * f);
}

// Calls launch(list, dtype, members) for consecutive runs of at most kListMax non-empty tensors of
// one dtype (members: their indices in 0..n). key(i) is the tensor whose dtype and size tensor i
// has; operands(i) its up to four pointers.
template <typename Key, typename Operands, typename Launch>
void for_each_list(size_t n, Key&& key, Operands&& operands, Launch&& launch) {
  TensorList l;
  std::vector<size_t> members;
  DType dt = kFloat32;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = key(i);
    if (t.numel() == 0) continue;
    if (l.count == kListMax || (l.count > 0 && t.dtype() != dt)) {
      launch(l, dt, members);
      l = TensorList(), members.clear();
    }
    dt = t.dtype();
    const int k = l.count++;
    const std::array<void*, 4> ptrs = operands(i);
    for (int j = 0; j < 4; ++j) l.ptr[j][k] = ptrs[j];
    l.numel[k] = t.numel();
    if (k == 0) l.block_start[0] = 0;
    l.block_start[k + 1] = l.block_start[k] + static_cast<int>((t.numel() + kChunk - 1) / kChunk);
    members.push_back(i);
  }
  if (l.count > 0) launch(l, dt, members);
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

cudaStream_t stream_of(const Tensor& t) { return current_raw_stream(t.device().index); }

}  // namespace

void clip_coefficient(const Tensor& slots, double max_norm, const Tensor& total, const Tensor& coef) {
  DeviceGuard guard(slots.device().index);
  clip_coef_kernel<<<1, kThreads, 0, stream_of(slots)>>>(static_cast<const double*>(slots.data_ptr()), slots.numel(),
                                                         max_norm, static_cast<float*>(total.data_ptr()),
                                                         static_cast<double*>(coef.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
}

void adamw_step(const std::vector<cpu::AdamWTensors>& params) {
  if (params.empty()) return;
  DeviceGuard guard(params[0].param.device().index);
  cudaStream_t stream = stream_of(params[0].param);
  for_each_list(
      params.size(), [&](size_t i) -> const Tensor& { return params[i].param; },
      [&](size_t i) {
        const cpu::AdamWTensors& a = params[i];
        return std::array<void*, 4>{a.param.data_ptr(), a.grad.data_ptr(), a.exp_avg.data_ptr(), a.exp_avg_sq.data_ptr()};
      },
      [&](const TensorList& l, DType dt, const std::vector<size_t>& members) {
        dispatch_floating(dt, "adamw", [&](auto tag) {
          using P = device_t<typename decltype(tag)::type>;
          using S = dacc_t<P>;
          AdamWList<S> s;
          for (int k = 0; k < l.count; ++k) {
            const cpu::AdamWScalars& c = params[members[k]].s;
            s.decay[k] = static_cast<S>(1.0 - c.lr * c.weight_decay), s.b1c[k] = static_cast<S>(1.0 - c.beta1);
            s.b2[k] = static_cast<S>(c.beta2), s.b2c[k] = static_cast<S>(1.0 - c.beta2);
            s.step_size[k] = static_cast<S>(c.step_size), s.bc2[k] = static_cast<S>(c.bias_correction2_sqrt);
            s.eps[k] = static_cast<S>(c.eps);
          }
          adamw_multi_kernel<P, S><<<l.block_start[l.count], kThreads, 0, stream>>>(l, s);
          KILN_CUDA_CHECK_LAUNCH("adamw");
        });
      });
}

void grad_sumsq(const std::vector<Tensor>& grads, const Tensor& slots) {
  if (grads.empty()) return;
  DeviceGuard guard(grads[0].device().index);
  cudaStream_t stream = stream_of(grads[0]);
  Tensor(slots).zero_();  // empty gradients keep 0
  for_each_list(
      grads.size(), [&](size_t i) -> const Tensor& { return grads[i]; },
      [&](size_t i) { return std::array<void*, 4>{grads[i].data_ptr()}; },
      [&](const TensorList& l, DType dt, const std::vector<size_t>& members) {
        const int blocks = l.block_start[l.count];
        Tensor partial = empty({blocks}, grads[0].options().dtype(kFloat64));
        SlotList where;
        for (int k = 0; k < l.count; ++k) where.index[k] = static_cast<int64_t>(members[k]);
        dispatch_floating(dt, "clip_grad_norm_", [&](auto tag) {
          using T = device_t<typename decltype(tag)::type>;
          sumsq_multi_kernel<T><<<blocks, kThreads, 0, stream>>>(l, static_cast<double*>(partial.data_ptr()));
          KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
        });
        sum_partials_per_tensor<<<l.count, kThreads, 0, stream>>>(
            l, where, static_cast<const double*>(partial.data_ptr()), static_cast<double*>(slots.data_ptr()));
        KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
      });
}

void scale_by(const std::vector<Tensor>& grads, const Tensor& coef) {
  if (grads.empty()) return;
  DeviceGuard guard(grads[0].device().index);
  cudaStream_t stream = stream_of(grads[0]);
  for_each_list(
      grads.size(), [&](size_t i) -> const Tensor& { return grads[i]; },
      [&](size_t i) { return std::array<void*, 4>{grads[i].data_ptr()}; },
      [&](const TensorList& l, DType dt, const std::vector<size_t>&) {
        dispatch_floating(dt, "clip_grad_norm_", [&](auto tag) {
          using T = device_t<typename decltype(tag)::type>;
          scale_multi_kernel<T><<<l.block_start[l.count], kThreads, 0, stream>>>(
              l, static_cast<const double*>(coef.data_ptr()));
          KILN_CUDA_CHECK_LAUNCH("clip_grad_norm_");
        });
      });
}

}  // namespace kiln::cuda
