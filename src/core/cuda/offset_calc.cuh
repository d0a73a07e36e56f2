#pragma once
// Element offsets of N strided operands from a linear index, for CUDA kernels over a
// coalesced Geometry (passed by value as a kernel argument).
#include <array>
#include <cstdint>

#include "core/cuda/int_divider.h"
#include "core/geometry.h"
#include "kiln/error.h"

namespace kiln::cuda {

constexpr int kMaxDims = 12;

template <int N>
struct OffsetCalc {
  int ndim = 0;
  bool narrow = false;  // fewer than 2^31 elements: the index splits by IntDivider (3 instructions
                        // a dim instead of a 64-bit divide and modulo, ~200: the strided kernels'
                        // cost on permuted tensors)
  int64_t sizes[kMaxDims];
  IntDivider div[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) off[i] = 0;
    if (narrow) {
      uint32_t rest = static_cast<uint32_t>(linear);
      for (int d = ndim - 1; d >= 0; --d) {
        uint32_t q, idx;
        div[d].divmod(rest, q, idx);
        rest = q;
#pragma unroll
        for (int i = 0; i < N; ++i) off[i] += static_cast<int64_t>(idx) * strides[i][d];
      }
      return;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t idx = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int i = 0; i < N; ++i) off[i] += idx * strides[i][d];
    }
  }
};

template <int N>
OffsetCalc<N> make_offset_calc(const Geometry<N>& g, const char* op) {
  KILN_CHECK(g.shape.size() <= static_cast<size_t>(kMaxDims), op, "tensors with more than ", kMaxDims,
             " non-mergeable dims are not supported on CUDA");
  OffsetCalc<N> c;
  c.ndim = static_cast<int>(g.shape.size());
  int64_t numel = 1;
  for (int d = 0; d < c.ndim; ++d) {
    c.sizes[d] = g.shape[d];
    numel *= g.shape[d];
    for (int i = 0; i < N; ++i) c.strides[i][d] = g.strides[i][d];
  }
  c.narrow = numel >= 1 && numel < (int64_t{1} << 31);
  if (c.narrow)
    for (int d = 0; d < c.ndim; ++d) c.div[d] = IntDivider(static_cast<uint32_t>(c.sizes[d]));
  return c;
}

}  // namespace kiln::cuda
