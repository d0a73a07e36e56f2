// Accuracy of the SIMD transcendental rows (src/ops/cpu/simd_math-inl.h) against float64
// references over dense sweeps: a dense grid over the interesting range, every 4099th float32
// bit pattern (all exponents: denormals, huge values, both signs, inf, NaN), hand-picked specials
// (+-0, +-inf, NaN, denormals, the overflow/underflow edges); for bf16 every one of the 65536
// bit patterns. Errors are relative for normal results and in units of the smallest denormal
// (2^-149) for denormal ones. The measured maxima are printed.
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "ops/cpu/elementwise.h"
#include "ops/elementwise_test_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Dense grid on [lo, hi], strided bit patterns over all floats, and specials.
std::vector<double> f32_sweep(double lo, double hi) {
  std::vector<double> xs;
  const int grid = 400000;
  for (int i = 0; i <= grid; ++i) xs.push_back(static_cast<float>(lo + (hi - lo) * i / grid));
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) xs.push_back(from_bits(static_cast<uint32_t>(u)));
  for (double s : {0.0, -0.0, kInf, -kInf, kNan, 1e-45, -1e-45, 1e-40, -1e-40, 1.17549435e-38, 87.0, 87.3, 88.0,
                   88.72, 88.73, 89.0, 100.0, 103.9, 104.0, 200.0, 3.4e38, 8.8, 9.0, 9.5, 12.4, 12.5, 15.0, 20.0})
    for (double v : {s, -s}) xs.push_back(static_cast<float>(v));
  return xs;
}

std::vector<double> all_bf16() {
  std::vector<double> xs;
  for (uint32_t b = 0; b < 65536; ++b) xs.push_back(from_bits(b << 16));
  return xs;
}

struct Err {
  double max_rel = 0, at = 0;
  double max_denormal_quanta = 0, at_denormal = 0;
  int64_t bad_special = 0;  // NaN/inf mismatches
  double worst_special = 0;
};

// out (computed in dtype) vs ref (float64, then rounded to dtype's range: overflow must give inf).
Err compare(const std::vector<double>& xs, const std::vector<double>& out, const std::vector<double>& ref,
            double max_finite) {
  Err e;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = ref[i], o = out[i];
    if (std::isnan(r) || std::isnan(o) || std::isinf(o) || std::fabs(r) > max_finite) {
      const bool ok = (std::isnan(r) && std::isnan(o)) ||
                      (!std::isnan(r) && std::isinf(o) && std::fabs(r) > max_finite * (1 - 1e-7) && (o > 0) == (r > 0));
      if (!ok) {
        ++e.bad_special;
        e.worst_special = xs[i];
      }
      continue;
    }
    if (std::fabs(r) < FLT_MIN) {
      const double q = std::fabs(o - r) / std::ldexp(1.0, -149);
      if (q > e.max_denormal_quanta) {
        e.max_denormal_quanta = q;
        e.at_denormal = xs[i];
      }
      continue;
    }
    const double rel = std::fabs(o - r) / std::fabs(r);
    if (rel > e.max_rel) {
      e.max_rel = rel;
      e.at = xs[i];
    }
  }
  return e;
}

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu_d(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_tanh_2u(double x) { return 2 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }
double gelu_tanh_d(double x) { return x / (1.0 + std::exp(-gelu_tanh_2u(x))); }  // = 0.5x(1+tanh u), no cancellation

struct Case {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;      // dense grid
  double f32_bound;   // max relative error allowed in float32 (normal results)
  double denormal_quanta = 2;  // denormal results: at most this many 2^-149 steps off
};

std::vector<Case> cases() {
  return {
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -104, 89, 3e-7},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0, 10, 3e-7},
      {"erf", [](const Tensor& x) { return erf(x); }, [](double x) { return std::erf(x); }, -5, 5, 5e-7},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -10, 10, 3e-7},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_d, -110, 30, 3e-7},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_d(x); }, -110, 30, 3e-7},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_d, -16, 16, 1e-6, 4},
      // 2u = 1.6 (x + 0.045 x^3) carries ~2 ulp; e^-2u turns that into |2u| * 2e-7 relative:
      // ~2e-5 near x = -10, where results are ~1e-37 (the scalar and CUDA paths share this).
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, gelu_tanh_d, -16, 16, 3e-5, 128},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0, 10, 3e-7},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 10, 1e-7},
  };
}

}  // namespace

TEST(ElementwiseAccuracy, Float32DenseSweep) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<double> xs = f32_sweep(c.lo, c.hi);
    const std::vector<double> out = c.op(tensor(xs, kFloat32)).to_vector();
    std::vector<double> ref(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) ref[i] = c.ref(xs[i]);
    const Err e = compare(xs, out, ref, FLT_MAX);
    std::printf("[accuracy] f32  %-9s max rel error %.3g (%.2f ulp) at x=%.9g over %zu inputs; denormal results "
                "within %.2f x 2^-149\n",
                c.name.c_str(), e.max_rel, e.max_rel / FLT_EPSILON, e.at, xs.size(), e.max_denormal_quanta);
    EXPECT_LE(e.max_rel, c.f32_bound) << "at x=" << e.at;
    EXPECT_LE(e.max_denormal_quanta, c.denormal_quanta) << "at x=" << e.at_denormal;
    EXPECT_EQ(e.bad_special, 0) << "NaN/inf mismatch, e.g. at x=" << e.worst_special;
  }
}

// bf16 values on one integer line: consecutive finite bf16 values (denormals included, +-0 both
// 0) differ by 1, so |key(a) - key(b)| counts bf16 steps.
int32_t bf16_key(uint16_t b) { return (b & 0x8000) ? -static_cast<int32_t>(b & 0x7fff) : (b & 0x7fff); }
uint16_t bf16_bits(double v) {  // v must be a bf16 value (or inf/NaN)
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
// The correctly rounded bf16 of a float64 value (nearest, ties to even), without the double
// rounding of going through float32.
uint16_t nearest_bf16(double r) {
  if (std::isnan(r)) return 0x7fc0;
  const float f = static_cast<float>(r);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t t = static_cast<uint16_t>(u >> 16);  // within a step of the answer
  if (std::isinf(f)) {  // beyond float: inf unless r is below the bf16 rounding edge (it is not)
    return t;
  }
  uint16_t best = t;
  double best_d = kInf;
  for (int32_t k = bf16_key(t) - 1; k <= bf16_key(t) + 1; ++k) {
    if (std::abs(k) > 0x7f80) continue;
    const uint16_t b = k < 0 ? static_cast<uint16_t>(0x8000 | -k) : static_cast<uint16_t>(k);
    const double v = from_bits(static_cast<uint32_t>(b) << 16);
    const double dist = std::fabs(v - r);
    if (dist < best_d || (dist == best_d && (b & 1) == 0)) best = b, best_d = dist;
  }
  if (best == 0x0000 && std::signbit(r)) best = 0x8000;  // -0 stays -0 (and tiny negatives round to -0)
  return best;
}

// bf16 ops whose rows look up a table of correctly rounded results (elementwise_tables.cpp).
bool is_bf16_table_op(const std::string& name) {
  for (const char* t : {"gelu", "silu", "gelu_tanh", "log", "tanh", "sigmoid", "erf"})
    if (name == t) return true;
  return false;
}

// Every bf16 input: the result is the correctly rounded bf16 of the float64 reference or one
// bf16 step from it; special inputs (+-0, +-inf, NaN) and NaN results are exact (zero's sign
// included). The count of results off the nearest is printed.
TEST(ElementwiseAccuracy, BFloat16AllValues) {
  const std::vector<double> xs = all_bf16();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<double> out = c.op(tensor(xs, kFloat32).to(kBFloat16)).to_vector();
    int64_t off_nearest = 0, beyond_one = 0, special_bad = 0;
    double worst_at = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double r = c.ref(xs[i]);
      const uint16_t want = nearest_bf16(r), got = bf16_bits(out[i]);
      const bool special_in = xs[i] == 0 || std::isinf(xs[i]) || std::isnan(xs[i]);
      if (std::isnan(r) || std::isnan(out[i]) || special_in) {
        const bool same = (std::isnan(r) && std::isnan(out[i])) || (!std::isnan(r) && want == got);
        if (!same) ++special_bad, worst_at = xs[i];
        continue;
      }
      const int32_t steps = std::abs(bf16_key(want) - bf16_key(got));
      if (steps > 0) ++off_nearest;
      if (steps > 1) ++beyond_one, worst_at = xs[i];
    }
    std::printf("[accuracy] bf16 %-9s %lld of 65536 results one step off the nearest bf16, %lld further\n",
                c.name.c_str(), static_cast<long long>(off_nearest), static_cast<long long>(beyond_one));
    EXPECT_EQ(beyond_one, 0) << "e.g. at x=" << worst_at;
    EXPECT_EQ(special_bad, 0) << "special input or NaN result wrong, e.g. at x=" << worst_at;
    EXPECT_LE(off_nearest, 65536 / 100);
    if (is_bf16_table_op(c.name)) {
      EXPECT_EQ(off_nearest, 0);  // a table of correctly rounded results
    }
  }
}

// The bf16 table rows (gelu, silu, gelu-tanh, log, tanh, sigmoid, erf) on many lengths and offsets and in place, and
// gelu's f32 rows: each bf16 result is the correctly rounded one.
TEST(ElementwiseAccuracy, GeluBFloat16TableRows) {
  const Tensor x = mul(randn({1031}, TensorOptions(kFloat32)), 2.5).to(kBFloat16);
  const std::vector<double> xv = x.to_vector();
  for (const Case& c : cases()) {
    if (!is_bf16_table_op(c.name)) continue;
    SCOPED_TRACE(c.name);
    for (int64_t off : {0, 1, 2, 3}) {
      for (int64_t len : {1, 2, 3, 4, 5, 7, 8, 9, 1000}) {
        const std::vector<double> out = c.op(x.slice(0, off, off + len)).to_vector();
        for (int64_t i = 0; i < len; ++i) {
          const double r = c.ref(xv[off + i]);
          if (std::isnan(r)) {  // log of a negative
            ASSERT_TRUE(std::isnan(out[i]));
            continue;
          }
          ASSERT_EQ(bf16_bits(out[i]), nearest_bf16(r)) << "x=" << xv[off + i] << " len " << len;
        }
      }
    }
  }
  Tensor y = x.clone();
  cpu::unary(UnaryOp::Gelu, y, y, {});
  const std::vector<double> yv = y.to_vector();
  for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(bf16_bits(yv[i]), nearest_bf16(gelu_d(xv[i])));
  // f32 rows run eight vectors per branch, then four, then two, then a padded tail.
  const Tensor xf = mul(randn({1031}, TensorOptions(kFloat32)), 2.0);
  const std::vector<double> xfv = xf.to_vector();
  for (int64_t len : {1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 97, 1000}) {
    const std::vector<double> out = gelu(xf.slice(0, 3, 3 + len)).to_vector();
    for (int64_t i = 0; i < len; ++i) {
      const double r = gelu_d(xfv[3 + i]);
      ASSERT_NEAR(out[i], r, 2e-6 * std::abs(r)) << "x=" << xfv[3 + i] << " len " << len;
    }
  }
  // Strided input takes the generic fp32 loop (src/ops/cpu/elementwise.cpp), whose
  // 0.5 x (1 + erf) flushes the far left tail (x < ~-5.5) to -0: compared with an absolute floor.
  const Tensor xs = x.slice(0, 0, 1030).view({515, 2}).transpose(0, 1);
  const std::vector<double> sv = gelu(xs).to_vector(), xsv = xs.to_vector();
  for (size_t i = 0; i < sv.size(); ++i) EXPECT_NEAR(sv[i], gelu_d(xsv[i]), 8e-3 * std::abs(gelu_d(xsv[i])) + 1e-6);
}

// Large bf16 table rows (at least 4 MiB of output per call) write with non-temporal stores after
// a scalar prologue that aligns them: the same bits as the small-call path, at an odd offset.
TEST(ElementwiseAccuracy, BFloat16TableRowsStreamed) {
  const Tensor all = tensor(all_bf16(), kFloat32).to(kBFloat16);  // 65536 patterns: small calls
  const int64_t n = (int64_t{1} << 23) + 5;
  const Tensor big = mul(randn({n + 1}, TensorOptions(kFloat32)), 3.0).to(kBFloat16).slice(0, 1, n + 1);
  for (UnaryOp op : {UnaryOp::Silu, UnaryOp::GeluTanh}) {
    Tensor small_out = empty_like(all), big_out = empty({n + 3}, TensorOptions(kBFloat16)).slice(0, 3, n + 3);
    cpu::unary(op, small_out, all, {});
    cpu::unary(op, big_out, big, {});
    const uint16_t* want = small_out.data_ptr<uint16_t>();
    const uint16_t *xb = big.data_ptr<uint16_t>(), *got = big_out.data_ptr<uint16_t>();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[i] != want[xb[i]];
    EXPECT_EQ(bad, 0) << "op " << static_cast<int>(op);
  }
}

// The fused backward rows and their float64 derivatives.
struct Bwd {
  std::string name;
  BinaryOp op;
  std::function<double(double)> ref;
};

std::vector<Bwd> backward_rows() {
  return {
      {"silu'", BinaryOp::SiluBackward,
       [](double x) { const double s = sigmoid_d(x); return s * (1 + x * (1 - s)); }},
      {"gelu'", BinaryOp::GeluBackward,
       [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }},
      {"gelu_tanh'", BinaryOp::GeluTanhBackward,
       [](double x) {
         const double s = sigmoid_d(gelu_tanh_2u(x));
         return s + 2 * x * s * (1 - s) * std::sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * x * x);
       }},
  };
}

// The fused backward rows (g = 1): derivative errors relative to max(|ref|, 0.01), as they cross
// zero (two terms of ~0.2 cancel) where a relative error means nothing.
TEST(ElementwiseAccuracy, BackwardFloat32Sweep) {
  const std::vector<Bwd> bwd = backward_rows();
  std::vector<double> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(static_cast<float>(-20 + 40.0 * i / 200000));
  for (double s : {0.0, 1e-40, 50.0, 100.0}) xs.push_back(s), xs.push_back(-s);
  const Tensor x = tensor(xs, kFloat32), g = ones({static_cast<int64_t>(xs.size())});
  for (const Bwd& b : bwd) {
    SCOPED_TRACE(b.name);
    const Tensor out = empty_like(x);
    cpu::binary(b.op, out, g, x, {});
    const std::vector<double> o = out.to_vector();
    double worst = 0, at = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double r = b.ref(xs[i]);
      ASSERT_TRUE(std::isfinite(o[i])) << "x=" << xs[i];
      const double e = std::fabs(o[i] - r) / std::max(std::fabs(r), 0.01);
      if (e > worst) worst = e, at = xs[i];
    }
    std::printf("[accuracy] f32  %-10s max error %.3g at x=%.6g\n", b.name.c_str(), worst, at);
    EXPECT_LE(worst, 1e-5) << "at x=" << at;
  }
}

// The fused backward rows in bf16 (g = 1) over every bf16 x: within one bf16 step of the
// correctly rounded float64 derivative, or, where the derivative crosses zero (two terms of
// ~0.2 cancel), within an absolute 2^-12 (the fp32 budget of ~2^-11 on each term).
TEST(ElementwiseAccuracy, BackwardBFloat16AllValues) {
  const std::vector<Bwd> bwd = backward_rows();
  const std::vector<double> xs = all_bf16();
  const Tensor x = tensor(xs, kBFloat16), g = ones({static_cast<int64_t>(xs.size())}, TensorOptions(kBFloat16));
  for (const Bwd& b : bwd) {
    SCOPED_TRACE(b.name);
    const Tensor out = empty_like(x);
    cpu::binary(b.op, out, g, x, {});
    const std::vector<double> o = out.to_vector();
    int64_t off_nearest = 0, beyond = 0, floor_used = 0, bad_nan = 0;
    double worst_abs = 0, at = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(xs[i]) || std::isinf(xs[i])) {  // NaN in: NaN out (inf: the limits are NaN or 0/1)
        if (std::isnan(xs[i]) && !std::isnan(o[i])) ++bad_nan;
        continue;
      }
      const double r = b.ref(xs[i]);
      const int32_t steps = std::abs(bf16_key(nearest_bf16(r)) - bf16_key(bf16_bits(o[i])));
      if (steps > 0) ++off_nearest;
      if (steps <= 1) continue;
      ++floor_used;
      if (std::fabs(o[i] - r) > worst_abs) worst_abs = std::fabs(o[i] - r), at = xs[i];
      if (std::fabs(o[i] - r) > std::ldexp(1.0, -12)) ++beyond;
    }
    std::printf("[accuracy] bf16 %-10s %lld of 65536 results off the nearest bf16; %lld more than one step off "
                "(near zero crossings), at most %.3g absolute (x=%.6g)\n",
                b.name.c_str(), static_cast<long long>(off_nearest), static_cast<long long>(floor_used), worst_abs, at);
    EXPECT_EQ(beyond, 0) << "at x=" << at;
    EXPECT_EQ(bad_nan, 0);
    EXPECT_LE(off_nearest, 65536 / 100);
    if (b.name == "gelu'" || b.name == "silu'" || b.name == "gelu_tanh'") {
      EXPECT_EQ(off_nearest, 0);  // a table of fp32 values rounded to odd
    }
  }
}

// NaN in gives NaN out in every dtype and op, and bf16 NaN survives the rounding.
TEST(ElementwiseAccuracy, NanPropagates) {
  for (const Case& c : cases()) {
    for (DType dt : {kFloat32, kBFloat16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      std::vector<double> xs(37, 0.5);
      xs[3] = xs[20] = xs[36] = kNan;
      const std::vector<double> out = c.op(tensor(xs, dt)).to_vector();
      EXPECT_TRUE(std::isnan(out[3]) && std::isnan(out[20]) && std::isnan(out[36]));
      EXPECT_FALSE(std::isnan(out[4]));
    }
  }
}

// pow with a tensor exponent against float64 std::pow on fresh random inputs: a wide spread, x
// near 1 with large exponents (y ln x up to the overflow and underflow edges), the bench's
// |randn|^randn, and negative x with integer y (std::pow's lanes). The exponent also as a
// broadcast one-element tensor, which must give the same bits as the expanded copy.
std::vector<std::pair<std::vector<double>, std::vector<double>>> pow_inputs() {
  const int64_t n = 200003;
  auto v = [](const Tensor& t) { return t.to_vector(); };
  const Tensor r1 = randn({n}), r2 = randn({n});
  std::vector<std::pair<std::vector<double>, std::vector<double>>> sets = {
      {v(exp(mul(r1, 4.0))), v(mul(r2, 6.0))},
      {v(add(mul(randn({n}), 0.01), 1.0)), v(mul(randn({n}), 3000.0))},
      {v(abs(randn({n}))), v(randn({n}))},
      {v(neg(exp(randn({n})))), v(mul(randn({n}), 8.0))},
  };
  for (double& e : sets[3].second) e = std::round(e);
  return sets;
}

// Specials: std::pow's results, compared exactly (zero's sign included; any NaN for NaN).
const std::vector<std::pair<double, double>> kPowSpecials = {
    {0, 2}, {-0.0, 3}, {-0.0, 2}, {0, -1}, {-0.0, -1}, {-0.0, -2}, {0, 0}, {kNan, 0}, {kNan, -0.0}, {1, kNan},
    {1, kInf}, {1, -kInf}, {-1, kInf}, {-1, -kInf}, {2, kInf}, {0.5, kInf}, {2, -kInf}, {0.5, -kInf}, {kInf, 2},
    {kInf, -1}, {kInf, 0}, {-kInf, 3}, {-kInf, 2}, {-kInf, -3}, {-kInf, -2}, {-kInf, 0.5}, {-2, 3}, {-2, 2},
    {-2, -1}, {-2, 0.5}, {-8, 1.0 / 3}, {-1, 0.5}, {2, 0}, {kNan, 1}, {2, kNan}, {-0.5, kNan}, {1, 1e30},
    {1, -3.5}, {1e-40, 0}, {1e-40, 1}, {-1e-40, 2}, {2, -149}, {2, -150}, {2, 128}, {2, 200}, {0.5, 200},
    {-3.4e38, 2}, {3.4e38, -0.5}, {-1, 1e30}, {-1, 3}};

TEST(ElementwiseAccuracy, PowTensorExponentFloat32) {
  double worst = 0;
  for (const auto& [xs, ys] : pow_inputs()) {
    const Tensor x = tensor(xs, kFloat32), y = tensor(ys, kFloat32);
    const std::vector<double> xf = x.to_vector(), yf = y.to_vector(), out = pow(x, y).to_vector();
    std::vector<double> ref(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) ref[i] = std::pow(xf[i], yf[i]);
    const Err e = compare(xf, out, ref, FLT_MAX);
    std::printf("[accuracy] f32  pow       max rel error %.3g (%.2f ulp) at x=%.9g; denormal results within %.2f x "
                "2^-149\n", e.max_rel, e.max_rel / FLT_EPSILON, e.at, e.max_denormal_quanta);
    EXPECT_LE(e.max_rel, 2e-7) << "at x=" << e.at;  // measured 0.83 ulp
    EXPECT_LE(e.max_denormal_quanta, 1.0) << "at x=" << e.at_denormal;
    EXPECT_EQ(e.bad_special, 0) << "e.g. at x=" << e.worst_special;
    worst = std::max(worst, e.max_rel);
    // Exponent broadcast from one element: the same bits as the expanded tensor.
    for (int64_t k : {int64_t{0}, int64_t{17}}) {
      const Tensor y1 = y.slice(0, k, k + 1);
      EXPECT_EQ(pow(x, y1).to_vector(), pow(x, y1.expand(x.sizes()).contiguous()).to_vector());
    }
  }
  EXPECT_GT(worst, 0.0);  // the fast formula is not std::pow: a test that sees no error sees nothing
  std::vector<double> sx, sy;
  for (const auto& [a, b] : kPowSpecials) sx.push_back(a), sy.push_back(b);
  for (size_t pad = 0; pad < 20; ++pad) sx.push_back(1.5), sy.push_back(0.5);  // a full vector beside them
  const std::vector<double> xf = tensor(sx, kFloat32).to_vector(), yf = tensor(sy, kFloat32).to_vector();
  const std::vector<double> out = pow(tensor(sx, kFloat32), tensor(sy, kFloat32)).to_vector();
  for (size_t i = 0; i < kPowSpecials.size(); ++i) {
    const double r = static_cast<float>(std::pow(xf[i], yf[i]));
    if (std::isnan(r)) {
      EXPECT_TRUE(std::isnan(out[i])) << "pow(" << xf[i] << ", " << yf[i] << ") = " << out[i];
    } else {
      EXPECT_EQ(out[i], r) << "pow(" << xf[i] << ", " << yf[i] << ")";
      EXPECT_EQ(std::signbit(out[i]), std::signbit(r)) << "pow(" << xf[i] << ", " << yf[i] << ")";
    }
  }
}

// Every SIMD target this CPU can run (AVX2 and older, emulated FMA included): the f32 bound holds
// on each (the fast path needs a real FMA; the others fall back to std::pow).
TEST(ElementwiseAccuracy, PowFloat32OnEverySimdTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  const auto inputs = pow_inputs();
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    for (const auto& [xs, ys] : inputs) {
      const Tensor x = tensor(xs, kFloat32), y = tensor(ys, kFloat32);
      const std::vector<double> xf = x.to_vector(), yf = y.to_vector(), out = pow(x, y).to_vector();
      std::vector<double> ref(xf.size());
      for (size_t i = 0; i < xf.size(); ++i) ref[i] = std::pow(xf[i], yf[i]);
      const Err e = compare(xf, out, ref, FLT_MAX);
      EXPECT_LE(e.max_rel, 2e-7) << "at x=" << e.at;
      EXPECT_EQ(e.bad_special, 0) << "e.g. at x=" << e.worst_special;
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the CPU's own choice
}

// bf16: within one step of the correctly rounded bf16 of the float64 result, few off the nearest;
// specials exact.
TEST(ElementwiseAccuracy, PowTensorExponentBFloat16) {
  for (const auto& [xs, ys] : pow_inputs()) {
    const Tensor x = tensor(xs, kBFloat16), y = tensor(ys, kBFloat16);
    const std::vector<double> xb = x.to_vector(), yb = y.to_vector(), out = pow(x, y).to_vector();
    int64_t off = 0, beyond = 0, special_bad = 0;
    double at = 0;
    for (size_t i = 0; i < xb.size(); ++i) {
      const double r = std::pow(xb[i], yb[i]);
      if (std::isnan(r) || std::isnan(out[i])) {
        if (std::isnan(r) != std::isnan(out[i])) ++special_bad, at = xb[i];
        continue;
      }
      const int32_t steps = std::abs(bf16_key(nearest_bf16(r)) - bf16_key(bf16_bits(out[i])));
      if (steps > 0) ++off;
      if (steps > 1) ++beyond, at = xb[i];
    }
    std::printf("[accuracy] bf16 pow       %lld of %zu results one step off the nearest bf16, %lld further\n",
                static_cast<long long>(off), xb.size(), static_cast<long long>(beyond));
    EXPECT_EQ(beyond, 0) << "e.g. at x=" << at;
    EXPECT_EQ(special_bad, 0) << "e.g. at x=" << at;
    EXPECT_LE(off, static_cast<int64_t>(xb.size()) / 50);
    const Tensor y1 = y.slice(0, 5, 6);
    EXPECT_EQ(pow(x, y1).to_vector(), pow(x, y1.expand(x.sizes()).contiguous()).to_vector());
  }
  std::vector<double> sx, sy;
  for (const auto& [a, b] : kPowSpecials) sx.push_back(a), sy.push_back(b);
  const Tensor x = tensor(sx, kBFloat16), y = tensor(sy, kBFloat16);
  const std::vector<double> xb = x.to_vector(), yb = y.to_vector(), out = pow(x, y).to_vector();
  for (size_t i = 0; i < xb.size(); ++i) {
    const double r = std::pow(xb[i], yb[i]);
    if (std::isnan(r)) {
      EXPECT_TRUE(std::isnan(out[i])) << "pow(" << xb[i] << ", " << yb[i] << ")";
    } else {
      EXPECT_EQ(bf16_bits(out[i]), nearest_bf16(r)) << "pow(" << xb[i] << ", " << yb[i] << ") = " << out[i];
    }
  }
}

// bf16 gelu, silu and gelu-tanh backward by table (g t[x] in fp32, rounded once) with random g,
// on many lengths and offsets (chunked lookups, vector blocks, scalar tail) and in place over x:
// within one bf16 step of the correctly rounded float64 g f'(x), few off the nearest.
TEST(ElementwiseAccuracy, GeluBackwardBFloat16TableRows) {
  const Tensor g = randn({1031}).to(kBFloat16), x = mul(randn({1031}), 2.5).to(kBFloat16);
  const std::vector<double> gv = g.to_vector(), xv = x.to_vector();
  for (const Bwd& b : backward_rows()) {
    if (b.name != "gelu'" && b.name != "silu'" && b.name != "gelu_tanh'") continue;  // the table rows
    SCOPED_TRACE(b.name);
    int64_t off = 0, total = 0;
    auto check = [&](const std::vector<double>& out, int64_t o, int64_t len) {
      for (int64_t i = 0; i < len; ++i) {
        const double r = gv[o + i] * b.ref(xv[o + i]);
        const int32_t steps = std::abs(bf16_key(nearest_bf16(r)) - bf16_key(bf16_bits(out[i])));
        ASSERT_LE(steps, 1) << "g=" << gv[o + i] << " x=" << xv[o + i] << " len " << len;
        off += steps, ++total;
      }
    };
    for (int64_t o : {0, 1, 2, 3}) {
      for (int64_t len : {1, 2, 15, 16, 17, 33, 511, 512, 513, 1000}) {
        const Tensor out = empty({len}, TensorOptions(kBFloat16));
        cpu::binary(b.op, out, g.slice(0, o, o + len), x.slice(0, o, o + len), {});
        check(out.to_vector(), o, len);
      }
    }
    Tensor y = x.clone();
    cpu::binary(b.op, y, g, y, {});
    check(y.to_vector(), 0, 1031);
    std::printf("[accuracy] bf16 %s (table, random g) %lld of %lld results one step off the nearest bf16\n",
                b.name.c_str(), static_cast<long long>(off), static_cast<long long>(total));
    EXPECT_LE(off, total / 100);
  }
}
