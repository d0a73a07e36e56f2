// Autograd engine: accumulation into leaves, graph release, version checks, no_grad, grad().
#include "support/testing.h"

using namespace kiln;

TEST(Autograd, AccumulatesIntoLeavesThroughViews) {
  Tensor x = randn({3, 4}, kFloat64).requires_grad_();
  Tensor y = x.transpose(0, 1).reshape({12});  // non-contiguous path: reshape copies
  Tensor z = sum(add(y, y));
  z.backward();
  ASSERT_TRUE(x.grad().defined());
  for (double g : x.grad().to_vector()) EXPECT_EQ(g, 2.0);
  // a second, independent graph accumulates
  sum(x.slice(1, 0, 2)).backward();
  const auto g = x.grad().to_vector();
  EXPECT_EQ(g[0], 3.0);
  EXPECT_EQ(g[3], 2.0);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(z.is_leaf());
}

// A leaf's first gradient is kept without a copy when the engine alone holds it, and copied when
// anything else can see its memory: the caller's root gradient, one gradient handed to two leaves,
// a view of a larger buffer. Later accumulation never writes into memory a caller sees.
TEST(Autograd, FirstGradientIsTakenOnlyWhenNothingElseSeesIt) {
  Tensor x = randn({4, 3}, kFloat64).requires_grad_(), w = randn({4, 3}, kFloat64).requires_grad_();
  const void* made = nullptr;
  Tensor y = x.detach().clone();
  autograd::record("test_made", {y}, {x}, [&made](const std::vector<Tensor>& g) {
    Tensor fresh = mul(g[0], 2.0);  // a new buffer, the engine's only handle once returned
    made = fresh.data_ptr();
    return std::vector<Tensor>{fresh};
  });
  y.backward(ones({4, 3}, kFloat64));
  EXPECT_EQ(x.grad().data_ptr(), made) << "a gradient only the engine held was copied";
  for (double v : x.grad().to_vector()) EXPECT_EQ(v, 2.0);

  // The root gradient: the caller keeps it, so .grad is a copy and accumulating leaves it alone.
  Tensor root = ones({4, 3}, kFloat64);
  Tensor a = randn({4, 3}, kFloat64).requires_grad_();
  a.backward(root);
  EXPECT_NE(a.grad().data_ptr(), root.data_ptr());
  a.backward(root);
  for (double v : root.to_vector()) EXPECT_EQ(v, 1.0);
  for (double v : a.grad().to_vector()) EXPECT_EQ(v, 2.0);

  // One fresh gradient for two leaves (add's backward hands it to both): no aliasing.
  sum(mul(add(x, w), 3.0)).backward();
  EXPECT_NE(x.grad().data_ptr(), w.grad().data_ptr());
  sum(w).backward();
  for (double v : x.grad().to_vector()) EXPECT_EQ(v, 5.0);
  for (double v : w.grad().to_vector()) EXPECT_EQ(v, 4.0);

  // A view of a larger buffer (the backward keeps the rest): copied, whole and contiguous.
  Tensor big;
  Tensor z = x.detach().clone();
  Tensor p = randn({4, 3}, kFloat64).requires_grad_();
  autograd::record("test_view", {z}, {p}, [&big](const std::vector<Tensor>& g) {
    big = zeros({8, 3}, kFloat64);
    big.narrow(0, 0, 4).copy_(g[0]);
    return std::vector<Tensor>{big.narrow(0, 0, 4)};
  });
  z.backward(ones({4, 3}, kFloat64));
  EXPECT_NE(p.grad().data_ptr(), big.data_ptr());
  sum(p).backward();
  for (double v : big.narrow(0, 0, 4).to_vector()) EXPECT_EQ(v, 1.0);
}

// A node of two outputs where only one is used: by default its backward sees zeros for the other;
// recorded with materialize_grads = false it sees an undefined tensor there.
TEST(Autograd, MaterializeGradsFalseLeavesUnusedOutputsUndefined) {
  for (const bool materialize : {true, false}) {
    Tensor x = randn({5}, kFloat64).requires_grad_();
    Tensor a = x.detach().clone(), b = x.detach().clone();
    bool second_defined = false;
    autograd::record("test_two_outputs", {a, b}, {x}, [&](const std::vector<Tensor>& g) {
      second_defined = g[1].defined();
      if (second_defined) {
        for (double v : g[1].to_vector()) EXPECT_EQ(v, 0.0);
      }
      return std::vector<Tensor>{mul(g[0], 3.0)};
    }, materialize);
    sum(a).backward();
    EXPECT_EQ(second_defined, materialize);
    for (double v : x.grad().to_vector()) EXPECT_EQ(v, 3.0);
  }
}

TEST(Autograd, ExpandBackwardSumsBroadcastDims) {
  Tensor b = randn({3, 1}, kFloat64).requires_grad_();
  sum(b.expand({2, 3, 5})).backward();
  for (double g : b.grad().to_vector()) EXPECT_EQ(g, 10.0);
}

TEST(Autograd, GradcheckViews) {
  Tensor x = randn({2, 3, 4}, kFloat64).requires_grad_();
  kiln::testing::expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].permute({2, 0, 1}).slice(0, 1, 4, 2).expand({5, 2, 2, 3}).reshape({10, 6}).clone();
      },
      {x});
}

TEST(Autograd, BackwardTwiceWithoutRetainRaises) {
  Tensor x = randn({4}, kFloat64).requires_grad_();
  Tensor z = sum(mul(x, 3.0));
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();  // allowed: the graph was retained
  EXPECT_EQ(x.grad().to_vector()[0], 6.0);
  try {
    z.backward();
    FAIL() << "third backward must raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, InPlaceModificationOfSavedTensorRaises) {
  Tensor x = randn({4}, kFloat64).requires_grad_();
  Tensor h = mul(x, 2.0);  // non-leaf
  Tensor saved_user = h.detach();
  SavedTensor saved(saved_user);
  saved_user.fill_(1.0);
  EXPECT_THROW(saved.unpack("test_op"), Error);
  // leaves that require grad refuse in-place writes under grad mode
  EXPECT_THROW(x.fill_(0), Error);
  EXPECT_THROW(h.zero_(), Error);
  {
    NoGradGuard no_grad;
    x.fill_(1.0);  // fine: optimizer-style update
  }
  EXPECT_EQ(x.to_vector()[0], 1.0);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = randn({4}, kFloat64).requires_grad_();
  {
    NoGradGuard no_grad;
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(is_grad_enabled());
  }
  EXPECT_TRUE(is_grad_enabled());
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
}

TEST(Autograd, GradFunctionDoesNotTouchDotGrad) {
  Tensor x = randn({5}, kFloat64).requires_grad_();
  Tensor y = sum(mul(x, 4.0));
  auto g = autograd::grad({y}, {x});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].to_vector()[2], 4.0);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, BadInputsRaise) {
  Tensor x = randn({3}, kFloat64);
  EXPECT_THROW(sum(x).backward(), Error);  // nothing requires grad
  Tensor w = randn({3}, kFloat64).requires_grad_();
  EXPECT_THROW(mul(w, 2.0).backward(), Error);  // non-scalar without grad
  EXPECT_THROW(mul(w, 2.0).backward(ones({4}, kFloat64)), Error);  // wrong grad shape
  EXPECT_THROW(arange(3, kInt64).requires_grad_(), Error);
}

TEST(Autograd, DeterministicSwitch) {
  EXPECT_FALSE(are_deterministic_algorithms_enabled());
  use_deterministic_algorithms(true);
  EXPECT_TRUE(are_deterministic_algorithms_enabled());
  use_deterministic_algorithms(false);
}

TEST(CudaAutograd, GradientsFlowAcrossDevicesAndDtypes) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({6}, kFloat32).requires_grad_();
  Tensor y = x.to(Device("cuda")).to(kBFloat16);
  sum(y.to(kCPU).to(kFloat32)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_FALSE(x.grad().is_cuda());
  for (double g : x.grad().to_vector()) EXPECT_EQ(g, 1.0);
}
