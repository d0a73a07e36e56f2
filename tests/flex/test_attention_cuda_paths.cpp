// FlexAttention on CUDA (KILN_REQUIRE_CUDA: skipped without a GPU), the kernel paths the plan
// (src/flex/cuda/kernel_config.cpp) chooses, each against the float64 reference and CPU kernels:
// the forward's tiles and register caps from the tuning values, the persistent forward on the
// caller's blocks beside the backward on the halved ones, the halved blocks, the keep bits from
// flex_mask_bits, a mask's runs, the split P / dS, the two-list walk of a BlockMask without a
// mask_mod, and the mma.sync kernels of other architectures run on this GPU.
#include <cstdint>
#include <vector>

#include "cuda_check.h"

#ifdef KILN_WITH_CUDA
#include "flex/block_mask_impl.h"
#include "flex/cuda/attention_cuda.h"
#include "flex/ir.h"
#include "kiln/tuning.h"
#endif

namespace kiln::flex {
namespace {

#ifdef KILN_WITH_CUDA

using namespace testing;

// The default plan on causal and late masks (rows that attend nothing, tiles of one block), a
// learned bias's gradient and softcap at E = 128; then a window with GQA at both head dims run to
// run and with every block marked partial, bit for bit.
void check_kernel_suite() {
  GpuCase c;
  const MaskMod causal = causal_mask(), late = MaskMod([](Expr, Expr, Expr q, Expr kv) { return kv < q - 69; });
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
  check_cuda(c, kFloat16, &late, [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < q - 69; }, ScoreMod(),
             nullptr);
  check_relative_bias(c, bias, {bias});
  c.E = 128;
  check_cuda(c, kBFloat16, &causal, kCausal, softcap(5.0), kSoftcap5);
  for (const int64_t E : {64, 128}) {
    SCOPED_TRACE("E = " + std::to_string(E));
    const int64_t L = 700, S = 900;
    const Tensor q = randn({2, 4, L, E}), k = randn({2, 2, S, E}), v = randn({2, 2, S, E}), cot = randn({2, 4, L, E});
    const BlockMask bm = create_block_mask(sliding_window_mask(300), 1, 1, L, S);
    FlexOptions o;
    o.block_mask = &bm;
    o.return_lse = true;
    o.enable_gqa = true;
    const FlexRun a = run_on(kGpu, kBFloat16, q, k, v, o, cot);
    EXPECT_TRUE(same_bits(a, run_on(kGpu, kBFloat16, q, k, v, o, cot))) << "two runs differ";
    const BlockMask partial = all_partial(bm, 128);
    o.block_mask = &partial;
    EXPECT_TRUE(same_bits(a, run_on(kGpu, kBFloat16, q, k, v, o, cot))) << "full vs partial changes the bits";
  }
}

TEST(FlexAttentionCuda, KernelSuiteMatchesReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(21);
  check_kernel_suite();
}

// The forward's tiles from the tuning values: 64 x 64 and 64 x 128 (one warpgroup, a block barrier a
// stage), 128 x 64 and 128 x 128 (two, the last warp done with a stage issuing its loads), at E = 128
// with ragged lengths, GQA, a window and a score_mod, and the suite at 128 x 128 and 64 x 64; then the
// register caps from the tuning values.
TEST(FlexAttentionCuda, TilesAndMinBlocksFromTuningMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(33);
  const GpuCase c = gqa_ragged_e128(400);
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{64, 64}, {64, 128}, {128, 64}, {128, 128}}) {
    SCOPED_TRACE("tile " + std::to_string(m) + " x " + std::to_string(n));
    Tuning t = tuning();
    t.flex.fwd_tile_m = m;
    t.flex.fwd_tile_n = n;
    const TuningGuard guard(t);
    check_window_softcap(c, 150);
    if (m == n) check_kernel_suite();
  }
  Tuning t = tuning();
  t.flex.fwd_min_blocks = 2;
  t.flex.bwd_dkdv_min_blocks = 2;
  t.flex.bwd_dq_min_blocks = 3;
  const TuningGuard guard(t);
  check_window_softcap(c, 150);
  GpuCase e64;
  e64.L = e64.S = 1000;
  check_window_softcap(e64, 200);
}

// Without a score_mod (or with one of gradient 1: ALiBi, a relative bias that needs no gradient)
// each backward tile's P is computed while its dP product is in flight: at E = 128 against the
// reference, and a window with GQA at both head dims against the CPU kernels.
TEST(FlexAttentionCuda, SplitPWithAdditiveScoreModsMatchesReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(42);
  GpuCase c;
  c.E = 128;
  const Tensor slopes = rand({4}, kFloat64), bias = randn({4, 1500}, kFloat64) * 0.5;
  const std::vector<double> sl = slopes.to_vector(), bv = bias.to_vector();
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, alibi(slopes),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
  check_cuda(c, kFloat16, &causal, kCausal, relative_position_bias(bias, 700),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * 1500 + (q - kv + 700)]; });
  for (const int64_t E : {64, 128}) {
    const int64_t L = 700, S = 800;
    const Tensor q = randn({1, 4, L, E}), k = randn({1, 2, S, E}), v = randn({1, 2, S, E}), cot = randn({1, 4, L, E});
    const BlockMask bm = create_block_mask(sliding_window_mask(300), 1, 1, L, S);
    for (const ScoreMod& mod : {alibi(slopes), relative_position_bias(bias, 700)}) {
      SCOPED_TRACE("E = " + std::to_string(E) + ", " + mod.to_string());
      FlexOptions o;
      o.block_mask = &bm;
      o.return_lse = true;
      o.enable_gqa = true;
      o.score_mod = mod;
      const FlexRun gpu = run_on(kGpu, kBFloat16, q, k, v, o, cot), cpu = run_on(kCPU, kFloat64, q, k, v, o, cot);
      EXPECT_CLOSE(gpu.out, cpu.out, 2e-2);
      EXPECT_CLOSE(gpu.lse, cpu.lse, 1e-3);
      expect_grads_close(gpu, cpu, 4e-2);
    }
  }
}

// Partial tiles of a mask that keeps one run a row and column test their elements against it: on
// compositions (a run joined with a head-only bool, equality, a row-only mask) and on masks that
// evaluate instead (prefix-LM, chunks), at both head dims.
TEST(FlexAttentionCuda, MaskRangesMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(43);
  using F = Expr;
  const std::vector<std::pair<MaskMod, MaskFn>> cases = {
      {MaskMod([](F, F h, F q, F kv) { return (q - kv < 100) & ((h == 1) | (kv >= q - 10)) & (kv <= q + 3); }),
       [](int64_t, int64_t h, int64_t q, int64_t kv) { return q - kv < 100 && (h == 1 || kv >= q - 10) && kv <= q + 3; }},
      {MaskMod([](F, F h, F q, F kv) { return (kv == q - 3) | (h == 0); }),
       [](int64_t, int64_t h, int64_t q, int64_t kv) { return kv == q - 3 || h == 0; }},
      {MaskMod([](F, F, F q, F) { return q < 300; }), [](int64_t, int64_t, int64_t q, int64_t) { return q < 300; }},
      {prefix_lm_mask(150), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 150 || q >= kv; }},
      {chunked_mask(100), [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 100 == kv / 100; }}};
  GpuCase c;
  c.Hq = 4;
  c.L = 500;
  c.S = 600;
  for (const auto& [mask, fn] : cases) {
    SCOPED_TRACE(mask.to_string());
    for (const int64_t E : {64, 128}) {
      c.E = E;
      check_cuda(c, kBFloat16, &mask, fn, ScoreMod(), nullptr);
    }
  }
}

// A causal document mask (it reads a captured tensor): partial blocks take their keep bits from
// flex_mask_bits in the forward and the dQ kernel, with and without a score_mod, at both head dims
// on short rows (halved blocks at E = 64) and GQA.
TEST(FlexAttentionCuda, MaskBitsMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(29);
  for (const int64_t E : {64, 128}) {
    SCOPED_TRACE("E = " + std::to_string(E));
    GpuCase c;
    c.Hq = 4;
    c.L = 700;
    c.S = 900;
    c.E = E;
    const DocumentCase d = causal_documents(c.S);
    check_cuda(c, kBFloat16, &d.mask, d.fn, ScoreMod(), nullptr);
    check_cuda(c, kBFloat16, &d.mask, d.fn, softcap(5.0), kSoftcap5);
  }
}

// 128-block masks on short rows run at 64-blocks, the empty halves of partial blocks dropped: a
// window at E = 64 and a document mask at E = 128 (the halving reads the captured ids).
TEST(FlexAttentionCuda, HalvedBlocksMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(41);
  GpuCase c;
  c.L = 1000;
  c.S = 1100;
  check_window_softcap(c, 200);
  c.E = 128;
  const DocumentCase d = causal_documents(c.S);
  check_cuda(c, kBFloat16, &d.mask, d.fn, ScoreMod(), nullptr);
}

// Short rows at E = 128 (a window): the persistent forward runs on the caller's 128-blocks with
// 128 x 128 tiles while the backward walks the halved 64-blocks; and where the mask uses the heads
// beyond the BlockMask's one head (so it is not halved), both on the caller's blocks.
TEST(FlexAttentionCuda, ShortRowsForwardOnCallersBlocksBackwardHalved) {
  KILN_REQUIRE_CUDA();
  manual_seed(41);
  GpuCase c;
  c.E = 128;
  c.L = 1000;
  c.S = 1100;
  const int64_t w = 200 + std::rand() % 200;
  const MaskMod window = sliding_window_mask(w);
  const MaskFn f = [w](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < w; };
  check_cuda(c, kBFloat16, &window, f, ScoreMod(), nullptr);
  // The same window, h >= 0 joined in; its BlockMask over one head.
  const MaskMod headed([w](Expr, Expr h, Expr q, Expr kv) { return (q >= kv) & (q - kv < w) & (h >= 0); });
  const Tensor q = randn({1, 2, c.L, c.E}, kFloat64), k = randn({1, 2, c.S, c.E}, kFloat64),
               v = randn({1, 2, c.S, c.E}, kFloat64), cot = randn({1, 2, c.L, c.E}, kFloat64);
  const BlockMask bm = create_block_mask(headed, 1, 1, c.L, c.S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  const FlexRun gpu = run_on(kGpu, kBFloat16, q, k, v, o, cot);
  const auto [ref_out, ref_lse] = reference(q, k, v, nullptr, f);
  EXPECT_CLOSE(gpu.out, ref_out, out_tolerance(kBFloat16));
  EXPECT_CLOSE(gpu.lse, ref_lse, 1e-3);
  expect_grads_close(gpu, run_on(kCPU, kFloat64, q, k, v, o, cot), grad_tolerance(kBFloat16));
}

// The persistent forward with more q tiles than CTAs fit at once (several units a CTA, with units
// that list no block between them; GQA): rows of at most 9 blocks at E = 128, with the rule's
// 128 x 128 tiles and the tuning's 64 x 64, against the float64 CPU kernels' out and lse.
TEST(FlexAttentionCuda, PersistentForwardWalksSeveralUnitsPerCta) {
  KILN_REQUIRE_CUDA();
  manual_seed(29);
  const int64_t L = 4000, S = 2500;
  const MaskMod late([](Expr, Expr, Expr q, Expr kv) { return (kv < q - 1500) & (kv > q - 2400); });
  const Tensor q = randn({1, 8, L, 128}, kBFloat16).to(kFloat64), k = randn({1, 4, S, 128}, kBFloat16).to(kFloat64),
               v = randn({1, 4, S, 128}, kBFloat16).to(kFloat64);
  const BlockMask bm = create_block_mask(late, 1, 1, L, S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  o.enable_gqa = true;
  const FlexOutput cpu = flex_attention(q, k, v, o);
  for (const int tile : {0, 64}) {
    SCOPED_TRACE("tuning tile " + std::to_string(tile));
    Tuning t = tuning();
    t.flex.fwd_tile_m = t.flex.fwd_tile_n = tile;
    const TuningGuard guard(t);
    const FlexOutput gpu = flex_attention(q.to(kGpu, kBFloat16), k.to(kGpu, kBFloat16), v.to(kGpu, kBFloat16), o);
    EXPECT_CLOSE(gpu.out.to(kCPU, kFloat64), cpu.out, out_tolerance(kBFloat16));
    EXPECT_CLOSE(gpu.lse.to(kCPU, kFloat64), cpu.lse, 1e-3);
  }
}

// A BlockMask without a mask_mod whose blocks are all partial (from_kv_blocks): the kernels walk its
// partial and full lists (no merged lists without a mask) and test only the lengths.
TEST(FlexAttentionCuda, BlockMaskWithoutMaskModWalksTwoLists) {
  KILN_REQUIRE_CUDA();
  manual_seed(30);
  for (const int64_t E : {64, 128}) {
    SCOPED_TRACE("E = " + std::to_string(E));
    const int64_t L = 500, S = 600;
    const BlockMask listed = all_partial(create_block_mask(sliding_window_mask(200), 1, 1, L, S), 128);
    const BlockMask bm = BlockMask::from_kv_blocks(listed.kv_num_blocks, listed.kv_indices, Tensor(), Tensor(), L, S);
    const Tensor dense = bm.to_dense();
    const int64_t nKV = bm.num_kv_blocks();
    const MaskFn f = [&](int64_t, int64_t, int64_t q, int64_t kv) {
      return dense.data_ptr<int32_t>()[(q / 128) * nKV + kv / 128] != 0;
    };
    const Tensor q = randn({1, 2, L, E}, kFloat64), k = randn({1, 2, S, E}, kFloat64), v = randn({1, 2, S, E}, kFloat64),
                 cot = randn({1, 2, L, E}, kFloat64);
    FlexOptions o;
    o.block_mask = &bm;
    o.return_lse = true;
    const FlexRun gpu = run_on(kGpu, kBFloat16, q, k, v, o, cot);
    const auto [ref_out, ref_lse] = reference(q, k, v, nullptr, f);
    EXPECT_CLOSE(gpu.out, ref_out, out_tolerance(kBFloat16));
    EXPECT_CLOSE(gpu.lse, ref_lse, 1e-3);
    expect_grads_close(gpu, run_on(kCPU, kFloat64, q, k, v, o, cot), grad_tolerance(kBFloat16));
  }
}

// The kernels of a device of compute capability 8 (mma.sync, cp.async), planned for it and run on
// this GPU (sm_90 runs them too): cuda::plan_for / make_state / forward / backward on a causal
// BlockMask with ALiBi at E = 64 and without a score_mod at E = 128 in fp16; out and lse against the
// float64 reference, dq, dk, dv against the float64 CPU kernels.
void check_planned_for_sm80(int64_t E, DType dt, const ScoreMod& smod, const ScoreFn& sfn) {
  const int64_t B = 1, H = 2, L = 200, S = 333;
  const Tensor q = randn({B, H, L, E}, dt).to(kFloat64), k = randn({B, H, S, E}, dt).to(kFloat64),
               v = randn({B, H, S, E}, dt).to(kFloat64), cot = randn({B, H, L, E}, dt).to(kFloat64);
  const MaskMod causal = causal_mask();
  const BlockMask bm = create_block_mask(causal, 1, 1, L, S);
  const BlockMask on_gpu = bm.to(kGpu), merged = detail::merge_block_lists(bm).to(kGpu);
  detail::Program mask = detail::compile(causal.expr), score;
  cpu::Problem p;
  p.B = B;
  p.Hq = p.Hkv = H;
  p.L = L;
  p.S = S;
  p.E = p.Ev = E;
  p.scale = 1.0 / std::sqrt(static_cast<double>(E));
  detail::use_block_mask(p, on_gpu);
  detail::use_merged_lists(p, merged);
  p.mask = &mask;
  if (!smod.is_identity()) {
    score = detail::compile(smod.expr);
    for (const detail::Buffer& b : score.buffers) b.build_pyramid();
    p.score = &score;
  }
  const cuda::Plan plan = cuda::plan_for(p, nullptr, dt, 8, FlexTuning{});
  ASSERT_FALSE(plan.fwd.wgmma || plan.bwd.wgmma);
  const std::shared_ptr<cuda::State> st = cuda::make_state(p, nullptr, dt, kGpu, plan);
  const Tensor qg = q.to(kGpu, dt), kg = k.to(kGpu, dt), vg = v.to(kGpu, dt), dout = cot.to(kGpu, dt);
  Tensor out = empty({B, H, L, E}, qg.options()), lse = empty({B, H, L}, qg.options().dtype(kFloat32));
  ASSERT_TRUE(cuda::forward(*st, qg, kg, vg, out, lse));
  Tensor dq = empty(qg.sizes(), qg.options()), dk = empty(kg.sizes(), kg.options()), dv = empty(vg.sizes(), vg.options());
  std::vector<std::vector<double>> cap(p.score ? p.score->buffers.size() : 0);
  ASSERT_TRUE(cuda::backward(*st, qg, kg, vg, out, dout, lse, Tensor(), dq, dk, dv, cap));
  const auto [ref_out, ref_lse] = reference(q, k, v, sfn, kCausal);
  EXPECT_CLOSE(out.to(kCPU, kFloat64), ref_out, out_tolerance(dt));
  EXPECT_CLOSE(lse.to(kCPU, kFloat64), ref_lse, 1e-3);
  FlexOptions o;
  o.block_mask = &bm;
  o.score_mod = smod;
  FlexRun gpu;
  gpu.grads = {dq.to(kCPU, kFloat64), dk.to(kCPU, kFloat64), dv.to(kCPU, kFloat64)};
  expect_grads_close(gpu, run_on(kCPU, kFloat64, q, k, v, o, cot), grad_tolerance(dt));
}

TEST(FlexAttentionCuda, MmaSyncKernelsMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(18);
  const Tensor slopes = rand({2}, kFloat64);
  const std::vector<double> sl = slopes.to_vector();
  check_planned_for_sm80(64, kBFloat16, alibi(slopes), [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s + sl[h] * static_cast<double>(kv - q);
  });
  check_planned_for_sm80(128, kFloat16, ScoreMod(), nullptr);
}

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln::flex
