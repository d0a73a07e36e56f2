#pragma once
// Dense fp32 <-> bf16 rows (Highway, core/cpu/convert_simd.cpp), bit-identical to BFloat16's
// scalar conversions: round to nearest even, NaN stays NaN (quiet). bf16 is passed as its bits.
#include <cstdint>

namespace kiln::cpu {

void convert_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, int64_t n);

}  // namespace kiln::cpu
