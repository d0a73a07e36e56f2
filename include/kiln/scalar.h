#pragma once
// A number operand of an op (a Python int / float / bool, or a C++ arithmetic value). Its kind,
// not its value, takes part in type promotion, as a Python number does in PyTorch: a scalar of a
// higher category (bool < integer < floating) than the tensor gives that category's default dtype
// (int64, float32), otherwise the tensor's dtype stays (int32 tensor * 2 -> int32, bf16 * 0.5 -> bf16,
// int64 * 0.1 -> float32).
#include <cstdint>
#include <type_traits>

#include "kiln/dtype.h"

namespace kiln {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Integer, Floating };

  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T v) {  // NOLINT: implicit, as the number it wraps
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::Bool;
      i_ = v ? 1 : 0;
    } else if constexpr (std::is_integral_v<T>) {
      kind_ = Kind::Integer;
      i_ = static_cast<int64_t>(v);
    } else {
      kind_ = Kind::Floating;
      d_ = static_cast<double>(v);
    }
  }

  Kind kind() const { return kind_; }
  bool is_floating_point() const { return kind_ == Kind::Floating; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  double to_double() const { return kind_ == Kind::Floating ? d_ : static_cast<double>(i_); }
  // The default dtype of its kind: bool, int64 or float32 (what torch.tensor(v) would give).
  DType default_dtype() const {
    return kind_ == Kind::Bool ? kBool : (kind_ == Kind::Integer ? kInt64 : kFloat32);
  }

 private:
  Kind kind_ = Kind::Floating;
  int64_t i_ = 0;
  double d_ = 0.0;
};

}  // namespace kiln
