// The CPU fusions of the GPT step against float64 references and against the unfused compositions
// they replace: swiglu (silu(gate) * up; its reference and derivatives written in the jit IR and
// evaluated in float64) and add_rms_norm (the residual add and the RMSNorm after it).
#include <omp.h>

#include <cmath>
#include <vector>

#include "jit/ir.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "support/testing.h"

namespace kiln {
namespace {

namespace F = nn::functional;
using testing::rel_error;
using testing::tolerance;

// Applies a float64 IR expression elementwise to equally shaped tensors.
Tensor eval_elementwise(const jit::Expr& e, const std::vector<Tensor>& in) {
  std::vector<std::vector<double>> v;
  for (const Tensor& t : in) v.push_back(t.to_vector());
  std::vector<double> out(v[0].size());
  std::vector<double> args(in.size());
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t k = 0; k < in.size(); ++k) args[k] = v[k][i];
    out[i] = jit::evaluate(e, args);
  }
  return tensor(out, kFloat64).view(in[0].sizes());
}

// gate values across silu's regimes: ordinary, peaked, and past exp's fast range.
Tensor gate_values(const Shape& shape) {
  Tensor g = randn(shape) * 3.0;
  Tensor peaks = (rand(shape) - 0.5) * 200.0;
  return where(gt(rand(shape), 0.9), peaks, g);
}

TEST(Swiglu, MatchesFloat64ReferenceForwardAndBackward) {
  const jit::Expr g = jit::arg(0), u = jit::arg(1), dy = jit::arg(2);
  const jit::Expr s = jit::sigmoid(g);
  const jit::Expr fwd = jit::silu(g) * u, dgate = dy * u * s * (jit::Expr(1.0) + g * (jit::Expr(1.0) - s)),
                  dup = dy * jit::silu(g);
  for (DType dt : {kFloat32, kFloat64, kBFloat16})
    for (const Shape& shape : std::vector<Shape>{{37, 129}, {5}, {2, 3, 64}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      manual_seed(3);
      const Tensor gate = gate_values(shape).to(dt).requires_grad_(true), up = randn(shape).to(dt).requires_grad_(true);
      const Tensor grad = randn(shape).to(dt);
      const Tensor out = F::swiglu(gate, up);
      out.backward(grad);
      const std::vector<Tensor> in = {gate.detach().to(kFloat64), up.detach().to(kFloat64), grad.to(kFloat64)};
      const double tol = dt == kFloat64 ? 1e-13 : dt == kFloat32 ? 2e-6 : tolerance(dt);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_LE(rel_error(out, eval_elementwise(fwd, in)), tol);
      EXPECT_LE(rel_error(gate.grad(), eval_elementwise(dgate, in)), tol);
      EXPECT_LE(rel_error(up.grad(), eval_elementwise(dup, in)), tol);
    }
}

TEST(Swiglu, EqualsTheComposition) {
  manual_seed(4);
  const Tensor g0 = gate_values({64, 200}), u0 = randn({64, 200}), dy = randn({64, 200});
  const Tensor g1 = g0.clone().requires_grad_(true), u1 = u0.clone().requires_grad_(true);
  const Tensor g2 = g0.clone().requires_grad_(true), u2 = u0.clone().requires_grad_(true);
  F::swiglu(g1, u1).backward(dy);
  const Tensor fused = F::swiglu(g1, u1);
  (silu(g2) * u2).backward(dy);
  EXPECT_LE(rel_error(fused, silu(g2) * u2), 2e-6);
  EXPECT_LE(rel_error(g1.grad(), g2.grad()), 2e-6);
  EXPECT_LE(rel_error(u1.grad(), u2.grad()), 2e-6);
}

TEST(Swiglu, GradcheckAndErrors) {
  manual_seed(5);
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return F::swiglu(in[0], in[1]); },
                            {randn({6, 7}, kFloat64).requires_grad_(true), randn({6, 7}, kFloat64).requires_grad_(true)});
  EXPECT_THROW(F::swiglu(randn({2, 3}), randn({3, 2})), Error);
  EXPECT_THROW(F::swiglu(randn({2, 3}), randn({2, 3}, kFloat64)), Error);
}

// The composition add_rms_norm replaces, in float64: the reference.
std::pair<Tensor, Tensor> add_norm_reference(const Tensor& x, const Tensor& r, const Tensor& w, double eps) {
  const Tensor h = x.to(kFloat64) + r.to(kFloat64);
  return {h, F::rms_norm(h, w.defined() ? w.to(kFloat64) : Tensor(), eps)};
}

TEST(AddRmsNorm, MatchesFloat64ReferenceWithBothOutputsUsed) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16})
    for (bool weighted : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (weighted ? " weighted" : ""));
      manual_seed(6);
      const Shape shape{3, 17, 96};
      const Tensor x = (randn(shape) * 2.0).to(dt).requires_grad_(true), r = randn(shape).to(dt).requires_grad_(true);
      const Tensor w = weighted ? (rand({96}) + 0.5).to(dt).requires_grad_(true) : Tensor();
      const Tensor gh = randn(shape).to(dt), gy = randn(shape).to(dt);
      auto [h, y] = F::add_rms_norm(x, r, w, 1e-5);
      autograd::backward({h, y}, {gh, gy});
      // The reference's gradients by autograd in float64 over the composition.
      const Tensor x64 = x.detach().to(kFloat64).requires_grad_(true), r64 = r.detach().to(kFloat64).requires_grad_(true);
      const Tensor w64 = weighted ? w.detach().to(kFloat64).requires_grad_(true) : Tensor();
      auto [h64, y64] = add_norm_reference(x64, r64, w64, 1e-5);
      autograd::backward({h64, y64}, {gh.to(kFloat64), gy.to(kFloat64)});
      const double tol = dt == kFloat64 ? 1e-12 : tolerance(dt);
      EXPECT_LE(rel_error(h, h64), tol);
      EXPECT_LE(rel_error(y, y64), tol);
      EXPECT_LE(rel_error(x.grad(), x64.grad()), tol);
      EXPECT_LE(rel_error(r.grad(), r64.grad()), tol);
      if (weighted) {
        EXPECT_LE(rel_error(w.grad(), w64.grad()), tol);
      }
    }
}

TEST(AddRmsNorm, EqualsTheCompositionAndGradchecks) {
  manual_seed(7);
  const Tensor x0 = randn({40, 64}), r0 = randn({40, 64}), w0 = rand({64}) + 0.5;
  const Tensor x1 = x0.clone().requires_grad_(true), r1 = r0.clone().requires_grad_(true),
               w1 = w0.clone().requires_grad_(true);
  const Tensor x2 = x0.clone().requires_grad_(true), r2 = r0.clone().requires_grad_(true),
               w2 = w0.clone().requires_grad_(true);
  const Tensor c = randn({40, 64});
  auto [h1, y1] = F::add_rms_norm(x1, r1, w1, 1e-5);
  sum(h1 * c + y1 * y1).backward();
  const Tensor h2 = x2 + r2, y2 = F::rms_norm(h2, w2, 1e-5);
  sum(h2 * c + y2 * y2).backward();
  EXPECT_EQ(h1.to_vector(), h2.to_vector());
  EXPECT_EQ(y1.to_vector(), y2.to_vector());
  EXPECT_LE(rel_error(x1.grad(), x2.grad()), 1e-6);
  EXPECT_LE(rel_error(r1.grad(), r2.grad()), 1e-6);
  EXPECT_EQ(w1.grad().to_vector(), w2.grad().to_vector());
  // Only the normalised output used, then only the sum.
  const Tensor x3 = x0.to(kFloat64).requires_grad_(true), r3 = r0.to(kFloat64).requires_grad_(true);
  testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) { return F::add_rms_norm(in[0], in[1], in[2], 1e-3).second; },
      {x3, r3, w0.to(kFloat64).requires_grad_(true)});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return F::add_rms_norm(in[0], in[1], Tensor()).first * 2.0; },
                            {x3, r3});
  EXPECT_THROW(F::add_rms_norm(randn({2, 3}), randn({3, 2}), Tensor()), Error);
}

TEST(AddRmsNorm, BitwiseIndependentOfThreadCount) {
  manual_seed(8);
  const Tensor x0 = randn({300, 64}), r0 = randn({300, 64}), w0 = rand({64}), gy = randn({300, 64});
  std::vector<std::vector<double>> runs;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto [h, y] = F::add_rms_norm(x, r0, w, 1e-5);
    autograd::backward({y}, {gy});
    std::vector<double> all = y.to_vector();
    for (const Tensor& t : {x.grad(), w.grad()})
      for (double v : t.to_vector()) all.push_back(v);
    runs.push_back(all);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace kiln
