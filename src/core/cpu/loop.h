#pragma once
// Strided N-operand loops for CPU kernels over a coalesced Geometry: fn gets one innermost
// row at a time (pointers, length, byte strides), rows split over OpenMP threads. Elementwise
// work is independent per element, so results do not depend on the thread count.
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/cpu/parallel.h"
#include "core/geometry.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {

template <int N>
struct StridedOperands {
  Geometry<N> geom;
  std::array<char*, N> base{};
  std::array<int64_t, N> elem_bytes{};

  // tensors[0] is usually the output; all must have the same sizes.
  explicit StridedOperands(const std::array<const Tensor*, N>& tensors) : geom(make_geometry<N>(tensors)) {
    for (int i = 0; i < N; ++i) {
      base[i] = static_cast<char*>(tensors[i]->data_ptr());
      elem_bytes[i] = static_cast<int64_t>(tensors[i]->element_size());
    }
  }

  int64_t numel() const { return geom.numel(); }
  // True when operand i's innermost run is dense (stride of one element).
  bool inner_contiguous(int i) const { return geom.strides[i].back() == 1; }

  // fn(const std::array<char*, N>& ptrs, int64_t n, const std::array<int64_t, N>& byte_strides);
  // rows split over threads at or above grain_elements (default: the elementwise grain).
  template <typename F>
  void for_each_row(F&& fn, int64_t grain_elements = 0) const {
    const auto& shape = geom.shape;
    const int64_t inner = shape.back();
    const int64_t nrows = geom.numel() / inner;
    std::array<int64_t, N> inner_strides;
    for (int i = 0; i < N; ++i) inner_strides[i] = geom.strides[i].back() * elem_bytes[i];
    const int64_t grain = grain_elements > 0 ? grain_elements : grains().elementwise_grain;
    const int nt = nrows > 1 ? static_cast<int>(std::min<int64_t>(threads_for(geom.numel(), grain), nrows)) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < nrows; ++r) {
      std::array<char*, N> ptrs = base;
      int64_t rem = r;
      for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
        const int64_t idx = rem % shape[d];
        rem /= shape[d];
        for (int i = 0; i < N; ++i) ptrs[i] += idx * geom.strides[i][d] * elem_bytes[i];
      }
      fn(ptrs, inner, inner_strides);
    }
  }
};

}  // namespace kiln::cpu
