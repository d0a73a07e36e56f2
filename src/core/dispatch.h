#pragma once
// Dtype dispatch: turns a runtime DType into a compile-time element type for a generic lambda,
//   dispatch_floating(t.dtype(), "softmax", [&](auto tag) { using T = typename decltype(tag)::type; ... });
// and the device switch that keeps CPU-only builds linking.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case kFloat32: return f(TypeTag<float>{});
    case kFloat64: return f(TypeTag<double>{});
    case kBFloat16: return f(TypeTag<BFloat16>{});
    case kFloat16: return f(TypeTag<Half>{});
    default: KILN_FAIL(op, "expected a floating-point tensor, got ", dtype_name(dtype));
  }
}

template <typename F>
decltype(auto) dispatch_integral(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case kInt64: return f(TypeTag<int64_t>{});
    case kInt32: return f(TypeTag<int32_t>{});
    case kInt8: return f(TypeTag<int8_t>{});
    case kUInt8: return f(TypeTag<uint8_t>{});
    case kBool: return f(TypeTag<bool>{});
    case kUInt16: return f(TypeTag<uint16_t>{});
    case kUInt32: return f(TypeTag<uint32_t>{});
    default: KILN_FAIL(op, "expected an integer or bool tensor, got ", dtype_name(dtype));
  }
}

template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& f) {
  if (is_floating_point(dtype)) return dispatch_floating(dtype, op, std::forward<F>(f));
  return dispatch_integral(dtype, op, std::forward<F>(f));
}

template <typename F>
decltype(auto) dispatch_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case kInt64: return f(TypeTag<int64_t>{});
    case kInt32: return f(TypeTag<int32_t>{});
    default: KILN_FAIL(op, "expected int64 or int32 indices, got ", dtype_name(dtype));
  }
}

// Converts between element types on the host; 16-bit floats go through float.
template <typename To, typename From>
inline To cast_value(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>) {
    return cast_value<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Compute type for arithmetic on T: fp32 for 16-bit floats, T otherwise.
template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<BFloat16> { using type = float; };
template <> struct acc_type<Half> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

}  // namespace kiln

// In a device switch: runs the CUDA call, or raises when kiln was built without CUDA.
#ifdef KILN_WITH_CUDA
#define KILN_CUDA_ONLY(op, ...) __VA_ARGS__
#else
#define KILN_CUDA_ONLY(op, ...) KILN_FAIL(op, "kiln was built without CUDA")
#endif
