#pragma once
// Memory statistics per device. Every byte a tensor holds goes through kiln's allocators, so
// these numbers are exact: memory_allocated is the sum of the sizes requested by live
// allocations (no rounding), memory_reserved what the allocator holds from the system/driver.
#include <cstdint>

#include "kiln/device.h"

namespace kiln {

struct MemoryStats {
  int64_t allocated = 0;       // bytes held by live tensors (requested sizes)
  int64_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
  int64_t reserved = 0;        // bytes the allocator holds (CUDA: the stream-ordered pool)
  int64_t peak_reserved = 0;
  int64_t num_allocs = 0;      // allocations made since the process started
};

MemoryStats memory_stats(Device device);
int64_t memory_allocated(Device device);
int64_t max_memory_allocated(Device device);
int64_t memory_reserved(Device device);
int64_t max_memory_reserved(Device device);
void reset_peak_memory_stats(Device device);
// Returns cached memory to the system: the CUDA pool's free blocks, the CPU's cached large blocks.
void empty_cache(Device device);

}  // namespace kiln
