// Elementwise backward: float64 finite-difference gradchecks for every differentiable op
// (plain, broadcast, and through create_graph for second derivatives), and the CPU-vs-CUDA
// harness for every op (skipped without a GPU).
#include "ops/elementwise_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::testing::ew;

namespace {
// gradcheck evaluates f under NoGradGuard; a first derivative needs grad mode inside f.
struct EnableGrad {
  bool prev = is_grad_enabled();
  EnableGrad() { set_grad_enabled(true); }
  ~EnableGrad() { set_grad_enabled(prev); }
};

// The perturbed copies gradcheck feeds f do not require grad; differentiate w.r.t. a leaf anyway.
Tensor differentiable(const Tensor& t) { return t.requires_grad() ? t : t.detach().requires_grad_(); }

Tensor leaf(const Shape& shape, bool positive = false, bool nonzero = false) {
  return make_input(shape, kFloat64, positive, nonzero).contiguous().requires_grad_();
}
}  // namespace

TEST(ElementwiseGrad, Unary) {
  manual_seed(20);
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return c.op(in[0]); }, {leaf({3, 4}, c.positive)});
  }
}

TEST(ElementwiseGrad, Binary) {
  manual_seed(21);
  for (const BinaryCase& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    auto f = [&](const std::vector<Tensor>& in) { return c.op(in[0], in[1]); };
    expect_gradcheck(f, {leaf({3, 4}, c.positive_a), leaf({3, 4}, false, c.nonzero_b)});
    // broadcast both ways: [4,1,3] with [2,1] -> [4,2,3]
    expect_gradcheck(f, {leaf({4, 1, 3}, c.positive_a), leaf({2, 1}, false, c.nonzero_b)});
    // only one input requires grad
    expect_gradcheck(f, {leaf({2, 3}, c.positive_a), make_input({3}, kFloat64, false, c.nonzero_b)});
  }
}

TEST(ElementwiseGrad, MixedDtypeGradientsTakeInputDtype) {
  manual_seed(22);
  Tensor a = randn({4, 3}, kBFloat16).requires_grad_(), b = randn({3}).requires_grad_();
  mul(a, b).backward(randn({4, 3}));
  EXPECT_EQ(a.grad().dtype(), kBFloat16);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().sizes(), (Shape{3}));
}

TEST(ElementwiseGrad, Where) {
  manual_seed(23);
  const Tensor c = gt(randn({4, 1, 3}), 0.0);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return where(c, in[0], in[1]); },
                   {leaf({2, 1}), leaf({4, 2, 3})});
}

TEST(ElementwiseGrad, MaximumTiesSplitTheGradient) {
  Tensor a = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_(), b = tensor({1.0, 5.0, 0.0}, kFloat64).requires_grad_();
  maximum(a, b).backward(ones({3}, kFloat64));
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{0.5, 0.0, 1.0}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{0.5, 1.0, 0.0}));
}

TEST(ElementwiseGrad, SecondOrderThroughCreateGraph) {
  manual_seed(24);
  for (const UnaryCase& c : unary_cases()) {
    // piecewise linear or linear: the first derivative does not depend on x
    if (c.name == "relu" || c.name == "abs" || c.name.rfind("clamp", 0) == 0 || c.name == "neg" ||
        c.name == "rsub" || c.name == "scalar_add" || c.name == "scalar_sub" || c.name == "scalar_mul" ||
        c.name == "scalar_div")
      continue;
    SCOPED_TRACE(c.name);
    const Tensor cot = randn({2, 3}, kFloat64);
    auto first = [&](const std::vector<Tensor>& in) {
      EnableGrad on;
      const Tensor x = differentiable(in[0]);
      return autograd::grad({c.op(x)}, {x}, {cot}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    };
    expect_gradcheck(first, {leaf({2, 3}, c.positive)}, 1e-6, 1e-5);
  }
  const Tensor cot = randn({2, 3}, kFloat64);
  for (const BinaryCase& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    auto first = [&](const std::vector<Tensor>& in) {
      EnableGrad on;
      const Tensor a = differentiable(in[0]), b = differentiable(in[1]);
      const std::vector<Tensor> g = autograd::grad({c.op(a, b)}, {a, b}, {cot}, true, true);
      return add(mul(g[0], 1.0), g[1]);
    };
    if (c.name == "maximum" || c.name == "minimum" || c.name.rfind("add", 0) == 0 || c.name.rfind("sub", 0) == 0)
      continue;  // gradients constant in the inputs
    expect_gradcheck(first, {leaf({2, 3}, c.positive_a), leaf({2, 3}, false, c.nonzero_b)}, 1e-6, 1e-5);
  }
}

TEST(ElementwiseCuda, UnaryMatchesCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(30);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      auto f = [&](const std::vector<Tensor>& in) { return c.op(in[0]); };
      // dense (vector path, with a tail) and transposed (strided path)
      expect_cuda_matches_cpu(c.name, f, {make_input({1001}, dt, c.positive, false).requires_grad_()});
      expect_cuda_matches_cpu(c.name, f, {make_input({40, 30}, dt, c.positive, false).t().requires_grad_()});
    }
  }
}

TEST(ElementwiseCuda, BinaryMatchesCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(31);
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      auto f = [&](const std::vector<Tensor>& in) { return c.op(in[0], in[1]); };
      expect_cuda_matches_cpu(c.name, f, {make_input({1003}, dt, c.positive_a, false).requires_grad_(),
                                          make_input({1003}, dt, false, c.nonzero_b).requires_grad_()});
      expect_cuda_matches_cpu(c.name, f, {make_input({4, 1, 5}, dt, c.positive_a, false).requires_grad_(),
                                          make_input({3, 1}, dt, false, c.nonzero_b).requires_grad_()});
    }
  }
}

TEST(ElementwiseCuda, CompareWhereIntegerAndInPlace) {
  KILN_REQUIRE_CUDA();
  manual_seed(32);
  const Tensor a = randint(0, 3, {4, 1, 5}).to(kFloat32), b = randint(0, 3, {3, 1}).to(kFloat32);
  using Cmp = Tensor (*)(const Tensor&, const Tensor&);
  for (Cmp op : std::vector<Cmp>{eq, ne, lt, le, gt, ge}) {
    expect_cuda_matches_cpu("compare", [op](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b});
  }
  expect_cuda_matches_cpu("compare_scalar", [](const std::vector<Tensor>& in) { return le(in[0], 1.0); }, {a});
  const Tensor c = gt(randn({4, 1, 5}), 0.0);
  expect_cuda_matches_cpu("where", [](const std::vector<Tensor>& in) { return where(in[0], in[1], in[2]); },
                          {c, randn({3, 1}).requires_grad_(), randn({5}, kBFloat16).requires_grad_()});
  const Tensor i = randint(-9, 9, {6, 7}), j = randint(1, 4, {7});
  expect_cuda_matches_cpu("int", [](const std::vector<Tensor>& in) { return maximum(add(in[0], in[1], 2.0), mul(in[0], in[1])); },
                          {i, j});
  expect_cuda_matches_cpu("int_div", [](const std::vector<Tensor>& in) { return div(in[0], in[1]); }, {i, j});
  expect_cuda_matches_cpu("promote", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); },
                          {randn({5, 3}, kBFloat16), randn({3})});
  // 0-d CPU tensor meeting a CUDA tensor
  const Tensor s = scalar_tensor(1.5);
  expect_cuda_matches_cpu("cpu_scalar", [&](const std::vector<Tensor>& in) { return mul(in[0], s); }, {randn({9})});
  // in place on a CUDA tensor, dense and strided
  Tensor x = randn({8, 6}), y = randn({6});
  Tensor xc = x.to(Device("cuda")), yc = y.to(Device("cuda"));
  add_(x, y, 0.5);
  add_(xc, yc, 0.5);
  Tensor xt = x.t(), xct = xc.t();
  mul_(xt, 3.0);
  mul_(xct, 3.0);
  EXPECT_CLOSE(xc.cpu(), x, 1e-6);
  // determinism on the device
  const Tensor big = randn({1 << 20}).to(Device("cuda"));
  EXPECT_EQ(gelu(big).to_vector(), gelu(big).to_vector());
}
