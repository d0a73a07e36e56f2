#pragma once
// What the API (lce.cpp) hands the CPU and CUDA backends: validated, contiguous, detached
// tensors, the call's scalars and its plan. Plain C++ (no CUDA headers).
#include <algorithm>

#include "kiln/lce.h"
#include "kiln/tensor.h"
#include "lce/lce_math.h"

namespace kiln::lce {

struct Needs {
  bool dx = false, dw = false, db = false;
  bool any() const { return dx || dw || db; }
};

struct Dims {
  int64_t n = 0, h = 0, v = 0;  // tokens, hidden size, classes
};

// How one call runs, decided once by plan() from shapes, dtype, device and options; the backends
// follow it and decide nothing themselves.
struct Plan {
  nn::functional::LceStrategy strategy = nn::functional::LceStrategy::Memory;  // Memory or Speed
  int64_t chunk_n = 1;  // tokens per logit tile (memory) or chunk (speed), in [1, max(N, 1)]
  int64_t chunk_v = 1;  // classes per logit tile (memory; the CPU speed strategy's W panels), <= V
  bool side_stream = false;  // CUDA speed: the dW GEMMs on a second stream beside the dx GEMMs
};

// The plan for inputs of dtype t (on CUDA when `cuda`) with the options' strategy, chunk sizes and
// memory budget (lce.cpp).
Plan plan(const Dims& d, DType t, bool cuda, const nn::functional::LinearCrossEntropyOptions& o, const Needs& nd);

struct Problem {
  Tensor x;             // [N, H] contiguous, dtype T (f32, f64, bf16, f16)
  Tensor w;             // [V, H] contiguous, T
  Tensor bias;          // [V] contiguous T, or undefined
  Tensor target;        // [N] int64 contiguous
  Tensor class_weight;  // [V] contiguous, acc dtype (f32, f64 for f64 inputs), or undefined
  Consts k;
  Plan plan;
  DType acc_dtype() const { return x.dtype() == kFloat64 ? kFloat64 : kFloat32; }
};

// Row stride of CUDA logit tiles (dtype T) of `cols` columns: a multiple of 8 elements and of 32
// bytes, so rows start aligned for the kernels' vector loads (two 16-byte vectors per thread) and
// for cuBLASLt's fastest 16-bit operand paths.
inline int64_t tile_stride(int64_t cols, DType tile) {
  const int64_t e = std::max<int64_t>(8, 32 / static_cast<int64_t>(element_size(tile)));
  return (std::max<int64_t>(cols, 1) + e - 1) / e * e;
}

struct Forward {
  Tensor loss;   // [] (mean/sum) or [N] (none), acc dtype
  Tensor lse;    // [N] acc dtype
  Tensor zterm;  // reduced like loss, acc dtype
  Tensor predicted;  // [N] int64 argmax per token, -1 where ignored (k.argmax only)
  Tensor tscale;     // [N] acc: each token's detached p(target), 0 where ignored (k.token_scaling only)
  Tensor dx, dw, db;  // speed strategy: gradients for an upstream gradient of 1 (T)
};

struct Grads {
  Tensor dx, dw, db;  // T; undefined where not needed
};

}  // namespace kiln::lce

namespace kiln::cpu {
lce::Forward lce_forward_memory(const lce::Problem& p);
lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& needs);
// grad: [] (mean/sum) or [N] (none) in the acc dtype, contiguous; tscale: Forward::tscale or undefined.
lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& tscale, const Tensor& grad,
                               const lce::Needs& needs);
}  // namespace kiln::cpu

namespace kiln::cuda {
lce::Forward lce_forward_memory(const lce::Problem& p);
lce::Forward lce_forward_speed(const lce::Problem& p, const lce::Needs& needs);
lce::Grads lce_backward_memory(const lce::Problem& p, const Tensor& lse, const Tensor& tscale, const Tensor& grad,
                               const lce::Needs& needs);
// out = src * (*scale) (in_place: out is src), elementwise, for the speed strategy's backward (scale: a 1-element acc tensor).
Tensor lce_scale(const Tensor& src, const Tensor& scale, bool in_place);
}  // namespace kiln::cuda
