// The lookup tables of the SIMD elementwise rows (elementwise_*_simd.cpp), built once on first use
// from float64 references: correctly rounded bf16 results of unary ops, fp32 derivatives and log2
// for every bf16 pattern, and float32 pow's ln table. Plain C++ (compiled once, not per SIMD
// target); the bf16 result rows' lookups use SSE2 where the compiler targets it.
#include "ops/cpu/elementwise_tables.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ops/cpu/elementwise_simd.h"

namespace kiln::cpu::simd {
namespace {
// bf16 unary ops by table (gelu, silu, gelu-tanh, log, tanh, sigmoid, erf): a bf16 input has
// 65536 bit patterns, so the correctly rounded bf16 of the float64 function of each, built once
// on first use (~2 ms), replaces the fp32 formula, which needs 12-22 vector ops per 8 values
// and runs latency-bound (0.59-0.68 of memcpy on Zen 2 at 31-35 GB/s copy). The lookups are scalar loads inserted
// into 128-bit vectors (AVX2 gathers measured 40% slower on Zen 2); 128 KiB, but activations
// touch a few thousand patterns, which stay in L1. Results are exact and depend on nothing but
// the input bits.
uint16_t round_bf16(double v) {  // nearest-even bf16 of a non-NaN float64, rounded once
  float f = static_cast<float>(v);  // nearest float, made round-to-odd: no double rounding
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (static_cast<double>(f) != v) u |= 1;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double gelu_d(double x) { return 0.5 * x * std::erfc(-x * 0.70710678118654752440); }
double silu_d(double x) { return x / (1.0 + std::exp(-x)); }
double gelu_tanh_d(double x) {  // x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
  return x / (1.0 + std::exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)));
}
double log_d(double x) { return std::log(x); }
double tanh_d(double x) { return std::tanh(x); }
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double erf_d(double x) { return std::erf(x); }
struct ResultBf16Table {
  std::vector<uint16_t> lo = std::vector<uint16_t>(65536);
#if !defined(__SSE2__)
  std::vector<uint32_t> hi = std::vector<uint32_t>(65536);  // lo << 16: a pair is one OR
#endif
  // NaN inputs keep their payload, quieted; inf inputs and NaN results (log of a negative, -inf
  // times 0) take the fp32 row's value, so specials match the fp32 rows.
  ResultBf16Table(double (*f)(double), UnaryOp op) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint32_t u = b << 16;
      float x;
      std::memcpy(&x, &u, 4);
      const double v = std::isfinite(x) ? f(x) : std::numeric_limits<double>::quiet_NaN();
      uint16_t r;
      if (std::isnan(x)) {
        r = static_cast<uint16_t>(b | 0x0040);
      } else if (!std::isnan(v)) {
        r = round_bf16(v);
      } else {
        float y;
        unary_f32(op, &x, &y, 1, 0.0f, 0.0f);
        uint32_t yu;
        std::memcpy(&yu, &y, 4);
        r = static_cast<uint16_t>(std::isnan(y) ? (yu >> 16) | 0x0040 : (yu + 0x7fffu + ((yu >> 16) & 1u)) >> 16);
      }
      lo[b] = r;
#if !defined(__SSE2__)
      hi[b] = uint32_t{r} << 16;
#endif
    }
  }
};
#if defined(__SSE2__)
// Eight lookups into one 128-bit vector: two u64 loads of indices, eight `pinsrw` from memory.
inline __m128i lookup8_bf16(const uint16_t* t, const uint16_t* x) {
  uint64_t w, u;
  std::memcpy(&w, x, 8);
  std::memcpy(&u, x + 4, 8);
  __m128i v = _mm_cvtsi32_si128(t[w & 0xffff]);
  v = _mm_insert_epi16(v, t[(w >> 16) & 0xffff], 1);
  v = _mm_insert_epi16(v, t[(w >> 32) & 0xffff], 2);
  v = _mm_insert_epi16(v, t[w >> 48], 3);
  v = _mm_insert_epi16(v, t[u & 0xffff], 4);
  v = _mm_insert_epi16(v, t[(u >> 16) & 0xffff], 5);
  v = _mm_insert_epi16(v, t[(u >> 32) & 0xffff], 6);
  return _mm_insert_epi16(v, t[u >> 48], 7);
}
#endif
// 32 values per step in four independent insert chains (single thread, in cache, Zen 2: 0.25
// ns/value against 0.34 for u32-pair lookups ORed into u64 stores, 0.27 with two chains).
#if defined(__SSE2__)
// Outputs of at least this many bytes per call are written with non-temporal stores: the lookups
// outrun memory there, and a plain store first reads the line it overwrites (a third stream).
constexpr int64_t kStreamBytes = int64_t{4} << 20;
template <bool kStream>
int64_t table_bf16_steps(const uint16_t* lo, const uint16_t* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m128i a = lookup8_bf16(lo, x + i), b = lookup8_bf16(lo, x + i + 8);
    const __m128i c = lookup8_bf16(lo, x + i + 16), d = lookup8_bf16(lo, x + i + 24);
    __m128i* o = reinterpret_cast<__m128i*>(out + i);
    if (kStream) {
      _mm_stream_si128(o, a), _mm_stream_si128(o + 1, b), _mm_stream_si128(o + 2, c), _mm_stream_si128(o + 3, d);
    } else {
      _mm_storeu_si128(o, a), _mm_storeu_si128(o + 1, b), _mm_storeu_si128(o + 2, c), _mm_storeu_si128(o + 3, d);
    }
  }
  if (kStream) _mm_sfence();
  return i;
}
#endif
void table_bf16_rows(const ResultBf16Table& table, const uint16_t* x, uint16_t* out, int64_t n) {
  const uint16_t* lo = table.lo.data();
  int64_t i = 0;
#if defined(__SSE2__)
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  if (2 * n >= kStreamBytes && addr % 2 == 0) {
    for (; (addr + 2 * i) % 16 != 0; ++i) out[i] = lo[x[i]];  // align the stores
    i += table_bf16_steps<true>(lo, x + i, out + i, n - i);
  } else {
    i = table_bf16_steps<false>(lo, x, out, n);
  }
#else
  const uint32_t* hi = table.hi.data();
  for (; i + 4 <= n; i += 4) {  // two u32 loads, four lookups, one u64 store
    uint32_t w0, w1;
    std::memcpy(&w0, x + i, 4);
    std::memcpy(&w1, x + i + 2, 4);
    const uint64_t r = uint64_t{lo[w0 & 0xffff] | hi[w0 >> 16]} | uint64_t{lo[w1 & 0xffff] | hi[w1 >> 16]} << 32;
    std::memcpy(out + i, &r, 8);
  }
#endif
  for (; i < n; ++i) out[i] = lo[x[i]];
}
// One table per function, built on first use.
template <double (*F)(double), UnaryOp kOp>
const ResultBf16Table* result_table_of() {
  static const ResultBf16Table t(F, kOp);
  return &t;
}
// The table for op, or null where the op keeps its vector formula.
const ResultBf16Table* result_bf16_table(UnaryOp op) {
  switch (op) {
    case UnaryOp::Gelu: return result_table_of<gelu_d, UnaryOp::Gelu>();
    case UnaryOp::Silu: return result_table_of<silu_d, UnaryOp::Silu>();
    case UnaryOp::GeluTanh: return result_table_of<gelu_tanh_d, UnaryOp::GeluTanh>();
    case UnaryOp::Log: return result_table_of<log_d, UnaryOp::Log>();
    case UnaryOp::Tanh: return result_table_of<tanh_d, UnaryOp::Tanh>();
    case UnaryOp::Sigmoid: return result_table_of<sigmoid_d, UnaryOp::Sigmoid>();
    case UnaryOp::Erf: return result_table_of<erf_d, UnaryOp::Erf>();
    default: return nullptr;
  }
}

// A derivative f'(x) in float64 for every bf16 x, stored as fp32 rounded to odd (so that with
// g = 1 the bf16 rounding gives the correctly rounded result): gelu'(x) = Phi(x) + x phi(x),
// silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x), gelu-tanh' as GeluTanhBwdF. NaN x keeps its NaN, +-inf give NaN (inf *
// 0, as the fp32 rows).
double gelu_derivative(double x) {
  return 0.5 * std::erfc(-x * 0.70710678118654752440) + x * std::exp(-0.5 * x * x) * 0.39894228040143267794;
}
double silu_derivative(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}
double gelu_tanh_derivative(double x) {  // s + 2 x s (1 - s) u', s = sigmoid(2u)
  const double s = 1.0 / (1.0 + std::exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)));
  return s + 2.0 * x * s * (1.0 - s) * 0.79788456080286536 * (1.0 + 3.0 * 0.044715 * x * x);
}
struct DerivativeBf16Table {
  std::vector<float> t = std::vector<float>(65536);
  explicit DerivativeBf16Table(double (*f)(double)) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint32_t u = b << 16;
      float x;
      std::memcpy(&x, &u, 4);
      if (std::isnan(x)) {
        const uint32_t q = u | 0x00400000u;
        std::memcpy(&t[b], &q, 4);
        continue;
      }
      if (std::isinf(x)) {
        t[b] = -std::numeric_limits<float>::quiet_NaN();  // the sign x86 gives a NaN made by an operation
        continue;
      }
      const double v = f(x);
      float r = static_cast<float>(v);  // round to odd: toward zero, then set the last bit if inexact
      if (std::fabs(static_cast<double>(r)) > std::fabs(v)) r = std::nextafter(r, 0.0f);
      if (static_cast<double>(r) != v) {
        uint32_t ru;
        std::memcpy(&ru, &r, 4);
        ru |= 1;
        std::memcpy(&r, &ru, 4);
      }
      t[b] = r;
    }
  }
};

// log2(x) for every bf16 x > 0 (denormals included) as the nearest fp32; NaN for x <= 0, inf,
// NaN, which sends those lanes to std::pow.
struct Log2Bf16Table {
  std::vector<float> t = std::vector<float>(65536);
  Log2Bf16Table() {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint32_t u = b << 16;
      float x;
      std::memcpy(&x, &u, 4);
      t[b] = x > 0 && std::isfinite(x) ? static_cast<float>(std::log2(static_cast<double>(x)))
                                       : std::numeric_limits<float>::quiet_NaN();
    }
  }
};

// ln x for float32 pow (PowF32Table), per top 16 bits of x (sign, exponent, 7 mantissa bits):
// x = 2^E m, m in [1, 2) on a bucket [M, M + 2^-7); c the 8-bit number in [1/2, 1] that
// minimises max |m c - 1| over the bucket (at most 0.0059), except c = 1 on [1, 1 + 2^-7) and
// c = 1/2 on [2 - 2^-7, 2), where r = x c' - 1 is x - 1 and K = 0 (for E = 0 and -1, x next to
// 1). c' = c 2^-E has 8 bits (a bf16), K = -ln c' in float64 split as K_hi (float) + K_lo
// (bf16, 2^-34 of K); every bucket has K_hi = 0 or |K_hi| > max |r| (Fast2Sum in PowF32Table).
// Entry: low 32 bits K_hi, high 32 bits c' << 16 | K_lo. x <= 0, denormal, inf, NaN and x >=
// 2^125 (where c' would be denormal) get K_hi = NaN: their lanes fail the range check. 512 KiB,
// built on first use; data spanning a few binades touch a few KiB of it.
struct LnF32Table {
  std::vector<uint64_t> t = std::vector<uint64_t>(65536);
  LnF32Table() {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint32_t ef = (b >> 7) & 0xff, j = b & 0x7f;
      if ((b >> 15) != 0 || ef == 0 || ef >= 127 + 125) {
        t[b] = 0x7fc00000u;
        continue;
      }
      const double lo = 1.0 + j / 128.0, hi = lo + 1.0 / 128.0;
      double c = j == 0 ? 1.0 : 0.5, best = 2.0;
      for (int k = 128; j != 0 && j != 127 && k <= 256; ++k) {
        const double e = std::max(std::fabs(lo * k / 256.0 - 1.0), std::fabs(hi * k / 256.0 - 1.0));
        if (e < best) best = e, c = k / 256.0;
      }
      const float cp = static_cast<float>(std::ldexp(c, 127 - static_cast<int>(ef)));  // exact
      const double k = -std::log(static_cast<double>(cp));
      const float k_hi = static_cast<float>(k), k_lo = static_cast<float>(k - k_hi);
      uint32_t hi_bits, lo_bits, c_bits;
      std::memcpy(&hi_bits, &k_hi, 4);
      std::memcpy(&lo_bits, &k_lo, 4);
      std::memcpy(&c_bits, &cp, 4);
      const uint32_t lo16 = (lo_bits + 0x7fffu + ((lo_bits >> 16) & 1u)) >> 16;
      t[b] = hi_bits | uint64_t{(c_bits & 0xffff0000u) | lo16} << 32;
    }
  }
};
// f' for every bf16 x (DerivativeBf16Table), one per function, built on first use.
template <double (*F)(double)>
const float* derivative_table_of() {
  static const DerivativeBf16Table table(F);
  return table.t.data();
}
}  // namespace

bool unary_bf16_by_table(UnaryOp op, const uint16_t* x, uint16_t* out, int64_t n) {
  const ResultBf16Table* t = result_bf16_table(op);
  if (!t) return false;
  table_bf16_rows(*t, x, out, n);
  return true;
}

const float* derivative_bf16_table(BinaryOp op) {
  switch (op) {
    case BinaryOp::GeluBackward: return derivative_table_of<gelu_derivative>();
    case BinaryOp::SiluBackward: return derivative_table_of<silu_derivative>();
    case BinaryOp::GeluTanhBackward: return derivative_table_of<gelu_tanh_derivative>();
    default: return nullptr;
  }
}

const float* log2_bf16_table() {
  static const Log2Bf16Table table;
  return table.t.data();
}

const uint64_t* ln_f32_table() {
  static const LnF32Table table;
  return table.t.data();
}

}  // namespace kiln::cpu::simd
