// FlexAttention on CUDA (KILN_REQUIRE_CUDA: skipped without a GPU): CUDA against the float64 dense
// reference and the float64 CPU kernels for every built-in mod, a learned relative bias (with its
// gradient), GQA, L != S, ragged lengths, fully masked rows, bf16 and fp16, E = 64 and 128, scales;
// bitwise determinism; the CPU fallback; index errors; unaligned views. The plan's kernel paths
// are in test_attention_cuda_paths.cpp, the generated sources and the plan's rules in
// test_codegen_cuda.cpp.
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_check.h"

namespace kiln::flex {
namespace {

#ifdef KILN_WITH_CUDA

using kiln::testing::rel_error;
using namespace testing;

TEST(FlexAttentionCuda, MasksMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(11);
  GpuCase c;
  const MaskMod causal = causal_mask(), window = sliding_window_mask(100), prefix = prefix_lm_mask(150),
                chunk = chunked_mask(128);
  check_cuda(c, kBFloat16, nullptr, nullptr, ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr, {}, /*device_mask=*/true);
  check_cuda(c, kBFloat16, &window, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 100; },
             ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &prefix, [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 150 || q >= kv; },
             ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &chunk, [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 128 == kv / 128; },
             ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, DocumentMaskE128Fp16) {
  KILN_REQUIRE_CUDA();
  manual_seed(12);
  GpuCase c;
  c.L = c.S = 333;
  c.E = 128;
  std::vector<double> ids(333);
  for (int64_t i = 0; i < 333; ++i) ids[i] = static_cast<double>(i < 100 ? 0 : i < 103 ? 1 : i < 250 ? 2 : 3);
  const MaskMod doc = and_masks({document_mask(tensor(ids, kInt32)), causal_mask()});
  const MaskFn f = [&](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; };
  check_cuda(c, kFloat16, &doc, f, ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &doc, f, ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, ScoreModsAndLearnedBiasGradient) {
  KILN_REQUIRE_CUDA();
  manual_seed(13);
  GpuCase c;
  const Tensor slopes = rand({c.Hq}, kFloat64);
  const std::vector<double> sl = slopes.to_vector();
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, alibi(slopes),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
  check_cuda(c, kFloat16, nullptr, nullptr, softcap(2.0),
             [](double s, int64_t, int64_t, int64_t, int64_t) { return 2.0 * std::tanh(s / 2.0); });
  // A learned relative bias: its gradient (reduced in fixed order on the GPU) against the CPU's.
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  check_relative_bias(c, bias, {bias});
}

// The compiled-mod and kernel caches key on captured tensors' versions: an in-place update of a
// captured bias (an optimizer step) reaches the next call's device copy and kernels.
TEST(FlexAttentionCuda, InPlaceChangeOfCapturedTensorIsSeen) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  GpuCase c;
  Tensor bias = randn({c.Hq, c.L + c.S}, kFloat64) * 0.5;
  const ScoreMod mod = relative_position_bias(bias, c.S);  // one expression for both calls
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    check_relative_bias(c, bias, {}, &mod);
    NoGradGuard ng;
    add_(bias, randn(bias.sizes(), kFloat64));
  }
}

TEST(FlexAttentionCuda, GqaRaggedLengthsE128) {
  KILN_REQUIRE_CUDA();
  manual_seed(14);
  GpuCase c = gqa_ragged_e128(200);
  check_window_softcap(c, 70);
  // Per-head mask (BlockMask over heads) with a 64-block mask.
  c.bs = 64;
  const MaskMod per_head([](Expr bb, Expr hh, Expr q, Expr kv) { return q - kv <= hh * 40 + bb; });
  check_cuda(c, kFloat16, &per_head, [](int64_t bb, int64_t hh, int64_t q, int64_t kv) { return q - kv <= hh * 40 + bb; },
             ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, FullyMaskedRowsGiveZeroAndNoNan) {
  KILN_REQUIRE_CUDA();
  manual_seed(15);
  const int64_t L = 150, S = 150;
  // Rows q < 70 attend nothing.
  const MaskMod m([](Expr, Expr, Expr q, Expr kv) { return kv < q - 69; });
  const BlockMask bm = create_block_mask(m, 1, 1, L, S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  const Tensor q = randn({1, 2, L, 64}), k = randn({1, 2, S, 64}), v = randn({1, 2, S, 64}), cot = randn({1, 2, L, 64});
  const FlexRun r = run_on(kGpu, kBFloat16, q, k, v, o, cot);
  const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector(), dq = r.grads[0].to_vector();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 70; ++i) {
      EXPECT_EQ(lse[h * L + i], -INFINITY);
      for (int64_t e = 0; e < 64; ++e) {
        EXPECT_EQ(out[(h * L + i) * 64 + e], 0.0);
        EXPECT_EQ(dq[(h * L + i) * 64 + e], 0.0);
      }
    }
  for (const Tensor& g : r.grads)
    for (double x : g.to_vector()) ASSERT_TRUE(std::isfinite(x));
  const auto [ref, ref_lse] =
      reference(q.to(kBFloat16).to(kFloat64), k.to(kBFloat16).to(kFloat64), v.to(kBFloat16).to(kFloat64), nullptr,
                [](int64_t, int64_t, int64_t qi, int64_t kv) { return kv < qi - 69; });
  EXPECT_CLOSE(r.out, ref, 2e-2);
  EXPECT_CLOSE(r.lse, ref_lse, 1e-3);
}

TEST(FlexAttentionCuda, BackwardIsBitwiseDeterministic) {
  KILN_REQUIRE_CUDA();
  manual_seed(16);
  const int64_t L = 300, S = 420, H = 4;
  const Tensor q = randn({2, H, L, 64}), k = randn({2, 2, S, 64}), v = randn({2, 2, S, 64}), cot = randn({2, H, L, 64});
  const Tensor bias = randn({H, L + S}, kFloat32).requires_grad_();
  const BlockMask bm = create_block_mask(sliding_window_mask(200), 1, 1, L, S);
  FlexOptions o;
  o.block_mask = &bm;
  o.enable_gqa = true;
  o.score_mod = relative_position_bias(bias, S);
  const FlexRun a = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  const FlexRun b = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  EXPECT_TRUE(same_bits(a, b)) << "two CUDA runs differ";
  // The same mask with every listed block marked partial: the same bits (classification-free).
  const BlockMask partial = all_partial(bm, 128);
  o.block_mask = &partial;
  EXPECT_TRUE(same_bits(a, run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias})))
      << "full vs partial classification changes the CUDA result";
}

// The captured-tensor gradient slots are zeroed before the side stream's dK/dV kernel starts: with
// a long dQ kernel ahead of it on the main stream (2048 causal rows), a zero fill queued after the
// dQ kernel would wipe dK/dV's sums, which shows as bits that change from run to run.
TEST(FlexAttentionCuda, ConcurrentBackwardCapturedGradsOnLongRows) {
  KILN_REQUIRE_CUDA();
  manual_seed(36);
  const int64_t L = 2048, H = 8;
  const Tensor q = randn({1, H, L, 64}), k = randn({1, H, L, 64}), v = randn({1, H, L, 64}), cot = randn({1, H, L, 64});
  const Tensor bias = randn({H, 2 * L}, kFloat32).requires_grad_();
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, L, L);
  FlexOptions o;
  o.block_mask = &bm;
  o.score_mod = relative_position_bias(bias, L);
  const FlexRun first = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(same_bits(first, run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias}))) << "run " << run;
  // The bias gradient against the float64 CPU kernels (a wiped sum is far off).
  const FlexRun cpu = run_on(kCPU, kFloat64, q, k, v, o, cot, {bias});
  EXPECT_CLOSE(first.grads[3], cpu.grads[3], grad_tolerance(kBFloat16));
}

// Captured-tensor gradients with several kv units per CTA: a bias table of 2^18 entries a head
// makes the slot budget (256 MiB of doubles) give 8 slots for 44 units, so each CTA walks units
// in turn (the TMA backward's barrier phases carry across them; kv tiles past L have no q tile).
TEST(FlexAttentionCuda, CapturedGradsWithSeveralUnitsPerCta) {
  KILN_REQUIRE_CUDA();
  manual_seed(28);
  GpuCase c;
  c.B = 2;
  c.Hq = 4;
  c.L = 300;
  c.S = 700;
  const int64_t W = int64_t{1} << 18, off = W / 2;
  const Tensor bias = (randn({c.Hq, W}, kFloat64) * 0.5).detach().requires_grad_();
  const std::vector<double> bv = bias.to_vector();
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, relative_position_bias(bias, off),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * W + q - kv + off]; }, {bias});
}

// Scales other than 1 / sqrt(E), folded into the exponent (scale > 0, no score_mod) or not (a
// negative scale; a score_mod): CUDA against the float64 CPU kernels, out, lse and gradients.
TEST(FlexAttentionCuda, ScalesMatchCpuFoldedOrNot) {
  KILN_REQUIRE_CUDA();
  manual_seed(28);
  const int64_t L = 300, S = 450;
  const BlockMask bm = create_block_mask(sliding_window_mask(200), 1, 1, L, S);
  for (const int64_t E : {64, 128})
    for (const double scale : {0.3, -0.2})
      for (const bool scored : {false, true}) {
        SCOPED_TRACE("E " + std::to_string(E) + ", scale " + std::to_string(scale) + (scored ? ", softcap" : ""));
        const Tensor q = randn({1, 2, L, E}, kFloat64), k = randn({1, 2, S, E}, kFloat64),
                     v = randn({1, 2, S, E}, kFloat64), cot = randn({1, 2, L, E}, kFloat64);
        FlexOptions o;
        o.block_mask = &bm;
        o.return_lse = true;
        o.scale = scale;
        if (scored) o.score_mod = softcap(5.0);
        const FlexRun gpu = run_on(kGpu, kBFloat16, q, k, v, o, cot), cpu = run_on(kCPU, kFloat64, q, k, v, o, cot);
        EXPECT_CLOSE(gpu.out, cpu.out, 2e-2);
        EXPECT_CLOSE(gpu.lse, cpu.lse, 1e-3);
        expect_grads_close(gpu, cpu, 4e-2);
      }
}

// E = 64 rows listing 6 or more blocks take the 64 x 128 forward tile (8 blocks here).
TEST(FlexAttentionCuda, LongRowsAtE64MatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(22);
  GpuCase c;
  c.L = 900;
  c.S = 1000;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
}

// Configurations outside the kernels (fp32, head dim 32, 16-blocks) run the CPU kernels on
// copies: same values as the CPU, gradients back on the device.
TEST(FlexAttentionCuda, UncoveredConfigurationsFallBackToCpu) {
  KILN_REQUIRE_CUDA();
  auto check = [](const Tensor& q_cpu, const FlexOptions& o, const char* what) {
    const Tensor qc = q_cpu.detach().requires_grad_(true);
    const Tensor qg = q_cpu.detach().to(kGpu).requires_grad_(true);
    const Tensor ref = flex_attention(qc, qc, qc, o).out;
    const Tensor got = flex_attention(qg, qg, qg, o).out;
    EXPECT_TRUE(got.is_cuda()) << what;
    EXPECT_EQ(rel_error(got.cpu(), ref), 0.0) << what;
    const auto gr = autograd::grad({sum(ref)}, {qc});
    const auto gg = autograd::grad({sum(got)}, {qg});
    EXPECT_TRUE(gg[0].is_cuda()) << what;
    EXPECT_EQ(rel_error(gg[0].cpu(), gr[0]), 0.0) << what;
  };
  check(randn({1, 2, 16, 64}, kFloat32), FlexOptions(), "fp32");
  check(randn({1, 2, 16, 32}, kBFloat16), FlexOptions(), "head dim 32");
  const BlockMask small = create_block_mask(causal_mask(), 1, 1, 16, 16, 16);
  FlexOptions o;
  o.block_mask = &small;
  check(randn({1, 2, 16, 64}, kBFloat16), o, "16-blocks");
}

TEST(FlexAttentionCuda, BadIndexRaises) {
  KILN_REQUIRE_CUDA();
  const Tensor qb = randn({1, 2, 16, 64}, TensorOptions().dtype(kBFloat16).device(kGpu));
  // A mod reading past its captured tensor raises after the kernel, as on the CPU.
  FlexOptions bad;
  bad.score_mod = relative_position_bias(randn({2, 3}), 0);
  EXPECT_THROW(flex_attention(qb, qb, qb, bad), Error);
}

// Inputs and dout that are views at a 2-byte offset into larger buffers (not 16-byte aligned, as
// TMA and the vector loads need): the same bits as their aligned copies, not an error.
TEST(FlexAttentionCuda, OffsetViewsMatchAlignedCopies) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  const Shape shape = {1, 2, 200, 64};
  const int64_t n = 2 * 200 * 64;
  auto offset_view = [&](const Tensor& dense) {  // dense's values, one element into a buffer
    Tensor buf = zeros({n + 1}, TensorOptions().dtype(kBFloat16).device(kGpu));
    buf.narrow(0, 1, n).copy_(dense.reshape({n}));
    return buf.narrow(0, 1, n).view(shape);
  };
  const Tensor q = randn(shape, kBFloat16).to(kGpu), k = randn(shape, kBFloat16).to(kGpu),
               v = randn(shape, kBFloat16).to(kGpu), cot = randn(shape, kBFloat16).to(kGpu);
  const BlockMask bm = create_block_mask(sliding_window_mask(70), 1, 1, 200, 200);
  FlexOptions o;
  o.block_mask = &bm;
  auto run = [&](const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& d) {
    Tensor qg = qi.detach().requires_grad_(), kg = ki.detach().requires_grad_(), vg = vi.detach().requires_grad_();
    const FlexOutput r = flex_attention(qg, kg, vg, o);
    std::vector<Tensor> got = autograd::grad({r.out}, {qg, kg, vg}, {d});
    got.insert(got.begin(), r.out);
    return got;
  };
  const Tensor qo = offset_view(q);
  ASSERT_NE(reinterpret_cast<uintptr_t>(qo.data_ptr()) % 16, 0u);
  const std::vector<Tensor> a = run(qo, offset_view(k), offset_view(v), offset_view(cot));
  const std::vector<Tensor> b = run(q, k, v, cot);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(rel_error(a[i].to(kCPU, kFloat64), b[i].to(kCPU, kFloat64)), 0.0) << "output " << i;
}

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln::flex
