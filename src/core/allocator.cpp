// CPU allocator and the device-independent memory-stats API. The CUDA side lives in
// src/core/cuda/allocator.cu.
//
// Small CPU blocks: 64-byte aligned (SIMD loads of any width start aligned), straight from libc.
// Large blocks (>= 1 MiB): 2 MiB aligned and advised to use transparent huge pages (512x fewer
// first-touch page faults), and cached by size when freed (up to kCacheLimit), so a training
// loop that allocates the same shapes every step neither faults nor calls the OS. A fresh 256 MiB
// output cost more in page faults than the elementwise op writing it (op-level add at 38% of
// memcpy before the cache). memory_reserved = live padded bytes + cached bytes.
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "core/memory_tracker.h"
#include "core/storage.h"
#include "kiln/cuda.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr size_t kCpuAlignment = 64;
constexpr size_t kLargeBlock = size_t{1} << 20;
constexpr size_t kHugeAlignment = size_t{2} << 20;
constexpr size_t kCacheLimit = size_t{4} << 30;

MemoryTracker& cpu_tracker() {
  static MemoryTracker tracker;
  return tracker;
}
std::atomic<int64_t> cpu_reserved{0};

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
size_t padded_size(size_t n) { return n >= kLargeBlock ? round_up(n, kHugeAlignment) : round_up(n, kCpuAlignment); }

class LargeBlockCache {
 public:
  void* take(size_t padded) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(padded);
    if (it == blocks_.end()) return nullptr;
    void* p = it->second;
    blocks_.erase(it);
    cached_ -= padded;
    return p;
  }
  // Returns false when the cache is full: the caller frees the block.
  bool put(void* p, size_t padded) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + padded > kCacheLimit) return false;
    blocks_.emplace(padded, p);
    cached_ += padded;
    return true;
  }
  // Frees every cached block; returns the bytes released.
  size_t clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : blocks_) std::free(p);
    blocks_.clear();
    const size_t released = cached_;
    cached_ = 0;
    return released;
  }

 private:
  std::mutex mu_;
  std::unordered_multimap<size_t, void*> blocks_;
  size_t cached_ = 0;
};
LargeBlockCache& large_cache() {
  static LargeBlockCache cache;
  return cache;
}

void* cpu_allocate(size_t nbytes, size_t padded) {
  if (padded >= kLargeBlock) {
    if (void* p = large_cache().take(padded)) return p;  // already counted in reserved
    void* p = std::aligned_alloc(kHugeAlignment, padded);
    KILN_CHECK(p != nullptr, "allocate", "out of CPU memory allocating ", nbytes, " bytes");
#ifdef MADV_HUGEPAGE
    madvise(p, padded, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
#endif
    cpu_reserved.fetch_add(static_cast<int64_t>(padded));
    return p;
  }
  void* p = std::aligned_alloc(kCpuAlignment, padded);
  KILN_CHECK(p != nullptr, "allocate", "out of CPU memory allocating ", nbytes, " bytes");
  cpu_reserved.fetch_add(static_cast<int64_t>(padded));
  return p;
}

void cpu_free(void* p, size_t padded) {
  if (padded >= kLargeBlock && large_cache().put(p, padded)) return;  // stays reserved
  std::free(p);
  cpu_reserved.fetch_sub(static_cast<int64_t>(padded));
}

}  // namespace

void* allocate_bytes(Device device, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return cuda_backend::allocate(device.index, nbytes);
#else
    cuda::check_available(device.index, "allocate");
    KILN_FAIL("allocate", "kiln was built without CUDA; cannot allocate on ", device.str());
#endif
  }
  void* p = cpu_allocate(nbytes, padded_size(nbytes));
  cpu_tracker().on_alloc(static_cast<int64_t>(nbytes), cpu_reserved.load());
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
  cpu_free(ptr, padded_size(nbytes));
  cpu_tracker().on_free(static_cast<int64_t>(nbytes), cpu_reserved.load());
}

MemoryStats memory_stats(Device device) {
  if (device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return cuda_backend::stats(device.index);
#else
    cuda::check_available(device.index, "memory_stats");
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
    cuda::check_available(device.index, "reset_peak_memory_stats");
    KILN_FAIL("reset_peak_memory_stats", "kiln was built without CUDA");
#endif
  }
  cpu_tracker().reset_peak(cpu_reserved.load());
}

void empty_cache(Device device) {
  if (device.is_cpu()) {
    cpu_reserved.fetch_sub(static_cast<int64_t>(large_cache().clear()));
    return;
  }
#ifdef KILN_WITH_CUDA
  cuda_backend::empty_cache(device.index);
#else
  cuda::check_available(device.index, "empty_cache");
  KILN_FAIL("empty_cache", "kiln was built without CUDA");
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
