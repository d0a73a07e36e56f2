// The CUDA fusions of the GPT step against float64 references: rms_norm and add_rms_norm with the
// output cast folded in (x fp32, y bf16 / fp16), the residual in its own dtype, the one-pass and
// wide-row variants and the composition the odd shapes take; swiglu forward and backward.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "support/testing.h"

namespace kiln {
namespace {

namespace F = nn::functional;
using testing::rel_error;
using testing::tolerance;

struct NormCase {
  DType x, y, r;
  int64_t H;
};

std::string name_of(const NormCase& c) {
  return std::string("x ") + dtype_name(c.x) + " y " + dtype_name(c.y) + " residual " + dtype_name(c.r) + " H " +
         std::to_string(c.H);
}

// The coarsest dtype a result passed through: the tolerance it is held to.
double tolerance_of(std::initializer_list<DType> dts) {
  double tol = 0;
  for (DType d : dts) tol = std::max(tol, d == kFloat64 ? 1e-12 : tolerance(d));
  return tol;
}

TEST(FusedNormCuda, AddRmsNormMatchesFloat64Reference) {
  KILN_REQUIRE_CUDA();
  // 768 / 4096 / 100 fp32: the one-pass kernel; 8192 fp32 and 16384 bf16: its wide-row variant;
  // 100 bf16 and 40000 fp32: the composition (a row that is no whole number of 16-byte packs, or
  // one too long).
  const std::vector<NormCase> cases = {
      {kFloat32, kFloat32, kFloat32, 768},   {kFloat32, kBFloat16, kBFloat16, 768},
      {kFloat32, kBFloat16, kFloat32, 4096}, {kFloat32, kFloat16, kFloat16, 768},
      {kFloat32, kFloat32, kBFloat16, 768},  {kBFloat16, kBFloat16, kBFloat16, 4096},
      {kFloat16, kFloat16, kFloat16, 768},   {kFloat64, kFloat64, kFloat64, 768},
      {kFloat32, kBFloat16, kBFloat16, 8192}, {kBFloat16, kBFloat16, kBFloat16, 16384},
      {kFloat32, kBFloat16, kBFloat16, 100}, {kBFloat16, kBFloat16, kBFloat16, 100},
      {kFloat32, kFloat32, kFloat32, 40000}};
  for (const NormCase& c : cases)
    for (bool weighted : {true, false}) {
      SCOPED_TRACE(name_of(c) + (weighted ? " weighted" : ""));
      manual_seed(21);
      const Shape shape{37, c.H};  // 37 rows: a partial last chunk of rows
      const Tensor x = (randn(shape) * 2.0).to(c.x).cuda().requires_grad_(true);
      const Tensor r = randn(shape).to(c.r).cuda().requires_grad_(true);
      const Tensor w = weighted ? (rand({c.H}) + 0.5).to(c.x).cuda().requires_grad_(true) : Tensor();
      const Tensor gh = randn(shape).to(c.x), gy = randn(shape).to(c.y);
      auto [h, y] = F::add_rms_norm(x, r, w, 1e-5, c.y);
      EXPECT_EQ(y.dtype(), c.y);
      autograd::backward({h, y}, {gh.cuda(), gy.cuda()});
      ASSERT_EQ(r.grad().dtype(), c.r);
      // The reference: the composition in float64 from the same (rounded) inputs; h is rounded
      // to its dtype before the norm reads it, as the kernel does.
      const Tensor x64 = x.detach().cpu().to(kFloat64).requires_grad_(true);
      const Tensor r64 = r.detach().cpu().to(kFloat64).requires_grad_(true);
      const Tensor w64 = weighted ? w.detach().cpu().to(kFloat64).requires_grad_(true) : Tensor();
      const Tensor h64 = x64 + r64, y64 = F::rms_norm(h64, w64, 1e-5);
      autograd::backward({h64, y64}, {gh.to(kFloat64), gy.to(kFloat64)});
      EXPECT_LE(rel_error(h.cpu(), h64), tolerance_of({c.x}));
      EXPECT_LE(rel_error(y.cpu(), y64), tolerance_of({c.x, c.y}));
      const double gtol = tolerance_of({c.x, c.y});
      EXPECT_LE(rel_error(x.grad().cpu(), x64.grad()), gtol);
      EXPECT_LE(rel_error(r.grad().cpu(), r64.grad()), tolerance_of({c.x, c.y, c.r}));
      if (weighted) {
        EXPECT_LE(rel_error(w.grad().cpu(), w64.grad()), gtol);
      }
    }
}

TEST(FusedNormCuda, RmsNormOutDtypeAndOnlyOneOutputUsed) {
  KILN_REQUIRE_CUDA();
  manual_seed(22);
  const Tensor x = randn({300, 768}).cuda().requires_grad_(true), w = (rand({768}) + 0.5).cuda().requires_grad_(true);
  const Tensor gy = randn({300, 768}).to(kBFloat16);
  const Tensor y = F::rms_norm(x, w, 1e-5, kBFloat16);
  EXPECT_EQ(y.dtype(), kBFloat16);
  y.backward(gy.cuda());
  const Tensor x64 = x.detach().cpu().to(kFloat64).requires_grad_(true), w64 = w.detach().cpu().to(kFloat64).requires_grad_(true);
  const Tensor y64 = F::rms_norm(x64, w64, 1e-5);
  y64.backward(gy.to(kFloat64));
  EXPECT_LE(rel_error(y.cpu(), y64), tolerance(kBFloat16));
  EXPECT_LE(rel_error(x.grad().cpu(), x64.grad()), tolerance(kBFloat16));
  EXPECT_LE(rel_error(w.grad().cpu(), w64.grad()), tolerance(kBFloat16));
  // add_rms_norm with only h used: the residual stream's gradient passes to both inputs.
  const Tensor a = randn({4, 64}).cuda().requires_grad_(true), b = randn({4, 64}).cuda().to(kBFloat16).requires_grad_(true);
  const Tensor gh = randn({4, 64});
  F::add_rms_norm(a, b, Tensor(), 1e-5, kBFloat16).first.backward(gh.cuda());
  EXPECT_LE(rel_error(a.grad().cpu(), gh.to(kFloat64)), 1e-12);
  EXPECT_LE(rel_error(b.grad().cpu(), gh.to(kFloat64)), tolerance(kBFloat16));
  EXPECT_THROW(F::rms_norm(x, w, 1e-5, kInt32), Error);
}

TEST(FusedNormCuda, WeightGradientIsReproducible) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  const Tensor x0 = randn({4096, 768}).cuda(), r0 = randn({4096, 768}).to(kBFloat16).cuda();
  const Tensor gy = randn({4096, 768}).to(kBFloat16).cuda();
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    const Tensor w = ones({768}).cuda().requires_grad_(true);
    auto [h, y] = F::add_rms_norm(x0, r0, w, 1e-5, kBFloat16);
    autograd::backward({y}, {gy});
    runs.push_back(w.grad().cpu().to_vector());
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(SwigluCuda, MatchesFloat64ReferenceForwardAndBackward) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64})
    for (const Shape& shape : std::vector<Shape>{{64, 2048}, {37, 129}, {5}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      manual_seed(24);
      const Tensor gate = (randn(shape) * 3.0).to(dt).cuda().requires_grad_(true);
      const Tensor up = randn(shape).to(dt).cuda().requires_grad_(true), grad = randn(shape).to(dt);
      const Tensor out = F::swiglu(gate, up);
      out.backward(grad.cuda());
      const Tensor g64 = gate.detach().cpu().to(kFloat64), u64 = up.detach().cpu().to(kFloat64),
                   d64 = grad.to(kFloat64);
      const Tensor s = sigmoid(g64);
      const double tol = dt == kFloat64 ? 1e-12 : tolerance(dt);
      EXPECT_LE(rel_error(out.cpu(), g64 * s * u64), tol);
      EXPECT_LE(rel_error(gate.grad().cpu(), d64 * u64 * s * (1.0 + g64 * (1.0 - s))), tol);
      EXPECT_LE(rel_error(up.grad().cpu(), d64 * g64 * s), tol);
    }
  // A view at an odd offset takes the element-at-a-time kernel.
  const Tensor big = randn({1001}).cuda().requires_grad_(true);
  const Tensor g = big.narrow(0, 1, 1000), u = big.narrow(0, 1, 1000) * 0.5;
  const Tensor out = F::swiglu(g, u);
  sum(out).backward();
  const Tensor g64 = g.detach().cpu().to(kFloat64), s = sigmoid(g64);
  EXPECT_LE(rel_error(out.cpu(), g64 * s * g64 * 0.5), tolerance(kFloat32));
  // d/dg of silu(g) * g / 2: both of swiglu's gradients reach the one input.
  const Tensor dg64 = g64 * 0.5 * s * (1.0 + g64 * (1.0 - s)) + g64 * s * 0.5;
  EXPECT_LE(rel_error(big.grad().cpu().narrow(0, 1, 1000), dg64), tolerance(kFloat32));
  EXPECT_EQ(big.grad().cpu().to_vector()[0], 0.0);
}

}  // namespace
}  // namespace kiln
