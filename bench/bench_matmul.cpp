// bench_matmul: kiln::mm against the GEMM library called directly, so the number that matters is
// the ratio (kiln's overhead: validation, output allocation, plan lookup).
//
//   CUDA (bf16 in/out, fp32 accumulation): kiln::mm vs. cuBLASLt alone (own handle, descriptors
//   and the heuristic's top algorithm with the same 32 MiB workspace, built outside the timed
//   loop), plus kiln's raw cuda::gemm entry point. Timed with cuda::Event around `iters` calls.
//   CPU (fp32): kiln::mm (fixed tiles over OpenMP, single-threaded OpenBLAS per tile: deterministic)
//   vs. cblas_sgemm with OpenBLAS's own threads into a preallocated output, timed with steady_clock.
//
// Each case: warmup, then `repeats` timed batches; the median batch time / iters is reported.
// Output: one JSON line per case,
//   {"bench":"matmul","device":...,"shape":[M,N,K],"layout":"nn"|"nt","dtype":...,
//    "kiln_ms":...,"cublaslt_ms":...(CUDA) | "cblas_ms":...(CPU),"ratio":kiln/library,"tflops":...}
// where "nt" means b is a transposed view (x @ W^T, the LM-head layout).
// After the JSON lines: a blank line and a plain table of the same figures (lib_ms = the library alone).
// Usage: bench_matmul [cpu|cuda|auto] [repeats]   (auto: cuda when available, else cpu)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

#ifdef KILN_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "ops/cuda/gemm.h"
#endif

namespace {

struct Case {
  int64_t m, n, k;
  bool b_transposed;  // b is W^T for W [n, k]
};

std::vector<std::string> g_table;  // human-readable rows, printed after a blank line at the end

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print(const char* device, const Case& c, const char* dtype, double kiln_ms, const char* lib_key, double lib_ms,
           const std::string& extra) {
  const double tflops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) /
                        (kiln_ms * 1e-3) / 1e12;
  std::printf(
      "{\"bench\":\"matmul\",\"device\":\"%s\",\"shape\":[%lld,%lld,%lld],\"layout\":\"%s\",\"dtype\":\"%s\","
      "\"kiln_ms\":%.4f,\"%s\":%.4f,\"ratio\":%.4f,\"tflops\":%.2f%s}\n",
      device, static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
      c.b_transposed ? "nt" : "nn", dtype, kiln_ms, lib_key, lib_ms, kiln_ms / lib_ms, tflops, extra.c_str());
  std::fflush(stdout);
  char row[256];
  std::snprintf(row, sizeof(row), "%-5s %6lld %6lld %6lld  %s  %-8s %10.3f %10.3f %7.3f %8.2f", device,
                static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
                c.b_transposed ? "nt" : "nn", dtype, kiln_ms, lib_ms, kiln_ms / lib_ms, tflops);
  g_table.emplace_back(row);
}

// ---- CPU ----

// Alternates the candidates inside each repeat so machine noise hits them alike; returns medians.
std::vector<double> time_cpu(const std::vector<std::function<void()>>& fs, int repeats) {
  for (const auto& f : fs) f(), f();
  std::vector<std::vector<double>> ms(fs.size());
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < fs.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[i]();
      const auto t1 = std::chrono::steady_clock::now();
      ms[i].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  std::vector<double> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

void bench_cpu(int repeats) {
  const int threads = omp_get_max_threads();
  const std::vector<Case> cases = {{1024, 1024, 1024, false}, {2048, 2048, 2048, false}, {2048, 8192, 1024, true}};
  for (const Case& c : cases) {
    const kiln::Tensor a = kiln::randn({c.m, c.k});
    const kiln::Tensor w = c.b_transposed ? kiln::randn({c.n, c.k}) : kiln::randn({c.k, c.n});
    const kiln::Tensor b = c.b_transposed ? w.t() : w;
    std::vector<float> out(static_cast<size_t>(c.m * c.n));
    const std::vector<double> t = time_cpu(
        {[&] { kiln::mm(a, b); },
         [&] {
           openblas_set_num_threads(threads);  // OpenBLAS with its own threads (kiln turns them off)
           cblas_sgemm(CblasRowMajor, CblasNoTrans, c.b_transposed ? CblasTrans : CblasNoTrans, static_cast<int>(c.m),
                       static_cast<int>(c.n), static_cast<int>(c.k), 1.0f, a.data_ptr<float>(), static_cast<int>(c.k),
                       w.data_ptr<float>(), static_cast<int>(c.b_transposed ? c.k : c.n), 0.0f, out.data(),
                       static_cast<int>(c.n));
         }},
        repeats);
    const double kiln_ms = t[0], blas_ms = t[1];
    print("cpu", c, "float32", kiln_ms, "cblas_ms", blas_ms, "");
  }
}

// ---- CUDA ----

#ifdef KILN_WITH_CUDA
#define BENCH_CHECK(call)                                                                           \
  do {                                                                                              \
    auto bench_status_ = (call);                                                                    \
    if (static_cast<int>(bench_status_) != 0) {                                                     \
      std::fprintf(stderr, "%s failed with status %d (%s:%d)\n", #call, static_cast<int>(bench_status_), \
                   __FILE__, __LINE__);                                                             \
      throw kiln::Error("bench_matmul: library call failed");                                       \
    }                                                                                               \
  } while (0)

// Alternates the candidates inside each repeat (each timed over `iters` back-to-back calls with
// cuda::Event) so clock and thermal drift hit them alike; returns per-call medians.
std::vector<double> time_cuda(const std::vector<std::function<void()>>& fs, int repeats, int iters) {
  for (const auto& f : fs)
    for (int i = 0; i < 3; ++i) f();
  kiln::cuda::Event start, stop;
  std::vector<std::vector<double>> ms(fs.size());
  for (int r = 0; r < repeats; ++r)
    for (size_t j = 0; j < fs.size(); ++j) {
      start.record();
      for (int i = 0; i < iters; ++i) fs[j]();
      stop.record();
      stop.synchronize();
      ms[j].push_back(static_cast<double>(start.elapsed_ms(stop)) / iters);
    }
  std::vector<double> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

// cuBLASLt alone: row-major C[m,n] = A[m,k] @ B issued as column-major C^T = B^T A^T, with the
// heuristic's top algorithm for a 32 MiB workspace, everything built before timing.
struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
  float alpha = 1.0f, beta = 0.0f;

  explicit LtGemm(const Case& c) {
    BENCH_CHECK(cublasLtCreate(&handle));
    BENCH_CHECK(cudaMalloc(&workspace, workspace_bytes));
    BENCH_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = c.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    BENCH_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    BENCH_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major: B (our b) is [n, k] (or stored W [n, k] -> [k, n] with op T); A^T is [k, m].
    BENCH_CHECK(c.b_transposed ? cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.k, c.n, c.k)
                               : cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.n, c.k, c.n));
    BENCH_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c.k, c.m, c.k));
    BENCH_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, c.n, c.m, c.n));
    cublasLtMatmulPreference_t pref = nullptr;
    BENCH_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    BENCH_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    BENCH_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result, &found));
    BENCH_CHECK(found == 1 ? 0 : 1);
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(const void* a, const void* w, void* out, cudaStream_t stream) {
    BENCH_CHECK(cublasLtMatmul(handle, desc, &alpha, w, la, a, lb, &beta, out, lc, out, lc, &algo, workspace,
                               workspace_bytes, stream));
  }
};

void bench_cuda(int repeats) {
  const std::vector<Case> cases = {
      {4096, 4096, 4096, false}, {8192, 8192, 8192, false}, {8192, 8192, 2048, false}, {8192, 32000, 4096, true}};
  const kiln::Device dev("cuda");
  const auto stream = static_cast<cudaStream_t>(kiln::cuda::current_stream(0).handle());
  for (const Case& c : cases) {
    const kiln::Tensor a = kiln::randn({c.m, c.k}, kiln::TensorOptions(kiln::kBFloat16).device(dev));
    const kiln::Tensor w = kiln::randn(c.b_transposed ? kiln::Shape{c.n, c.k} : kiln::Shape{c.k, c.n},
                                       kiln::TensorOptions(kiln::kBFloat16).device(dev));
    const kiln::Tensor b = c.b_transposed ? w.t() : w;
    kiln::Tensor out = kiln::empty({c.m, c.n}, kiln::TensorOptions(kiln::kBFloat16).device(dev));
    const int iters = 5;
    LtGemm lt(c);
    kiln::cuda::GemmParams p;
    p.trans_b = c.b_transposed;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.a = a.data_ptr();
    p.lda = c.k;
    p.b = w.data_ptr();
    p.ldb = c.b_transposed ? c.k : c.n;
    p.c = out.data_ptr();
    p.ldc = c.n;
    p.ab_type = p.c_type = kiln::kBFloat16;
    p.stream = stream;
    const std::vector<double> t =
        time_cuda({[&] { kiln::mm(a, b); }, [&] { lt.run(a.data_ptr(), w.data_ptr(), out.data_ptr(), stream); },
                   [&] { kiln::cuda::gemm(p); }},
                  repeats, iters);
    const double kiln_ms = t[0], lt_ms = t[1], raw_ms = t[2];
    print("cuda", c, "bf16", kiln_ms, "cublaslt_ms", lt_ms, ",\"raw_gemm_ms\":" + std::to_string(raw_ms));
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "auto";
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 0;
  try {
    const bool cuda = mode == "cuda" || (mode == "auto" && kiln::cuda_is_available());
    if (cuda) {
#ifdef KILN_WITH_CUDA
      bench_cuda(repeats > 0 ? repeats : 20);
#else
      std::fprintf(stderr, "bench_matmul: kiln was built without CUDA\n");
      return 1;
#endif
    } else {
      bench_cpu(repeats > 0 ? repeats : 5);
    }
    std::printf("\n%-5s %6s %6s %6s  %s  %-8s %10s %10s %7s %8s\n", "dev", "M", "N", "K", "ly", "dtype", "kiln_ms",
                "lib_ms", "ratio", "TFLOP/s");
    for (const std::string& row : g_table) std::printf("%s\n", row.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matmul: %s\n", e.what());
    return 1;
  }
  return 0;
}
