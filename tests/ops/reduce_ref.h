#pragma once
// Float64 references for the reduction and softmax tests: plain loops over to_vector().
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

// For each output (row-major over the kept dims), the flat input indices it folds, in
// row-major order of the reduced dims.
inline std::vector<std::vector<int64_t>> reduce_groups(const Shape& shape, const std::vector<int64_t>& dims_in) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> red(static_cast<size_t>(nd), dims_in.empty());
  for (int64_t d : dims_in) red[(d + nd) % std::max<int64_t>(nd, 1)] = true;
  Shape kept = shape;
  for (int64_t d = 0; d < nd; ++d)
    if (red[d]) kept[d] = 1;
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(shape_numel(kept)));
  const int64_t n = shape_numel(shape);
  for (int64_t flat = 0; flat < n; ++flat) {  // row-major walk: reduced indices arrive in order
    int64_t rem = flat, out = 0, mul = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (!red[d]) out += idx * mul;
      mul *= kept[d];
    }
    groups[static_cast<size_t>(out)].push_back(flat);
  }
  return groups;
}

inline Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims_in, bool keepdim) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> red(static_cast<size_t>(nd), dims_in.empty());
  for (int64_t d : dims_in) red[(d + nd) % std::max<int64_t>(nd, 1)] = true;
  Shape out;
  for (int64_t d = 0; d < nd; ++d) {
    if (!red[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

enum class RefKind { Sum, Mean, Max, Min, LogSumExp, ArgMax };

inline double ref_fold(RefKind kind, const std::vector<double>& v, const std::vector<int64_t>& g) {
  switch (kind) {
    case RefKind::Sum:
    case RefKind::Mean: {
      double s = 0;
      for (int64_t i : g) s += v[i];
      return kind == RefKind::Mean ? s / static_cast<double>(g.size()) : s;
    }
    case RefKind::Max:
    case RefKind::Min: {
      double m = v[g[0]];
      for (int64_t i : g) m = kind == RefKind::Max ? std::max(m, v[i]) : std::min(m, v[i]);
      return m;
    }
    case RefKind::LogSumExp: {
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (int64_t i : g) m = std::max(m, v[i]);
      for (int64_t i : g) s += std::exp(v[i] - m);
      return m + std::log(s);
    }
    case RefKind::ArgMax: {
      size_t best = 0;
      for (size_t k = 1; k < g.size(); ++k)
        if (v[g[k]] > v[g[best]]) best = k;
      return static_cast<double>(best);
    }
  }
  return 0;
}

// Float64 reference of a reduction of x (any layout) -> tensor in kFloat64.
inline Tensor ref_reduce(RefKind kind, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const std::vector<double> v = x.to_vector();
  const auto groups = reduce_groups(x.sizes(), dims);
  std::vector<double> out;
  for (const auto& g : groups) out.push_back(ref_fold(kind, v, g));
  return tensor(out, kFloat64).reshape(reduced_shape(x.sizes(), dims, keepdim));
}

// Float64 softmax / log_softmax along dim.
inline Tensor ref_softmax(const Tensor& x, int64_t dim, bool log) {
  const std::vector<double> v = x.to_vector();
  const int64_t nd = x.dim();
  const int64_t d = nd == 0 ? 0 : (dim + nd) % nd;
  std::vector<double> out(v.size());
  for (const auto& g : reduce_groups(x.sizes(), nd == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{d})) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t i : g) m = std::max(m, v[i]);
    for (int64_t i : g) s += std::exp(v[i] - m);
    for (int64_t i : g) out[i] = log ? v[i] - m - std::log(s) : std::exp(v[i] - m) / s;
  }
  return tensor(out, kFloat64).reshape(x.sizes());
}

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

}  // namespace kiln::testing
