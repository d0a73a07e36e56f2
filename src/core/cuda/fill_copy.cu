// CUDA copies (strided, with dtype conversion), fills, arange and Philox random fills.
// Dense same-dtype copies go to cudaMemcpyAsync; the rest is a grid-stride loop over a
// coalesced geometry, in 16-byte packs where the innermost dim is contiguous on both sides. Everything runs on the current stream of the tensor's device.
#include <optional>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/offset_calc.cuh"
#include "core/dispatch.h"
#include "core/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename D, typename S>
__global__ void copy_kernel(D* dst, const S* src, int64_t n, OffsetCalc<2> calc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    calc.get(i, off);
    dst[off[0]] = convert<D>(src[off[1]]);
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, T value, int64_t n, OffsetCalc<1> calc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[1];
    calc.get(i, off);
    dst[off[0]] = value;
  }
}

template <typename T>
__global__ void arange_kernel(T* dst, double start, double step, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(start + static_cast<double>(i) * step);
}

template <typename T>
__global__ void random_kernel(T* dst, int64_t n, philox::Distribution dist, uint64_t seed, uint64_t offset,
                              int64_t low, int64_t high) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(philox::sample(seed, offset, static_cast<uint64_t>(i), dist, low, high));
}

cudaStream_t stream_of(const Tensor& t) { return current_raw_stream(t.device().index); }

// A same-dtype copy whose innermost dim is contiguous on both sides (a permute that keeps the
// last dim, e.g. attention heads moved next to tokens) as 16-byte packs: the geometry in packs
// when the innermost run, every other stride and both pointers allow, else empty.
std::optional<Geometry<2>> in_packs(const Geometry<2>& g, size_t elem, const void* dst, const void* src) {
  const int64_t per = static_cast<int64_t>(16 / elem);
  const size_t last = g.shape.size() - 1;
  if (per <= 1 || g.strides[0][last] != 1 || g.strides[1][last] != 1 || g.shape[last] % per != 0) return std::nullopt;
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) return std::nullopt;
  Geometry<2> p = g;
  p.shape[last] /= per;
  for (int i = 0; i < 2; ++i)
    for (size_t d = 0; d < last; ++d) {
      if (g.strides[i][d] % per != 0) return std::nullopt;
      p.strides[i][d] /= per;
    }
  return p;
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device().index);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream_of(dst)));
    return;
  }
  const Geometry<2> geometry = make_geometry<2>({&dst, &src});
  if (dst.dtype() == src.dtype()) {
    if (auto packs = in_packs(geometry, element_size(dst.dtype()), dst.data_ptr(), src.data_ptr())) {
      copy_kernel<uint4, uint4><<<blocks_for(packs->numel(), kThreads), kThreads, 0, stream_of(dst)>>>(
          static_cast<uint4*>(dst.data_ptr()), static_cast<const uint4*>(src.data_ptr()), packs->numel(),
          make_offset_calc(*packs, "copy_"));
      KILN_CUDA_CHECK_LAUNCH("copy_");
      return;
    }
  }
  const auto calc = make_offset_calc(geometry, "copy_");
  dispatch_all(dst.dtype(), "copy_", [&](auto dtag) {
    using D = device_t<typename decltype(dtag)::type>;
    dispatch_all(src.dtype(), "copy_", [&](auto stag) {
      using S = device_t<typename decltype(stag)::type>;
      copy_kernel<D, S><<<blocks_for(n, kThreads), kThreads, 0, stream_of(dst)>>>(
          static_cast<D*>(dst.data_ptr()), static_cast<const S*>(src.data_ptr()), n, calc);
      KILN_CUDA_CHECK_LAUNCH("copy_");
    });
  });
}

void fill(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device().index);
  if (value == 0.0 && dst.is_contiguous()) {  // all-zero bit pattern for every dtype
    KILN_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream_of(dst)));
    return;
  }
  const auto calc = make_offset_calc(make_geometry<1>({&dst}), "fill_");
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    fill_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream_of(dst)>>>(static_cast<T*>(dst.data_ptr()),
                                                                             convert<T>(value), n, calc);
    KILN_CUDA_CHECK_LAUNCH("fill_");
  });
}

void arange(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device().index);
  dispatch_all(dst.dtype(), "arange", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    arange_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream_of(dst)>>>(static_cast<T*>(dst.data_ptr()),
                                                                               start, step, n);
    KILN_CUDA_CHECK_LAUNCH("arange");
  });
}

void random(const Tensor& dst, philox::Distribution dist, uint64_t seed, uint64_t offset, int64_t low,
            int64_t high) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device().index);
  dispatch_all(dst.dtype(), "random", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    random_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream_of(dst)>>>(
        static_cast<T*>(dst.data_ptr()), n, dist, seed, offset, low, high);
    KILN_CUDA_CHECK_LAUNCH("random");
  });
}

void memcpy_host_to_device(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = current_raw_stream(device);
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
  // The host buffer may be freed as soon as we return (pageable memory): wait for the copy.
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
}

void memcpy_device_to_host(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t s = current_raw_stream(device);
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace kiln::cuda
