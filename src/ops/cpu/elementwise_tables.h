#pragma once
// The lookup tables of the SIMD elementwise rows (elementwise_*_simd.cpp), built once on first use
// from float64 references (elementwise_tables.cpp); each depends only on the op.
#include <cstdint>

#include "ops/elementwise_ops.h"

namespace kiln::cpu::simd {
// bf16 gelu, silu, gelu-tanh, log, tanh, sigmoid and erf by table: out[i] = the correctly rounded
// bf16 of op(x[i]) in float64 (x, out: n bf16 bit patterns; out may alias x). False, writing
// nothing, for the ops that keep their vector formula.
bool unary_bf16_by_table(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n);
// f'(x) for every bf16 x (65536 fp32, rounded to odd) of GeluBackward, SiluBackward and
// GeluTanhBackward's f; null for other ops.
const float* derivative_bf16_table(BinaryOp op);
// log2(x) for every bf16 x (65536 fp32; NaN where x <= 0, inf or NaN): bf16 pow.
const float* log2_bf16_table();
// float32 pow's ln x per top 16 bits of x (65536 packed entries; see LnF32Table).
const uint64_t* ln_f32_table();
}  // namespace kiln::cpu::simd
