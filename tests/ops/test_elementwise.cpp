// Elementwise forward: float64 references on fresh random inputs in every float dtype,
// broadcasting, non-contiguous operands, 0-d tensors, dtype promotion, integer ops, in-place
// updates, NaN handling, determinism, and error messages.
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/elementwise_test_util.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::testing::ew;

TEST(Elementwise, UnaryMatchesFloat64Reference) {
  manual_seed(1);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      // 1000 elements: several SIMD vectors plus a tail; also odd sizes for the tail path.
      for (const Shape& shape : {Shape{10, 100}, Shape{37}}) {
        const Tensor x = make_input(shape, dt, c.positive, false);
        const Tensor out = c.op(x);
        EXPECT_EQ(out.dtype(), dt);
        EXPECT_EQ(out.sizes(), shape);
        EXPECT_CLOSE(out, ref_map({x}, [&](const std::vector<double>& v) { return c.ref(v[0]); }), tolerance(dt));
      }
    }
  }
}

TEST(Elementwise, BinaryMatchesFloat64Reference) {
  manual_seed(2);
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      for (const Shape& shape : {Shape{8, 125}, Shape{3}}) {
        const Tensor a = make_input(shape, dt, c.positive_a, false);
        const Tensor b = make_input(shape, dt, false, c.nonzero_b);
        const Tensor out = c.op(a, b);
        EXPECT_EQ(out.dtype(), dt);
        EXPECT_CLOSE(out, ref_map({a, b}, [&](const std::vector<double>& v) { return c.ref(v[0], v[1]); }),
                     tolerance(dt));
      }
    }
  }
}

TEST(Elementwise, BroadcastingAndNonContiguous) {
  manual_seed(3);
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : {kFloat32, kBFloat16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      auto ref = [&](const Tensor& a, const Tensor& b) {
        return ref_map({a, b}, [&](const std::vector<double>& v) { return c.ref(v[0], v[1]); });
      };
      // [4,1,5] with [3,1] -> [4,3,5], both ways round.
      const Tensor a = make_input({4, 1, 5}, dt, c.positive_a, false);
      const Tensor b = make_input({3, 1}, dt, false, c.nonzero_b);
      const Tensor out = c.op(a, b);
      EXPECT_EQ(out.sizes(), (Shape{4, 3, 5}));
      EXPECT_CLOSE(out, ref(a, b), tolerance(dt));
      const Tensor a2 = make_input({3, 1}, dt, c.positive_a, false);
      const Tensor b2 = make_input({4, 1, 5}, dt, false, c.nonzero_b);
      EXPECT_CLOSE(c.op(a2, b2), ref(a2, b2), tolerance(dt));
      // transposed a, strided slice b
      const Tensor at = make_input({6, 4}, dt, c.positive_a, false).t();
      const Tensor bs = make_input({4, 12}, dt, false, c.nonzero_b).slice(1, 0, 12, 2);
      ASSERT_FALSE(at.is_contiguous());
      ASSERT_FALSE(bs.is_contiguous());
      EXPECT_CLOSE(c.op(at, bs), ref(at, bs), tolerance(dt));
      // 0-d with 0-d, and 0-d with a vector
      const Tensor s = make_input({}, dt, c.positive_a, false);
      const Tensor s2 = make_input({}, dt, false, c.nonzero_b);
      const Tensor o0 = c.op(s, s2);
      EXPECT_EQ(o0.dim(), 0);
      EXPECT_CLOSE(o0, ref(s, s2), tolerance(dt));
      const Tensor v = make_input({7}, dt, false, c.nonzero_b);
      EXPECT_CLOSE(c.op(s, v), ref(s, v), tolerance(dt));
    }
  }
}

TEST(Elementwise, UnaryNonContiguousMatchesContiguous) {
  manual_seed(4);
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = make_input({33, 20}, kFloat32, c.positive, false);
    const Tensor xt = x.t();  // scalar strided loop vs the SIMD row on the same values
    EXPECT_CLOSE(c.op(xt), c.op(xt.contiguous()), 1e-6);
    const Tensor s = make_input({}, kFloat32, c.positive, false);
    EXPECT_CLOSE(c.op(s), ref_map({s}, [&](const std::vector<double>& v) { return c.ref(v[0]); }), 1e-5);
  }
}

TEST(Elementwise, TypePromotion) {
  manual_seed(5);
  const Tensor bf = randn({4, 3}, kBFloat16), f = randn({4, 3}), d = randn({4, 3}, kFloat64);
  const Tensor i = randint(-5, 5, {4, 3}), i32 = randint(-5, 5, {4, 3}, kInt32);
  EXPECT_EQ(add(bf, f).dtype(), kFloat32);
  EXPECT_CLOSE(add(bf, f), ref_map({bf, f}, [](const std::vector<double>& v) { return v[0] + v[1]; }), 1e-6);
  EXPECT_EQ(mul(i, f).dtype(), kFloat32);
  EXPECT_CLOSE(mul(i, f), ref_map({i, f}, [](const std::vector<double>& v) { return v[0] * v[1]; }), 1e-6);
  EXPECT_EQ(sub(f, d).dtype(), kFloat64);
  EXPECT_EQ(add(i, i32).dtype(), kInt64);
  // a 0-d tensor does not widen a dimensioned one of its kind; a float 0-d makes ints float32
  EXPECT_EQ(add(bf, scalar_tensor(2.0)).dtype(), kBFloat16);
  EXPECT_EQ(add(i, scalar_tensor(0.5)).dtype(), kFloat32);
  EXPECT_EQ(add(scalar_tensor(1.0), scalar_tensor(1.0, kFloat64)).dtype(), kFloat64);
  // a number keeps the tensor's dtype unless its kind is higher (as a Python number in PyTorch)
  EXPECT_EQ(mul(bf, 3.0).dtype(), kBFloat16);
  EXPECT_EQ(add(i, 2).dtype(), kInt64);
  EXPECT_EQ(add(i, 2.0).dtype(), kFloat32);
  // true division of integers
  const Tensor q = div(i, randint(1, 4, {4, 3}));
  EXPECT_EQ(q.dtype(), kFloat32);
  EXPECT_EQ(exp(i).dtype(), kFloat32);
  EXPECT_EQ(gt(bf, f).dtype(), kBool);
}

TEST(Elementwise, IntegerOps) {
  manual_seed(6);
  const Tensor a = randint(-20, 20, {5, 6}), b = randint(1, 7, {5, 6});
  auto check = [&](const Tensor& out, const std::function<double(double, double)>& f) {
    EXPECT_EQ(out.dtype(), kInt64);
    EXPECT_EQ(out.to_vector(), ref_map({a, b}, [&](const std::vector<double>& v) { return f(v[0], v[1]); }).to_vector());
  };
  check(add(a, b, 3.0), [](double x, double y) { return x + 3 * y; });
  check(a - b, [](double x, double y) { return x - y; });
  check(a * b, [](double x, double y) { return x * y; });
  check(maximum(a, b), [](double x, double y) { return std::max(x, y); });
  check(minimum(a, b), [](double x, double y) { return std::min(x, y); });
  const Tensor e = randint(0, 4, {5, 6});
  EXPECT_EQ(pow(a, e).to_vector(),
            ref_map({a, e}, [](const std::vector<double>& v) { return std::pow(v[0], v[1]); }).to_vector());
  EXPECT_EQ(neg(a).to_vector(), ref_map({a}, [](const std::vector<double>& v) { return -v[0]; }).to_vector());
  EXPECT_EQ(abs(a).to_vector(), ref_map({a}, [](const std::vector<double>& v) { return std::fabs(v[0]); }).to_vector());
  EXPECT_EQ(relu(a).to_vector(), ref_map({a}, [](const std::vector<double>& v) { return std::max(v[0], 0.0); }).to_vector());
  EXPECT_EQ(clamp(a, -3.0, 4.0).to_vector(),
            ref_map({a}, [](const std::vector<double>& v) { return std::clamp(v[0], -3.0, 4.0); }).to_vector());
  const Tensor a8 = randint(0, 100, {9}, kUInt8), b8 = randint(0, 100, {9}, kUInt8);
  EXPECT_EQ(maximum(a8, b8).to_vector(),
            ref_map({a8, b8}, [](const std::vector<double>& v) { return std::max(v[0], v[1]); }).to_vector());
}

TEST(Elementwise, Comparisons) {
  manual_seed(7);
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  using CmpS = std::function<Tensor(const Tensor&, double)>;
  using Ref = std::function<bool(double, double)>;
  const std::vector<std::tuple<std::string, Cmp, CmpS, Ref>> cases = {
      {"eq", [](auto& a, auto& b) { return eq(a, b); }, [](auto& a, double b) { return eq(a, b); }, std::equal_to<double>()},
      {"ne", [](auto& a, auto& b) { return ne(a, b); }, [](auto& a, double b) { return ne(a, b); }, std::not_equal_to<double>()},
      {"lt", [](auto& a, auto& b) { return lt(a, b); }, [](auto& a, double b) { return lt(a, b); }, std::less<double>()},
      {"le", [](auto& a, auto& b) { return le(a, b); }, [](auto& a, double b) { return le(a, b); }, std::less_equal<double>()},
      {"gt", [](auto& a, auto& b) { return gt(a, b); }, [](auto& a, double b) { return gt(a, b); }, std::greater<double>()},
      {"ge", [](auto& a, auto& b) { return ge(a, b); }, [](auto& a, double b) { return ge(a, b); }, std::greater_equal<double>()},
  };
  for (const auto& [name, op, op_s, ref] : cases) {
    for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64, kInt64, kInt32}) {
      SCOPED_TRACE(name + " " + dtype_name(dt));
      // small integers so ties happen; a broadcast against a transposed b
      const Tensor a = randint(0, 3, {4, 1, 5}).to(dt);
      const Tensor b = randint(0, 3, {5, 3}).to(dt).t();
      const Tensor out = op(a, b);
      EXPECT_EQ(out.dtype(), kBool);
      EXPECT_EQ(out.to_vector(), ref_map({a, b}, [&](const std::vector<double>& v) { return ref(v[0], v[1]) ? 1.0 : 0.0; })
                                     .to_vector());
      EXPECT_EQ(op_s(a, 1.0).to_vector(),
                ref_map({a}, [&](const std::vector<double>& v) { return ref(v[0], 1.0) ? 1.0 : 0.0; }).to_vector());
    }
  }
}

TEST(Elementwise, Where) {
  manual_seed(8);
  for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64, kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor c = gt(randn({4, 1, 5}), 0.0);
    const Tensor a = randn({3, 1}).to(dt);
    const Tensor b = randn({5}).to(dt).slice(0, 0, 5);
    const Tensor out = where(c, a, b);
    EXPECT_EQ(out.sizes(), (Shape{4, 3, 5}));
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.to_vector(),
              ref_map({c, a, b}, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; }).to_vector());
  }
  EXPECT_EQ(where(gt(randn({3}), 0.0), randn({3}, kBFloat16), randn({3})).dtype(), kFloat32);
}

// Same-shape contiguous operands take the dense byte-select path: every element size, a length
// that spans several thread chunks.
TEST(Elementwise, WhereDense) {
  manual_seed(9);
  const int64_t n = 100003;
  for (DType dt : {kFloat32, kBFloat16, kFloat64, kInt64, kInt8, kUInt8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor c = gt(randn({n}), 0.0);
    const Tensor a = (randn({n}) * 50.0).to(dt), b = (randn({n}) * 50.0).to(dt);
    const std::vector<double> got = where(c, a, b).to_vector(), cv = c.to_vector(), av = a.to_vector(),
                              bv = b.to_vector();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], cv[i] != 0 ? av[i] : bv[i]) << i;
  }
}

TEST(Elementwise, NanAndInfHandling) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = tensor({nan, 1.0, -inf, inf, -2.0, 0.0, 3.0, nan, 100.0}, dt);
    const Tensor y = tensor({0.0, nan, 1.0, -1.0, -3.0, 0.0, 2.0, nan, 1.0}, dt);
    const std::vector<double> mx = maximum(x, y).to_vector();
    EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]) && std::isnan(mx[7]));
    EXPECT_EQ(mx[2], 1.0);
    EXPECT_EQ(mx[4], -2.0);
    EXPECT_TRUE(std::isnan(minimum(x, y).to_vector()[1]));
    EXPECT_TRUE(std::isnan(relu(x).to_vector()[0]));
    EXPECT_TRUE(std::isnan(clamp(x, -1.0, 1.0).to_vector()[0]));
    EXPECT_TRUE(std::isnan(exp(x).to_vector()[0]));
    const std::vector<double> e = exp(x).to_vector();
    EXPECT_EQ(e[2], 0.0);
    EXPECT_EQ(e[3], inf);
    if (dt != kFloat64) {
      EXPECT_EQ(e[8], inf);  // overflow
    }
    const std::vector<double> s = sigmoid(x).to_vector();
    EXPECT_EQ(s[2], 0.0);
    EXPECT_EQ(s[3], 1.0);
    EXPECT_TRUE(std::isnan(s[0]));
    EXPECT_EQ(tanh(x).to_vector()[3], 1.0);
  }
}

TEST(Elementwise, InPlace) {
  manual_seed(9);
  Tensor a = randn({4, 5});
  const Tensor a0 = a.clone(), b = randn({5});
  const uint64_t v0 = a.version();
  add_(a, b, 2.0);
  EXPECT_GT(a.version(), v0);
  EXPECT_CLOSE(a, ref_map({a0, b}, [](const std::vector<double>& v) { return v[0] + 2 * v[1]; }), 1e-6);
  mul_(a, 0.5);
  mul_(a, b);
  sub_(a, b);
  div_(a, 2.0);
  EXPECT_CLOSE(a, ref_map({a0, b}, [](const std::vector<double>& v) {
                 return ((v[0] + 2 * v[1]) * 0.5 * v[1] - v[1]) / 2;
               }), 1e-6);
  // bf16 self, fp32 other: computed in fp32, stored in bf16
  Tensor h = randn({64}, kBFloat16);
  const Tensor h0 = h.clone(), g = randn({64});
  add_(h, g, -0.1);
  EXPECT_EQ(h.dtype(), kBFloat16);
  EXPECT_CLOSE(h, ref_map({h0, g}, [](const std::vector<double>& v) { return v[0] - 0.1 * v[1]; }), 1e-2);
  // a strided self is updated through its view
  Tensor base = randn({6, 4});
  const Tensor base0 = base.clone();
  Tensor col = base.t();
  add_(col, ones({4, 6}));
  EXPECT_CLOSE(base, add(base0, 1.0), 1e-6);
  // leaves that require grad: allowed under NoGradGuard (optimizer step)
  Tensor w = randn({3}).requires_grad_();
  {
    NoGradGuard ng;
    add_(w, ones({3}), -0.5);
    mul_(w, 2.0);
  }
}

TEST(Elementwise, Determinism) {
  manual_seed(10);
  // Large enough for many OpenMP chunks and SIMD tails.
  const Tensor x = randn({1 << 18, 1}).flatten(), y = randn({1 << 18});
  const Tensor xb = x.to(kBFloat16);
  for (int rep = 0; rep < 2; ++rep) {
    EXPECT_EQ(silu(x).to_vector(), silu(x).to_vector());
    EXPECT_EQ(gelu(xb).to_vector(), gelu(xb).to_vector());
    EXPECT_EQ(add(x, y, 0.3).to_vector(), add(x, y, 0.3).to_vector());
    EXPECT_EQ(div(x.t().contiguous(), y).to_vector(), div(x, y).to_vector());
  }
  Tensor xr = x.detach().clone().requires_grad_(), xr2 = x.detach().clone().requires_grad_();
  silu(xr).backward(y);
  silu(xr2).backward(y);
  EXPECT_EQ(xr.grad().to_vector(), xr2.grad().to_vector());
}

TEST(Elementwise, Errors) {
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected a kiln::Error containing " << needle;
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const Tensor a = randn({2, 3}), b = randn({4});
  expect_error([&] { add(a, b); }, "[add]");
  expect_error([&] { mul(a, b); }, "not broadcastable");
  expect_error([&] { maximum(a, randn({3, 2})); }, "[maximum]");
  expect_error([&] { where(randn({2, 3}), a, a); }, "[where] condition must be a bool tensor");
  expect_error([&] { sub(gt(a, 0.0), gt(a, 0.0)); }, "[sub] subtraction with a bool operand");
  expect_error([&] { neg(gt(a, 0.0)); }, "[neg]");
  expect_error([&] { gelu(a, "fast"); }, "[gelu]");
  expect_error([&] { clamp(a, std::nullopt, std::nullopt); }, "[clamp]");
  expect_error([&] { add(a, Tensor()); }, "[add]");
  Tensor leaf = randn({3}).requires_grad_();
  expect_error([&] { add_(leaf, ones({3})); }, "[add_] a leaf tensor that requires grad");
  expect_error([&] { mul_(leaf, 2.0); }, "[mul_]");
  Tensor small = randn({3});
  expect_error([&] { add_(small, randn({2, 3})); }, "[add_] other of shape");
  Tensor ints = randint(0, 5, {3});
  expect_error([&] { add_(ints, randn({3})); }, "[add_] result type float32");
  Tensor expanded = randn({1}).expand({3});
  expect_error([&] { add_(expanded, ones({3})); }, "[add_]");
  // device mismatch: with CUDA the op names it; without CUDA moving to "cuda" already raises
  EXPECT_THROW(add(a, randn({2, 3}).to(Device("cuda"))), kiln::Error);
  if (has_cuda()) expect_error([&] { add(a, randn({2, 3}).to(Device("cuda"))); }, "[add] expected all tensors on one device");
}
