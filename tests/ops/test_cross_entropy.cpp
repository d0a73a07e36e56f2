// cross_entropy (the unfused reference): every combination of class weight x ignore_index x
// reduction x label smoothing against a float64 loop reference written from PyTorch's
// definition (log_softmax, nll, smoothing term, mean over the targets' weights), gradients
// included; gradchecks; int32 targets; all-ignored; CPU vs CUDA; errors.
#include <cmath>
#include <string>
#include <vector>

#include "support/testing.h"

namespace kiln {
namespace {

namespace F = nn::functional;
using F::CrossEntropyOptions;
using F::Reduction;
using testing::expect_cuda_matches_cpu;
using testing::expect_gradcheck;
using testing::tolerance;

struct CeRef {
  Tensor loss, grad;
};

// grad_out: one value (mean/sum) or N values (none).
CeRef ce_reference(const Tensor& logits, const std::vector<int64_t>& target, const std::vector<double>& weight,
                   int64_t ignore, Reduction red, double eps, const std::vector<double>& grad_out) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const auto x = logits.contiguous().to_vector();
  auto w = [&](int64_t c) { return weight.empty() ? 1.0 : weight[c]; };
  std::vector<double> logp(x.size()), nll(N, 0), smooth(N, 0);
  double denom = 0;
  for (int64_t i = 0; i < N; ++i) {
    double m = -INFINITY;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[i * C + c]);
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[i * C + c] - m);
    for (int64_t c = 0; c < C; ++c) logp[i * C + c] = x[i * C + c] - m - std::log(s);
    if (target[i] == ignore) continue;
    nll[i] = -w(target[i]) * logp[i * C + target[i]];
    for (int64_t c = 0; c < C; ++c) smooth[i] -= w(c) * logp[i * C + c];
    denom += w(target[i]);
  }
  std::vector<double> loss;
  if (red == Reduction::None) {
    for (int64_t i = 0; i < N; ++i) loss.push_back((1 - eps) * nll[i] + eps / C * smooth[i]);
  } else {
    double a = 0, b = 0;
    for (int64_t i = 0; i < N; ++i) {
      a += nll[i];
      b += smooth[i];
    }
    if (red == Reduction::Mean) {
      a /= denom;
      b /= denom;
    }
    loss.push_back((1 - eps) * a + eps / C * b);
  }
  // d loss / d logp, then through log_softmax: dx_c = dlogp_c - p_c sum_k dlogp_k.
  std::vector<double> grad(x.size(), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    if (target[i] == ignore) continue;
    double coef = red == Reduction::None ? grad_out[i] : grad_out[0];
    if (red == Reduction::Mean) coef /= denom;
    std::vector<double> dlogp(C);
    double total = 0;
    for (int64_t c = 0; c < C; ++c) {
      dlogp[c] = coef * (-(eps / C) * w(c) - (c == target[i] ? (1 - eps) * w(c) : 0.0));
      total += dlogp[c];
    }
    for (int64_t c = 0; c < C; ++c) grad[i * C + c] = dlogp[c] - std::exp(logp[i * C + c]) * total;
  }
  Tensor lt = tensor(loss, kFloat64);
  if (red != Reduction::None) lt = lt.view({});
  return {lt, tensor(grad, kFloat64).view({N, C})};
}

const char* reduction_name(Reduction r) {
  return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none";
}

struct Case {
  bool weighted;
  int ignore_mode;  // 0: nothing ignored, 1: ignore_index -100 present, 2: ignore_index = class 2
  Reduction reduction;
  double smoothing;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (bool w : {false, true})
    for (int ig : {0, 1, 2})
      for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
        for (double ls : {0.0, 0.15}) cases.push_back({w, ig, r, ls});
  return cases;
}

std::string case_name(const Case& c) {
  return std::string(c.weighted ? "weight" : "no-weight") + " ignore" + std::to_string(c.ignore_mode) + " " +
         reduction_name(c.reduction) + " ls=" + std::to_string(c.smoothing);
}

// Targets for a case: class indices with a few rows set to the ignored value.
std::vector<int64_t> make_targets(int64_t N, int64_t C, int ignore_mode, int64_t* ignore) {
  const auto r = randint(0, C, {N}).to_vector();
  std::vector<int64_t> t(r.begin(), r.end());
  *ignore = ignore_mode == 2 ? 2 : -100;
  if (ignore_mode == 1) {
    t[1] = -100;
    t[N - 2] = -100;
  } else if (ignore_mode == 2) {
    t[0] = 2;
    t[3] = 2;
  } else {
    for (auto& v : t) v = v == 2 ? 1 : v;  // keep it simple: class 2 never appears
  }
  return t;
}

Tensor targets_tensor(const std::vector<int64_t>& t, DType dtype = kInt64) {
  return tensor(std::vector<double>(t.begin(), t.end()), kFloat64).to(dtype);
}

void check_case(const Case& c, DType dt, double scale) {
  SCOPED_TRACE(case_name(c) + " " + dtype_name(dt) + " scale=" + std::to_string(scale));
  const int64_t N = 13, C = 6;
  int64_t ignore = -100;
  const std::vector<int64_t> t = make_targets(N, C, c.ignore_mode, &ignore);
  Tensor logits = (randn({N, C}) * scale).to(dt).requires_grad_(true);
  std::vector<double> w;
  CrossEntropyOptions opt;
  opt.ignore_index = ignore;
  opt.reduction = c.reduction;
  opt.label_smoothing = c.smoothing;
  if (c.weighted) {
    Tensor wt = rand({C}) + ones({C}) * 0.25;
    w = wt.to_vector();
    opt.weight = wt.to(dt);
    w = opt.weight.to_vector();  // what the kernel sees
  }
  Tensor loss = F::cross_entropy(logits, targets_tensor(t), opt);
  Tensor g = c.reduction == Reduction::None ? randn({N}).to(dt) : scalar_tensor(1.7, dt);
  loss.backward(g);
  const CeRef ref = ce_reference(logits.detach(), t, w, ignore, c.reduction, c.smoothing, g.to_vector());
  const double tol = dt == kFloat64 ? 1e-10 : tolerance(dt);
  EXPECT_EQ(loss.dtype(), dt);
  EXPECT_CLOSE(loss, ref.loss, tol);
  EXPECT_CLOSE(logits.grad(), ref.grad, tol);
}

TEST(CrossEntropy, AllOptionCombinationsFloat64) {
  for (const Case& c : all_cases()) check_case(c, kFloat64, 1.0);
}

TEST(CrossEntropy, AllOptionCombinationsFloat32AndPeaked) {
  for (const Case& c : all_cases()) {
    check_case(c, kFloat32, 1.0);
    check_case(c, kFloat32, 25.0);  // peaked logits
  }
}

TEST(CrossEntropy, LowPrecision) {
  for (const Case& c : all_cases()) {
    if (c.ignore_mode == 0) continue;
    check_case(c, kBFloat16, 3.0);
  }
  check_case({true, 1, Reduction::Mean, 0.1}, kFloat16, 3.0);
}

TEST(CrossEntropy, KnownValue) {
  // -log softmax([1, 2, 3])[2] = log(1 + e^-1 + e^-2)
  Tensor loss = F::cross_entropy(tensor({1, 2, 3}).view({1, 3}), tensor({2}, kInt64));
  EXPECT_NEAR(loss.item(), std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
}

TEST(CrossEntropy, Int32TargetsMatchInt64) {
  Tensor logits = randn({9, 5});
  const auto r = randint(0, 5, {9}).to_vector();
  std::vector<int64_t> t(r.begin(), r.end());
  CrossEntropyOptions opt;
  opt.label_smoothing = 0.2;
  EXPECT_EQ(F::cross_entropy(logits, targets_tensor(t, kInt32), opt).item(),
            F::cross_entropy(logits, targets_tensor(t, kInt64), opt).item());
}

TEST(CrossEntropy, AllIgnored) {
  Tensor logits = randn({4, 3}).requires_grad_(true);
  Tensor t = full({4}, -100, kInt64);
  Tensor mean = F::cross_entropy(logits, t);
  EXPECT_TRUE(std::isnan(mean.item()));  // PyTorch: 0 / 0
  mean.backward();
  for (double v : logits.grad().to_vector()) EXPECT_EQ(v, 0.0);
  CrossEntropyOptions sum;
  sum.reduction = Reduction::Sum;
  EXPECT_EQ(F::cross_entropy(logits, t, sum).item(), 0.0);
  CrossEntropyOptions none;
  none.reduction = Reduction::None;
  for (double v : F::cross_entropy(logits, t, none).to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(CrossEntropy, Gradcheck) {
  for (const Case& c : {Case{true, 1, Reduction::Mean, 0.1}, Case{false, 2, Reduction::None, 0.3},
                        Case{true, 0, Reduction::Sum, 0.0}}) {
    SCOPED_TRACE(case_name(c));
    int64_t ignore = -100;
    const auto t = make_targets(6, 4, c.ignore_mode, &ignore);
    CrossEntropyOptions opt;
    opt.ignore_index = ignore;
    opt.reduction = c.reduction;
    opt.label_smoothing = c.smoothing;
    if (c.weighted) opt.weight = rand({4}, kFloat64) + ones({4}, kFloat64);
    Tensor target = targets_tensor(t);
    Tensor logits = randn({6, 4}, kFloat64).requires_grad_(true);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return F::cross_entropy(in[0], target, opt); }, {logits});
  }
}

TEST(CrossEntropy, Deterministic) {
  Tensor logits = randn({300, 77});
  Tensor t = randint(0, 77, {300});
  const double a = F::cross_entropy(logits, t).item();
  const double b = F::cross_entropy(logits, t).item();
  EXPECT_EQ(a, b);
}

TEST(CrossEntropy, Errors) {
  Tensor logits = randn({4, 3});
  auto expect_ce_error = [](auto fn) {
    try {
      fn();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[cross_entropy]"), std::string::npos) << e.what();
    }
  };
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, 3, 0}, kInt64)); });   // out of range
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, -1, 0}, kInt64)); });  // negative
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, 2}, kInt64)); });      // length
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, 2, 0}, kFloat32)); }); // dtype
  expect_ce_error([&] { F::cross_entropy(randn({4}), tensor({0}, kInt64)); });         // rank
  CrossEntropyOptions opt;
  opt.weight = ones({4});
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, 2, 0}, kInt64), opt); });
  CrossEntropyOptions ls;
  ls.label_smoothing = 1.5;
  expect_ce_error([&] { F::cross_entropy(logits, tensor({0, 1, 2, 0}, kInt64), ls); });
}

TEST(CrossEntropyCuda, MatchesCpuForEveryOption) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kBFloat16}) {
    for (const Case& c : all_cases()) {
      SCOPED_TRACE(case_name(c));
      const int64_t N = 37, C = 1000;
      int64_t ignore = -100;
      const auto t = make_targets(N, C, c.ignore_mode, &ignore);
      CrossEntropyOptions opt;
      opt.ignore_index = ignore;
      opt.reduction = c.reduction;
      opt.label_smoothing = c.smoothing;
      Tensor w = c.weighted ? (rand({C}) + ones({C})).to(dt) : Tensor();
      Tensor logits = (randn({N, C}) * 4.0).to(dt).requires_grad_(true);
      expect_cuda_matches_cpu("cross_entropy", [opt](const std::vector<Tensor>& in) {
        CrossEntropyOptions o = opt;
        o.weight = in[2];
        return F::cross_entropy(in[0], in[1], o);
      }, {logits, targets_tensor(t), w});
    }
  }
  // Out-of-range targets raise on CUDA too.
  EXPECT_THROW(F::cross_entropy(randn({3, 4}).cuda(), tensor({0, 9, 1}, kInt64).cuda()), Error);
}

}  // namespace
}  // namespace kiln
