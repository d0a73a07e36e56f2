// The mod IR's vocabulary beyond + - * /: sign, sigmoid, floor, to_int / to_float, clamp and float
// modulo, each checked forward against the float64 reference, differentiated by finite differences
// (score and a captured tensor flowing through them), classified soundly by the BlockMask analysis,
// and printed.
#include <cmath>

#include "flex/ir.h"
#include "kiln/flex.h"
#include "kiln/ops.h"
#include "reference.h"
#include "support/testing.h"
#ifdef KILN_WITH_CUDA
#include "cuda_check.h"
#endif

namespace kiln::flex {
namespace {

using kiln::testing::expect_gradcheck;
using testing::MaskFn;
using testing::reference;

double ref_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_fmod(double x, double y) { return x - std::floor(x / y) * y; }
int64_t ref_floor_div(int64_t x, int64_t y) { return static_cast<int64_t>(std::floor(static_cast<double>(x) / y)); }

TEST(FlexModVocabulary, ForwardMatchesReference) {
  const int64_t B = 1, H = 2, L = 23, S = 29, E = 8;
  // Every new op in one score_mod and one mask_mod (a NATTEN-like clamped window on a 2-d grid).
  const ScoreMod smod([](Expr s, Expr, Expr hh, Expr q, Expr kv) {
    const Expr d = to_float(q - kv);
    return s * sigmoid(Expr(0.3) * d) + sign(s) * Expr(0.25) + floor(s * Expr(2.0)) * Expr(0.1) +
           (s % Expr(0.75)) - to_float(to_int(s * Expr(3.0))) * Expr(0.05) + to_float(sign(q - kv) * (hh + 1)) +
           clamp(s, Expr(-0.5), Expr(0.5)) + to_float(q > kv) * Expr(0.2);
  });
  const MaskMod mmod([](Expr, Expr, Expr q, Expr kv) {
    const Expr qx = q % 6, qy = q / 6, kx = kv % 6, ky = kv / 6;
    const Expr cx = clamp(qx, Expr(1), Expr(4)), cy = clamp(qy, Expr(1), Expr(3));
    return ((abs(cx - kx) <= 1) & (abs(cy - ky) <= 1)) | ((sign(kv - q) == -1) & (to_int(to_float(kv) * Expr(0.5)) < 3));
  });
  const MaskFn mfn = [](int64_t, int64_t, int64_t q, int64_t kv) {
    const int64_t qx = q % 6, qy = q / 6, kx = kv % 6, ky = kv / 6;
    const int64_t cx = std::clamp<int64_t>(qx, 1, 4), cy = std::clamp<int64_t>(qy, 1, 3);
    return (std::abs(cx - kx) <= 1 && std::abs(cy - ky) <= 1) || (kv < q && kv / 2 < 3);
  };
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = randn({B, H, L, E}, dt), k = randn({B, H, S, E}, dt), v = randn({B, H, S, E}, dt);
    FlexOptions o;
    o.score_mod = smod;
    o.return_lse = true;
    const BlockMask bm = create_block_mask(mmod, 1, 1, L, S, 8);
    o.block_mask = &bm;
    const FlexOutput r = flex_attention(q, k, v, o);
    const auto [ref_out, ref_lse] = reference(
        q, k, v,
        [](double s, int64_t, int64_t hh, int64_t qi, int64_t kv) {
          const double d = static_cast<double>(qi - kv);
          return s * ref_sigmoid(0.3 * d) + ref_sign(s) * 0.25 + std::floor(s * 2.0) * 0.1 + ref_fmod(s, 0.75) -
                 std::trunc(s * 3.0) * 0.05 + ref_sign(d) * static_cast<double>(hh + 1) + std::clamp(s, -0.5, 0.5) +
                 (qi > kv ? 0.2 : 0.0);
        },
        mfn);
    // fp32 floors and truncations of s may flip where s sits within an ulp of a step: such
    // elements are a handful of random scores, far from this draw; the float64 run is exact.
    const double tol = dt == kFloat64 ? 1e-11 : 1e-5;
    EXPECT_CLOSE(r.out, ref_out, tol);
    EXPECT_CLOSE(r.lse, ref_lse, tol);
  }
}

TEST(FlexModVocabulary, IntegerFloorDivisionAndModuloFollowPython) {
  // (q - kv) // 5 and (q - kv) % 5 on negative operands floor, as Python's and torch's do; the row
  // evaluator and the BlockMask analysis agree with them.
  const MaskMod m([](Expr, Expr, Expr q, Expr kv) { return ((q - kv) / 5 == -1) | ((q - kv) % 5 == 3); });
  const detail::Program p = detail::compile(m.expr);
  detail::RowEval<double> ev(p, 20);
  const BlockMask bm = create_block_mask(m, 1, 1, 20, 20, 4);
  const std::vector<double> blocks = bm.to_dense().to_vector();  // [1, 1, 5, 5]
  for (int64_t q = 0; q < 20; ++q) {
    ev.run(0, 0, q, 0, 20, nullptr);
    for (int64_t kv = 0; kv < 20; ++kv) {
      const int64_t x = q - kv, r = ((x % 5) + 5) % 5;
      const bool want = ref_floor_div(x, 5) == -1 || r == 3;
      EXPECT_EQ(ev.bool_result()[kv] != 0, want) << q << " " << kv;
      if (want) {
        EXPECT_EQ(blocks[(q / 4) * 5 + kv / 4], 1.0) << "block of " << q << ", " << kv << " skipped";
      }
    }
  }
}

TEST(FlexModVocabulary, GradientsThroughNewOps) {
  const int64_t H = 2, L = 7, S = 9;
  const Tensor q = randn({1, H, L, 4}, kFloat64).requires_grad_(), k = randn({1, H, S, 4}, kFloat64).requires_grad_(),
               v = randn({1, H, S, 3}, kFloat64).requires_grad_();
  // Values away from clamp's corners and floor's steps so finite differences see smooth functions.
  const Tensor bias = (randn({H, L + S}, kFloat64) * 0.3).detach().requires_grad_();
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        Captured t = capture(in[3]);
        FlexOptions o;
        o.score_mod = ScoreMod([&](Expr s, Expr, Expr hh, Expr qi, Expr kv) {
          const Expr b = t[hh][qi - kv + S];
          return sigmoid(s) * Expr(2.0) + clamp(b, Expr(-5.0), Expr(5.0)) * sign(b) + s * floor(Expr(2.5)) +
                 (s % Expr(100.0)) + b * to_float(to_int(b * Expr(0.0)));
        });
        return flex_attention(in[0], in[1], in[2], o).out;
      },
      {q, k, v, bias});
}

TEST(FlexModVocabulary, ClampGradientIsTorchs) {
  // torch.clamp passes the gradient where lo <= x <= hi (bounds included) and 0 outside.
  const Tensor q = randn({1, 1, 3, 4}, kFloat64), k = randn({1, 1, 5, 4}, kFloat64), v = randn({1, 1, 5, 2}, kFloat64);
  const Tensor bias = tensor({-2.0, -1.0, 0.5, 1.0, 3.0}, kFloat64).requires_grad_();
  Captured t = capture(bias);
  FlexOptions o;
  o.score_mod = ScoreMod([&](Expr s, Expr, Expr, Expr, Expr kv) { return s + clamp(t[kv], Expr(-1.0), Expr(1.0)); });
  sum(flex_attention(q, k, v, o).out).backward();
  const std::vector<double> g = bias.grad().to_vector();
  EXPECT_EQ(g[0], 0.0);
  EXPECT_NE(g[1], 0.0);
  EXPECT_NE(g[2], 0.0);
  EXPECT_NE(g[3], 0.0);
  EXPECT_EQ(g[4], 0.0);
}

TEST(FlexModVocabulary, ToIntTruncatesAndMapsNanToZero) {
  EXPECT_EQ(detail::float_to_int(2.7f), 2);
  EXPECT_EQ(detail::float_to_int(-2.7), -2);
  EXPECT_EQ(detail::float_to_int(std::nan("")), 0);
  EXPECT_EQ(detail::float_to_int(1e30), int64_t{1} << 62);
  EXPECT_EQ(detail::float_to_int(-1e30f), -(int64_t{1} << 62));
}

TEST(FlexModVocabulary, KindsAndPrinting) {
  const Expr q = q_idx(), kv = kv_idx(), s = score();
  EXPECT_EQ(sign(q - kv).kind(), Kind::Int);
  EXPECT_EQ(sign(s).kind(), Kind::Float);
  EXPECT_EQ(floor(q).node(), q.node());  // floor of an int is the int itself
  EXPECT_EQ(to_int(q > kv).kind(), Kind::Int);
  EXPECT_EQ(to_float(q > kv).kind(), Kind::Float);
  EXPECT_EQ(to_string(sigmoid(s)), "sigmoid(score)");
  EXPECT_EQ(to_string(to_int(floor(s))), "int(floor(score))");
  EXPECT_EQ(to_string(clamp(q, Expr(1), Expr(4))), "min(max(q_idx, 1), 4)");
  EXPECT_EQ(to_string(s % Expr(2.0)), "(score - (floor((score / 2.0)) * 2.0))");
  EXPECT_THROW(sign(q > kv), Error);
  EXPECT_THROW(sigmoid(q > kv), Error);
  EXPECT_THROW(floor(q > kv), Error);
}

#ifdef KILN_WITH_CUDA
// The generated CUDA mods: a NATTEN-like clamped mask and a score_mod with every new op (on values
// a float32 and a float64 evaluation agree on, so no step flips between them), bf16, against the
// float64 reference and the float64 CPU kernels' gradients (q, k, v and the captured bias).
TEST(FlexModVocabularyCuda, NewOpsMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(21);
  const testing::GpuCase c;
  const Tensor bias = (randn({c.Hq, 16}, kFloat64) * 0.5).to(kFloat32).detach().requires_grad_();
  const std::vector<double> bv = bias.to_vector();
  Captured t = capture(bias);
  const ScoreMod smod([&](Expr s, Expr, Expr hh, Expr q, Expr kv) {
    const Expr b = t[hh][clamp(abs(q - kv), Expr(0), Expr(15))];
    return s * sigmoid(b) + clamp(b, Expr(-0.4), Expr(0.4)) + to_float(sign(q - kv)) * Expr(0.25) +
           floor(to_float(q - kv) * Expr(0.25)) * Expr(0.01) + ((to_float(kv) + Expr(0.5)) * Expr(0.25)) % Expr(1.0) +
           to_float(to_int(to_float(kv) * Expr(0.5)) % 3) * Expr(0.1);
  });
  const testing::ScoreFn sfn = [&](double s, int64_t, int64_t hh, int64_t q, int64_t kv) {
    const double b = bv[hh * 16 + std::min<int64_t>(std::abs(q - kv), 15)];
    return s * ref_sigmoid(b) + std::clamp(b, -0.4, 0.4) + ref_sign(static_cast<double>(q - kv)) * 0.25 +
           std::floor(static_cast<double>(q - kv) * 0.25) * 0.01 + ref_fmod((kv + 0.5) * 0.25, 1.0) +
           static_cast<double>((kv / 2) % 3) * 0.1;
  };
  const MaskMod mask([](Expr, Expr, Expr q, Expr kv) {
    return (abs(clamp(q % 20, Expr(3), Expr(16)) - kv % 20) <= 3) | (kv < 40);
  });
  const MaskFn mfn = [](int64_t, int64_t, int64_t q, int64_t kv) {
    return std::abs(std::clamp<int64_t>(q % 20, 3, 16) - kv % 20) <= 3 || kv < 40;
  };
  testing::check_cuda(c, kBFloat16, &mask, mfn, smod, sfn, {bias});
}
#endif

}  // namespace
}  // namespace kiln::flex
