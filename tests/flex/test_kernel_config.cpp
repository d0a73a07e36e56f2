// The CUDA FlexAttention plan's rules (src/flex/cuda/kernel_config.cpp), checked without a GPU: the
// kernels' configuration by architecture, head dim, row length (blocks a row), block size, mods and
// captured-tensor gradients; what the tuning values override; which BlockMask each kernel walks; the
// plan of a call with its forward on the caller's blocks.
#include "kiln/flex.h"
#include "kiln/tuning.h"
#include "support/testing.h"

#ifdef KILN_WITH_CUDA
#include "flex/cuda/kernel_config.h"
#endif

namespace kiln::flex {
namespace {

#ifdef KILN_WITH_CUDA

const int32_t kList[1] = {0};  // stands in for the BlockMask lists' device pointers

// A [1, 8, 32768, E] problem on a BlockMask of `block`-blocks listing kv_m partial and fkv_m full
// blocks a row, its lists merged when it has a mask (as the plan does).
cpu::Problem problem(int64_t E, int64_t block, int64_t kv_m, int64_t fkv_m, const detail::Program* mask) {
  cpu::Problem p;
  p.B = 1;
  p.Hq = p.Hkv = 8;
  p.L = p.S = 32768;
  p.E = p.Ev = E;
  p.scale = 0.125;
  p.QB = p.KB = block;
  p.nQ = p.nKV = 32768 / block;
  p.kv_m = kv_m;
  p.fkv_m = fkv_m;
  p.kv_num = p.kv_idx = p.fkv_num = p.fkv_idx = kList;
  p.mask = mask;
  if (mask) p.kv_all_num = p.kv_all_idx = p.q_all_num = p.q_all_idx = kList;
  return p;
}

cuda::KernelConfig config(const cpu::Problem& p, int major, int64_t grad_numel = 0, const FlexTuning& t = {},
                          int64_t* words = nullptr) {
  int64_t w = 0;
  return cuda::kernel_config_for(p, kBFloat16, major, false, true, grad_numel, t, words ? words : &w);
}

TEST(FlexCudaConfig, DefaultsFollowTheMeasuredRules) {
  const detail::Program window = detail::compile(sliding_window_mask(256).expr);
  // E = 64, 64-blocks, 5 listed a row (short rows).
  cpu::Problem p = problem(64, 64, 2, 3, &window);
  int64_t words = -1;
  cuda::KernelConfig c = config(p, 9, 0, {}, &words);
  EXPECT_TRUE(c.wgmma && c.fwd_keepbits && c.mask_ranges && c.merged_walk && c.bwd_split_p && c.fast_mods);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 64);
  EXPECT_EQ(c.fwd_min_blocks, 5);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 3);
  EXPECT_EQ(c.bwd_dq_min_blocks, 1);
  EXPECT_EQ(words, 0);
  EXPECT_FALSE(c.mask_bits) << "the window reads no tensor";
  EXPECT_TRUE(c.fold_scale) << "no score_mod and scale > 0";
  EXPECT_FALSE(c.fwd_last_issues) << "one warpgroup a CTA keeps the barrier";
  EXPECT_FALSE(c.fwd_persist) << "E = 64";
  EXPECT_EQ(config(p, 9, 100).bwd_dkdv_min_blocks, 1) << "captured-tensor gradients spill at 168 registers";
  p.scale = -0.125;
  EXPECT_FALSE(config(p, 9).fold_scale) << "the max of raw scores is not the raw score of the max";
  p.scale = 0.125;
  // Not sm_90: mma.sync, cp.async, no caps, the lists still merged.
  c = config(p, 8);
  EXPECT_FALSE(c.wgmma || c.fwd_keepbits || c.mask_ranges || c.bwd_split_p || c.fwd_persist || c.fwd_last_issues);
  EXPECT_TRUE(c.merged_walk);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  // Longer E = 64 rows (8 blocks of 128): 64 x 128 forward tiles, no caps.
  p = problem(64, 128, 3, 5, &window);
  c = config(p, 9);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 128);
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  // E = 128 on 128-blocks: rows of up to 9 blocks with a mask that reads no tensors and no score_mod
  // take the persistent forward at 128 x 128; on 64-blocks (the halved mask, the backward's) the
  // staged one at 64 x 64; with a score_mod too; long rows 128 x 128 staged, the last warp issuing.
  p = problem(128, 128, 3, 5, &window);
  c = config(p, 9);
  EXPECT_TRUE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_EQ(c.fwd_tile_n, 128);
  EXPECT_FALSE(c.fwd_last_issues) << "the persistent forward has no stage barrier";
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  const detail::Program soft = detail::compile(softcap(30.0).expr), slopes = detail::compile(alibi(rand({8})).expr);
  p.score = &soft;
  c = config(p, 9);
  EXPECT_FALSE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_FALSE(c.bwd_split_p) << "softcap's gradient is not 1";
  EXPECT_FALSE(c.fold_scale);
  p.score = &slopes;
  EXPECT_TRUE(config(p, 9).bwd_split_p) << "ALiBi's gradient is 1";
  p = problem(128, 64, 2, 4, &window);
  c = config(p, 9);
  EXPECT_FALSE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 64);
  p = problem(128, 128, 1, 31, &window);
  c = config(p, 9);
  EXPECT_FALSE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_TRUE(c.fwd_last_issues) << "two warpgroups a CTA: the last warp done with a stage issues";
  // No BlockMask: rows of nKV blocks, the two-list walk's all_full path.
  p = problem(128, 128, 1, 1, nullptr);
  p.all_full = true;
  c = config(p, 9);
  EXPECT_FALSE(c.merged_walk);
  EXPECT_EQ(c.fwd_tile_m, 128);
  // Lengths past the narrow bounds: the exact 64-bit mods.
  p.L = p.S = detail::kNarrowQKv + 1;
  EXPECT_FALSE(config(p, 9).fast_mods);
}

// A mask that reads a captured tensor (documents): its partial blocks' keep bits from flex_mask_bits
// (words: one bit an element of each listed partial block), the keep-bits forward and the runs off;
// not without the merged lists, nor where the mask uses heads the BlockMask does not have.
TEST(FlexCudaConfig, MaskBitsForMasksThatReadTensors) {
  const detail::Program docs =
      detail::compile(and_masks({document_mask(tensor(std::vector<double>(32768, 1), kInt64)), causal_mask()}).expr);
  cpu::Problem p = problem(128, 128, 4, 12, &docs);
  int64_t words = -1;
  cuda::KernelConfig c = config(p, 9, 0, {}, &words);
  EXPECT_TRUE(c.mask_bits);
  EXPECT_EQ(words, 1 * 1 * 256 * 4 * (128 * 128 / 32));
  EXPECT_FALSE(c.fwd_keepbits || c.mask_ranges);
  EXPECT_FALSE(c.fwd_persist) << "the mask reads a tensor";
  EXPECT_FALSE(config(p, 8, 0, {}, &words).mask_bits);
  EXPECT_EQ(words, 0);
  p.kv_all_idx = nullptr;
  EXPECT_FALSE(config(p, 9).mask_bits) << "the slots come from the merged walk";
  const detail::Program per_head = detail::compile(
      and_masks({document_mask(tensor(std::vector<double>(32768, 1), kInt64)),
                 MaskMod([](Expr, Expr h, Expr q, Expr kv) { return q - kv >= h; })})
          .expr);
  p = problem(128, 128, 4, 12, &per_head);
  EXPECT_FALSE(config(p, 9).mask_bits) << "one bit set per mask row cannot serve 8 heads";
  p.mH = 8;
  EXPECT_TRUE(config(p, 9).mask_bits);
}

// The tuning values replace the rule's tile where valid (wgmma: 64 or 128 each) and the blocks allow
// it (else 64 x 64), and the register caps everywhere.
TEST(FlexCudaConfig, TuningOverridesTheRules) {
  const detail::Program window = detail::compile(sliding_window_mask(256).expr);
  const cpu::Problem p = problem(64, 128, 3, 5, &window);  // rule: 64 x 128
  FlexTuning t;
  t.fwd_tile_m = 128;
  t.fwd_tile_n = 64;
  cuda::KernelConfig c = config(p, 9, 0, t);
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_EQ(c.fwd_tile_n, 64);
  EXPECT_EQ(c.fwd_threads(), 256);
  t.fwd_tile_n = 32;  // not a wgmma tile: the rule's
  c = config(p, 9, 0, t);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 128);
  c = config(p, 8, 0, t);  // mma.sync takes 128 x 32
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_EQ(c.fwd_tile_n, 32);
  t.fwd_tile_m = t.fwd_tile_n = 128;  // 128-rows on 64-blocks: 64 x 64
  c = config(problem(64, 64, 3, 5, &window), 9, 0, t);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 64);
  // A window at E = 128 on 128-blocks with a 64 x 64 tuning tile: the persistent forward at 64 x 64;
  // with 128 x 64 the staged one (the persistent forward's output goes through a V tile).
  const cpu::Problem w128 = problem(128, 128, 2, 2, &window);
  t.fwd_tile_m = t.fwd_tile_n = 64;
  c = config(w128, 9, 0, t);
  EXPECT_TRUE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 64);
  t.fwd_tile_m = 128;
  EXPECT_FALSE(config(w128, 9, 0, t).fwd_persist);
  FlexTuning caps;
  caps.fwd_min_blocks = 2;
  caps.bwd_dkdv_min_blocks = 4;
  caps.bwd_dq_min_blocks = 3;
  c = config(p, 9, 0, caps);
  EXPECT_EQ(c.fwd_min_blocks, 2);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 4);
  EXPECT_EQ(c.bwd_dq_min_blocks, 3);
}

// Which BlockMask each kernel walks: merged lists for masks; 64-blocks on 128-block masks whose rows
// take 64 x 64 forward tiles on sm_90 (E = 64 under 6 blocks a row, E = 128 up to 9) where the
// mask's dims allow; the forward on the caller's 128-blocks where it runs persistent.
TEST(FlexCudaConfig, BlockPlanFollowsTheRules) {
  const detail::Program window = detail::compile(sliding_window_mask(256).expr);
  auto plan = [&](const cpu::Problem& p, int major = 9, bool can_halve = true, const FlexTuning& t = {}) {
    return cuda::block_plan_for(p, major, can_halve, t);
  };
  cuda::BlockPlan b = plan(problem(64, 128, 2, 3, &window));
  EXPECT_TRUE(b.merge && b.halve);
  EXPECT_FALSE(b.forward_keeps) << "E = 64 takes no persistent forward";
  b = plan(problem(64, 128, 3, 5, &window));
  EXPECT_TRUE(b.merge);
  EXPECT_FALSE(b.halve) << "8 blocks a row: 64 x 128 tiles on the 128-blocks";
  b = plan(problem(128, 128, 2, 2, &window));
  EXPECT_TRUE(b.merge && b.halve && b.forward_keeps);
  cpu::Problem scored = problem(128, 128, 2, 2, &window);
  const detail::Program soft = detail::compile(softcap(30.0).expr);
  scored.score = &soft;
  b = plan(scored);
  EXPECT_TRUE(b.halve);
  EXPECT_FALSE(b.forward_keeps) << "a score_mod: the staged forward at 64 x 64 on the halved blocks";
  EXPECT_FALSE(plan(problem(128, 128, 1, 31, &window)).halve) << "long rows: 128 x 128 tiles";
  EXPECT_FALSE(plan(problem(128, 64, 2, 4, &window)).halve) << "64-blocks already";
  EXPECT_FALSE(plan(problem(128, 128, 2, 2, &window), 8).halve) << "mma.sync";
  b = plan(problem(128, 128, 2, 2, &window), 9, false);
  EXPECT_TRUE(b.merge);
  EXPECT_FALSE(b.halve || b.forward_keeps) << "the mask's dims do not allow the halving";
  FlexTuning big;
  big.fwd_tile_m = big.fwd_tile_n = 128;
  EXPECT_FALSE(plan(problem(64, 128, 2, 3, &window), 9, true, big).halve) << "a 128 x 128 tuning tile";
  b = plan(problem(64, 128, 2, 3, nullptr));
  EXPECT_FALSE(b.merge || b.halve) << "no mask_mod: the two lists, the caller's blocks";
  cpu::Problem dense = problem(64, 128, 1, 1, nullptr);
  dense.all_full = true;
  b = plan(dense);
  EXPECT_FALSE(b.merge || b.halve || b.forward_keeps);
}

// plan_for: the backward's configuration on p, the forward's on fwd_p where given (the caller's
// 128-blocks: the persistent forward) or the backward's; the index checks from the mods' proofs; the
// captured-tensor gradients' size.
TEST(FlexCudaConfig, PlanHoldsEachKernelsConfiguration) {
  const detail::Program window = detail::compile(sliding_window_mask(256).expr);
  const cpu::Problem fwd_p = problem(128, 128, 2, 2, &window), p = problem(128, 64, 2, 4, &window);
  cuda::Plan plan = cuda::plan_for(p, &fwd_p, kBFloat16, 9, FlexTuning{});
  EXPECT_TRUE(plan.separate_forward);
  EXPECT_TRUE(plan.fwd.fwd_persist);
  EXPECT_EQ(plan.fwd.fwd_tile_m, 128);
  EXPECT_FALSE(plan.bwd.fwd_persist);
  EXPECT_EQ(plan.bwd.fwd_tile_m, 64);
  EXPECT_FALSE(plan.check_indices);
  EXPECT_EQ(plan.grad_numel, 0);
  plan = cuda::plan_for(p, nullptr, kFloat16, 9, FlexTuning{});
  EXPECT_FALSE(plan.separate_forward);
  EXPECT_FALSE(plan.fwd.bf16);
  EXPECT_EQ(plan.fwd.fwd_persist, plan.bwd.fwd_persist);
  EXPECT_EQ(plan.fwd.fwd_tile_m, plan.bwd.fwd_tile_m);
  // A learned bias read at q - kv + 100 of 300 entries: out of range for 32768-long rows (the flag),
  // its 8 x 300 gradient.
  cpu::Problem scored = p;
  const detail::Program bias = detail::compile(relative_position_bias(zeros({8, 300}).requires_grad_(), 100).expr);
  for (const detail::Buffer& b : bias.buffers) b.build_pyramid();
  scored.score = &bias;
  plan = cuda::plan_for(scored, nullptr, kBFloat16, 9, FlexTuning{});
  EXPECT_TRUE(plan.check_indices);
  EXPECT_TRUE(plan.bwd.index_check);
  EXPECT_FALSE(plan.bwd.index32);
  EXPECT_EQ(plan.grad_numel, 8 * 300);
  EXPECT_EQ(plan.bwd.bwd_dkdv_min_blocks, 1);
}

#else

TEST(FlexCudaConfig, DefaultsFollowTheMeasuredRules) { GTEST_SKIP() << "kiln was built without CUDA"; }

#endif

}  // namespace
}  // namespace kiln::flex
