// CPU allocator (64-byte aligned, so SIMD loads of any width start aligned) and the
// device-independent memory-stats API. The CUDA side lives in src/core/cuda/allocator.cu.
#include <atomic>
#include <cstdlib>

#include "core/memory_tracker.h"
#include "core/storage.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr size_t kCpuAlignment = 64;
MemoryTracker& cpu_tracker() {
  static MemoryTracker tracker;
  return tracker;
}
std::atomic<int64_t> cpu_reserved{0};

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void* allocate_bytes(Device device, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return cuda_backend::allocate(device.index, nbytes);
#else
    KILN_FAIL("allocate", "kiln was built without CUDA; cannot allocate on ", device.str());
#endif
  }
  const size_t padded = round_up(nbytes, kCpuAlignment);
  void* p = std::aligned_alloc(kCpuAlignment, padded);
  KILN_CHECK(p != nullptr, "allocate", "out of CPU memory allocating ", nbytes, " bytes");
  const int64_t reserved = cpu_reserved.fetch_add(static_cast<int64_t>(padded)) + static_cast<int64_t>(padded);
  cpu_tracker().on_alloc(static_cast<int64_t>(nbytes), reserved);
  return p;
}

void free_bytes(Device device, void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    cuda_backend::free(device.index, ptr, nbytes);
#endif
    return;
  }
  std::free(ptr);
  const auto padded = static_cast<int64_t>(round_up(nbytes, kCpuAlignment));
  const int64_t reserved = cpu_reserved.fetch_sub(padded) - padded;
  cpu_tracker().on_free(static_cast<int64_t>(nbytes), reserved);
}

MemoryStats memory_stats(Device device) {
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return cuda_backend::stats(device.index);
#else
    KILN_FAIL("memory_stats", "kiln was built without CUDA");
#endif
  }
  return cpu_tracker().snapshot(cpu_reserved.load());
}

int64_t memory_allocated(Device device) { return memory_stats(device).allocated; }
int64_t max_memory_allocated(Device device) { return memory_stats(device).peak_allocated; }
int64_t memory_reserved(Device device) { return memory_stats(device).reserved; }
int64_t max_memory_reserved(Device device) { return memory_stats(device).peak_reserved; }

void reset_peak_memory_stats(Device device) {
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    cuda_backend::reset_peak(device.index);
    return;
#else
    KILN_FAIL("reset_peak_memory_stats", "kiln was built without CUDA");
#endif
  }
  cpu_tracker().reset_peak(cpu_reserved.load());
}

void empty_cache(Device device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) cuda_backend::empty_cache(device.index);
#else
  KILN_CHECK(!device.is_cuda(), "empty_cache", "kiln was built without CUDA");
#endif
}

Storage::Storage(Device device, size_t nbytes)
    : data_(allocate_bytes(device, nbytes)), nbytes_(nbytes), device_(device) {}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), owned_(false), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (owned_) {
    try {
      free_bytes(device_, data_, nbytes_);
    } catch (...) {  // a destructor must not throw; the driver already reported the failure
    }
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace kiln
