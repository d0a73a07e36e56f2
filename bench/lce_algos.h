#pragma once
// `bench_lce --variants algos` (CUDA only): cuBLASLt's ranked algorithms for the fused op's
// GEMMs at one shape, each timed alone, and the KILN_GEMM_PICK value that pins the fastest.
#ifdef KILN_WITH_CUDA
#include "kiln/tensor.h"

namespace kiln::bench {

// x: [N, H] bf16/fp16 on CUDA and w: [V, H], both requiring grad (the op's chunks depend on it);
// y: [N] int64.
void cuda_gemm_algos(const Tensor& x, const Tensor& w, const Tensor& y, bool json);

}  // namespace kiln::bench
#endif
