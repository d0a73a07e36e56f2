#pragma once
// Raw CUDA GEMM over device pointers (cuBLASLt underneath), for ops that manage their own buffers:
// matmul/linear here, later the fused linear cross-entropy (logit chunks in fp32) and attention
// references. Plain C++ header: no CUDA includes, so .cpp files can use it.
//
// Everything is ROW-MAJOR, as in kiln tensors (the column-major swap happens inside):
//
//   C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C[m, n]  (+ bias[n] on every row)
//
//   A: trans_a ? stored [k, m] : stored [m, k], row stride lda (>= its column count)
//   B: trans_b ? stored [n, k] : stored [k, n], row stride ldb
//   C: stored [m, n], row stride ldc >= n
//
// Types (ab_type -> c_type), all with fp32 accumulation except fp64:
//   bf16 -> bf16 or fp32;  fp16 -> fp16 or fp32;  fp32 -> fp32;  fp64 -> fp64 (fp64 compute).
// fp32 inputs use exact fp32 (CUBLAS_COMPUTE_32F) unless allow_tf32 is set.
// bias: n elements of c_type (or fp32 when c_type is 16-bit), fused through the cuBLASLt bias
// epilogue where an algorithm supports it, else added by a small kernel before the gemm; the same
// bias applies to every batch matrix.
//
// Batches: `batch` matrices, operand X of matrix p at X + p * stride_x elements; a stride of 0
// reuses one A or B for the whole batch (C's stride must separate the outputs).
//
// Edge cases: m == 0 or n == 0 (or batch == 0) does nothing; k == 0 gives C = beta * C (+ bias).
//
// Cost of a call: the cuBLASLt descriptors and the heuristic's top algorithm are built once per
// (device, shape, leading dims, strides, transposes, types, alignments, epilogue) and cached for
// the process, so repeated calls are a hash lookup plus cublasLtMatmul. One cuBLASLt handle per
// device and one workspace of gemm_workspace_bytes() per (device, stream) are created lazily; the
// workspace comes from kiln's CUDA allocator, so it shows up in memory_allocated.
// cuBLASLt results are bitwise reproducible for a fixed algorithm, which the cache pins.
// Errors (unsupported combination, cuBLASLt failure) throw kiln::Error naming the call.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::cuda {

struct GemmParams {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  DType ab_type = kFloat32;  // A and B share one type
  DType c_type = kFloat32;
  double alpha = 1.0;
  double beta = 0.0;
  const void* bias = nullptr;  // optional, [n]
  DType bias_type = kFloat32;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch matrices
  bool allow_tf32 = false;    // fp32 inputs only: TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
  int device = 0;
  void* stream = nullptr;     // cudaStream_t to run on (nullptr: the legacy default stream);
                              // tensor code passes current_raw_stream(device)
};

void gemm(const GemmParams& p);

// Bytes of cuBLASLt workspace kept per (device, stream): 32 MiB, what Hopper's kernels want.
size_t gemm_workspace_bytes();
// Number of cached plans (all devices): lets tests and benchmarks check that repeated calls reuse one.
size_t gemm_cached_plans();

// Algorithm choice, for measurement (bench_lce --variants algos). cuBLASLt's heuristic ranks the
// algorithms for a problem; gemm() runs its first unless Tuning::gemm.pick (kiln/tuning.h) pins
// another rank for that shape (read when the shape's plan is made; the pinned algorithm then serves
// every call of that shape, so results stay bitwise reproducible).
struct GemmCandidate {
  int rank = 0;            // 0: the heuristic's first choice, what gemm() runs by default
  size_t workspace = 0;    // bytes it needs (at most gemm_workspace_bytes())
  float waves = 0;         // the heuristic's wave count estimate
  std::string config;      // "algo A tile T stages S splitk K reduction R swizzle W custom C cluster L"
};
// Up to max_count candidates for p's problem, best-ranked first (none when m, n, k or batch is 0).
std::vector<GemmCandidate> gemm_candidates(const GemmParams& p, int max_count);
// Tuning::gemm.pick parsed: {m, n, k, trans_a, trans_b} -> rank (a later entry for a shape wins);
// a malformed entry throws kiln::Error naming the variable.
using GemmShape = std::array<int64_t, 5>;
std::map<GemmShape, int> parse_gemm_picks(const std::string& spec);
// p run with the candidate of that rank (throws kiln::Error when there is none, or no product: a
// dimension of 0).
void gemm_with_candidate(const GemmParams& p, int rank);

}  // namespace kiln::cuda
