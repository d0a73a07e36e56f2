#include "dist/reduce.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace kiln::dist::detail {

namespace {

// Integer arithmetic in the unsigned type: wraps like torch instead of being undefined.
template <typename T> T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T> T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}
template <typename T> bool is_nan(T a) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(a);
  return false;
}
template <typename T> T min_of(T a, T b) { return (is_nan(a) || a < b) ? a : b; }
template <typename T> T max_of(T a, T b) { return (is_nan(a) || a > b) ? a : b; }

template <typename T> T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::MIN: return min_of(a, b);
    case ReduceOp::MAX: return max_of(a, b);
    case ReduceOp::PRODUCT: return mul(a, b);
    default: return add(a, b);
  }
}

// One loop per (type, op), so the compiler vectorises each without a branch inside.
template <typename T, ReduceOp Op> void binary(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = apply(Op, x[i], y[i]);
}

template <typename T> ReduceFn fn_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::MIN: return &binary<T, ReduceOp::MIN>;
    case ReduceOp::MAX: return &binary<T, ReduceOp::MAX>;
    case ReduceOp::PRODUCT: return &binary<T, ReduceOp::PRODUCT>;
    default: return &binary<T, ReduceOp::SUM>;
  }
}

// Accumulates blocks in Acc (fp32 for the 16-bit floats), converting once at the end.
template <typename T, typename Acc> void blocks_typed(void* out, const void* in, size_t blocks, size_t n, ReduceOp op) {
  const T* src = static_cast<const T*>(in);
  T* dst = static_cast<T*>(out);
  std::vector<Acc> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = static_cast<Acc>(src[i]);
  for (size_t b = 1; b < blocks; ++b) {
    const T* blk = src + b * n;
    for (size_t i = 0; i < n; ++i) acc[i] = apply(op, acc[i], static_cast<Acc>(blk[i]));
  }
  if (op == ReduceOp::AVG)
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<Acc>(acc[i] / static_cast<Acc>(blocks));
  for (size_t i = 0; i < n; ++i) dst[i] = T(acc[i]);
}

}  // namespace

void check_reducible(DType dtype, ReduceOp op, const char* opname) {
  switch (dtype) {
    case kFloat32: case kFloat64: case kBFloat16: case kFloat16:
      return;
    case kInt32: case kInt64: case kInt8: case kUInt8:
      KILN_CHECK(op != ReduceOp::AVG, opname, "AVG needs a floating-point tensor, got ", dtype_name(dtype));
      return;
    default:
      KILN_FAIL(opname, "cannot reduce a ", dtype_name(dtype), " tensor");
  }
}

bool reduces_in_float32(DType dtype) { return dtype == kBFloat16 || dtype == kFloat16; }

ReduceFn reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case kFloat32: return fn_for<float>(op);
    case kFloat64: return fn_for<double>(op);
    case kInt32: return fn_for<int32_t>(op);
    case kInt64: return fn_for<int64_t>(op);
    case kInt8: return fn_for<int8_t>(op);
    case kUInt8: return fn_for<uint8_t>(op);
    default: KILN_FAIL("all_reduce", "no native reduction for ", dtype_name(dtype));
  }
}

void reduce_blocks(void* out, const void* in, size_t blocks, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case kFloat32: return blocks_typed<float, float>(out, in, blocks, n, op);
    case kFloat64: return blocks_typed<double, double>(out, in, blocks, n, op);
    case kBFloat16: return blocks_typed<BFloat16, float>(out, in, blocks, n, op);
    case kFloat16: return blocks_typed<Half, float>(out, in, blocks, n, op);
    case kInt32: return blocks_typed<int32_t, int32_t>(out, in, blocks, n, op);
    case kInt64: return blocks_typed<int64_t, int64_t>(out, in, blocks, n, op);
    case kInt8: return blocks_typed<int8_t, int8_t>(out, in, blocks, n, op);
    case kUInt8: return blocks_typed<uint8_t, uint8_t>(out, in, blocks, n, op);
    default: KILN_FAIL("reduce_scatter_single", "cannot reduce a ", dtype_name(dtype), " tensor");
  }
}

void to_float32(const void* src, float* dst, size_t n, DType dtype) {
  if (dtype == kBFloat16) {
    const auto* s = static_cast<const BFloat16*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = s[i];
  } else {
    const auto* s = static_cast<const Half*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = s[i];
  }
}

void from_float32(const float* src, void* dst, size_t n, DType dtype) {
  if (dtype == kBFloat16) {
    auto* d = static_cast<BFloat16*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = BFloat16(src[i]);
  } else {
    auto* d = static_cast<Half*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = Half(src[i]);
  }
}

void divide(void* p, size_t n, DType dtype, double divisor) {
  if (dtype == kFloat64) {
    auto* d = static_cast<double*>(p);
    for (size_t i = 0; i < n; ++i) d[i] /= divisor;
  } else if (dtype == kFloat32) {
    auto* d = static_cast<float*>(p);
    const auto q = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) d[i] /= q;
  } else {
    KILN_FAIL("all_reduce", "AVG divides float32 / float64 buffers only, got ", dtype_name(dtype));
  }
}

}  // namespace kiln::dist::detail
