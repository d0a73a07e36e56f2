// RNG state (get/set_rng_state, per CUDA device) and autocast (AutocastGuard, casts at op entry).
#include <thread>

#include "support/testing.h"

using namespace kiln;
using kiln::testing::tolerance;

namespace {
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return false;
  return true;
}
}  // namespace

TEST(RngState, RestoreReplaysTheSameNumbers) {
  manual_seed(123);
  (void)randn({7});
  const Tensor st = get_rng_state();
  EXPECT_EQ(st.dtype(), kInt64);
  EXPECT_EQ(st.sizes(), Shape({2}));
  EXPECT_EQ(st.to_vector()[0], 123.0);
  const Tensor a = randn({33}), b = rand({5, 3}), c = randint(0, 1000, {9});
  const Tensor d = nn::functional::dropout(ones({64}), 0.5, true);
  set_rng_state(st);
  EXPECT_TRUE(bitwise_equal(randn({33}), a));
  EXPECT_TRUE(bitwise_equal(rand({5, 3}), b));
  EXPECT_TRUE(bitwise_equal(randint(0, 1000, {9}), c));
  EXPECT_TRUE(bitwise_equal(nn::functional::dropout(ones({64}), 0.5, true), d));
  // The state advances by ceil(numel / 4) Philox counters per op.
  EXPECT_GT(get_rng_state().to_vector()[1], st.to_vector()[1]);
}

TEST(RngState, SeedFromStateAndManualSeedResets) {
  manual_seed(5);
  const Tensor ref = randn({10});
  manual_seed(99);
  (void)randn({3});
  set_rng_state(tensor({5, 0}, kInt64));  // seed 5, offset 0 == manual_seed(5)
  EXPECT_TRUE(bitwise_equal(randn({10}), ref));
  manual_seed(5);  // clears the per-device seed as well
  EXPECT_TRUE(bitwise_equal(randn({10}), ref));
  // A full 64-bit seed round-trips through the int64 bits.
  manual_seed(0xfedcba9876543210ULL);
  const Tensor st = get_rng_state();
  const Tensor x = randn({4});
  manual_seed(1);
  set_rng_state(st);
  EXPECT_TRUE(bitwise_equal(randn({4}), x));
}

TEST(RngState, CudaStatesArePerDeviceAndIndependentOfTheCpu) {
  // Bookkeeping only: works without a GPU when the device index is explicit.
  manual_seed(7);
  const Tensor cpu0 = get_rng_state();
  cuda::set_rng_state(tensor({11, 40}, kInt64), 1);
  const std::vector<double> s1 = cuda::get_rng_state(1).to_vector();
  EXPECT_EQ(s1[0], 11);
  EXPECT_EQ(s1[1], 40);
  const std::vector<double> s0 = cuda::get_rng_state(0).to_vector();
  EXPECT_EQ(s0[0], 7);  // device 0 keeps the global seed
  EXPECT_EQ(s0[1], 0);
  EXPECT_TRUE(bitwise_equal(get_rng_state(), cpu0));
  manual_seed(7);
  EXPECT_EQ(cuda::get_rng_state(1).to_vector()[0], 7);
}

TEST(RngState, BadStatesRaise) {
  try {
    set_rng_state(tensor({1, 2, 3}, kInt64));
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[set_rng_state]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(set_rng_state(tensor({1, 2}, kFloat32)), kiln::Error);
  EXPECT_THROW(cuda::set_rng_state(Tensor(), 0), kiln::Error);
}

TEST(RngState, CudaRestoreReplays) {
  KILN_REQUIRE_CUDA();
  manual_seed(3);
  const Device dev(DeviceType::CUDA, 0);
  (void)randn({5}, dev);
  const Tensor st = cuda::get_rng_state(0);
  const Tensor a = randn({1000}, dev);
  const Tensor cpu_state = get_rng_state();
  set_rng_state(tensor({77, 3}, kInt64));  // the CPU generator does not affect CUDA's
  cuda::set_rng_state(st, 0);
  EXPECT_TRUE(bitwise_equal(randn({1000}, dev), a));
  set_rng_state(cpu_state);
}

// ---- autocast ----

TEST(Autocast, GuardStateNestsAndIsThreadLocal) {
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
  {
    AutocastGuard g(DeviceType::CPU, kBFloat16);
    EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
    EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
    EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), kBFloat16);
    {
      AutocastGuard inner(DeviceType::CPU, kFloat16);
      EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), kFloat16);
      AutocastGuard off(DeviceType::CPU, kBFloat16, false);
      EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
    }
    EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(get_autocast_dtype(DeviceType::CPU), kBFloat16);
    bool other_thread = true;
    std::thread([&] { other_thread = is_autocast_enabled(DeviceType::CPU); }).join();
    EXPECT_FALSE(other_thread);
  }
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
  EXPECT_THROW(AutocastGuard(DeviceType::CPU, kFloat32), kiln::Error);
}

// Under autocast, linear matches the explicit-cast reference bit for bit, forward and backward,
// and the fp32 leaves receive fp32 gradients.
TEST(Autocast, LinearMatchesExplicitCastReference) {
  manual_seed(11);
  const Tensor x0 = randn({6, 4, 24}), w0 = randn({16, 24}), b0 = randn({16}), gy = randn({6, 4, 16});
  auto leaves = [&] {
    return std::vector<Tensor>{x0.clone().requires_grad_(true), w0.clone().requires_grad_(true),
                               b0.clone().requires_grad_(true)};
  };
  std::vector<Tensor> a = leaves(), r = leaves();
  Tensor ya;
  {
    AutocastGuard ac(DeviceType::CPU, kBFloat16);
    ya = linear(a[0], a[1], a[2]);
  }
  EXPECT_EQ(ya.dtype(), kBFloat16);
  ya.backward(gy.to(kBFloat16));
  const Tensor yr = linear(r[0].to(kBFloat16), r[1].to(kBFloat16), r[2].to(kBFloat16));
  yr.backward(gy.to(kBFloat16));
  EXPECT_TRUE(bitwise_equal(ya, yr));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(a[i].grad().defined());
    EXPECT_EQ(a[i].grad().dtype(), kFloat32) << i;
    EXPECT_TRUE(bitwise_equal(a[i].grad(), r[i].grad())) << i;
  }
  // And close to the fp32 result (bf16 rounding of inputs only; fp32 accumulation).
  EXPECT_CLOSE(ya.to(kFloat32), linear(x0, w0, b0), tolerance(kBFloat16));
}

TEST(Autocast, MatmulMmBmmRunInBf16) {
  manual_seed(12);
  const Tensor a = randn({3, 5, 8}).requires_grad_(true), b = randn({3, 8, 4}).requires_grad_(true);
  Tensor mm_out, bmm_out, mat_out;
  {
    AutocastGuard ac(DeviceType::CPU);
    mm_out = mm(a.select(0, 0), b.select(0, 0));
    bmm_out = bmm(a, b);
    mat_out = matmul(a, b.to(kBFloat16));  // mixed dtypes are fine under autocast
  }
  EXPECT_EQ(mm_out.dtype(), kBFloat16);
  EXPECT_EQ(bmm_out.dtype(), kBFloat16);
  EXPECT_EQ(mat_out.dtype(), kBFloat16);
  EXPECT_TRUE(bitwise_equal(bmm_out, bmm(a.to(kBFloat16), b.to(kBFloat16))));
  EXPECT_TRUE(bitwise_equal(mat_out, bmm_out));
  EXPECT_TRUE(bitwise_equal(mm_out, bmm_out.select(0, 0)));
  (sum(bmm_out.to(kFloat32)) + sum(mm_out.to(kFloat32))).backward();
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
  // Outside the region nothing is cast; mixed dtypes raise as before.
  EXPECT_EQ(bmm(a, b).dtype(), kFloat32);
  EXPECT_THROW(matmul(a, b.to(kBFloat16)), kiln::Error);
  // float64 is left alone.
  AutocastGuard ac(DeviceType::CPU);
  EXPECT_EQ(mm(randn({2, 3}, kFloat64), randn({3, 2}, kFloat64)).dtype(), kFloat64);
}

TEST(Autocast, NormsSoftmaxAndLossesRunInFp32) {
  namespace F = nn::functional;
  manual_seed(13);
  const Tensor x = randn({4, 32}).to(kBFloat16), w = randn({32}), tgt = randint(0, 32, {4});
  AutocastGuard ac(DeviceType::CPU);
  const Tensor n = F::rms_norm(x, w, 1e-5);  // bf16 input, fp32 weight: both in fp32
  EXPECT_EQ(n.dtype(), kFloat32);
  EXPECT_TRUE(bitwise_equal(n, F::rms_norm(x.to(kFloat32), w, 1e-5)));
  EXPECT_EQ(softmax(x, -1).dtype(), kFloat32);
  EXPECT_EQ(log_softmax(x, -1).dtype(), kFloat32);
  const Tensor l = F::cross_entropy(x, tgt);
  EXPECT_EQ(l.dtype(), kFloat32);
  EXPECT_TRUE(bitwise_equal(l, F::cross_entropy(x.to(kFloat32), tgt)));
  // Elementwise ops keep their own dtype rules (bf16 + fp32 promotes to fp32).
  EXPECT_EQ((x + n).dtype(), kFloat32);
  EXPECT_EQ(silu(x).dtype(), kBFloat16);
}

TEST(Autocast, CpuRegionDoesNotTouchCudaTensorsAndViceVersa) {
  {
    AutocastGuard ac(DeviceType::CUDA);
    EXPECT_EQ(linear(randn({2, 3}), randn({4, 3})).dtype(), kFloat32);  // CPU tensors: not cast
  }
  KILN_REQUIRE_CUDA();
  const Tensor x = randn({8, 16}).cuda(), w = randn({12, 16}).cuda().requires_grad_(true);
  Tensor y;
  {
    AutocastGuard cpu_only(DeviceType::CPU);
    EXPECT_EQ(linear(x, w).dtype(), kFloat32);
  }
  {
    AutocastGuard ac(DeviceType::CUDA, kBFloat16);
    y = linear(x, w);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  sum(y.to(kFloat32)).backward();
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_TRUE(w.grad().is_cuda());
  EXPECT_CLOSE(y.cpu(), linear(x.cpu().to(kBFloat16), w.detach().cpu().to(kBFloat16)), tolerance(kBFloat16));
}
