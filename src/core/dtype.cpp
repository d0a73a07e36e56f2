#include "kiln/dtype.h"

#include "kiln/error.h"

namespace kiln {

size_t element_size(DType dtype) {
  switch (dtype) {
    case kFloat64: case kInt64: return 8;
    case kFloat32: case kInt32: case kUInt32: return 4;
    case kBFloat16: case kFloat16: case kUInt16: return 2;
    case kInt8: case kUInt8: case kBool: return 1;
  }
  KILN_FAIL("dtype", "unknown dtype ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kBFloat16: return "bfloat16";
    case kFloat16: return "float16";
    case kInt64: return "int64";
    case kInt32: return "int32";
    case kInt8: return "int8";
    case kUInt8: return "uint8";
    case kBool: return "bool";
    case kUInt16: return "uint16";
    case kUInt32: return "uint32";
  }
  return "unknown";
}

bool is_floating_point(DType d) { return d == kFloat32 || d == kFloat64 || d == kBFloat16 || d == kFloat16; }
bool is_low_precision(DType d) { return d == kBFloat16 || d == kFloat16; }

namespace {
// uint16 / uint32 with another integer type (PyTorch refuses these pairs): the smallest type that
// holds both ranges, as NumPy does (uint16 + int8 -> int32, uint32 + int32 -> int64).
DType promote_wide_unsigned(DType a, DType b) {
  auto bits = [](DType d) { return static_cast<int>(element_size(d)) * 8; };
  auto is_unsigned = [](DType d) { return d == kUInt8 || d == kUInt16 || d == kUInt32; };
  if (is_unsigned(a) && is_unsigned(b)) return bits(a) >= bits(b) ? a : b;
  const DType u = is_unsigned(a) ? a : b, s = is_unsigned(a) ? b : a;
  if (bits(s) > bits(u)) return s;
  return bits(u) >= 32 ? kInt64 : kInt32;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating_point(a), fb = is_floating_point(b);
  if (fa != fb) return fa ? a : b;  // float beats integer and bool
  if (fa) {
    if (a == kFloat64 || b == kFloat64) return kFloat64;
    return kFloat32;  // f32 with a 16-bit type, or bf16 with f16
  }
  if (a == kBool) return b;
  if (b == kBool) return a;
  if (a == kUInt16 || a == kUInt32 || b == kUInt16 || b == kUInt32) return promote_wide_unsigned(a, b);
  auto rank = [](DType d) { return d == kUInt8 ? 0 : d == kInt8 ? 1 : d == kInt32 ? 2 : 3; };
  if ((a == kUInt8 && b == kInt8) || (a == kInt8 && b == kUInt8)) return kInt32;  // torch: int16
  return rank(a) > rank(b) ? a : b;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

uint16_t Half::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal (or zero): round abs * 2^24 to an integer
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact
    // round half to even via the float adder
    const float rounded = (scaled + 12582912.0f) - 12582912.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rounded));
  }
  // normal: re-bias exponent and round mantissa 23 -> 10 bits, ties to even
  uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((mant_round - 0x38000000u) >> 13));
}

float Half::to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
    std::memcpy(&out, &f, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace kiln
