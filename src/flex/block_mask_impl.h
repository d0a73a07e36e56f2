#pragma once
// Internal: builds a BlockMask (padded tensors + the transposed q_* set) from per-row block lists.
#include <cstdint>
#include <vector>

#include "kiln/flex.h"

namespace kiln::flex::detail {

// part / full: one ascending list of kv blocks per (b, h, q-block) row, row-major over [B, H, nQ].
BlockMask assemble(std::vector<std::vector<int32_t>> part, std::vector<std::vector<int32_t>> full, int64_t B,
                   int64_t H, int64_t q_len, int64_t kv_len, int64_t block_size, MaskMod mask_mod);

}  // namespace kiln::flex::detail
