#pragma once
// Element types. bf16 and fp16 are stored as 16-bit patterns; arithmetic converts to fp32.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>

namespace kiln {

// UInt16 and UInt32 come last so the older codes (saved by value in files and DLPack tables) keep
// their numbers.
enum class DType : uint8_t { Float32, Float64, BFloat16, Float16, Int64, Int32, Int8, UInt8, Bool, UInt16, UInt32 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt8 = DType::Int8;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt16 = DType::UInt16;
inline constexpr DType kUInt32 = DType::UInt32;

size_t element_size(DType dtype);
const char* dtype_name(DType dtype);  // PyTorch's spelling: "float32", "bfloat16", ...
bool is_floating_point(DType dtype);
bool is_low_precision(DType dtype);  // bf16 or fp16
// The type two operands meet in (PyTorch's promotion for tensor-tensor operands).
DType promote_types(DType a, DType b);
std::ostream& operator<<(std::ostream& os, DType dtype);

// bfloat16: the upper half of an IEEE float32; conversion rounds to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like the float it wraps
  operator float() const {                    // NOLINT
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

// IEEE binary16; conversion rounds to nearest even, handles subnormals, inf and NaN.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const { return to_float(bits); }  // NOLINT
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = kFloat32; };
template <> struct dtype_of<double> { static constexpr DType value = kFloat64; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = kBFloat16; };
template <> struct dtype_of<Half> { static constexpr DType value = kFloat16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = kInt64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = kInt32; };
template <> struct dtype_of<int8_t> { static constexpr DType value = kInt8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = kUInt8; };
template <> struct dtype_of<bool> { static constexpr DType value = kBool; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = kUInt16; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = kUInt32; };

}  // namespace kiln
