#pragma once
// Run-time compilation of the generated FlexAttention source: NVRTC -> cubin through kiln::jit (a
// worker process per compile, and its disk cache in kiln's cache folder keyed by source + embedded
// headers + arch + NVRTC version), cached in memory as loaded modules (source + device), so a second
// process loads the cubin without compiling. Modules load through the
// driver API reached via cudaGetDriverEntryPointByVersion (no link-time libcuda dependency: the
// library still loads on machines without a driver). No CUDA headers here.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace kiln::flex::cuda {

// NVRTC's "major.minor".
std::string nvrtc_version();
// "sm_90a" on sm_90 (H100/H200), otherwise "sm_<major><minor>" of the device.
std::string device_arch(int device);

// Compiles `source` for `arch` ("sm_90a") with NVRTC; no GPU needed. The kernel sources embedded
// into the library (core/embedded.h) are its headers: `#include "core/cuda/hopper.cuh"` finds the
// file as it was at build time. Throws kiln::Error naming flex_attention with the NVRTC log on failure.
std::string compile_cubin(const std::string& source, const std::string& arch);
// The disk cache in front of compile_cubin (a missing or unwritable cache directory only costs
// the compile).
std::string cached_cubin(const std::string& source, const std::string& arch);
std::string cache_path(const std::string& source, const std::string& arch);

struct CacheStats {
  int64_t memory_hits = 0, disk_hits = 0, compiles = 0;
};
CacheStats cache_stats();
// Forgets the in-memory modules (they stay loaded: launches in flight keep working).
void clear_kernel_cache();

// The kernels of one generated source on one device (opaque driver handles): a forward module and a
// backward module, compiled concurrently on a miss (each with its own disk-cache entry).
struct FlexKernels {
  void* fwd = nullptr;
  void* bwd_pre = nullptr;
  void* bwd_dq = nullptr;
  void* bwd_dkdv = nullptr;
  void* capgrad_reduce = nullptr;
  void* mask_bits = nullptr;  // flex_mask_bits (KILN_FLEX_MASK_BITS)
};
const FlexKernels& load_kernels(const std::string& source, int device, int64_t fwd_smem, int64_t bwd_smem);
// The forward module from fwd_source and the backward one from bwd_source (a forward generated for
// another configuration, on the caller's BlockMask where the backward's is halved).
const FlexKernels& load_kernels(const std::string& fwd_source, const std::string& bwd_source, int device,
                                int64_t fwd_smem, int64_t bwd_smem);
// load_kernels behind a cache keyed by `id`, a string the caller derives from whatever determines
// the sources (cheaper than generating and hashing them): sources() runs only on a miss and gives
// the forward's and the backward's (the same string for both, usually). Hits count as memory hits;
// clear_kernel_cache forgets these too.
using SourcePair = std::pair<std::string, std::string>;
const FlexKernels& load_kernels_by_id(const std::string& id, const std::function<SourcePair()>& sources, int device,
                                      int64_t fwd_smem, int64_t bwd_smem);

// cuTensorMapEncodeTiled for a row-major 16-bit [outer, rows, cols] tensor at `base` (cols 64 or
// 128): boxes of {64, box_rows, 1} with the 128-byte swizzle, zeros past the bounds. `map` is a
// 64-byte aligned 128-byte CUtensorMap; throws kiln::Error naming flex_attention on failure.
void encode_tile_map(void* map, const void* base, bool bf16, int64_t outer, int64_t rows, int64_t cols, int box_rows);

// How many CTAs of `block` threads and `smem` dynamic bytes fit one SM at once.
int max_active_blocks(void* function, int block, int64_t smem);
// cuLaunchKernel with one argument (the parameter block) on `stream` (a cudaStream_t).
void launch(void* function, int64_t grid, int block, int64_t smem, void* stream, void* params);

}  // namespace kiln::flex::cuda
