// The element-wise IR: float64 evaluation against written-out formulas, and the CUDA it prints.
#include <cmath>

#include "jit/ir.h"
#include "kiln/error.h"
#include "support/testing.h"

namespace kiln::jit {
namespace {

TEST(JitIr, EvaluatesInFloat64) {
  const Expr x = arg(0), y = arg(1);
  const Expr e = silu(x) * y + exp(-x) / sqrt(y) - max(x, y) + min(x, Expr(0.5)) * tanh(x) + rsqrt(y) + log(y) +
                 sigmoid(y);
  for (double a : {-2.5, -0.3, 0.7, 3.1})
    for (double b : {0.2, 1.3, 4.0}) {
      const double want = a / (1 + std::exp(-a)) * b + std::exp(-a) / std::sqrt(b) - std::max(a, b) +
                          std::min(a, 0.5) * std::tanh(a) + 1 / std::sqrt(b) + std::log(b) + 1 / (1 + std::exp(-b));
      EXPECT_NEAR(evaluate(e, {a, b}), want, 1e-14 * (1 + std::abs(want)));
    }
}

TEST(JitIr, PrintsCuda) {
  Pointwise p{"swiglu_fwd", 2, {silu(arg(0)) * arg(1)}};
  const std::string s = cuda_source(p, "float");
  EXPECT_NE(s.find("extern \"C\" __global__ void swiglu_fwd(const float* __restrict__ in0, const float* "
                   "__restrict__ in1, float* __restrict__ out0, long long n)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("out0[i] = static_cast<float>((kiln_silu(a0) * a1));"), std::string::npos) << s;
  RowSum r{"sumsq", 1, arg(0) * arg(0)};
  EXPECT_NE(cuda_source(r, "float").find("acc += (a0 * a0);"), std::string::npos);
}

TEST(JitIr, RejectsAnInputTheKernelLacks) {
  Pointwise p{"bad", 1, {arg(0) + arg(2)}};
  EXPECT_THROW(cuda_source(p, "float"), Error);
}

}  // namespace
}  // namespace kiln::jit
