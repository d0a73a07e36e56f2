#pragma once
// Reference-counted bytes on one device, with the version counter shared by all views.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kiln/device.h"

namespace kiln {

class Storage {
 public:
  // Allocates through kiln's allocator for `device` (counted in memory stats).
  Storage(Device device, size_t nbytes);
  // Wraps external memory; `deleter` (may be null) runs on destruction. Not counted.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool owned_ = true;
  std::function<void(void*)> deleter_;
  std::atomic<uint64_t> version_{0};
};

// The raw allocators behind Storage (src/core/allocator.cpp, src/core/cuda/allocator.cu).
void* allocate_bytes(Device device, size_t nbytes);
void free_bytes(Device device, void* ptr, size_t nbytes);

}  // namespace kiln
