// Unfused cross-entropy on CUDA (the reference for the fused LinearCrossEntropy). One warp per
// row, 8 rows per block: pass 1 finds the row max, pass 2 sums exp(x - m) and w_c (m - x_c)
// (the label-smoothing term without cancellation), lane 0 writes lse, the row loss and the
// row's target weight. A single 512-thread block then adds the rows in fp64 in a fixed order
// (no atomics), so the loss is bitwise reproducible. Backward: the same warp-per-row layout
// writes dlogits = scale * ((1-eps) w_t (p - onehot) + eps/C (W p - w)).
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/loss.h"
#include "ops/cuda/warp.cuh"

namespace kiln::cuda {
namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kReduceThreads = 512;

template <typename T, typename I, typename A>
__global__ void ce_rows_kernel(const T* __restrict__ logits, const I* __restrict__ target, const A* __restrict__ weight,
                               A* __restrict__ lse, A* __restrict__ row_loss, A* __restrict__ row_weight,
                               int* __restrict__ bad, int64_t N, int64_t C, int64_t ignore_index, A eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= N) return;
  const T* x = logits + i * C;
  A m = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += 32) {
    const A v = convert<A>(x[c]);
    m = v > m ? v : m;
  }
  m = warp_max(m);
  A s = 0, gap = 0, W = 0;
  if (m != -INFINITY) {
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const A d = m - convert<A>(x[c]);
      const A w = weight ? weight[c] : A(1);
      s += exp(-d);
      gap += w * d;
      W += w;
    }
  }
  s = warp_sum(s);
  gap = warp_sum(gap);
  W = warp_sum(W);
  if (threadIdx.x != 0) return;
  const A l = m + log(s);
  lse[i] = l;
  const int64_t t = static_cast<int64_t>(target[i]);
  if (t == ignore_index) {
    row_loss[i] = 0;
    row_weight[i] = 0;
    return;
  }
  if (t < 0 || t >= C) {
    *bad = 1;
    row_loss[i] = NAN;
    row_weight[i] = 0;
    return;
  }
  const A wt = weight ? weight[t] : A(1);
  A loss = (A(1) - eps) * wt * (l - convert<A>(x[t]));
  if (eps != A(0)) loss += eps / static_cast<A>(C) * ((l - m) * W + gap);
  row_loss[i] = loss;
  row_weight[i] = wt;
}

template <typename T, typename A>
__global__ void ce_reduce_kernel(const A* __restrict__ row_loss, const A* __restrict__ row_weight, T* __restrict__ out,
                                 A* __restrict__ total_weight, int64_t N, bool mean) {
  double total = 0, wsum = 0;
  for (int64_t i = threadIdx.x; i < N; i += kReduceThreads) {
    total += static_cast<double>(row_loss[i]);
    wsum += static_cast<double>(row_weight[i]);
  }
  total = block_sum<kReduceThreads>(total);
  wsum = block_sum<kReduceThreads>(wsum);
  if (threadIdx.x != 0) return;
  if (mean) total /= wsum;  // all rows ignored: 0/0 = nan, as in PyTorch
  if (total_weight) *total_weight = static_cast<A>(wsum);
  *out = convert<T>(total);
}

template <typename T, typename I, typename A>
__global__ void ce_backward_kernel(const T* __restrict__ grad, int64_t gstride, const T* __restrict__ logits,
                                   const I* __restrict__ target, const A* __restrict__ weight,
                                   const A* __restrict__ lse, const A* __restrict__ total_weight, T* __restrict__ dlogits,
                                   int64_t N, int64_t C, int64_t ignore_index, A eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (i >= N) return;
  T* d = dlogits + i * C;
  const int64_t t = static_cast<int64_t>(target[i]);
  if (t == ignore_index || t < 0 || t >= C) {
    for (int64_t c = threadIdx.x; c < C; c += 32) d[c] = convert<T>(A(0));
    return;
  }
  const A eps_c = eps / static_cast<A>(C);
  A W = static_cast<A>(C);
  if (weight && eps != A(0)) {
    A w = 0;
    for (int64_t c = threadIdx.x; c < C; c += 32) w += weight[c];
    W = warp_sum(w);
  }
  const T* x = logits + i * C;
  A scale = convert<A>(grad[i * gstride]);
  if (total_weight) scale /= *total_weight;
  const A wt = weight ? weight[t] : A(1);
  const A l = lse[i];
  const A a = (A(1) - eps) * wt + eps_c * W;
  for (int64_t c = threadIdx.x; c < C; c += 32) {
    const A p = exp(convert<A>(x[c]) - l);
    A v = a * p - eps_c * (weight ? weight[c] : A(1));
    if (c == t) v -= (A(1) - eps) * wt;
    d[c] = convert<T>(scale * v);
  }
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                        double smoothing, const Tensor& lse, const Tensor& row_loss, const Tensor& row_weight) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0) return;
  DeviceGuard guard(logits.device().index);
  cudaStream_t stream = current_raw_stream(logits.device().index);
  Tensor bad = zeros({1}, logits.options().dtype(kInt32));
  dispatch_index(target.dtype(), "cross_entropy", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
      using T = device_t<typename decltype(tag)::type>;
      using A = dacc_t<T>;
      ce_rows_kernel<T, I, A><<<row_blocks(N), dim3(32, kRowsPerBlock), 0, stream>>>(
          static_cast<const T*>(logits.data_ptr()), static_cast<const I*>(target.data_ptr()),
          weight.defined() ? static_cast<const A*>(weight.data_ptr()) : nullptr, static_cast<A*>(lse.data_ptr()),
          static_cast<A*>(row_loss.data_ptr()), static_cast<A*>(row_weight.data_ptr()),
          static_cast<int*>(bad.data_ptr()), N, C, ignore_index, static_cast<A>(smoothing));
      KILN_CUDA_CHECK_LAUNCH("cross_entropy");
    });
  });
  KILN_CHECK(bad.item() == 0, "cross_entropy", "a target is out of range for ", C,
             " classes (and is not ignore_index ", ignore_index, ")");
}

void cross_entropy_reduce(const Tensor& row_loss, const Tensor& row_weight, bool mean, const Tensor& out,
                          const Tensor& total_weight) {
  DeviceGuard guard(out.device().index);
  cudaStream_t stream = current_raw_stream(out.device().index);
  dispatch_floating(out.dtype(), "cross_entropy", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    using A = dacc_t<T>;
    ce_reduce_kernel<T, A><<<1, kReduceThreads, 0, stream>>>(
        static_cast<const A*>(row_loss.data_ptr()), static_cast<const A*>(row_weight.data_ptr()),
        static_cast<T*>(out.data_ptr()), total_weight.defined() ? static_cast<A*>(total_weight.data_ptr()) : nullptr,
        row_loss.numel(), mean);
    KILN_CUDA_CHECK_LAUNCH("cross_entropy");
  });
}

void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& weight,
                            const Tensor& lse, const Tensor& total_weight, int64_t ignore_index, double smoothing,
                            const Tensor& dlogits) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0) return;
  DeviceGuard guard(logits.device().index);
  cudaStream_t stream = current_raw_stream(logits.device().index);
  dispatch_index(target.dtype(), "cross_entropy_backward", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
      using T = device_t<typename decltype(tag)::type>;
      using A = dacc_t<T>;
      ce_backward_kernel<T, I, A><<<row_blocks(N), dim3(32, kRowsPerBlock), 0, stream>>>(
          static_cast<const T*>(grad.data_ptr()), grad.dim() == 0 ? 0 : 1, static_cast<const T*>(logits.data_ptr()),
          static_cast<const I*>(target.data_ptr()),
          weight.defined() ? static_cast<const A*>(weight.data_ptr()) : nullptr,
          static_cast<const A*>(lse.data_ptr()),
          total_weight.defined() ? static_cast<const A*>(total_weight.data_ptr()) : nullptr,
          static_cast<T*>(dlogits.data_ptr()), N, C, ignore_index, static_cast<A>(smoothing));
      KILN_CUDA_CHECK_LAUNCH("cross_entropy_backward");
    });
  });
}

}  // namespace kiln::cuda
