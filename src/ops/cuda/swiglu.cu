// swiglu on CUDA: silu(gate) * up in one pass forward (read gate, up; write out) and one backward
// (read grad, gate, up; write both gradients), where the composition of silu and mul makes three
// passes forward and five backward. Computed in fp32 for 16-bit dtypes (fp64 for fp64).
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cuda/elementwise_launch.cuh"
#include "ops/cuda/swiglu.h"

namespace kiln::cuda {
namespace {

template <typename A>
__device__ __forceinline__ A sigmoid_of(A g) {
  return static_cast<A>(1) / (static_cast<A>(1) + exp(-g));
}

struct SwigluForward {
  template <typename A>
  __device__ __forceinline__ A operator()(A g, A u) const {
    return g * sigmoid_of(g) * u;
  }
};

// One pack of N elements per step, grid-stride; N = 1 serves unaligned pointers and the tail.
template <typename T, int N>
__global__ void __launch_bounds__(kElementwiseThreads)
    swiglu_backward_kernel(const T* __restrict__ grad, const T* __restrict__ gate, const T* __restrict__ up,
                           T* __restrict__ dgate, T* __restrict__ dup, int64_t packs) {
  using A = dacc_t<T>;
  using P = Pack<T, N>;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P dy = reinterpret_cast<const P*>(grad)[p], g = reinterpret_cast<const P*>(gate)[p],
            u = reinterpret_cast<const P*>(up)[p];
    P dg, du;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const A gv = convert<A>(g.v[k]), uv = convert<A>(u.v[k]), dv = convert<A>(dy.v[k]);
      const A s = sigmoid_of(gv);
      dg.v[k] = convert<T>(dv * uv * s * (static_cast<A>(1) + gv * (static_cast<A>(1) - s)));
      du.v[k] = convert<T>(dv * gv * s);
    }
    reinterpret_cast<P*>(dgate)[p] = dg;
    reinterpret_cast<P*>(dup)[p] = du;
  }
}

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<T, T, T>("swiglu", out, {&gate, &up}, SwigluForward{});
  });
}

void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  DeviceGuard guard(gate.device().index);
  cudaStream_t stream = current_raw_stream(gate.device().index);
  dispatch_floating(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    constexpr int N = static_cast<int>(16 / sizeof(T));
    const T* ptrs[] = {static_cast<const T*>(grad.data_ptr()), static_cast<const T*>(gate.data_ptr()),
                       static_cast<const T*>(up.data_ptr()), static_cast<const T*>(dgate.data_ptr()),
                       static_cast<const T*>(dup.data_ptr())};
    bool vec = true;
    for (const T* p : ptrs) vec = vec && ew_detail::aligned(p, 16);
    const int64_t body = vec ? n / N * N : 0;
    if (body > 0) {
      swiglu_backward_kernel<T, N><<<blocks_for(body / N, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
          ptrs[0], ptrs[1], ptrs[2], const_cast<T*>(ptrs[3]), const_cast<T*>(ptrs[4]), body / N);
      KILN_CUDA_CHECK_LAUNCH("swiglu_backward");
    }
    if (body < n) {  // the unaligned case and the tail
      swiglu_backward_kernel<T, 1><<<blocks_for(n - body, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
          ptrs[0] + body, ptrs[1] + body, ptrs[2] + body, const_cast<T*>(ptrs[3]) + body,
          const_cast<T*>(ptrs[4]) + body, n - body);
      KILN_CUDA_CHECK_LAUNCH("swiglu_backward");
    }
  });
}

}  // namespace kiln::cuda
