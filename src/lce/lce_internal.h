#pragma once
// What the API (lce.cpp) hands the CPU and CUDA backends: validated, contiguous, detached
// tensors and the call's scalars. Plain C++ (no CUDA headers).
#include <algorithm>

#include "kiln/tensor.h"
#include "lce/lce_math.h"

namespace kiln::lce {

struct Problem {
  Tensor x;             // [N, H] contiguous, dtype T (f32, f64, bf16, f16)
  Tensor w;             // [V, H] contiguous, T
  Tensor bias;          // [V] contiguous T, or undefined
  Tensor target;        // [N] int64 contiguous
  Tensor class_weight;  // [V] contiguous, acc dtype (f32, f64 for f64 inputs), or undefined
  Consts k;
  int64_t chunk_n = 0;  // tokens per tile
  int64_t chunk_v = 0;  // vocabulary entries per tile (memory strategy)
  DType tile = kFloat32;  // CUDA logit tiles: T for 16-bit T (see cuda_tile_dtype), else the acc dtype
  DType acc_dtype() const { return x.dtype() == kFloat64 ? kFloat64 : kFloat32; }
};

// The element type of CUDA logit tiles for inputs of dtype t: t itself when 16-bit (cuBLASLt
// rounds the fp32 sums once, as torch's linear does), unless KILN_LCE_TILE32=1 (read once per
// process) keeps fp32 tiles; the acc dtype otherwise. The chunk choice follows it.
DType cuda_tile_dtype(DType t);
// Test hook: 1 forces fp32 tiles for 16-bit inputs, 0 forces 16-bit tiles, -1 follows the switch.
void set_tile32_override(int v);
// Two overlaps of the CUDA strategies (variables read once per process): KILN_LCE_SIDE_STREAM
// (default 1), the speed strategy's dW GEMMs on a second stream beside the dx GEMMs; KILN_LCE_ROWPASS
// (default 0: measured slower), the speed strategy's fused row pass (stats and dz in one read of
// each 16-bit chunk, sm_90). Test hook: 0 / 1 forces both off / on (as far as they apply), -1
// follows the variables.
bool fused_row_pass();
bool side_stream_dw();
void set_speed_overlaps_override(int v);
// Row stride of CUDA logit tiles of `cols` columns: a multiple of 8 elements and of 32 bytes, so
// rows start aligned for the kernels' vector loads (two 16-byte vectors per thread) and for
// cuBLASLt's fastest 16-bit operand paths.
inline int64_t tile_stride(int64_t cols, DType tile) {
  const int64_t e = std::max<int64_t>(8, 32 / static_cast<int64_t>(element_size(tile)));
  return (std::max<int64_t>(cols, 1) + e - 1) / e * e;
}

// The fused-epilogue GEMMs' partials (lce/cuda/lce_fused_gemm.h): per row and 256-column tile, a
// (max, sum exp) pair, and the smoothing sum with label smoothing.
constexpr int64_t kFusedTileCols = 256;
inline int64_t fused_partial_bytes(const Consts& k, int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kFusedTileCols - 1) / kFusedTileCols;
  return tiles * rows * (8 + (k.eps != 0.0 ? 4 : 0));
}

// The memory strategy's fused forward windows: `rows` x `cols` per launch, their partials within
// `budget` bytes (the bytes of the tile they replace) where one 256-column tile a row allows it, so
// working memory depends on neither N nor V: all rows when they fit (else whole 128-row GEMM tiles),
// then as many 256-column tiles as fit.
struct FusedWindows {
  int64_t rows = 1, cols = 1;
};
inline FusedWindows fused_windows(const Consts& k, int64_t budget) {
  const int64_t per_row_tile = fused_partial_bytes(k, 1, 1);
  FusedWindows w;
  w.rows = std::clamp<int64_t>(budget / per_row_tile, 1, std::max<int64_t>(k.n, 1));
  if (w.rows < k.n && w.rows >= 128) w.rows = w.rows / 128 * 128;
  w.cols = std::min(k.v, std::max<int64_t>(1, budget / (w.rows * per_row_tile)) * kFusedTileCols);
  return w;
}

// The fused-epilogue GEMMs on CUDA (KILN_LCE_WGMMA=1, lce/cuda/lce_fused_gemm.h), both strategies':
// whether `device` runs them (an sm_90 GPU, the library's sm_90a code) and how many have run in this
// process, so tests know the path was taken. false / 0 in a build without CUDA.
bool fused_gemm_device(int device);
int64_t fused_gemm_launches();

struct Needs {
  bool dx = false, dw = false, db = false;
  bool any() const { return dx || dw || db; }
};

struct Forward {
  Tensor loss;   // [] (mean/sum) or [N] (none), T
  Tensor lse;    // [N] acc dtype
  Tensor zterm;  // reduced like loss, acc dtype
  Tensor dx, dw, db;  // speed strategy: gradients for an upstream gradient of 1 (T)
};

struct Grads {
  Tensor dx, dw, db;  // T; undefined where not needed
};

}  // namespace kiln::lce

namespace kiln::cpu {
lce::Forward lce_forward_memory(const lce::Problem& p);
lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& needs);
// grad: [] (mean/sum) or [N] (none) in the acc dtype, contiguous.
lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& grad, const lce::Needs& needs);
}  // namespace kiln::cpu

namespace kiln::cuda {
lce::Forward lce_forward_memory(const lce::Problem& p);
lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& needs);
lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& grad, const lce::Needs& needs);
// out = src * (*scale) (in_place: out is src), elementwise, for the speed strategy's backward (scale: a 1-element acc tensor).
Tensor lce_scale(const Tensor& src, const Tensor& scale, bool in_place);
}  // namespace kiln::cuda
