// cuda::gemm over cuBLASLt. kiln is row-major and cuBLASLt column-major, so a row-major
// C[m,n] = op(A) op(B) is issued as the column-major C^T[n,m] = op(B)^T op(A)^T: the operands
// swap places, their transpose flags carry over, and the memory is never touched. Each distinct
// problem gets a Plan (descriptors + the heuristic's top algorithm) built once and cached, so the
// steady-state cost of a call is one hash lookup and cublasLtMatmul.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/tuning.h"
#include "core/cuda/check.h"
#include "core/storage.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/gemm.h"
#include "kiln/tuning.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case kFloat32: return CUDA_R_32F;
    case kFloat64: return CUDA_R_64F;
    case kBFloat16: return CUDA_R_16BF;
    case kFloat16: return CUDA_R_16F;
    default: KILN_FAIL("gemm", "unsupported dtype ", dtype_name(t), " (expected float32/float64/bfloat16/float16)");
  }
}

// Largest power of two (<= 256, cuBLASLt's default requirement) dividing every matrix start.
uint32_t alignment(const void* ptr, int64_t stride_elems, int64_t batch, size_t elem) {
  uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
  if (batch > 1) v |= static_cast<uintptr_t>(stride_elems) * elem;
  uint32_t a = 1;
  while (a < 256 && v % (2 * a) == 0) a *= 2;
  return a;
}

// A stored [rows, cols] row-major matrix is column-major [cols, rows]: cuBLASLt wants its
// ld >= cols, which a single row does not need.
int64_t fix_ld(int64_t rows, int64_t cols, int64_t ld, const char* what) {
  if (rows <= 1) return std::max<int64_t>({ld, cols, 1});
  KILN_CHECK(ld >= std::max<int64_t>(cols, 1), "gemm", what, " = ", ld, " is smaller than the row length ", cols);
  return ld;
}

using Key = std::array<int64_t, 21>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;  // cuBLASLt's A (our B), B (our A), C/D
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool fused_bias = false;
  std::array<uint32_t, 3> align{};  // A, B, C byte alignments the heuristic was asked for
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;  // the heuristic's ranking, fetched on demand
  std::mutex mu;  // the bias pointer is a descriptor attribute: set + launch must not interleave

  ~Plan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct Problem {  // the normalised call: leading dims fixed, batch strides zeroed for one matrix
  const GemmParams& p;
  int64_t lda, ldb, ldc, sa, sb, sc;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    KILN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// Tuning::gemm.pick (kiln/tuning.h): the heuristic's rank-th algorithm instead of its first for
// problems of a shape, read when a shape's plan is made; plans are cached, so a shape keeps its
// algorithm (and its bits) for the process.
int pinned_rank(const GemmParams& p) {
  const auto picks = parse_gemm_picks(tuning().gemm.pick);
  const auto it = picks.find({p.m, p.n, p.k, p.trans_a ? 1 : 0, p.trans_b ? 1 : 0});
  return it == picks.end() ? 0 : it->second;
}

// The heuristic's ranking for `plan`, at most `count` algorithms, best first. Returns the
// heuristic's status; NOT_SUPPORTED stands for "no algorithm" (cuBLASLt reports that both ways).
cublasStatus_t rank_algos(const Problem& q, const Plan& plan, int count,
                          std::vector<cublasLtMatmulHeuristicResult_t>& out) {
  const std::array<uint32_t, 3>& align = plan.align;
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> guard(
      pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kWorkspaceBytes;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[1],
                                                         sizeof(uint32_t)));  // cuBLASLt's A is our B
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[0],
                                                         sizeof(uint32_t)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
                                                         sizeof(uint32_t)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2],
                                                         sizeof(uint32_t)));
  out.assign(static_cast<size_t>(count), cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(q.p.device), plan.desc, plan.la, plan.lb,
                                                           plan.lc, plan.lc, pref, count, out.data(), &found);
  out.resize(st == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(found) : 0);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  return found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}

// The heuristic's first algorithm for `plan` (or the tuned rank for its shape).
cublasStatus_t pick_algo(const Problem& q, Plan& plan) {
  const int rank = pinned_rank(q.p);
  std::vector<cublasLtMatmulHeuristicResult_t> ranked;
  const cublasStatus_t st = rank_algos(q, plan, rank + 1, ranked);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  KILN_CHECK(rank < static_cast<int>(ranked.size()), "gemm", "the tuned pick (KILN_GEMM_PICK) asks for rank ", rank, " of m=", q.p.m,
             " n=", q.p.n, " k=", q.p.k, " but cuBLASLt offers ", ranked.size(), " algorithms");
  plan.algo = ranked[static_cast<size_t>(rank)].algo;
  plan.workspace = ranked[static_cast<size_t>(rank)].workspaceSize;
  return CUBLAS_STATUS_SUCCESS;
}

std::unique_ptr<Plan> make_plan(const Problem& q, const std::array<uint32_t, 3>& align) {
  const GemmParams& p = q.p;
  auto plan = std::make_unique<Plan>();
  plan->align = align;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, q.compute, q.scale));
  const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // the operands swap places
  const cublasOperation_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cudaDataType_t ab = cuda_type(p.ab_type), ct = cuda_type(p.c_type);
  // Column-major shapes: our B is [n, k] (op N) or stored [k, n]^T; our A likewise with m.
  plan->la = make_layout(ab, p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k, q.ldb, p.batch, q.sb);
  plan->lb = make_layout(ab, p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m, q.lda, p.batch, q.sa);
  plan->lc = make_layout(ct, p.n, p.m, q.ldc, p.batch, q.sc);
  if (p.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = cuda_type(p.bias_type);
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
    // The heuristic reads the bias pointer's alignment; later calls use pointers of the same class.
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    // Any refusal of the fused form (type or layout combination) falls back to the plain gemm.
    plan->fused_bias = pick_algo(q, *plan) == CUBLAS_STATUS_SUCCESS;
    if (plan->fused_bias) return plan;
    const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;  // fall back to add_bias_rows + beta = 1
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof(none)));
  }
  const cublasStatus_t st = pick_algo(q, *plan);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
    KILN_FAIL("cublasLt", "cublasLtMatmulAlgoGetHeuristic failed: ", cublasLtGetStatusName(st), " (",
              cublasLtGetStatusString(st), ") (", __FILE__, ":", __LINE__, ")");
  KILN_CHECK(st == CUBLAS_STATUS_SUCCESS, "gemm", "cuBLASLt has no algorithm for m=", p.m, " n=", p.n, " k=", p.k,
             " batch=", p.batch, " ", dtype_name(p.ab_type), " -> ", dtype_name(p.c_type), " trans_a=", p.trans_a,
             " trans_b=", p.trans_b, " lda=", q.lda, " ldb=", q.ldb, " ldc=", q.ldc);
  return plan;
}

using PlanCache = std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash>;
std::mutex g_plans_mu;
PlanCache& plans() {
  static auto* cache = new PlanCache();  // leaked on purpose: plans live for the process, exit order never matters
  return *cache;
}

Plan& plan_for(const Problem& q) {
  const GemmParams& p = q.p;
  const std::array<uint32_t, 3> align{alignment(p.a, q.sa, p.batch, element_size(p.ab_type)),
                                      alignment(p.b, q.sb, p.batch, element_size(p.ab_type)),
                                      alignment(p.c, q.sc, p.batch, element_size(p.c_type))};
  const int64_t bias_key = p.bias ? static_cast<int64_t>(p.bias_type) * 1024 + alignment(p.bias, 0, 1, 1) : -1;
  const Key key{p.device, p.trans_a, p.trans_b, p.m, p.n, p.k, q.lda, q.ldb, q.ldc, p.batch, q.sa, q.sb, q.sc,
                static_cast<int64_t>(p.ab_type), static_cast<int64_t>(p.c_type), static_cast<int64_t>(q.compute),
                bias_key, align[0], align[1], align[2], 0};
  std::lock_guard<std::mutex> lock(g_plans_mu);
  PlanCache& cache = plans();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(q, align)).first;
  return *it->second;
}

void check_types(const GemmParams& p) {
  const bool low = is_low_precision(p.ab_type);
  KILN_CHECK(p.ab_type == kFloat32 || p.ab_type == kFloat64 || low, "gemm", "unsupported input dtype ",
             dtype_name(p.ab_type));
  KILN_CHECK(p.c_type == p.ab_type || (low && p.c_type == kFloat32), "gemm", "unsupported output dtype ",
             dtype_name(p.c_type), " for ", dtype_name(p.ab_type), " inputs");
  KILN_CHECK(!p.bias || p.bias_type == p.c_type || (is_low_precision(p.c_type) && p.bias_type == kFloat32), "gemm",
             "bias dtype ", dtype_name(p.bias_type), " does not fit output dtype ", dtype_name(p.c_type));
}

}  // namespace

size_t gemm_workspace_bytes() { return kWorkspaceBytes; }

std::map<GemmShape, int> parse_gemm_picks(const std::string& spec) {
  std::map<GemmShape, int> out;
  std::stringstream all(spec);
  std::string item;
  while (std::getline(all, item, ';')) {
    if (item.empty()) continue;
    int64_t m = 0, n = 0, k = 0, ta = 0, tb = 0;
    int rank = -1;
    char c1 = 0, c2 = 0, c3 = 0, c4 = 0, eq = 0;
    std::stringstream one(item);
    one >> m >> c1 >> n >> c2 >> k >> c3 >> ta >> c4 >> tb >> eq >> rank;
    const bool ok = one && c1 == ',' && c2 == ',' && c3 == ',' && c4 == ',' && eq == '=' && rank >= 0 && one.eof();
    KILN_CHECK(ok && m > 0 && n > 0 && k > 0 && (ta == 0 || ta == 1) && (tb == 0 || tb == 1), "gemm",
               "KILN_GEMM_PICK entry '", item, "' is not m,n,k,trans_a,trans_b=rank (positive sizes, 0/1 flags)");
    out[{m, n, k, ta, tb}] = rank;
  }
  return out;
}

size_t gemm_cached_plans() {
  std::lock_guard<std::mutex> lock(g_plans_mu);
  return plans().size();
}

cublasLtHandle_t cublaslt_handle(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "gemm", "bad device index ", device);
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  std::call_once(once[device], [&] {
    DeviceGuard guard(device);
    KILN_CUBLAS_CHECK(cublasLtCreate(&handles[device]));  // kept for the process
  });
  return handles[device];
}

void* cublaslt_workspace(int device, cudaStream_t stream) {
  static std::mutex mu;
  static auto* spaces = new std::unordered_map<uint64_t, void*>[kMaxDevices];  // leaked: process lifetime
  std::lock_guard<std::mutex> lock(mu);
  auto& map = spaces[device];
  const auto key = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream));
  auto it = map.find(key);
  if (it != map.end()) return it->second;
  void* ws = allocate_bytes(Device(DeviceType::CUDA, device), kWorkspaceBytes);
  // The pool hands it out in the order of the allocating stream; wait once so any stream may use it.
  KILN_CUDA_CHECK(cudaStreamSynchronize(current_raw_stream(device)));
  map.emplace(key, ws);
  return ws;
}

namespace {

// The call validated and normalised (leading dims fixed, batch strides zeroed for one matrix);
// false when there is no product to run (m, n, batch or k is 0).
bool normalise(const GemmParams& p, std::optional<Problem>& q) {
  KILN_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0, "gemm", "negative size m=", p.m, " n=", p.n,
             " k=", p.k, " batch=", p.batch);
  KILN_CHECK(p.batch <= INT32_MAX, "gemm", "batch ", p.batch, " exceeds cuBLASLt's 32-bit batch count");
  check_types(p);
  if (p.m == 0 || p.n == 0 || p.batch == 0 || p.k == 0) return false;
  const bool one = p.batch == 1;
  const bool f64 = p.ab_type == kFloat64;
  q.emplace(Problem{p,
                    p.trans_a ? fix_ld(p.k, p.m, p.lda, "lda") : fix_ld(p.m, p.k, p.lda, "lda"),
                    p.trans_b ? fix_ld(p.n, p.k, p.ldb, "ldb") : fix_ld(p.k, p.n, p.ldb, "ldb"),
                    fix_ld(p.m, p.n, p.ldc, "ldc"),
                    one ? 0 : p.stride_a,
                    one ? 0 : p.stride_b,
                    one ? 0 : p.stride_c,
                    f64 ? CUBLAS_COMPUTE_64F
                        : (p.allow_tf32 && p.ab_type == kFloat32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F),
                    f64 ? CUDA_R_64F : CUDA_R_32F});
  return true;
}

// One cublasLtMatmul of the normalised problem with `algo` (needing `workspace` bytes).
void launch(const Problem& q, Plan& plan, const cublasLtMatmulAlgo_t& algo, size_t workspace) {
  const GemmParams& p = q.p;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const bool f64 = p.ab_type == kFloat64;
  double beta = p.beta;
  if (p.bias && !plan.fused_bias) {
    add_bias_rows(p.c_type, p.c, q.ldc, q.sc, p.batch, p.m, p.n, beta, p.bias_type, p.bias, stream);
    beta = 1.0;
  }
  const float alpha32 = static_cast<float>(p.alpha), beta32 = static_cast<float>(beta);
  const void* alpha_ptr = f64 ? static_cast<const void*>(&p.alpha) : &alpha32;
  const void* beta_ptr = f64 ? static_cast<const void*>(&beta) : &beta32;
  void* ws = workspace > 0 ? cublaslt_workspace(p.device, stream) : nullptr;
  std::unique_lock<std::mutex> lock(plan.mu, std::defer_lock);
  if (plan.fused_bias) {
    lock.lock();
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  KILN_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(p.device), plan.desc, alpha_ptr, p.b, plan.la, p.a, plan.lb,
                                   beta_ptr, p.c, plan.lc, p.c, plan.lc, &algo, ws, workspace, stream));
}

// The plan's ranking of up to `count` algorithms, fetched once (a larger count fetches again).
std::vector<cublasLtMatmulHeuristicResult_t> ranking(const Problem& q, Plan& plan, int count) {
  std::lock_guard<std::mutex> lock(plan.mu);
  if (static_cast<int>(plan.candidates.size()) < count) {
    std::vector<cublasLtMatmulHeuristicResult_t> ranked;
    const cublasStatus_t st = rank_algos(q, plan, count, ranked);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
      KILN_FAIL("cublasLt", "cublasLtMatmulAlgoGetHeuristic failed: ", cublasLtGetStatusName(st));
    plan.candidates = std::move(ranked);
  }
  return plan.candidates;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
    uint32_t v = 0;  // every attribute read here is 32 bits or narrower, little-endian
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1LL;
    return static_cast<long long>(v);
  };
  std::ostringstream o;
  o << "algo " << attr(CUBLASLT_ALGO_CONFIG_ID) << " tile " << attr(CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
    << attr(CUBLASLT_ALGO_CONFIG_STAGES_ID) << " splitk " << attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) << " reduction "
    << attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) << " swizzle " << attr(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)
    << " custom " << attr(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) << " cluster "
    << attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  return o.str();
}

}  // namespace

void gemm(const GemmParams& p) {
  std::optional<Problem> q;
  if (!normalise(p, q)) {
    if (p.k == 0 && p.m > 0 && p.n > 0 && p.batch > 0) {  // no product: C = beta * C (+ bias)
      DeviceGuard guard(p.device);
      add_bias_rows(p.c_type, p.c, p.ldc, p.stride_c, p.batch, p.m, p.n, p.beta, p.bias_type, p.bias,
                    static_cast<cudaStream_t>(p.stream));
    }
    return;
  }
  DeviceGuard guard(p.device);
  Plan& plan = plan_for(*q);
  launch(*q, plan, plan.algo, plan.workspace);
}

std::vector<GemmCandidate> gemm_candidates(const GemmParams& p, int max_count) {
  KILN_CHECK(max_count > 0, "gemm", "gemm_candidates needs max_count > 0, got ", max_count);
  std::optional<Problem> q;
  if (!normalise(p, q)) return {};
  DeviceGuard guard(p.device);
  Plan& plan = plan_for(*q);
  std::vector<GemmCandidate> out;
  const auto ranked = ranking(*q, plan, max_count);
  for (size_t r = 0; r < ranked.size() && static_cast<int>(r) < max_count; ++r)
    out.push_back({static_cast<int>(r), ranked[r].workspaceSize, ranked[r].wavesCount, describe(ranked[r].algo)});
  return out;
}

void gemm_with_candidate(const GemmParams& p, int rank) {
  std::optional<Problem> q;
  KILN_CHECK(normalise(p, q), "gemm", "gemm_with_candidate needs a product: m=", p.m, " n=", p.n, " k=", p.k,
             " batch=", p.batch);
  DeviceGuard guard(p.device);
  Plan& plan = plan_for(*q);
  const auto ranked = ranking(*q, plan, rank + 1);
  KILN_CHECK(rank >= 0 && rank < static_cast<int>(ranked.size()), "gemm", "no candidate of rank ", rank, " for m=",
             p.m, " n=", p.n, " k=", p.k, " (cuBLASLt offers ", ranked.size(), ")");
  const cublasLtMatmulHeuristicResult_t& r = ranked[static_cast<size_t>(rank)];
  launch(*q, plan, r.algo, r.workspaceSize);
}

}  // namespace kiln::cuda
