#pragma once
// Highway SIMD rows for the hot elementwise ops on dense fp32 and bf16 data (bf16 is widened to
// fp32, computed, and rounded to nearest even like kiln::BFloat16). Each returns false when the
// op has no SIMD row, and the caller falls back to the scalar loop.
#include <cstdint>

#include "ops/elementwise_ops.h"

namespace kiln::cpu::simd {
bool has_binary(BinaryOp op);
bool has_unary(UnaryOp op);
// out[i] = op(a[i], b[i]); b_scalar: b is one value broadcast (b[0]).
void binary_f32(BinaryOp op, const float* a, const float* b, bool b_scalar, float* out, int64_t n, float alpha,
                float lo, float hi);
void binary_bf16(BinaryOp op, const uint16_t* a, const uint16_t* b, bool b_scalar, uint16_t* out, int64_t n,
                 float alpha, float lo, float hi);
void unary_f32(UnaryOp op, const float* x, float* out, int64_t n, float lo, float hi);
void unary_bf16(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n, float lo, float hi);
}  // namespace kiln::cpu::simd
