#pragma once
// Plain-loop helpers for the float64 references of the indexing tests.
#include <functional>
#include <string>
#include <vector>

#include "support/testing.h"

namespace kiln::testing::idx {

// Calls fn(multi-index) for every element of `shape`, row-major.
inline void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& fn) {
  const int64_t n = shape_numel(shape);
  std::vector<int64_t> ix(shape.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    fn(ix);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++ix[d] < shape[d]) break;
      ix[d] = 0;
    }
  }
}

// Row-major position of a multi-index in `shape`.
inline int64_t flat(const Shape& shape, const std::vector<int64_t>& ix) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + ix[d];
  return f;
}

inline Tensor from_values(const std::vector<double>& v, const Shape& shape) {
  return tensor(v, kFloat64).reshape(shape);
}

// Expects f to throw a kiln::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a kiln::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// A random tensor of `dtype` (fresh normal values; integers from randint).
inline Tensor random_of(const Shape& shape, DType dtype) {
  if (is_floating_point(dtype)) return randn(shape).to(dtype);
  return randint(-50, 50, shape, dtype);
}

}  // namespace kiln::testing::idx
