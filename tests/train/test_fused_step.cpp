// The fused GPT step (add_rms_norm, swiglu, the multi-tensor AdamW) against the unfused
// composition (unfused_gpt.h) from the same initial weights: equal losses, gradients and loss
// curves within fp32 tolerance.
#include <cmath>

#include "kiln/autocast.h"
#include "kiln/optim.h"
#include "model.h"
#include "support/testing.h"
#include "unfused_gpt.h"

namespace kiln::train {
namespace {

TEST(FusedStep, LossCurveEqualsTheUnfusedSteps) {
  ModelConfig c = model_preset("micro");
  manual_seed(11);
  GPT fused(c);
  manual_seed(11);
  GPT unfused(c);
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  ao.weight_decay = 0.1;
  optim::AdamW opt_a(fused.parameters(), ao), opt_b(unfused.parameters(), ao);
  const int64_t B = 3, T = c.seq_len;
  double worst = 0;
  for (int step = 0; step < 8; ++step) {
    manual_seed(100 + step);
    const Tensor idx = randint(0, c.vocab_size, {B, T});
    Tensor target = randint(0, c.vocab_size, {B, T});
    Tensor docs = zeros({B, T}, kInt32);
    docs.narrow(1, T / 2, T / 2).fill_(1.0);  // two documents a row
    const flex::BlockMask mask = fused.block_mask(docs);
    const Tensor la = fused.loss(idx, target, mask), lb = testing::unfused_gpt_loss(unfused, idx, target, mask);
    la.backward();
    lb.backward();
    if (step == 0) {
      const auto pa = fused.named_parameters(), pb = unfused.named_parameters();
      for (size_t i = 0; i < pa.size(); ++i)
        EXPECT_LE(kiln::testing::rel_error(pa[i].second.grad(), pb[i].second.grad()), 1e-5) << pa[i].first;
    }
    const double a = la.item(), b = lb.item();
    worst = std::max(worst, std::abs(a - b) / std::abs(b));
    opt_a.step();
    opt_b.step();
    opt_a.zero_grad();
    opt_b.zero_grad();
  }
  EXPECT_LE(worst, 1e-5) << "the fused step's loss curve left the unfused one's";
}

// On CUDA under bf16 autocast, as `kiln train --device cuda` runs: the norms write bf16 for their
// GEMMs, each block's MLP output joins the stream in the next norm's pass, swiglu is one kernel;
// the unfused step computes norms in fp32, casts in each linear and adds separately. 50 steps.
TEST(FusedStepCuda, LossCurveEqualsTheUnfusedStepsUnderAutocast) {
  KILN_REQUIRE_CUDA();
  ModelConfig c = model_preset("micro");
  c.dim = 128, c.n_heads = 2, c.seq_len = 128;  // FlexAttention's CUDA kernels: 64-row blocks
  manual_seed(12);
  GPT fused(c);
  manual_seed(12);
  GPT unfused(c);
  fused.to(Device(DeviceType::CUDA, 0));
  unfused.to(Device(DeviceType::CUDA, 0));
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  optim::AdamW opt_a(fused.parameters(), ao), opt_b(unfused.parameters(), ao);
  const int64_t B = 4, T = c.seq_len;
  double worst = 0, first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    manual_seed(200 + step);
    const Tensor idx = randint(0, c.vocab_size, {B, T}).cuda();
    const Tensor target = idx;  // a task the model learns within the 50 steps: the loss must fall
    Tensor docs = zeros({B, T}, kInt32);
    docs.narrow(1, T / 2, T / 2).fill_(1.0);
    const flex::BlockMask mask = fused.block_mask(docs);
    Tensor la, lb;
    {
      AutocastGuard ac(DeviceType::CUDA, kBFloat16);
      la = fused.loss(idx, target, mask);
      lb = testing::unfused_gpt_loss(unfused, idx, target, mask);
    }
    la.backward();
    lb.backward();
    const double a = la.item(), b = lb.item();
    worst = std::max(worst, std::abs(a - b) / std::abs(b));
    if (step == 0) first = a;
    last = a;
    opt_a.step();
    opt_b.step();
    opt_a.zero_grad();
    opt_b.zero_grad();
  }
  EXPECT_LT(last, first) << "the loss did not go down";
  EXPECT_LE(worst, kiln::testing::tolerance(kBFloat16)) << "the fused step's loss curve left the unfused one's";
}

}  // namespace
}  // namespace kiln::train
