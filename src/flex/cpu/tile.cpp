// Tile primitives shared by the CPU forward and backward. Defined once (never inlined into the
// two kernels separately) so a score recomputed in the backward is bit-for-bit the forward's.
// gemm keeps a 6 x (2 vectors) block of accumulators in registers (12 of AVX2's 16) and streams
// rows of b (for scores: the transposed K block, E x n): every element is one multiply-add chain
// over k in order, whatever its tile position. Optional per-row ranges let partial blocks skip
// masked panels and zero terms without changing any kept element's bits. exp_sum is the online
// softmax's exp and row sum, vectorised (8 lanes, lane sums combined in a fixed order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "flex/cpu/attention.h"

namespace kiln::flex::cpu {

void Problem::kv_blocks(int64_t b, int64_t h, int64_t i, std::vector<std::pair<int32_t, bool>>& out) const {
  out.clear();
  if (all_full) {
    for (int64_t j = 0; j < nKV; ++j) out.emplace_back(static_cast<int32_t>(j), false);
    return;
  }
  const int64_t r = mask_bh(b, h) * nQ + i;
  const int32_t *pa = kv_idx + r * kv_m, *pe = pa + kv_num[r];
  const int32_t *fa = fkv_idx + r * fkv_m, *fe = fa + fkv_num[r];
  while (pa < pe || fa < fe) {
    if (fa == fe || (pa < pe && *pa < *fa)) out.emplace_back(*pa++, true);
    else out.emplace_back(*fa++, false);
  }
}

void Problem::q_blocks(int64_t b, int64_t h, int64_t j, std::vector<std::pair<int32_t, bool>>& out) const {
  out.clear();
  if (all_full) {
    for (int64_t i = 0; i < nQ; ++i) out.emplace_back(static_cast<int32_t>(i), false);
    return;
  }
  const int64_t r = mask_bh(b, h) * nKV + j;
  const int32_t *pa = q_idx + r * q_m, *pe = pa + q_num[r];
  const int32_t *fa = fq_idx + r * fq_m, *fe = fa + fq_num[r];
  while (pa < pe || fa < fe) {
    if (fa == fe || (pa < pe && *pa < *fa)) out.emplace_back(*pa++, true);
    else out.emplace_back(*fa++, false);
  }
}

template <typename F>
Mods<F>::Mods(const Problem& p) {
  if (p.score) score = std::make_unique<detail::RowEval<F>>(*p.score, p.KB);
  if (p.mask) {
    mask = std::make_unique<detail::RowEval<F>>(*p.mask, p.KB);
    affine = std::make_unique<AffineMask>(*p.mask);
    if (!affine->ok()) affine.reset();
  }
}

namespace {

constexpr int64_t kR = 6;

// 32-byte vectors (GCC/Clang vector extension): one ymm register with AVX2, two xmm without.
template <typename F>
struct Vec {
  typedef F type __attribute__((vector_size(32)));
  static constexpr int64_t kLanes = 32 / static_cast<int64_t>(sizeof(F));
};

// R x (2 vectors) register tile, R <= 6: 12 accumulators (of AVX2's 16 registers), two b loads
// and R broadcasts per k. Every element is one fused multiply-add chain over k in order, the
// same for every R, so a row's bits never depend on where it falls in the tile.
template <typename F, int64_t R>
[[gnu::always_inline]] inline void micro_full(const F* a, int64_t ars, int64_t acs, const F* b, int64_t ldb,
                                              int64_t K, F scale, F* c, int64_t ldc, bool accumulate) {
  using V = typename Vec<F>::type;
  constexpr int64_t W = Vec<F>::kLanes;
  V acc[R][2] = {};
  for (int64_t k = 0; k < K; ++k) {
    V b0, b1;
    std::memcpy(&b0, b + k * ldb, sizeof(V));
    std::memcpy(&b1, b + k * ldb + W, sizeof(V));
    const F* ak = a + k * acs;
    for (int64_t i = 0; i < R; ++i) {
      const F ai = ak[i * ars];
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  for (int64_t i = 0; i < R; ++i)
    for (int64_t h = 0; h < 2; ++h) {
      V out = acc[i][h] * scale;
      F* dst = c + i * ldc + h * W;
      if (accumulate) {
        V cur;
        std::memcpy(&cur, dst, sizeof(V));
        out = cur + out;
      }
      std::memcpy(dst, &out, sizeof(V));
    }
}

// Column edges (fewer than 2 vectors of columns): the same per-element sum in scalar code.
template <typename F>
[[gnu::always_inline]] inline void micro_edge(const F* a, int64_t ars, int64_t acs, const F* b, int64_t ldb,
                                              int64_t rows, int64_t cols, int64_t K, F scale, F* c, int64_t ldc,
                                              bool accumulate) {
  F acc[kR][2 * Vec<F>::kLanes] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < rows; ++i) {
      const F ai = a[i * ars + k * acs];
      for (int64_t j = 0; j < cols; ++j) acc[i][j] += ai * b[k * ldb + j];
    }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc[i][j] * scale : acc[i][j] * scale;
}

// Optional per output row ranges [lo, hi): of k (terms outside are zero: skipping them leaves every
// sum's bits unchanged, as acc + 0 * b == acc) or, with cols, of the columns wanted (the others of
// the row's panels are written as 0). A strip of rows uses the union of its rows' ranges.
struct Ranges {
  const int32_t *lo = nullptr, *hi = nullptr;
  bool cols = false;
};

template <typename F, int64_t R>
[[gnu::always_inline]] inline void strip(const F* a, int64_t ars, int64_t acs, const F* b, int64_t ldb, int64_t N,
                                         int64_t K, F scale, F* c, int64_t ldc, bool accumulate, const Ranges& rg,
                                         int64_t r) {
  constexpr int64_t kC = 2 * Vec<F>::kLanes;
  int64_t j0 = 0, j1 = N;
  if (rg.lo) {
    int64_t ulo = std::numeric_limits<int64_t>::max(), uhi = 0;
    for (int64_t i = r; i < r + R; ++i)
      if (rg.lo[i] < rg.hi[i]) {
        ulo = std::min<int64_t>(ulo, rg.lo[i]);
        uhi = std::max<int64_t>(uhi, rg.hi[i]);
      }
    if (uhi == 0) ulo = 0;
    if (rg.cols) {  // whole panels, so each column is computed by the same kernel as without ranges
      j0 = std::min(N, ulo / kC * kC);
      j1 = std::max(j0, std::min(N, (uhi + kC - 1) / kC * kC));
      for (int64_t i = 0; i < R; ++i) {
        std::fill(c + i * ldc, c + i * ldc + j0, F(0));
        std::fill(c + i * ldc + j1, c + i * ldc + N, F(0));
      }
    } else {
      const int64_t k0 = std::min(K, ulo), k1 = std::max(k0, std::min(K, uhi));
      a += k0 * acs;
      b += k0 * ldb;
      K = k1 - k0;
    }
  }
  int64_t j = j0;
  for (; j + kC <= N && j < j1; j += kC) micro_full<F, R>(a, ars, acs, b + j, ldb, K, scale, c + j, ldc, accumulate);
  if (j < j1) micro_edge<F>(a, ars, acs, b + j, ldb, R, N - j, K, scale, c + j, ldc, accumulate);
}

template <typename F>
[[gnu::always_inline]] inline void gemm_body(const F* a, int64_t ars, int64_t acs, const F* b, int64_t ldb, int64_t M,
                                             int64_t N, int64_t K, F scale, F* c, int64_t ldc, bool accumulate,
                                             const Ranges& rg) {
  int64_t r = 0;
  for (; r + kR <= M; r += kR)
    strip<F, kR>(a + r * ars, ars, acs, b, ldb, N, K, scale, c + r * ldc, ldc, accumulate, rg, r);
  const F* ar = a + r * ars;
  F* cr = c + r * ldc;
  switch (M - r) {
    case 5: strip<F, 5>(ar, ars, acs, b, ldb, N, K, scale, cr, ldc, accumulate, rg, r); break;
    case 4: strip<F, 4>(ar, ars, acs, b, ldb, N, K, scale, cr, ldc, accumulate, rg, r); break;
    case 3: strip<F, 3>(ar, ars, acs, b, ldb, N, K, scale, cr, ldc, accumulate, rg, r); break;
    case 2: strip<F, 2>(ar, ars, acs, b, ldb, N, K, scale, cr, ldc, accumulate, rg, r); break;
    case 1: strip<F, 1>(ar, ars, acs, b, ldb, N, K, scale, cr, ldc, accumulate, rg, r); break;
    default: break;
  }
}

// x86-64: an AVX2+FMA clone picked once at load time (the baseline build is SSE2 only).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_FLEX_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_FLEX_CLONES
#endif

KILN_FLEX_CLONES void gemm_f32(const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, int64_t M,
                               int64_t N, int64_t K, float scale, float* c, int64_t ldc, bool accumulate,
                               const Ranges& rg) {
  gemm_body<float>(a, ars, acs, b, ldb, M, N, K, scale, c, ldc, accumulate, rg);
}
KILN_FLEX_CLONES void gemm_f64(const double* a, int64_t ars, int64_t acs, const double* b, int64_t ldb, int64_t M,
                               int64_t N, int64_t K, double scale, double* c, int64_t ldc, bool accumulate,
                               const Ranges& rg) {
  gemm_body<double>(a, ars, acs, b, ldb, M, N, K, scale, c, ldc, accumulate, rg);
}

// e^x, 8 lanes, for the softmax (x <= 0 up to rounding): x = n ln2 + r with |r| <= ln2 / 2,
// e^r by its degree-7 Taylor polynomial (truncation < 2e-8 relative), 2^n added to the exponent.
// x < -87 (including -inf) gives 0 (e^-87 is below float's normal range); x above 88 is clamped.
using V8f = Vec<float>::type;
typedef int32_t V8i __attribute__((vector_size(32)));
// In place (by reference: a 32-byte vector by value would change the baseline clone's ABI).
[[gnu::always_inline]] inline void exp8(V8f& x) {
  const V8f lo = x < -87.0f ? V8f{} + 1.0f : V8f{};  // lanes that underflow to 0
  x = x < -87.0f ? V8f{} - 87.0f : x;
  x = x > 88.0f ? V8f{} + 88.0f : x;
  const V8f magic = V8f{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds to an integer
  const V8f nf = (x * 1.44269504088896341f + magic) - magic;
  const V8f r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723e-6f;  // ln2 = hi + lo
  V8f p = V8f{} + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const V8i e = (__builtin_convertvector(nf, V8i) + 127) << 23;
  V8f scale2;
  std::memcpy(&scale2, &e, sizeof(V8f));
  const V8f y = p * scale2;
  x = lo != 0.0f ? V8f{} : y;
}

// s[c] = e^(s[c] - m) (0 where s[c] is -inf); returns the sum (8 lane partial sums, combined in a
// fixed order). Requires m finite.
KILN_FLEX_CLONES float exp_sum_f32(float* s, int64_t n, float m) {
  V8f acc{};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    V8f x;
    std::memcpy(&x, s + c, sizeof(V8f));
    x -= m;
    exp8(x);
    std::memcpy(s + c, &x, sizeof(V8f));
    acc += x;
  }
  if (c < n) {  // tail: padded with -inf lanes, which give 0
    V8f x = V8f{} - std::numeric_limits<float>::infinity();
    std::memcpy(&x, s + c, static_cast<size_t>(n - c) * sizeof(float));
    x -= m;
    exp8(x);
    std::memcpy(s + c, &x, static_cast<size_t>(n - c) * sizeof(float));
    acc += x;
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

KILN_FLEX_CLONES float max_f32(const float* s, int64_t n) {
  V8f mx = V8f{} - std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    V8f x;
    std::memcpy(&x, s + c, sizeof(V8f));
    mx = x > mx ? x : mx;
  }
  float r = -std::numeric_limits<float>::infinity();
  for (int64_t l = 0; l < 8; ++l) r = mx[l] > r ? mx[l] : r;
  for (; c < n; ++c) r = s[c] > r ? s[c] : r;
  return r;
}

}  // namespace

template <>
float row_max<float>(const float* s, int64_t n) { return max_f32(s, n); }
template <>
double row_max<double>(const double* s, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
  return mx;
}
template <>
float exp_sum<float>(float* s, int64_t n, float m) { return exp_sum_f32(s, n, m); }
template <>
double exp_sum<double>(double* s, int64_t n, double m) {
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    s[c] = s[c] == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(s[c] - m);
    sum += s[c];
  }
  return sum;
}

template <>
void gemm<float>(const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, int64_t M, int64_t N, int64_t K,
                 float scale, float* c, int64_t ldc, bool accumulate, const int32_t* klo, const int32_t* khi) {
  gemm_f32(a, ars, acs, b, ldb, M, N, K, scale, c, ldc, accumulate, Ranges{klo, khi, false});
}
template <>
void gemm<double>(const double* a, int64_t ars, int64_t acs, const double* b, int64_t ldb, int64_t M, int64_t N,
                  int64_t K, double scale, double* c, int64_t ldc, bool accumulate, const int32_t* klo,
                  const int32_t* khi) {
  gemm_f64(a, ars, acs, b, ldb, M, N, K, scale, c, ldc, accumulate, Ranges{klo, khi, false});
}

template <>
void score_tile<float>(const float* a, const float* bt, int64_t m, int64_t n, int64_t E, float scale, float* s,
                       int64_t ld, const int32_t* clo, const int32_t* chi) {
  gemm_f32(a, E, 1, bt, n, m, n, E, scale, s, ld, false, Ranges{clo, chi, true});
}
template <>
void score_tile<double>(const double* a, const double* bt, int64_t m, int64_t n, int64_t E, double scale, double* s,
                        int64_t ld, const int32_t* clo, const int32_t* chi) {
  gemm_f64(a, E, 1, bt, n, m, n, E, scale, s, ld, false, Ranges{clo, chi, true});
}

template <typename F>
void mod_row(Mods<F>& mods, const Problem& p, F* s, int64_t b, int64_t h, int64_t q, int64_t c0, int64_t n,
             bool partial) {
  if (mods.score) {
    mods.score->run(b, h, q, c0, n, s);
    std::copy_n(mods.score->float_result(), n, s);
  }
  if (partial && mods.mask) {
    if (const uint64_t* bits = p.tiles ? p.tiles->row(p, b, h, q, c0) : nullptr) {
      for (int64_t c = 0; c < n; ++c)
        if (!((bits[c >> 6] >> (c & 63)) & 1)) s[c] = -std::numeric_limits<F>::infinity();
      return;
    }
    if (mods.affine && mods.affine->apply(b, h, q, c0, n, s)) return;
    mods.mask->run(b, h, q, c0, n, nullptr);
    const uint8_t* keep = mods.mask->bool_result();
    for (int64_t c = 0; c < n; ++c)
      if (!keep[c]) s[c] = -std::numeric_limits<F>::infinity();
  }
}

template <typename F>
bool kept_columns(Mods<F>& mods, int64_t b, int64_t h, int64_t q0, int64_t m, int64_t c0, int64_t n, bool partial,
                  int32_t* lo, int32_t* hi) {
  return partial && mods.affine && mods.affine->bounds(b, h, q0, m, c0, n, lo, hi);
}

void kept_rows(const int32_t* lo, const int32_t* hi, int64_t m, int64_t n, int32_t* rlo, int32_t* rhi) {
  std::fill_n(rlo, n, static_cast<int32_t>(m));
  std::fill_n(rhi, n, 0);
  for (int64_t r = 0; r < m; ++r)  // the first and last rows whose range holds c
    for (int32_t c = lo[r]; c < hi[r]; ++c) {
      rlo[c] = std::min(rlo[c], static_cast<int32_t>(r));
      rhi[c] = static_cast<int32_t>(r + 1);
    }
  for (int64_t c = 0; c < n; ++c)
    if (rlo[c] >= rhi[c]) rlo[c] = rhi[c] = 0;
}

template <typename T, typename F>
void load_rows(const T* src, int64_t r0, int64_t m, int64_t D, F* dst) {
  const T* p = src + r0 * D;
  for (int64_t i = 0; i < m * D; ++i) dst[i] = cast_value<F>(p[i]);
}

template <typename T, typename F>
void load_transposed(const T* src, int64_t r0, int64_t n, int64_t D, F* dst) {
  const T* p = src + r0 * D;
  for (int64_t c = 0; c < n; ++c)
    for (int64_t d = 0; d < D; ++d) dst[d * n + c] = cast_value<F>(p[c * D + d]);
}

#define KILN_FLEX_INSTANTIATE_F(F)                                                                              \
  template struct Mods<F>;                                                                                      \
  template bool kept_columns<F>(Mods<F>&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int32_t*,     \
                                int32_t*);                                                                      \
  template void mod_row<F>(Mods<F>&, const Problem&, F*, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
KILN_FLEX_INSTANTIATE_F(float)
KILN_FLEX_INSTANTIATE_F(double)
#define KILN_FLEX_INSTANTIATE_T(T)                                                           \
  template void load_rows<T, acc_t<T>>(const T*, int64_t, int64_t, int64_t, acc_t<T>*);      \
  template void load_transposed<T, acc_t<T>>(const T*, int64_t, int64_t, int64_t, acc_t<T>*);
KILN_FLEX_INSTANTIATE_T(float)
KILN_FLEX_INSTANTIATE_T(double)
KILN_FLEX_INSTANTIATE_T(BFloat16)
KILN_FLEX_INSTANTIATE_T(Half)

}  // namespace kiln::flex::cpu
