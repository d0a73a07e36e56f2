#pragma once
// Byte accounting shared by the CPU and CUDA allocators.
#include <algorithm>
#include <mutex>

#include "kiln/memory.h"

namespace kiln {

class MemoryTracker {
 public:
  void on_alloc(int64_t bytes, int64_t reserved_now) {
    std::lock_guard<std::mutex> lock(mu_);
    s_.allocated += bytes;
    s_.peak_allocated = std::max(s_.peak_allocated, s_.allocated);
    s_.num_allocs += 1;
    set_reserved_locked(reserved_now);
  }
  void on_free(int64_t bytes, int64_t reserved_now) {
    std::lock_guard<std::mutex> lock(mu_);
    s_.allocated -= bytes;
    set_reserved_locked(reserved_now);
  }
  MemoryStats snapshot(int64_t reserved_now) {
    std::lock_guard<std::mutex> lock(mu_);
    set_reserved_locked(reserved_now);
    return s_;
  }
  void reset_peak(int64_t reserved_now) {
    std::lock_guard<std::mutex> lock(mu_);
    s_.peak_allocated = s_.allocated;
    s_.reserved = reserved_now;
    s_.peak_reserved = reserved_now;
  }

 private:
  void set_reserved_locked(int64_t r) {
    s_.reserved = r;
    s_.peak_reserved = std::max(s_.peak_reserved, r);
  }
  std::mutex mu_;
  MemoryStats s_;
};

#ifdef KILN_WITH_CUDA
namespace cuda_backend {
void* allocate(int device, size_t nbytes);
void free(int device, void* ptr, size_t nbytes);
MemoryStats stats(int device);
void reset_peak(int device);
void empty_cache(int device);
}  // namespace cuda_backend
#endif

}  // namespace kiln
