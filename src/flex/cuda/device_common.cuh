#pragma once
// What every FlexAttention device compile starts with, before the generated mod functions: the short
// integer types, the argument block (flex_params.cuh, checked against the host's size when the
// generated source defines KILN_PARAMS_SIZE) and the helpers the mods call (floor division and modulo
// in 64 and 32 bits, tanh on the SFU, the exact small int -> float). Reads and writes nothing.

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#include "flex/cuda/flex_params.cuh"
#ifdef KILN_PARAMS_SIZE  // the generated source's: the host's sizeof(FlexParams)
static_assert(sizeof(FlexParams) == KILN_PARAMS_SIZE, "host and device FlexParams differ");
#endif

__device__ __forceinline__ i64 kiln_floordiv(i64 x, i64 y) {
  if (y == 0) return 0;
  i64 q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
__device__ __forceinline__ i64 kiln_floormod(i64 x, i64 y) { return y == 0 ? 0 : x - kiln_floordiv(x, y) * y; }
// The narrow-int locals' (never INT32_MIN, so neither x / y nor x % y overflows). The remainder is
// corrected rather than x - q * y, whose product can leave 32 bits when the result does not.
__device__ __forceinline__ int kiln_floordiv(int x, int y) {
  if (y == 0) return 0;
  int q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
__device__ __forceinline__ int kiln_floormod(int x, int y) {
  if (y == 0) return 0;
  const int r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
// float -> int toward zero, NaN -> 0, clamped to +-2^62: the CPU's float_to_int (flex/ir.h).
__device__ __forceinline__ long long kiln_f2i(float x) {
  if (x != x) return 0;
  const float lim = 4611686018427387904.0f;
  return (long long)(x < -lim ? -lim : (x > lim ? lim : x));
}
// tanh on the SFU (sm_75+): max relative error ~2^-11, under bf16 / fp16 resolution; tanhf is a
// polynomial or an exp and a reciprocal, with a branch between them.
__device__ __forceinline__ float kiln_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// int -> float for |x| <= 2^22, exact: x added into the mantissa of 1.5 * 2^23, which is then
// subtracted. Two full-rate adds instead of I2F, a conversion issued at a fraction of the FMA rate
// (ALiBi's (float)(kv - q) on every element, beside the softmax's ex2).
__device__ __forceinline__ float kiln_i2f(int x) { return __int_as_float(0x4B400000 + x) - 12582912.0f; }
