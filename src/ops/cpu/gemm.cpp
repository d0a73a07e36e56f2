// CPU GEMM: row-major wrappers over OpenBLAS cblas_sgemm/dgemm that validate sizes, normalise
// leading dims of single-row operands (BLAS insists ld >= cols even when unused), handle k == 0
// themselves, and split C (and batches) into fixed tiles run over OpenMP threads, each tile one
// single-threaded OpenBLAS call, so results do not depend on the thread count.
#include "ops/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "core/cpu/parallel.h"
#include "kiln/error.h"

namespace kiln::cpu {
namespace {

// kiln owns the CPU threads: OpenBLAS runs single-threaded and C is cut into fixed tiles run over
// OpenMP. OpenBLAS's own threading changes its summation order with the thread count (measured:
// 1 vs 2 threads differ bitwise), while a tiling that depends only on the shape gives identical
// bits for any thread count. 256x512 tiles keep the repacking of A and B panels per tile at a
// few percent of the flops and still give 32+ tasks for a 2048^3 product.
constexpr int64_t kTileM = 256;
constexpr int64_t kTileN = 512;
// Small products (a [512, 64] x [64, 192] linear) take shorter row tiles of about kTileWork
// multiply-adds, so they still split over threads. At least 64 rows: every tile repacks B, and
// tiles of 2^20 multiply-adds and 32 rows took 6 % more CPU time in kiln train's tiny-bench step
// (1 thread) than these, for the same tokens/s on 2 threads.
constexpr int64_t kTileWork = int64_t{3} << 19;
constexpr int64_t kMinTileM = 64;

int64_t tile_rows(int64_t n, int64_t k) {
  const int64_t per_row = std::max<int64_t>(1, std::min(n, kTileN) * k);
  const int64_t rows = (kTileWork / per_row + kMinTileM - 1) / kMinTileM * kMinTileM;
  return std::clamp(rows, kMinTileM, kTileM);
}

// Checked on every call (a cheap read) because anything else in the process may raise it again.
void single_threaded_blas() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

blasint to_blasint(int64_t v, const char* what) {
  KILN_CHECK(v >= 0 && v <= INT_MAX, "gemm", what, " = ", v, " does not fit OpenBLAS's 32-bit integers");
  return static_cast<blasint>(v);
}

// A stored [rows, cols] row-major matrix with row stride ld: BLAS wants ld >= max(1, cols),
// which a single row does not need, so such a row gets a legal ld.
int64_t fix_ld(int64_t rows, int64_t cols, int64_t ld, const char* what) {
  if (rows <= 1) return std::max<int64_t>({ld, cols, 1});
  KILN_CHECK(ld >= std::max<int64_t>(cols, 1), "gemm", what, " = ", ld, " is smaller than the row length ", cols);
  return ld;
}

template <typename T>
void scale_rows(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
}

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, float alpha, const float* a,
          blasint lda, const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, double alpha, const double* a,
          blasint lda, const double* b, blasint ldb, double beta, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

struct Problem {
  CBLAS_TRANSPOSE ta, tb;
  blasint m, n, k, lda, ldb, ldc;
};

// Validates once for a whole batch; returns false when there is nothing for BLAS to do.
bool prepare(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
             Problem& p) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm", "negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0 || k == 0) return false;
  p.ta = trans_a ? CblasTrans : CblasNoTrans;
  p.tb = trans_b ? CblasTrans : CblasNoTrans;
  p.m = to_blasint(m, "m");
  p.n = to_blasint(n, "n");
  p.k = to_blasint(k, "k");
  p.lda = to_blasint(trans_a ? fix_ld(k, m, lda, "lda") : fix_ld(m, k, lda, "lda"), "lda");
  p.ldb = to_blasint(trans_b ? fix_ld(n, k, ldb, "ldb") : fix_ld(k, n, ldb, "ldb"), "ldb");
  p.ldc = to_blasint(fix_ld(m, n, ldc, "ldc"), "ldc");
  return true;
}

template <typename T>
void gemm_batched_impl(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha,
                       const T* a, int64_t lda, int64_t sa, const T* b, int64_t ldb, int64_t sb, T beta, T* c,
                       int64_t ldc, int64_t sc) {
  if (batch <= 0 || m == 0 || n == 0) return;
  Problem prob{};
  if (!prepare(trans_a, trans_b, m, n, k, lda, ldb, ldc, prob)) {  // k == 0: C = beta * C
    for (int64_t i = 0; i < batch; ++i) scale_rows(m, n, beta, c + i * sc, ldc);
    return;
  }
  single_threaded_blas();
  const int64_t tile_m = tile_rows(n, k);
  const int64_t tm = (m + tile_m - 1) / tile_m, tn = (n + kTileN - 1) / kTileN, tasks = batch * tm * tn;
  const int nt = tasks > 1 ? static_cast<int>(std::min<int64_t>(threads_for(batch * m * n * k, grains().gemm_grain), tasks)) : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t p = t / (tm * tn), i0 = (t % (tm * tn)) / tn * tile_m, j0 = t % tn * kTileN;
    const auto mi = static_cast<blasint>(std::min(tile_m, m - i0)), nj = static_cast<blasint>(std::min(kTileN, n - j0));
    const T* ap = a + p * sa + (trans_a ? i0 : i0 * prob.lda);  // rows i0.. of op(A)
    const T* bp = b + p * sb + (trans_b ? j0 * prob.ldb : j0);  // columns j0.. of op(B)
    T* cp = c + p * sc + i0 * prob.ldc + j0;
    blas(prob.ta, prob.tb, mi, nj, prob.k, alpha, ap, prob.lda, bp, prob.ldb, beta, cp, prob.ldc);
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_batched_impl(trans_a, trans_b, 1, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0);
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_batched_impl(trans_a, trans_b, 1, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0);
}
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                  float beta, float* c, int64_t ldc, int64_t stride_c) {
  gemm_batched_impl(trans_a, trans_b, batch, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                    stride_c);
}
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, int64_t stride_a, const double* b, int64_t ldb, int64_t stride_b,
                  double beta, double* c, int64_t ldc, int64_t stride_c) {
  gemm_batched_impl(trans_a, trans_b, batch, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                    stride_c);
}

}  // namespace kiln::cpu
