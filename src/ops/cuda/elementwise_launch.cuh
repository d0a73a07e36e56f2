#pragma once
// Reusable CUDA elementwise launcher: any op family can include this and pass a functor.
//
//   launch_elementwise<Out, In...>("op", out, {&in0, &in1, ...}, f);
//
// computes out[i] = Out(f(in0[i], in1[i], ...)) with each input widened to its compute type
// (dacc_t: fp32 for bf16/fp16) and the result narrowed to Out. Out/In are kiln host element
// types (float, BFloat16, Half, int64_t, bool, ...). Every operand must already have out's sizes
// (expand() for broadcasting); strides are free. Scalars belong inside the functor (by value in
// the kernel arguments), never in device tensors.
//
// Paths:
//  - all operands contiguous and aligned: each thread moves one 16-byte vector per operand per
//    access (VEC = 16 / largest element size: 8 bf16 or 4 fp32), grid-stride over vectors; the
//    last n % VEC elements are done one by one. This is the bandwidth path (target: >= 80% of
//    a device copy on multi-GiB tensors).
//  - anything else (broadcast, transposed, sliced, misaligned): one element per thread with
//    offsets from an OffsetCalc over the coalesced geometry.
// 256 threads per block: 8 warps keep enough loads in flight per SM without limiting occupancy;
// the grid is capped by blocks_for and the loops are grid-stride.
#include <cuda/std/tuple>

#include <array>
#include <cstdint>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/offset_calc.cuh"
#include "kiln/tensor.h"

namespace kiln::cuda {

constexpr int kElementwiseThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

namespace ew_detail {

template <typename... T>
constexpr size_t max_size() {
  size_t m = 1;
  ((m = sizeof(T) > m ? sizeof(T) : m), ...);
  return m;
}

template <typename Out, typename... In, typename F, typename Regs, size_t... K>
__device__ __forceinline__ Out apply_packed(const F& f, const Regs& regs, int j, std::index_sequence<K...>) {
  return convert<Out>(f(convert<dacc_t<In>>(::cuda::std::get<K>(regs).v[j])...));
}

template <int VEC, typename Out, typename F, typename... In, size_t... K>
__device__ __forceinline__ void contiguous_body(int64_t n, const F& f, Out* __restrict__ out,
                                                std::index_sequence<K...> seq, const In* __restrict__... in) {
  const int64_t nvec = n / VEC;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = tid; v < nvec; v += step) {
    const ::cuda::std::tuple<Pack<In, VEC>...> regs{reinterpret_cast<const Pack<In, VEC>*>(in)[v]...};
    Pack<Out, VEC> r;
#pragma unroll
    for (int j = 0; j < VEC; ++j) r.v[j] = apply_packed<Out, In...>(f, regs, j, seq);
    reinterpret_cast<Pack<Out, VEC>*>(out)[v] = r;
  }
  for (int64_t i = nvec * VEC + tid; i < n; i += step) out[i] = convert<Out>(f(convert<dacc_t<In>>(in[i])...));
}

template <int VEC, typename Out, typename F, typename... In>
__global__ void __launch_bounds__(kElementwiseThreads)
    contiguous_kernel(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  contiguous_body<VEC>(n, f, out, std::index_sequence_for<In...>{}, in...);
}

template <typename Out, typename F, typename... In, size_t... K>
__device__ __forceinline__ void strided_body(int64_t n, const F& f, const OffsetCalc<1 + sizeof...(In)>& calc,
                                             Out* out, std::index_sequence<K...>, const In*... in) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[1 + sizeof...(In)];
    calc.get(i, off);
    out[off[0]] = convert<Out>(f(convert<dacc_t<In>>(in[off[K + 1]])...));
  }
}

template <typename Out, typename F, typename... In>
__global__ void __launch_bounds__(kElementwiseThreads)
    strided_kernel(int64_t n, F f, OffsetCalc<1 + sizeof...(In)> calc, Out* out, const In*... in) {
  strided_body(n, f, calc, out, std::index_sequence_for<In...>{}, in...);
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename DOut, typename... DIn, typename F, size_t... K>
void launch(const char* op, const Tensor& out, const std::array<const Tensor*, sizeof...(DIn)>& ins, const F& f,
            std::index_sequence<K...>) {
  constexpr int N = 1 + static_cast<int>(sizeof...(DIn));
  constexpr int kVec = static_cast<int>(16 / max_size<DOut, DIn...>());
  const int64_t n = out.numel();
  cudaStream_t stream = current_raw_stream(out.device().index);
  DOut* o = static_cast<DOut*>(out.data_ptr());
  const bool contiguous = out.is_contiguous() && (ins[K]->is_contiguous() && ...);
  const bool vec_ok = aligned(o, kVec * sizeof(DOut)) && (aligned(ins[K]->data_ptr(), kVec * sizeof(DIn)) && ...);
  if (contiguous && vec_ok) {
    const unsigned blocks = blocks_for((n + kVec - 1) / kVec, kElementwiseThreads);
    contiguous_kernel<kVec, DOut, F, DIn...><<<blocks, kElementwiseThreads, 0, stream>>>(
        n, f, o, static_cast<const DIn*>(ins[K]->data_ptr())...);
  } else {
    std::array<const Tensor*, N> all{&out, ins[K]...};
    const auto calc = make_offset_calc(make_geometry<N>(all), op);
    strided_kernel<DOut, F, DIn...><<<blocks_for(n, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
        n, f, calc, o, static_cast<const DIn*>(ins[K]->data_ptr())...);
  }
  KILN_CUDA_CHECK_LAUNCH(op);
}

}  // namespace ew_detail

template <typename Out, typename... In, typename F>
void launch_elementwise(const char* op, const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& ins,
                        const F& f) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  ew_detail::launch<device_t<Out>, device_t<In>...>(op, out, ins, f, std::index_sequence_for<In...>{});
}

}  // namespace kiln::cuda
