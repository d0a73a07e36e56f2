// AdamW against a float64 loop transcription of torch.optim.AdamW over several steps (fp32,
// fp64, bf16 params with fp32 state), state access and reload, param groups, zero_grad;
// clip_grad_norm_ value, scaling and determinism; the LR schedule; CPU vs CUDA.
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/optim.h"
#include "support/testing.h"

namespace kiln {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using testing::tolerance;

struct RefState {
  std::vector<double> p, m, v;
  int64_t step = 0;
};

double round_to(DType dt, double x) {
  if (dt == kBFloat16) return static_cast<float>(BFloat16(static_cast<float>(x)));
  if (dt == kFloat32) return static_cast<float>(x);
  return x;
}

// One step of torch.optim.AdamW (single-tensor path), in float64; the param is stored in `dt`.
void reference_step(RefState& s, const std::vector<double>& g, const AdamWOptions& o, DType dt) {
  s.step += 1;
  if (s.m.empty()) {
    s.m.assign(g.size(), 0.0);
    s.v.assign(g.size(), 0.0);
  }
  const double bc1 = 1 - std::pow(o.beta1, s.step), bc2 = 1 - std::pow(o.beta2, s.step);
  for (size_t i = 0; i < g.size(); ++i) {
    double p = s.p[i] * (1 - o.lr * o.weight_decay);
    s.m[i] = s.m[i] + (1 - o.beta1) * (g[i] - s.m[i]);
    s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * g[i] * g[i];
    const double denom = std::sqrt(s.v[i]) / std::sqrt(bc2) + o.eps;
    p -= o.lr / bc1 * s.m[i] / denom;
    s.p[i] = round_to(dt, p);
  }
}

Tensor as_tensor(const std::vector<double>& v, const Shape& shape) { return tensor(v, kFloat64).view(shape); }

void run_against_reference(DType dt, const AdamWOptions& o, int steps) {
  SCOPED_TRACE(dtype_name(dt));
  Tensor p = randn({7, 9}).to(dt).requires_grad_(true);
  RefState ref;
  ref.p = p.to_vector();
  AdamW opt({p}, o);
  for (int s = 0; s < steps; ++s) {
    Tensor g = (randn({7, 9}) * (s % 2 ? 0.1 : 3.0)).to(dt);
    p.set_grad(g);
    opt.step();
    reference_step(ref, g.to_vector(), o, dt);
  }
  const optim::AdamWState& st = opt.state()[0];
  EXPECT_EQ(st.step, steps);
  EXPECT_EQ(st.exp_avg.dtype(), dt == kFloat64 ? kFloat64 : kFloat32);
  const double tol = dt == kFloat64 ? 1e-12 : tolerance(dt);
  EXPECT_CLOSE(p, as_tensor(ref.p, {7, 9}), tol);
  EXPECT_CLOSE(st.exp_avg, as_tensor(ref.m, {7, 9}), dt == kFloat64 ? 1e-12 : 1e-5);
  EXPECT_CLOSE(st.exp_avg_sq, as_tensor(ref.v, {7, 9}), dt == kFloat64 ? 1e-12 : 1e-5);
}

TEST(AdamW, MatchesPyTorchAlgorithmDefaults) {
  for (DType dt : {kFloat64, kFloat32}) run_against_reference(dt, AdamWOptions{}, 6);
}

TEST(AdamW, MatchesPyTorchAlgorithmCustomHyperparameters) {
  AdamWOptions o;
  o.lr = 3e-2;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  for (DType dt : {kFloat64, kFloat32}) run_against_reference(dt, o, 8);
}

TEST(AdamW, Bf16ParamsKeepFp32State) {
  AdamWOptions o;
  o.lr = 5e-2;  // large enough that bf16 params move visibly every step
  run_against_reference(kBFloat16, o, 5);
  run_against_reference(kFloat16, o, 5);
}

TEST(AdamW, DecoupledWeightDecayAloneWithZeroGradient) {
  Tensor p = randn({5}).requires_grad_(true);
  const auto before = p.to_vector();
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  AdamW opt({p}, o);
  p.set_grad(zeros({5}));
  opt.step();
  const auto after = p.to_vector();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i] * 0.95, 1e-6 * std::abs(before[i]));
}

TEST(AdamW, SkipsParamsWithoutGradAndZeroGrad) {
  Tensor a = randn({3}).requires_grad_(true), b = randn({4}).requires_grad_(true);
  const auto b_before = b.to_vector();
  AdamW opt({a, b});
  a.set_grad(randn({3}));
  opt.step();
  EXPECT_EQ(b.to_vector(), b_before);
  EXPECT_EQ(opt.state()[1].step, 0);
  EXPECT_FALSE(opt.state()[1].exp_avg.defined());
  EXPECT_EQ(opt.state()[0].step, 1);
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(a.grad().defined());
  for (double v : a.grad().to_vector()) EXPECT_EQ(v, 0.0);
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(AdamW, ParamGroupsUseTheirOwnOptions) {
  Tensor a = randn({6}).requires_grad_(true), b = randn({6}).requires_grad_(true);
  const auto a0 = a.to_vector(), b0 = b.to_vector();
  AdamWOptions decay, no_decay;
  decay.lr = no_decay.lr = 0.1;
  decay.weight_decay = 0.3;
  no_decay.weight_decay = 0.0;
  AdamW opt({{{a}, decay}, {{b}, no_decay}});
  Tensor g = randn({6});
  a.set_grad(g.clone());
  b.set_grad(g.clone());
  opt.step();
  RefState ra{a0, {}, {}, 0}, rb{b0, {}, {}, 0};
  reference_step(ra, g.to_vector(), decay, kFloat32);
  reference_step(rb, g.to_vector(), no_decay, kFloat32);
  EXPECT_CLOSE(a, as_tensor(ra.p, {6}), 1e-6);
  EXPECT_CLOSE(b, as_tensor(rb.p, {6}), 1e-6);
  opt.set_lr(0.01);
  EXPECT_EQ(opt.lr(), 0.01);
  EXPECT_EQ(opt.param_groups()[1].options.lr, 0.01);
}

// Every CPU parameter is updated in one multi-tensor pass over fixed chunks: parameters of
// several sizes (one spanning several chunks, one of one element), dtypes and groups each match
// the float64 reference, and the result does not depend on the thread count.
TEST(AdamW, MultiTensorStepMatchesReferenceAcrossChunksAndGroups) {
  const std::vector<Shape> shapes = {{3}, {16389}, {200, 201}, {1}};
  const std::vector<DType> dtypes = {kFloat32, kFloat64, kBFloat16, kFloat32};
  AdamWOptions a, b;
  a.lr = 3e-3, a.weight_decay = 0.1;
  b.lr = 1e-2, b.weight_decay = 0.0, b.beta1 = 0.8;
  auto run = [&](int threads, std::vector<RefState>* refs) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    manual_seed(21);
    std::vector<Tensor> ps;
    for (size_t i = 0; i < shapes.size(); ++i) ps.push_back(randn(shapes[i]).to(dtypes[i]).requires_grad_(true));
    if (refs)
      for (const Tensor& p : ps) refs->push_back(RefState{p.to_vector(), {}, {}, 0});
    AdamW opt(std::vector<optim::ParamGroup>{{{ps[0], ps[1]}, a}, {{ps[2], ps[3]}, b}});
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < ps.size(); ++i) {
        const Tensor g = (randn(shapes[i]) * (s == 1 ? 0.05 : 2.0)).to(dtypes[i]);
        ps[i].set_grad(g);
        if (refs) reference_step((*refs)[i], g.to_vector(), i < 2 ? a : b, dtypes[i]);
      }
      opt.step();
    }
    omp_set_num_threads(saved);
    return ps;
  };
  std::vector<RefState> refs;
  const std::vector<Tensor> two = run(2, &refs);
  const std::vector<Tensor> one = run(1, nullptr);
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE(i);
    const double tol = dtypes[i] == kFloat64 ? 1e-12 : tolerance(dtypes[i]);
    EXPECT_CLOSE(two[i], as_tensor(refs[i].p, shapes[i]), tol);
    EXPECT_EQ(two[i].to_vector(), one[i].to_vector()) << "the update depends on the thread count";
  }
}

TEST(AdamW, StateReloadContinuesIdentically) {
  Tensor p = randn({4, 4}).requires_grad_(true);
  AdamW opt({p});
  for (int s = 0; s < 3; ++s) {
    p.set_grad(randn({4, 4}));
    opt.step();
  }
  Tensor q = p.detach().clone().requires_grad_(true);
  AdamW opt2({q});
  opt2.load_state(opt.state());
  EXPECT_EQ(opt2.state()[0].step, 3);
  Tensor g = randn({4, 4});
  p.set_grad(g.clone());
  q.set_grad(g.clone());
  opt.step();
  opt2.step();
  EXPECT_EQ(p.to_vector(), q.to_vector());
  std::vector<optim::AdamWState> bad(1);
  bad[0].step = 1;
  bad[0].exp_avg = zeros({3});
  bad[0].exp_avg_sq = zeros({3});
  EXPECT_THROW(opt2.load_state(bad), Error);
}

TEST(AdamW, Errors) {
  Tensor p = randn({2}).requires_grad_(true);
  AdamWOptions o;
  o.lr = -1;
  try {
    AdamW opt({p}, o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[AdamW]"), std::string::npos);
  }
  AdamWOptions b;
  b.beta2 = 1.0;
  EXPECT_THROW(AdamW({p}, b), Error);
  EXPECT_THROW(AdamW({randint(0, 3, {2})}), Error);
}

// ---------------------------------------------------------------- clip_grad_norm_

TEST(ClipGradNorm, ValueAndScaling) {
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> params;
    double ref = 0;
    for (Shape s : {Shape{10, 3}, Shape{7}, Shape{2, 2, 5}}) {
      Tensor p = randn(s).to(dt).requires_grad_(true);
      Tensor g = (randn(s) * 2.0).to(dt);
      for (double v : g.to_vector()) ref += v * v;
      p.set_grad(g);
      params.push_back(p);
    }
    params.push_back(randn({3}).requires_grad_(true));  // no grad: skipped
    ref = std::sqrt(ref);
    std::vector<std::vector<double>> before;
    for (auto& p : params)
      if (p.grad().defined()) before.push_back(p.grad().to_vector());
    // max_norm above the norm: nothing changes.
    Tensor n1 = optim::clip_grad_norm_(params, ref * 2);
    EXPECT_EQ(n1.dtype(), kFloat32);
    EXPECT_NEAR(n1.item(), ref, 1e-6 * ref);
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(params[i].grad().to_vector(), before[i]);
    // max_norm below: every grad scales by max_norm / (norm + 1e-6).
    const double max_norm = ref / 4;
    Tensor n2 = optim::clip_grad_norm_(params, max_norm);
    EXPECT_NEAR(n2.item(), ref, 1e-6 * ref);
    const double coef = max_norm / (ref + 1e-6);
    double after = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      std::vector<double> expect;
      for (double v : before[i]) expect.push_back(v * coef);
      EXPECT_CLOSE(params[i].grad(), as_tensor(expect, params[i].sizes()), tolerance(dt));
      for (double v : params[i].grad().to_vector()) after += v * v;
    }
    EXPECT_NEAR(std::sqrt(after), coef * ref, tolerance(dt) * max_norm * 2);
  }
}

TEST(ClipGradNorm, DeterministicAndEdgeCases) {
  Tensor p = randn({200000}).requires_grad_(true);
  p.set_grad(randn({200000}));
  const double a = optim::clip_grad_norm_({p}, 1e9).item();
  const double b = optim::clip_grad_norm_({p}, 1e9).item();
  EXPECT_EQ(a, b);
  EXPECT_EQ(optim::clip_grad_norm_({randn({2}).requires_grad_(true)}, 1.0).item(), 0.0);  // no grads
  EXPECT_THROW(optim::clip_grad_norm_({p}, -1.0), Error);
}

TEST(LrSchedule, WarmupThenCosine) {
  using optim::warmup_cosine_lr;
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(0, 10, 110, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(9, 10, 110, 1.0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(10, 10, 110, 1.0, 0.1), 1.0);
  EXPECT_NEAR(warmup_cosine_lr(60, 10, 110, 1.0, 0.1), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(110, 10, 110, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(500, 10, 110, 1.0, 0.1), 0.1);
  for (int s = 11; s < 110; ++s)
    EXPECT_LT(warmup_cosine_lr(s, 10, 110, 1.0, 0.1), warmup_cosine_lr(s - 1, 10, 110, 1.0, 0.1));
  EXPECT_THROW(warmup_cosine_lr(0, 20, 10, 1.0), Error);
}

TEST(AdamWCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor pc = randn({33, 65}).to(dt).requires_grad_(true);
    Tensor pg = pc.detach().cuda().requires_grad_(true);
    AdamWOptions o;
    o.lr = 1e-2;
    AdamW oc({pc}, o), og({pg}, o);
    for (int s = 0; s < 4; ++s) {
      Tensor g = randn({33, 65}).to(dt);
      pc.set_grad(g.clone());
      pg.set_grad(g.cuda());
      oc.step();
      og.step();
    }
    EXPECT_TRUE(pg.is_cuda());
    EXPECT_CLOSE(pg.cpu(), pc, tolerance(dt));
    EXPECT_CLOSE(og.state()[0].exp_avg_sq.cpu(), oc.state()[0].exp_avg_sq, 1e-5);
  }
}

// The multi-tensor launches: more parameters than one list holds, dtypes mixed in one optimizer
// (lists split where the dtype changes), an empty parameter, tensors spanning several chunks,
// two groups with their own learning rates and weight decay.
TEST(AdamWCuda, ManyParametersInListsMatchCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(31);
  std::vector<Tensor> cpu_a, cuda_a, cpu_b, cuda_b;
  for (int i = 0; i < 75; ++i) {
    const Shape shape = i % 10 == 3 ? Shape{0} : i % 7 == 0 ? Shape{40000 + i} : Shape{i + 1, 9};
    const Tensor p = randn(shape).to(i % 5 == 0 ? kBFloat16 : kFloat32).requires_grad_(true);
    (i < 50 ? cpu_a : cpu_b).push_back(p);
    (i < 50 ? cuda_a : cuda_b).push_back(p.detach().cuda().requires_grad_(true));
  }
  AdamWOptions oa, ob;
  oa.lr = 1e-2, ob.lr = 3e-3, ob.weight_decay = 0.3;
  AdamW oc(std::vector<optim::ParamGroup>{{cpu_a, oa}, {cpu_b, ob}}), og(std::vector<optim::ParamGroup>{{cuda_a, oa}, {cuda_b, ob}});
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < cpu_a.size() + cpu_b.size(); ++i) {
      Tensor& pc = i < cpu_a.size() ? cpu_a[i] : cpu_b[i - cpu_a.size()];
      Tensor& pg = i < cuda_a.size() ? cuda_a[i] : cuda_b[i - cuda_a.size()];
      const Tensor g = randn(pc.sizes()).to(pc.dtype());
      pc.set_grad(g.clone());
      pg.set_grad(g.cuda());
    }
    oc.step();
    og.step();
  }
  for (size_t i = 0; i < cpu_a.size(); ++i) EXPECT_CLOSE(cuda_a[i].cpu(), cpu_a[i], tolerance(cpu_a[i].dtype()));
  for (size_t i = 0; i < cpu_b.size(); ++i) EXPECT_CLOSE(cuda_b[i].cpu(), cpu_b[i], tolerance(cpu_b[i].dtype()));
  // The clip over the same lists: one norm, every gradient scaled by the same factor.
  std::vector<Tensor> all_c = cpu_a, all_g = cuda_a;
  all_c.insert(all_c.end(), cpu_b.begin(), cpu_b.end());
  all_g.insert(all_g.end(), cuda_b.begin(), cuda_b.end());
  const double nc = optim::clip_grad_norm_(all_c, 0.5).item(), ng = optim::clip_grad_norm_(all_g, 0.5).item();
  EXPECT_NEAR(ng, nc, 1e-5 * nc);
  for (size_t i = 0; i < all_c.size(); ++i)
    EXPECT_CLOSE(all_g[i].grad().cpu(), all_c[i].grad(), tolerance(all_c[i].dtype()));
}

TEST(ClipGradNormCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  std::vector<Tensor> cpu_params, cuda_params;
  for (Shape s : {Shape{1000, 37}, Shape{5}, Shape{300000}}) {
    Tensor p = randn(s).requires_grad_(true);
    p.set_grad(randn(s));
    Tensor q = p.detach().cuda().requires_grad_(true);
    q.set_grad(p.grad().cuda());
    cpu_params.push_back(p);
    cuda_params.push_back(q);
  }
  Tensor nc = optim::clip_grad_norm_(cpu_params, 1.0);
  Tensor ng = optim::clip_grad_norm_(cuda_params, 1.0);
  EXPECT_TRUE(ng.is_cuda());
  EXPECT_NEAR(ng.item(), nc.item(), 1e-6 * nc.item());
  for (size_t i = 0; i < cpu_params.size(); ++i)
    EXPECT_CLOSE(cuda_params[i].grad().cpu(), cpu_params[i].grad(), 1e-6);
  const double again = optim::clip_grad_norm_(cuda_params, 1e9).item();
  EXPECT_EQ(again, optim::clip_grad_norm_(cuda_params, 1e9).item());
}

}  // namespace
}  // namespace kiln
