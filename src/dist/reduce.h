#pragma once
// Host reductions for the Gloo backend: element-wise two-buffer reductions for Gloo's ring
// all-reduce, block reductions for reduce-scatter (after an all-to-all), and the fp32 staging of
// bf16 / fp16, which Gloo cannot reduce. Integers wrap on overflow; MIN / MAX propagate NaN.
#include <cstddef>

#include "kiln/dist.h"

namespace kiln::dist::detail {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Raises kiln::Error("[op] ...") for a dtype / op pair kiln does not reduce (bool; AVG of integers).
void check_reducible(DType dtype, ReduceOp op, const char* opname);
bool reduces_in_float32(DType dtype);  // bf16, fp16
// out[i] = a[i] op b[i] over a native dtype (float32, float64, int32, int64, int8, uint8); AVG sums.
ReduceFn reduce_fn(DType dtype, ReduceOp op);
// out[i] = in[0 * n + i] op in[1 * n + i] op ... over `blocks` blocks, accumulating bf16 / fp16 in
// fp32; AVG divides by blocks. out may not alias in.
void reduce_blocks(void* out, const void* in, size_t blocks, size_t n, DType dtype, ReduceOp op);
void to_float32(const void* src, float* dst, size_t n, DType dtype);   // bf16 / fp16 -> fp32
void from_float32(const float* src, void* dst, size_t n, DType dtype);  // fp32 -> bf16 / fp16
// p[i] /= divisor over a floating dtype (AVG after a sum).
void divide(void* p, size_t n, DType dtype, double divisor);

}  // namespace kiln::dist::detail
