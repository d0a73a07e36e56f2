#pragma once
// The global Philox generator: one seed for all devices, one counter offset per device.
// Each random op reserves ceil(numel / 4) counters, so successive ops never reuse a block.
#include <cstdint>

#include "kiln/device.h"

namespace kiln {

struct PhiloxState {
  uint64_t seed;
  uint64_t offset;
};

PhiloxState reserve_philox(Device device, int64_t numel);

}  // namespace kiln
