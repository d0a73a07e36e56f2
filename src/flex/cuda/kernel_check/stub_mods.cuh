#pragma once
// The mod functions codegen.cpp generates, written out for the build-time check of the kernels
// (flex.cu): a causal mask_mod, the identity score_mod and its gradient, and the causal mask's runs
// (MASK_RANGES: a row keeps kv <= q, a column q >= kv). Their signatures are the generated ones, so a
// kernel that calls a mod with other arguments fails here as it would under NVRTC.
__device__ __forceinline__ bool mask_mod(long long b, long long h, long long q, long long kv, const FlexParams& P) {
  return q >= kv;
}

__device__ __forceinline__ float score_mod(float score, long long b, long long h, long long q, long long kv,
                                           const FlexParams& P) {
  return score;
}

__device__ __forceinline__ float score_grad(float score, long long b, long long h, long long q, long long kv, float g,
                                            const FlexParams& P, double* slot) {
  return g;
}

#if MASK_RANGES
__device__ __forceinline__ void mask_kv_range(long long b, long long h, long long q, long long kv, const FlexParams& P,
                                              long long* lo, long long* hi) {
  *lo = -(1LL << 62);
  *hi = q;
}

__device__ __forceinline__ void mask_q_range(long long b, long long h, long long q, long long kv, const FlexParams& P,
                                             long long* lo, long long* hi) {
  *lo = kv;
  *hi = 1LL << 62;
}
#endif
