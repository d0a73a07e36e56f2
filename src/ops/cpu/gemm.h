#pragma once
// Raw CPU GEMM over host pointers (OpenBLAS underneath), for ops that manage their own buffers
// (matmul, fused linear cross-entropy, attention references). Everything is ROW-MAJOR, as in
// kiln tensors:
//
//   C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C[m, n]
//
//   A: trans_a ? stored [k, m] : stored [m, k], row stride lda (>= its column count)
//   B: trans_b ? stored [n, k] : stored [k, n], row stride ldb
//   C: stored [m, n], row stride ldc >= n
//
// k == 0 gives C = beta * C (beta == 0 writes zeros even over NaN garbage). m == 0 or n == 0 is a
// no-op. Sizes and leading dims must fit in 32 bits (OpenBLAS's blasint); larger throws.
// Threads: C is cut into fixed tiles (per batch matrix; 256x512, fewer rows for small products, the
// sizes a function of the shape alone) run over OpenMP, each tile one single-threaded OpenBLAS call,
// so results are bitwise identical for any thread count. Each call
// sets OpenBLAS's own thread count back to 1 if something raised it: kiln owns the CPU threads.
#include <cstdint>

namespace kiln::cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// The same problem `batch` times, operand i of matrix p at base + p * stride (stride may be 0 to
// reuse one matrix). The batch and the tiles share one OpenMP loop.
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                  float beta, float* c, int64_t ldc, int64_t stride_c);
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, int64_t stride_a, const double* b, int64_t ldb, int64_t stride_b,
                  double beta, double* c, int64_t ldc, int64_t stride_c);

}  // namespace kiln::cpu
