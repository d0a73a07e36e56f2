#pragma once
// The shape every reduction kernel sees: the input as [outer, r, inner] with element strides
// (so, sr, si), results written at o * oo + i * oi of a contiguous output. Built in reduce.cpp
// from any input by sorting dims by stride and merging runs; inputs that do not fit are first
// permuted to (kept..., reduced...) and made contiguous.
#include <cstdint>

namespace kiln {

enum class ReduceKind { Sum, Mean, Max, Min, ArgMax, ArgMin, LogSumExp };

struct ReduceGeom {
  int64_t outer = 1, r = 1, inner = 1;
  int64_t so = 0, sr = 0, si = 0;  // input element strides
  int64_t oo = 0, oi = 0;          // output element strides
  int64_t outputs() const { return outer * inner; }
};

}  // namespace kiln
