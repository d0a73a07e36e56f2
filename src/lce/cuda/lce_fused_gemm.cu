// The logit GEMMs with the loss in their epilogue (see lce_fused_gemm.h): the GEMM is
// hopper_gemm.cuh's; these are its two epilogues, the partials' combine and the launchers. Each
// epilogue has both of the GEMM's schedules: `apply` on a thread's accumulator fragment (registers),
// `row_params` / `row` on one row of the bf16 staging tile, 8 columns a lane (staged).
//   stats: per row, over the tile's 256 columns, the logits (bias and soft-cap applied in registers)
//          reduce to (max, sum exp) and the smoothing sum (quad or warp shuffles in a fixed order),
//          one pair a row a tile into the partials; the target's logit goes straight to the state;
//          with the speed strategy's chunk, the logits are stored first, rounded to T.
//          combine_kernel merges a row's tiles in column order: deterministic.
//   grad:  dz = lce_k::grad's element formula on the recomputed logits (in registers: fp32, no
//          16-bit rounding between GEMM and softmax, unlike the stored tiles), written in T.
// Forward and backward recompute the same logits from the same K order, so the backward's softmax
// matches the forward's lse in the logits it sees.
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/cuda/tensor_map.h"
#include "core/dispatch.h"
#include "core/env.h"
#include "lce/cuda/hopper_gemm.cuh"
#include "lce/cuda/lce_device.cuh"
#include "lce/cuda/lce_fused_gemm.h"
#include "lce/lce_internal.h"
#include "ops/cuda/warp.cuh"

namespace kiln::cuda::lce_k {
namespace {

constexpr const char* kOp = "linear_cross_entropy";
using hopper::BN;
static_assert(lce::kFusedTileCols == BN, "partials are kept per GEMM tile column");

std::atomic<int64_t> g_launches{0};

template <typename T>
__device__ __forceinline__ void store_pair(T* p, float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// Eight values of one row (the staged epilogue's lane share) into T at p: one 16-byte store when all
// are in the window and `vec` (p 16-byte aligned), else the first n one by one.
template <typename T>
__device__ __forceinline__ void store_row8(T* p, const float (&v)[8], int n, bool vec) {
  if (n >= 8 && vec) {
    Vec<T, 8> o;
#pragma unroll
    for (int e = 0; e < 8; ++e) o.v[e] = convert<T>(v[e]);
    *reinterpret_cast<Vec<T, 8>*>(p) = o;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < n) p[e] = convert<T>(v[e]);
  }
}

// What both epilogues know of their window: its size, its first class, bias and class weights.
template <typename T>
struct Window {
  int rows = 0, cols = 0;
  int64_t c0 = 0;                     // the window's first class
  const T* bias = nullptr;            // [v] or null
  const float* cw = nullptr;          // [v] or null
};

template <typename T>
Window<T> window(const FusedGemm& f, int64_t rows, int64_t c0, int64_t cols) {
  Window<T> w;
  w.rows = static_cast<int>(rows);
  w.cols = static_cast<int>(cols);
  w.c0 = c0;
  w.bias = static_cast<const T*>(f.bias);
  w.cw = static_cast<const float*>(f.cw);
  return w;
}

// kPlain: no bias, soft-cap or smoothing (the logit is the accumulator).
template <typename T, bool kPlain>
struct StatsEpi : Window<T> {
  using Window<T>::rows, Window<T>::cols, Window<T>::c0, Window<T>::bias, Window<T>::cw;
  const int64_t* target = nullptr;    // the window's first row's
  float cap = 0;                      // soft-cap, 0: off
  bool smooth = false;                // label smoothing: also the (class-weighted) logit sum
  float2* part = nullptr;             // [tiles, rows]: (max, sum exp)
  float* part_ws = nullptr;           // [tiles, rows]: the smoothing sum
  float* target_logit = nullptr;      // [rows]: the state's third row
  T* logits = nullptr;                // the speed strategy's chunk [rows, ld]: raw logits in T, or null
  int64_t ld = 0;
  bool vec_ok = false;                // logits rows 16-byte aligned (the staged schedule's vector stores)

  __device__ __forceinline__ void apply(float (&d)[128], int row, int col, int tn) const {
    const int ncols = cols - col;  // this thread's columns 8 j + e lie in the window while 8 j + e < ncols
    const bool full_cols = (tn + 1) * BN <= cols;
    if (logits) store_rounded(d, row, col, ncols, full_cols);
    if constexpr (!kPlain) {  // bias and soft-cap in place (one bias load serves both rows)
#pragma unroll
      for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool in = full_cols || 8 * j + e < ncols;
          const float b = bias && in ? convert<float>(bias[c0 + col + 8 * j + e]) : 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h) d[4 * j + 2 * h + e] = softcap(d[4 * j + 2 * h + e] + b, cap);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      float m = -INFINITY;
#pragma unroll
      for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (full_cols || 8 * j + e < ncols) m = fmaxf(m, d[4 * j + 2 * h + e]);
      m = quad_max(m);  // finite: a window's tile holds at least its first column
      const float ml = m * kLog2e;
      const int64_t y = r < rows ? target[r] - c0 - col : -1;
      // The target's offset from this thread's first column, when the window holds it.
      const int yl = y >= 0 && y < BN && y < ncols ? static_cast<int>(y) : -1;
      float sum = 0.f, ws = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = d[4 * j + 2 * h + e];
          const bool in = full_cols || 8 * j + e < ncols;
          if (in) sum += fast_ex2(fmaf(v, kLog2e, -ml));
          if constexpr (!kPlain)
            if (smooth && in) ws += cw ? cw[c0 + col + 8 * j + e] * v : v;
          if (8 * j + e == yl) target_logit[r] = v;  // one thread of one tile holds the row's target
        }
      sum = quad_sum(sum);
      if constexpr (!kPlain) ws = quad_sum(ws);
      if ((threadIdx.x & 3) == 0 && r < rows) {
        part[static_cast<int64_t>(tn) * rows + r] = make_float2(m, sum);
        if (!kPlain && smooth) part_ws[static_cast<int64_t>(tn) * rows + r] = ws;
      }
    }
  }

  // The staged schedule: one row's 8 columns a lane (values rounded to bf16 by the staging).
  struct RowParams {
    int64_t y;  // the target's class, -1 past the window
  };
  __device__ __forceinline__ RowParams row_params(int r) const { return {r < rows ? target[r] : -1}; }
  __device__ __forceinline__ void row(float (&v)[8], int r, int c, int tn, const RowParams& p) const {
    if (r >= rows) return;  // the same row for the whole warp
    const int n = cols - c;  // this lane's columns in the window: min(n, 8)
    if (logits) store_row8(logits + r * ld + c, v, n, vec_ok);
    if constexpr (!kPlain) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float b = bias && e < n ? convert<float>(bias[c0 + c + e]) : 0.f;
        v[e] = softcap(v[e] + b, cap);
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < n) m = fmaxf(m, v[e]);
    m = warp_max(m);  // finite: lane 0's first column is in the window
    const float ml = m * kLog2e;
    const int64_t y = p.y - c0 - c;
    float sum = 0.f, ws = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < n) sum += fast_ex2(fmaf(v[e], kLog2e, -ml));
      if constexpr (!kPlain)
        if (smooth && e < n) ws += cw ? cw[c0 + c + e] * v[e] : v[e];
      if (e == y && e < n) target_logit[r] = v[e];
    }
    sum = warp_sum(sum);
    if constexpr (!kPlain) ws = warp_sum(ws);
    if ((threadIdx.x & 31) == 0) {
      part[static_cast<int64_t>(tn) * rows + r] = make_float2(m, sum);
      if (!kPlain && smooth) part_ws[static_cast<int64_t>(tn) * rows + r] = ws;
    }
  }

  // The raw logits rounded to T, stored, and kept rounded in d: the statistics then see what the
  // gradient pass will read back (one rounding, as the cuBLASLt tile path makes).
  __device__ __forceinline__ void store_rounded(float (&d)[128], int row, int col, int ncols, bool full_cols) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      T* out = logits + r * ld + col;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const T a = convert<T>(d[4 * j + 2 * h]), b = convert<T>(d[4 * j + 2 * h + 1]);
        d[4 * j + 2 * h] = convert<float>(a);
        d[4 * j + 2 * h + 1] = convert<float>(b);
        if (r >= rows) continue;
        if (full_cols || 8 * j + 1 < ncols) store_pair(out + 8 * j, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        else if (8 * j < ncols) out[8 * j] = a;
      }
    }
  }
};

template <typename T, bool kPlain>
struct GradEpi : Window<T> {
  using Window<T>::rows, Window<T>::cols, Window<T>::c0, Window<T>::bias, Window<T>::cw;
  int64_t n0 = 0;                     // the window's first token
  const int64_t* target = nullptr;    // [n]
  const float* lse = nullptr;         // [n]
  const float* g = nullptr;           // null (1), one value, or [n]
  bool g_per_token = false;
  const float* totals = nullptr;
  lce::Consts k;
  T* dz = nullptr;                    // [rows, ldz]
  int64_t ldz = 0;
  bool vec_ok = false;                // dz rows 16-byte aligned (the staged schedule's vector stores)

  // The staged schedule: one row's 8 columns a lane (values rounded to bf16 by the staging).
  struct RowParams {
    RowGrad<float> rg;
    int64_t y;
  };
  __device__ __forceinline__ RowParams row_params(int r) const {
    RowParams p{};
    p.y = -1;
    if (r < rows) {
      const int64_t i = n0 + r;
      p.y = target[i];
      p.rg = row_grad<float>(p.y, lse[i], g ? g[g_per_token ? i : 0] : 1.f, cw, totals, k);
    }
    return p;
  }
  __device__ __forceinline__ void row(float (&v)[8], int r, int c, int tn, const RowParams& p) const {
    if (r >= rows) return;
    const int n = cols - c;
    const float cap = static_cast<float>(k.softcap), l2 = p.rg.lse * kLog2e;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t cls = c0 + c + e;
      if (p.rg.dead) {
        o[e] = 0.f;
      } else if constexpr (kPlain) {
        o[e] = p.rg.c.a * fast_ex2(fmaf(v[e], kLog2e, -l2)) - (cls == p.y ? p.rg.c.b : 0.f);
      } else {
        const float s = softcap(v[e] + (bias && e < n ? convert<float>(bias[cls]) : 0.f), cap);
        o[e] = e < n ? element_grad<float, T>(s, cls, p.y, p.rg, cw, cap) : 0.f;
      }
    }
    store_row8(dz + r * ldz + c, o, n, vec_ok);
  }

  __device__ __forceinline__ void apply(float (&d)[128], int row, int col, int tn) const {
    const int ncols = cols - col;
    const bool full_cols = (tn + 1) * BN <= cols;
    const float cap = static_cast<float>(k.softcap);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      if (r >= rows) continue;
      const int64_t i = n0 + r, y = target[i];
      const RowGrad<float> rg = row_grad<float>(y, lse[i], g ? g[g_per_token ? i : 0] : 1.f, cw, totals, k);
      const float l2 = rg.lse * kLog2e;
      const int64_t yl = y - c0 - col;
      T* out = dz + r * ldz + col;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        float o[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float z = d[4 * j + 2 * h + e];
          if (rg.dead) {
            o[e] = 0.f;
          } else if constexpr (kPlain) {
            o[e] = rg.c.a * fast_ex2(fmaf(z, kLog2e, -l2)) - (8 * j + e == yl ? rg.c.b : 0.f);
          } else {
            const int64_t v = c0 + col + 8 * j + e;
            const bool in = full_cols || 8 * j + e < ncols;
            const float s = softcap(z + (bias && in ? convert<float>(bias[v]) : 0.f), cap);
            o[e] = in ? element_grad<float, T>(s, v, y, rg, cw, cap) : 0.f;
          }
        }
        if (full_cols || 8 * j + 1 < ncols) store_pair(out + 8 * j, o[0], o[1]);
        else if (8 * j < ncols) out[8 * j] = convert<T>(o[0]);
      }
    }
  }
};

// Each window row's tile partials merged in column order into the state (first: replacing it).
__global__ void combine_kernel(const float2* part, const float* part_ws, int rows, int tiles, bool first,
                               float* state, int64_t st) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float m = first ? -INFINITY : state[r], s = first ? 0.f : state[st + r], ws = first ? 0.f : state[3 * st + r];
  for (int t = 0; t < tiles; ++t) {
    const float2 p = part[static_cast<int64_t>(t) * rows + r];
    merge(m, s, p.x, p.y);
    if (part_ws) ws += part_ws[static_cast<int64_t>(t) * rows + r];
  }
  state[r] = m;
  state[st + r] = s;
  state[3 * st + r] = ws;
}

// 1 where this build holds the GEMM's sm_90a code (the library's 80-virtual PTX holds an empty body).
__global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

}  // namespace

bool fused_gemm_device(int device) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  int has = 0;
  if (major == 9 && minor == 0) {  // sm_90a code runs on 9.0 alone
    DeviceGuard dg(device);
    int* flag = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    sm90a_probe_kernel<<<1, 1>>>(flag);
    const cudaError_t e = cudaMemcpy(&has, flag, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(flag);
    KILN_CUDA_CHECK(e);
  }
  return known[device] = has == 1;
}

namespace {

hopper::GemmMaps make_maps(const FusedGemm& f, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  hopper::GemmMaps g;
  const MapElem e = f.t == kBFloat16 ? MapElem::BFloat16 : MapElem::Float16;
  encode_tensor_map(&g.x, e, f.x, 2, 1, f.n, f.h, hopper::BK, hopper::BM, kOp);  // rank 2: the 2d bulk copies
  encode_tensor_map(&g.w, e, f.w, 2, 1, f.v, f.h, hopper::BK, BN, kOp);
  encode_tensor_map(&g.w_half, e, f.w, 2, 1, f.v, f.h, hopper::BK, BN / 2, kOp);
  g.m = static_cast<int>(rows);
  g.n = static_cast<int>(cols);
  g.k = static_cast<int>(f.h);
  g.x_row0 = static_cast<int>(r0);
  g.w_row0 = static_cast<int>(c0);
  return g;
}

// The persistent GEMM over the window: one CTA (cluster: MC CTAs) an SM at most.
template <bool kBf16, bool kStaged, class Epi, int MC>
void launch_mc(const hopper::GemmMaps& g, const Epi& epi, void* stream) {
  const auto kernel = hopper::gemm_kernel<kBf16, kStaged, Epi, MC>;
  constexpr int smem = hopper::smem_bytes<kStaged>();
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int units = hopper::Work<MC>(g).units;
  if (units == 0) return;
  hopper::GemmArgs<Epi> args{g, epi};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(units, sms / MC) * MC));
  cfg.blockDim = dim3(hopper::THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = MC;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

// KILN_LCE_WGMMA_EPILOGUE=warps: the staged schedule (hopper_gemm.cuh); registers (default) otherwise.
bool staged_epilogue() {
  const char* e = detail::env_switch(kOp, "KILN_LCE_WGMMA_EPILOGUE", "registers", "warps");
  return e && e[0] == 'w';
}

template <bool kBf16, class Epi>
void launch(const hopper::GemmMaps& g, const Epi& epi, void* stream) {
  const char* mc = detail::env_switch(kOp, "KILN_LCE_WGMMA_CLUSTER", "1", "2");
  const bool two = mc && mc[0] == '2';
  if (staged_epilogue()) {
    if (two) launch_mc<kBf16, true, Epi, 2>(g, epi, stream);
    else launch_mc<kBf16, true, Epi, 1>(g, epi, stream);
  } else {
    if (two) launch_mc<kBf16, false, Epi, 2>(g, epi, stream);
    else launch_mc<kBf16, false, Epi, 1>(g, epi, stream);
  }
}

// Rows of stride ld elements of T from p take 16-byte vectors.
bool rows_vector_ok(const void* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * 2) % 16 == 0;
}

// Calls f(T-tag, plain) with T the 16-bit device type and plain a std::bool_constant.
template <typename F>
void with_variant(DType t, bool plain, F&& f) {
  auto go = [&](auto tt) {
    if (plain) f(tt, std::true_type{});
    else f(tt, std::false_type{});
  };
  if (t == kBFloat16) go(TypeTag<__nv_bfloat16>{});
  else go(TypeTag<__half>{});
}

bool plain(const FusedGemm& f) { return f.bias == nullptr && f.k.softcap == 0.0 && f.k.eps == 0.0; }

}  // namespace

bool fused_gemm_usable(const FusedGemm& f, int device) {
  if (!detail::env_flag(kOp, "KILN_LCE_WGMMA", false)) return false;
  if (f.t != kBFloat16 && f.t != kFloat16) return false;
  if (f.h <= 0 || f.h % 8 != 0 || f.n >= (int64_t{1} << 31) || f.v >= (int64_t{1} << 31)) return false;
  if (reinterpret_cast<uintptr_t>(f.x) % 16 != 0 || reinterpret_cast<uintptr_t>(f.w) % 16 != 0) return false;
  return fused_gemm_device(device);
}

int64_t fused_gemm_launches() { return g_launches.load(); }

void fused_stats(const FusedGemm& f, int64_t r0, int64_t rows, int64_t c0, int64_t cols, void* part, bool first,
                 void* state, int64_t st, void* logits, int64_t ld) {
  if (rows == 0 || cols == 0) return;
  KILN_CHECK(!logits || (ld % 2 == 0 && reinterpret_cast<uintptr_t>(logits) % 4 == 0), kOp,
             "the fused logits GEMM stores aligned pairs: row stride ", ld);
  const int64_t tiles = (cols + BN - 1) / BN;
  float2* pairs = static_cast<float2*>(part);
  float* ws = f.k.eps != 0.0 ? reinterpret_cast<float*>(pairs + tiles * rows) : nullptr;
  float* st_f = static_cast<float*>(state);
  const hopper::GemmMaps g = make_maps(f, r0, rows, c0, cols);
  with_variant(f.t, plain(f), [&](auto tt, auto pl) {
    using T = typename decltype(tt)::type;
    StatsEpi<T, decltype(pl)::value> e;
    static_cast<Window<T>&>(e) = window<T>(f, rows, c0, cols);
    e.target = f.target + r0;
    e.cap = static_cast<float>(f.k.softcap);
    e.smooth = f.k.eps != 0.0;
    e.part = pairs;
    e.part_ws = ws;
    e.target_logit = st_f + 2 * st;
    e.logits = static_cast<T*>(logits);
    e.ld = ld;
    e.vec_ok = logits && rows_vector_ok(logits, ld);
    launch<std::is_same_v<T, __nv_bfloat16>>(g, e, f.stream);
  });
  combine_kernel<<<blocks_for(rows, 256), 256, 0, static_cast<cudaStream_t>(f.stream)>>>(
      pairs, ws, static_cast<int>(rows), static_cast<int>(tiles), first, st_f, st);
  KILN_CUDA_CHECK_LAUNCH(kOp);
}

void fused_grad(const FusedGemm& f, int64_t n0, int64_t rows, int64_t v0, int64_t cols, const void* lse,
                const void* g, bool g_per_token, const void* totals, void* dz, int64_t ldz) {
  if (rows == 0 || cols == 0) return;
  KILN_CHECK(ldz % 2 == 0 && reinterpret_cast<uintptr_t>(dz) % 4 == 0, kOp,
             "the fused backward writes dz in aligned pairs: row stride ", ldz);
  const hopper::GemmMaps maps = make_maps(f, n0, rows, v0, cols);
  with_variant(f.t, plain(f), [&](auto tt, auto pl) {
    using T = typename decltype(tt)::type;
    GradEpi<T, decltype(pl)::value> e;
    static_cast<Window<T>&>(e) = window<T>(f, rows, v0, cols);
    e.n0 = n0;
    e.target = f.target;
    e.lse = static_cast<const float*>(lse);
    e.g = static_cast<const float*>(g);
    e.g_per_token = g_per_token;
    e.totals = static_cast<const float*>(totals);
    e.k = f.k;
    e.dz = static_cast<T*>(dz);
    e.ldz = ldz;
    e.vec_ok = rows_vector_ok(dz, ldz);
    launch<std::is_same_v<T, __nv_bfloat16>>(maps, e, f.stream);
  });
}

}  // namespace kiln::cuda::lce_k
