#pragma once
// Driver functions reached through the runtime (cudaGetDriverEntryPointByVersion: no link-time
// libcuda dependency, so the library still loads on machines without a driver), and Hopper's TMA
// descriptors built with them.
#include <cstdint>

namespace kiln::cuda {

// The driver function `name` (CUDA 12.0 ABI); throws kiln::Error naming `op` when unreachable.
void* driver_entry(const char* name, const char* op);

enum class MapElem { BFloat16, Float16, Float32 };

// cuTensorMapEncodeTiled for a row-major [outer, rows, cols] tensor at `base` (row stride cols,
// 16-byte aligned): boxes of {box_cols, box_rows, 1}, the 128-byte swizzle, zeros past the bounds.
// rank 3, or 2 for [rows, cols] alone (outer ignored): the rank the kernel's bulk tensor copies name.
// `map` is a 64-byte aligned 128-byte CUtensorMap; a failure is a kiln::Error naming `op`.
void encode_tensor_map(void* map, MapElem elem, const void* base, int rank, int64_t outer, int64_t rows,
                       int64_t cols, int box_cols, int box_rows, const char* op);

}  // namespace kiln::cuda
