#pragma once
// Iteration geometry shared by CPU loops and CUDA offset calculators: the common shape of N
// operands (inputs already broadcast to it) with size-1 dims dropped and dims merged wherever
// every operand walks them as one run. Strides are in elements.
#include <array>
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

template <int N>
struct Geometry {
  std::vector<int64_t> shape;                   // innermost last; never empty
  std::array<std::vector<int64_t>, N> strides;  // elements

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

template <int N>
Geometry<N> make_geometry(const std::array<const Tensor*, N>& tensors) {
  Geometry<N> g;
  const Shape& sizes = tensors[0]->sizes();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    g.shape.push_back(sizes[d]);
    for (int i = 0; i < N; ++i) g.strides[i].push_back(tensors[i]->strides()[d]);
  }
  if (g.shape.empty()) {
    g.shape.push_back(1);
    for (int i = 0; i < N; ++i) g.strides[i].push_back(0);
    return g;
  }
  // Merge dim d into the run that follows it when, for every operand, stride[d] equals the
  // run's stride times its length.
  std::vector<int64_t> s{g.shape.back()};
  std::array<std::vector<int64_t>, N> st;
  for (int i = 0; i < N; ++i) st[i] = {g.strides[i].back()};
  for (int64_t d = static_cast<int64_t>(g.shape.size()) - 2; d >= 0; --d) {
    bool merge = true;
    for (int i = 0; i < N; ++i) merge = merge && g.strides[i][d] == st[i].front() * s.front();
    if (merge) {
      s.front() *= g.shape[d];
    } else {
      s.insert(s.begin(), g.shape[d]);
      for (int i = 0; i < N; ++i) st[i].insert(st[i].begin(), g.strides[i][d]);
    }
  }
  g.shape = std::move(s);
  g.strides = std::move(st);
  return g;
}

}  // namespace kiln
