// CUDA allocator: the driver's stream-ordered pool (cudaMallocAsync) on the current stream.
// The pool keeps freed memory (release threshold = max) so steady-state training steps do not
// call into the driver; memory_reserved reads the pool's own counter.
#include <array>
#include <cstdint>
#include <mutex>

#include "core/cuda/check.h"
#include "core/memory_tracker.h"
#include "kiln/cuda.h"

namespace kiln::cuda_backend {
namespace {

constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag init;
  cudaMemPool_t pool = nullptr;
  MemoryTracker tracker;
};

DeviceState& state(int device) {
  static std::array<DeviceState, kMaxDevices> states;
  KILN_CHECK(device >= 0 && device < kMaxDevices, "cuda allocator", "bad device index ", device);
  DeviceState& s = states[device];
  std::call_once(s.init, [&] {
    cuda::check_available(device, "cuda");  // no driver: said plainly, not as a driver version
    KILN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&s.pool, device));
    uint64_t threshold = UINT64_MAX;
    KILN_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
  return s;
}

int64_t reserved_now(DeviceState& s) {
  uint64_t value = 0;
  if (cudaMemPoolGetAttribute(s.pool, cudaMemPoolAttrReservedMemCurrent, &value) != cudaSuccess) return 0;
  return static_cast<int64_t>(value);
}

}  // namespace

void* allocate(int device, size_t nbytes) {
  DeviceState& s = state(device);
  cuda::DeviceGuard guard(device);
  void* ptr = nullptr;
  cudaError_t err = cudaMallocAsync(&ptr, nbytes, cuda::current_raw_stream(device));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state so the caller can recover
    KILN_FAIL("cuda allocator", "out of memory allocating ", nbytes, " bytes on cuda:", device,
              " (", cudaGetErrorString(err), "); allocated ", s.tracker.snapshot(reserved_now(s)).allocated,
              " bytes, reserved ", reserved_now(s));
  }
  s.tracker.on_alloc(static_cast<int64_t>(nbytes), reserved_now(s));
  return ptr;
}

void free(int device, void* ptr, size_t nbytes) {
  DeviceState& s = state(device);
  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != device) cudaSetDevice(device);
  // Errors here come from a dying context at process exit; nothing useful can be done.
  if (cudaFreeAsync(ptr, cuda::current_raw_stream(device)) != cudaSuccess) cudaGetLastError();
  if (previous != device) cudaSetDevice(previous);
  s.tracker.on_free(static_cast<int64_t>(nbytes), reserved_now(s));
}

MemoryStats stats(int device) {
  DeviceState& s = state(device);
  return s.tracker.snapshot(reserved_now(s));
}

void reset_peak(int device) {
  DeviceState& s = state(device);
  uint64_t zero = 0;
  KILN_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReservedMemHigh, &zero));
  s.tracker.reset_peak(reserved_now(s));
}

void empty_cache(int device) {
  DeviceState& s = state(device);
  cuda::DeviceGuard guard(device);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  KILN_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
}

}  // namespace kiln::cuda_backend
