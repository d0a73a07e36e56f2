// SGD against a float64 loop transcription of torch.optim.SGD over several steps (plain,
// momentum with dampening, Nesterov, weight decay, maximize; fp32, fp64 and bf16 params with an
// fp32 buffer), skipped parameters, state reload, option checks.
#include <cmath>
#include <vector>

#include "kiln/optim.h"
#include "support/testing.h"

namespace kiln {
namespace {

using optim::SGD;
using optim::SGDOptions;
using testing::tolerance;

struct RefState {
  std::vector<double> p, buf;
};

double round_to(DType dt, double x) {
  if (dt == kBFloat16) return static_cast<float>(BFloat16(static_cast<float>(x)));
  if (dt == kFloat32) return static_cast<float>(x);
  return x;
}

void reference_step(RefState& s, const std::vector<double>& grad, const SGDOptions& o, DType dt) {
  const bool first = s.buf.empty();
  if (first) s.buf.assign(grad.size(), 0.0);
  for (size_t i = 0; i < grad.size(); ++i) {
    double g = (o.maximize ? -grad[i] : grad[i]) + o.weight_decay * s.p[i];
    if (o.momentum != 0) {
      s.buf[i] = first ? g : o.momentum * s.buf[i] + (1 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * s.buf[i] : s.buf[i];
    }
    s.p[i] = round_to(dt, s.p[i] - o.lr * g);
  }
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

void run_against_reference(DType dt, const SGDOptions& o) {
  SCOPED_TRACE(dtype_name(dt));
  Tensor p = randn({5, 11}).to(dt).requires_grad_(true);
  RefState ref;
  ref.p = p.to_vector();
  SGD opt({p}, o);
  for (int s = 0; s < 6; ++s) {
    Tensor g = (randn({5, 11}) * (s % 2 ? 0.1 : 2.0)).to(dt);
    p.set_grad(g);
    opt.step();
    reference_step(ref, g.to_vector(), o, dt);
  }
  // bf16 parameters are rounded once per step on both sides; the fp32 buffer keeps them in step.
  EXPECT_LT(max_rel(p.to_vector(), ref.p), dt == kBFloat16 ? 1e-2 : tolerance(dt));
}

TEST(SGD, MatchesTorchSgdForEveryOption) {
  manual_seed(3);
  SGDOptions plain;
  plain.lr = 0.1;
  SGDOptions damped = plain;
  damped.momentum = 0.9, damped.dampening = 0.3, damped.weight_decay = 0.05;
  SGDOptions nesterov = plain;
  nesterov.momentum = 0.8, nesterov.nesterov = true, nesterov.weight_decay = 0.01;
  SGDOptions maximize = damped;
  maximize.maximize = true;
  for (const SGDOptions& o : {plain, damped, nesterov, maximize})
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) run_against_reference(dt, o);
}

TEST(SGD, SkipsParametersWithoutGradientAndReloadsState) {
  manual_seed(4);
  SGDOptions o;
  o.lr = 0.5, o.momentum = 0.9;
  Tensor a = randn({3}).requires_grad_(true), b = randn({2}).requires_grad_(true);
  const std::vector<double> b0 = b.to_vector();
  SGD opt({a, b}, o);
  a.set_grad(ones({3}));
  opt.step();
  EXPECT_EQ(b.to_vector(), b0);
  ASSERT_TRUE(opt.state()[0].defined());
  EXPECT_FALSE(opt.state()[1].defined());

  // A second optimizer restored from the first's buffers takes the same next step.
  Tensor a2 = a.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
  SGD restored({a2, b2}, o);
  restored.load_state(opt.state());
  a.set_grad(full({3}, 0.25));
  a2.set_grad(full({3}, 0.25));
  opt.step();
  restored.step();
  EXPECT_EQ(a.to_vector(), a2.to_vector());
  EXPECT_THROW(restored.load_state({Tensor()}), Error);
  EXPECT_THROW(restored.load_state({ones({4}), Tensor()}), Error);
}

TEST(SGD, RejectsBadOptions) {
  Tensor p = randn({2}).requires_grad_(true);
  SGDOptions o;
  o.nesterov = true;  // without momentum
  EXPECT_THROW(SGD({p}, o), Error);
  o.momentum = 0.9, o.dampening = 0.1;
  EXPECT_THROW(SGD({p}, o), Error);
  SGDOptions negative;
  negative.lr = -1;
  EXPECT_THROW(SGD({p}, negative), Error);
  EXPECT_THROW(SGD({zeros({2}, kInt64)}, SGDOptions{}), Error);
}

TEST(SGDCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  SGDOptions o;
  o.lr = 0.05, o.momentum = 0.9, o.nesterov = true, o.weight_decay = 0.01;
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor pc = randn({33, 65}).to(dt).requires_grad_(true);
    Tensor pg = pc.detach().cuda().requires_grad_(true);
    SGD oc({pc}, o), og({pg}, o);
    for (int s = 0; s < 4; ++s) {
      Tensor g = randn({33, 65}).to(dt);
      pc.set_grad(g.clone());
      pg.set_grad(g.cuda());
      oc.step();
      og.step();
    }
    EXPECT_TRUE(pg.is_cuda() && og.state()[0].is_cuda());
    EXPECT_CLOSE(pg.cpu(), pc, tolerance(dt));
    EXPECT_CLOSE(og.state()[0].cpu(), oc.state()[0], 1e-5);
  }
}

}  // namespace
}  // namespace kiln
