#pragma once
// Highway kernels over one contiguous run, dispatched at run time to the best SIMD target
// (SSE4/AVX2/AVX-512 on x86, NEON/SVE on Arm). 16-bit inputs are widened to fp32; every lane
// order is fixed, so results depend only on the input and the CPU's SIMD target.
#include <cstdint>

#include "kiln/dtype.h"

namespace kiln::cpu::simd {

#define KILN_SIMD_DECLARE(T, A)                                                          \
  A sum(const T* p, int64_t n);                                                          \
  A max(const T* p, int64_t n); /* NaN if any element is NaN */                          \
  A min(const T* p, int64_t n);                                                          \
  /* m = max(p) (NaN-propagating); s = sum exp(p - m) when m is finite */                \
  void max_sumexp(const T* p, int64_t n, A* m, A* s);                                    \
  /* y = softmax(x) or log_softmax(x) of one row */                                      \
  void softmax_row(const T* x, T* y, int64_t n, bool log);                               \
  /* gx = y * (g - sum(g * y)), or for log: g - exp(y) * sum(g) */                       \
  void softmax_backward_row(const T* y, const T* g, T* gx, int64_t n, bool log);

KILN_SIMD_DECLARE(float, float)
KILN_SIMD_DECLARE(double, double)
KILN_SIMD_DECLARE(BFloat16, float)
KILN_SIMD_DECLARE(Half, float)
#undef KILN_SIMD_DECLARE

}  // namespace kiln::cpu::simd
