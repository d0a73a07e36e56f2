// What the fused linear cross-entropy reports besides gradients: the loss in fp32 for 16-bit inputs
// (the input's dtype only on request), the predicted tokens and token accuracy (exact, ties to the
// first maximum, across vocabulary tiles), and Liger's token scaling, against the float64
// reference, on the CPU and (with a GPU) on CUDA.
#include <cmath>

#include "kiln/kiln.h"
#include "kiln/lce.h"
#include "lce_reference.h"
#include "support/testing.h"

namespace kiln {
namespace {

using lce_test::RefIn;
using lce_test::RefOut;
using nn::functional::LceStrategy;
using nn::functional::LinearCrossEntropyOptions;
using nn::functional::LinearCrossEntropyResult;
using nn::functional::Reduction;
using testing::rel_error;

constexpr Reduction kReductions[] = {Reduction::Mean, Reduction::Sum, Reduction::None};
constexpr LceStrategy kStrategies[] = {LceStrategy::Memory, LceStrategy::Speed};

// n x h inputs and v classes drawn in f64 and rounded to dt (the reference sees what the op sees);
// integral: small integers, so every logit is exact in fp32 and fp64 alike and ties are common.
RefIn inputs(int64_t n, int64_t h, int64_t classes, DType dt, bool integral) {
  RefIn in;
  in.n = n;
  in.h = h;
  in.v = classes;
  auto draw = [&](const Shape& s, double scale) {
    std::vector<double> v = (randn(s, kFloat64) * scale).to_vector();
    if (integral)
      for (double& e : v) e = std::round(e * 1.5);
    return tensor(v, kFloat64).to(dt).to(kFloat64).to_vector();
  };
  in.x = draw({n, h}, 1.0);
  in.w = draw({classes, h}, integral ? 1.0 : 1.0 / std::sqrt(static_cast<double>(h)));
  std::vector<double> yd = randint(0, classes, {n}).to_vector();
  in.y.assign(yd.begin(), yd.end());
  for (int64_t i = 0; i < n; i += 4) in.y[i] = -100;
  return in;
}

struct Got {
  LinearCrossEntropyResult r;
  Tensor dx, dw;
};

Got run(const RefIn& in, DType dt, const LinearCrossEntropyOptions& base, LceStrategy st, const std::vector<double>& cot,
        Device dev = kCPU) {
  LinearCrossEntropyOptions o = base;
  o.strategy = st;
  o.chunk_tokens = 8;
  o.chunk_vocab = 16;
  Tensor x = tensor(in.x, kFloat64).reshape({in.n, in.h}).to(dev, dt).requires_grad_(true);
  Tensor w = tensor(in.w, kFloat64).reshape({in.v, in.h}).to(dev, dt).requires_grad_(true);
  std::vector<double> yd(in.y.begin(), in.y.end());
  Got g;
  g.r = nn::functional::linear_cross_entropy_with_stats(x, w, tensor(yd, kInt64).to(dev), o);
  const Tensor up = tensor(cot, kFloat64).reshape(g.r.loss.sizes()).to(dev, g.r.loss.dtype());
  const auto grads = autograd::grad({g.r.loss}, {x, w}, {up});
  g.dx = grads[0];
  g.dw = grads[1];
  return g;
}

std::vector<double> cotangent(Reduction red, int64_t n) {
  return red == Reduction::None ? randn({n}, kFloat64).to_vector() : std::vector<double>{1.25};
}

Tensor ref_tensor(const std::vector<double>& v, const Shape& s) { return tensor(v, kFloat64).reshape(s); }

void expect_fp32_loss(Device dev) {
  manual_seed(3);
  for (DType dt : {kBFloat16, kFloat16})
    for (LceStrategy st : kStrategies)
      for (Reduction red : kReductions) {
        SCOPED_TRACE(detail::str_cat(dtype_name(dt), " strategy ", static_cast<int>(st), " reduction ",
                                     static_cast<int>(red)));
        RefIn in = inputs(29, 32, 67, dt, false);
        in.o.reduction = red;
        in.o.z_loss = 1e-3;
        // CUDA keeps 16-bit logit tiles (one rounding per logit): the reference rounds them alike.
        if (dev.is_cuda()) in.logits = dt;
        const std::vector<double> cot = cotangent(red, in.n);
        const RefOut ref = lce_test::reference(in, cot);
        const Got g = run(in, dt, in.o, st, cot, dev);
        EXPECT_EQ(g.r.loss.dtype(), kFloat32);
        const Shape ls = red == Reduction::None ? Shape{in.n} : Shape{};
        EXPECT_LE(rel_error(g.r.loss.to(kFloat64).cpu(), ref_tensor(ref.loss, ls)), 1e-5);
        // On request, the same value rounded to the input's dtype (and still differentiable).
        LinearCrossEntropyOptions o = in.o;
        o.loss_in_input_dtype = true;
        const Got h = run(in, dt, o, st, cot, dev);
        EXPECT_EQ(h.r.loss.dtype(), dt);
        EXPECT_EQ(h.r.loss.to(kFloat64).cpu().to_vector(), g.r.loss.to(dt).to(kFloat64).cpu().to_vector());
        EXPECT_CLOSE(h.dx.to(kFloat64).cpu(), ref_tensor(ref.dx, {in.n, in.h}), testing::tolerance(dt));
        if (::testing::Test::HasFailure()) return;
      }
}

TEST(LinearCrossEntropyOutputs, LossIsFloat32ForSixteenBitInputs) { expect_fp32_loss(kCPU); }

TEST(LinearCrossEntropyOutputs, Float64InputsGiveFloat64Loss) {
  RefIn in = inputs(9, 8, 21, kFloat64, false);
  const Got g = run(in, kFloat64, in.o, LceStrategy::Memory, {1.0});
  EXPECT_EQ(g.r.loss.dtype(), kFloat64);
  EXPECT_LE(rel_error(g.r.loss, ref_tensor(lce_test::reference(in, {1.0}).loss, {})), 1e-12);
}

void expect_exact_predictions(Device dev) {
  manual_seed(5);
  for (DType dt : {kFloat32, kBFloat16})
    for (LceStrategy st : kStrategies)
      for (Reduction red : kReductions) {
        SCOPED_TRACE(detail::str_cat(dtype_name(dt), " strategy ", static_cast<int>(st), " reduction ",
                                     static_cast<int>(red)));
        RefIn in = inputs(37, 6, 53, dt, true);  // integer logits in a small range: many ties
        in.o.reduction = red;
        in.o.label_smoothing = 0.1;  // changes the loss, not the argmax
        const RefOut ref = lce_test::reference(in, cotangent(red, in.n));
        // Half the targets are the argmax, so accuracy is neither 0 nor 1.
        for (int64_t i = 1; i < in.n; i += 2) in.y[i] = ref.predicted[i] >= 0 ? ref.predicted[i] : in.y[i];
        LinearCrossEntropyOptions o = in.o;
        o.return_predicted_tokens = o.return_token_accuracy = true;
        const Got g = run(in, dt, o, st, cotangent(red, in.n), dev);
        const std::vector<double> pred = g.r.predicted_tokens.to(kFloat64).cpu().to_vector();
        int64_t valid = 0, hits = 0, ties = 0;
        for (int64_t i = 0; i < in.n; ++i) {
          const bool ignored = in.y[i] == -100;
          EXPECT_EQ(static_cast<int64_t>(pred[i]), ignored ? -1 : ref.predicted[i]) << "token " << i;
          valid += !ignored;
          hits += !ignored && ref.predicted[i] == in.y[i];
        }
        for (int64_t i = 0; i < in.n; ++i) {  // the draw must exercise the tie rule
          double m = -INFINITY;
          int count = 0;
          for (int64_t j = 0; j < in.v; ++j) {
            double z = 0;
            for (int64_t k = 0; k < in.h; ++k) z += in.x[i * in.h + k] * in.w[j * in.h + k];
            if (z > m) m = z, count = 1;
            else if (z == m) ++count;
          }
          ties += count > 1;
        }
        EXPECT_GT(ties, 0);
        EXPECT_EQ(g.r.predicted_tokens.dtype(), kInt64);
        EXPECT_EQ(g.r.token_accuracy.dtype(), kFloat32);
        if (red == Reduction::None) {
          const std::vector<double> acc = g.r.token_accuracy.cpu().to_vector();
          for (int64_t i = 0; i < in.n; ++i)
            EXPECT_EQ(acc[i], in.y[i] != -100 && ref.predicted[i] == in.y[i] ? 1.0 : 0.0) << "token " << i;
        } else {
          EXPECT_GT(hits, 0);
          EXPECT_LT(hits, valid);
          EXPECT_EQ(g.r.token_accuracy.item(), static_cast<double>(static_cast<float>(hits) / static_cast<float>(valid)));
        }
        if (::testing::Test::HasFailure()) return;
      }
}

TEST(LinearCrossEntropyOutputs, PredictedTokensAndAccuracyAreExact) { expect_exact_predictions(kCPU); }

TEST(LinearCrossEntropyOutputs, AccuracyOfAllIgnoredIsNaN) {
  RefIn in = inputs(5, 4, 9, kFloat32, false);
  for (int64_t& y : in.y) y = -100;
  LinearCrossEntropyOptions o;
  o.return_token_accuracy = o.return_predicted_tokens = true;
  const Got g = run(in, kFloat32, o, LceStrategy::Memory, {1.0});
  EXPECT_TRUE(std::isnan(g.r.token_accuracy.item()));
  for (double p : g.r.predicted_tokens.to_vector()) EXPECT_EQ(p, -1.0);
}

void expect_token_scaling(Device dev) {
  manual_seed(9);
  for (DType dt : {kFloat32, kBFloat16})
    for (LceStrategy st : kStrategies)
      for (Reduction red : kReductions) {
        SCOPED_TRACE(detail::str_cat(dtype_name(dt), " strategy ", static_cast<int>(st), " reduction ",
                                     static_cast<int>(red)));
        RefIn in = inputs(23, 16, 41, dt, false);
        in.o.reduction = red;
        in.o.use_token_scaling = true;
        in.o.z_loss = 1e-2;
        in.o.logit_softcap = 3.0;
        if (dev.is_cuda() && dt != kFloat32) in.logits = dt;
        const std::vector<double> cot = cotangent(red, in.n);
        const RefOut ref = lce_test::reference(in, cot);
        // The scaling must matter: the unscaled loss differs.
        RefIn plain = in;
        plain.o.use_token_scaling = false;
        EXPECT_GT(rel_error(ref_tensor(lce_test::reference(plain, cot).loss, {static_cast<int64_t>(ref.loss.size())}),
                            ref_tensor(ref.loss, {static_cast<int64_t>(ref.loss.size())})),
                  0.1);
        const Got g = run(in, dt, in.o, st, cot, dev);
        const double tol = dt == kFloat32 ? 2e-5 : testing::tolerance(dt);
        const Shape ls = red == Reduction::None ? Shape{in.n} : Shape{};
        EXPECT_CLOSE(g.r.loss.to(kFloat64).cpu(), ref_tensor(ref.loss, ls), tol);
        EXPECT_CLOSE(g.dx.to(kFloat64).cpu(), ref_tensor(ref.dx, {in.n, in.h}), tol);
        EXPECT_CLOSE(g.dw.to(kFloat64).cpu(), ref_tensor(ref.dw, {in.v, in.h}), tol);
        if (::testing::Test::HasFailure()) return;
      }
}

TEST(LinearCrossEntropyOutputs, TokenScalingMatchesReference) { expect_token_scaling(kCPU); }

TEST(LinearCrossEntropyOutputsCuda, LossIsFloat32ForSixteenBitInputs) {
  KILN_REQUIRE_CUDA();
  expect_fp32_loss(Device("cuda"));
}

TEST(LinearCrossEntropyOutputsCuda, PredictedTokensAndAccuracyAreExact) {
  KILN_REQUIRE_CUDA();
  expect_exact_predictions(Device("cuda"));
}

TEST(LinearCrossEntropyOutputsCuda, TokenScalingMatchesReference) {
  KILN_REQUIRE_CUDA();
  expect_token_scaling(Device("cuda"));
}

}  // namespace
}  // namespace kiln
