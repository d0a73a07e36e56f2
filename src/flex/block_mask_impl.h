#pragma once
// Internal: builds a BlockMask (padded tensors + the transposed q_* set) from per-row block lists.
#include <cstdint>
#include <vector>

#include "kiln/flex.h"

namespace kiln::flex::detail {

// part / full: one ascending list of kv blocks per (b, h, q-block) row, row-major over [B, H, nQ].
BlockMask assemble(std::vector<std::vector<int32_t>> part, std::vector<std::vector<int32_t>> full, int64_t B,
                   int64_t H, int64_t q_len, int64_t kv_len, int64_t block_size, MaskMod mask_mod);

struct Program;

// bm at half its (square, even) block size: a full block's four sub-blocks full, a partial block's
// classified by interval analysis of prog (bm's mask_mod, compiled): provably empty ones dropped,
// provably full ones full, the rest partial. Lists nothing bm does not, so every kernel sees the
// same kept elements. prog may use b / h only where bm has those dims (bm's row b, h are passed).
BlockMask halve_blocks(const BlockMask& bm, const Program& prog);

// bm's partial and full lists merged, for the CUDA kernels' one-list walk (every BlockMask with a
// mask_mod): kv_num_blocks [B, H, nQ] and kv_indices [B, H, nQ, m]
// list each row's blocks ascending as 2 * block + (1 if partial); q_num_blocks / q_indices the
// same of the transposed lists. The full_* tensors are bm's (unused). On the CPU.
BlockMask merge_block_lists(const BlockMask& bm);

}  // namespace kiln::flex::detail

namespace kiln::flex::cpu {
struct Problem;
}

namespace kiln::flex::detail {

// p's block fields (sizes, counts, the eight lists' pointers) from m, whose tensors are on the
// kernels' device.
void use_block_mask(cpu::Problem& p, const BlockMask& m);
// p's merged lists (kv_all_* / q_all_*) from merged, merge_block_lists of p's BlockMask on the
// kernels' device.
void use_merged_lists(cpu::Problem& p, const BlockMask& merged);

}  // namespace kiln::flex::detail
