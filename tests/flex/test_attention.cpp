// flex_attention on the CPU against the float64 dense reference: every built-in mod, random
// compositions, captured tensors, GQA, L != S, ragged lengths, fully masked rows, dtypes;
// finite-difference gradients; bitwise determinism; errors.
#include <omp.h>

#include <cstring>
#include <random>

#include "flex/cpu/attention.h"
#include "flex/ir.h"
#include "kiln/flex.h"
#include "reference.h"
#include "support/testing.h"

namespace kiln::flex {
namespace {

using kiln::testing::expect_gradcheck;
using kiln::testing::rel_error;
using kiln::testing::tolerance;
using testing::all_partial;
using testing::MaskFn;
using testing::reference;
using testing::ScoreFn;

struct Case {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 37, S = 53, E = 16, Ev = 16, bs = 16;
};

// Runs flex_attention and the reference; checks out and lse.
void check(const Case& c, DType dtype, const MaskMod* mask, const MaskFn& mfn, const ScoreMod& smod,
           const ScoreFn& sfn, double tol = -1) {
  const Tensor q = randn({c.B, c.Hq, c.L, c.E}, dtype), k = randn({c.B, c.Hkv, c.S, c.E}, dtype),
               v = randn({c.B, c.Hkv, c.S, c.Ev}, dtype);
  FlexOptions o;
  o.score_mod = smod;
  o.enable_gqa = c.Hq != c.Hkv;
  o.return_lse = true;
  BlockMask bm;
  if (mask) {
    bm = create_block_mask(*mask, mask->expr.uses_b() ? c.B : 1, mask->expr.uses_h() ? c.Hq : 1, c.L, c.S, c.bs);
    o.block_mask = &bm;
  }
  const FlexOutput r = flex_attention(q, k, v, o);
  const auto [ref_out, ref_lse] = reference(q, k, v, sfn, mfn);
  const double t = tol > 0 ? tol : std::max(tolerance(dtype), 1e-11);
  EXPECT_EQ(r.out.dtype(), dtype);
  EXPECT_CLOSE(r.out, ref_out, t);
  EXPECT_CLOSE(r.lse, ref_lse, t);
}

TEST(FlexAttention, BuiltInMasksMatchReference) {
  const Case c;
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    const MaskMod causal = causal_mask(), window = sliding_window_mask(9), prefix = prefix_lm_mask(7),
                  chunk = chunked_mask(12);
    check(c, dt, nullptr, nullptr, ScoreMod(), nullptr);
    check(c, dt, &causal, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; }, ScoreMod(), nullptr);
    check(c, dt, &window, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 9; }, ScoreMod(),
          nullptr);
    check(c, dt, &prefix, [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 7 || q >= kv; }, ScoreMod(), nullptr);
    check(c, dt, &chunk, [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 12 == kv / 12; }, ScoreMod(), nullptr);
  }
}

TEST(FlexAttention, DocumentMask) {
  Case c;
  c.S = c.L = 70;
  std::vector<double> ids(70);
  for (int64_t i = 0; i < 70; ++i) ids[i] = static_cast<double>(i < 20 ? 0 : i < 23 ? 1 : i < 50 ? 2 : 3);
  const MaskMod doc = and_masks({document_mask(tensor(ids, kInt32)), causal_mask()});
  check(c, kFloat32, &doc, [&](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; },
        ScoreMod(), nullptr);
}

TEST(FlexAttention, ScoreModsMatchReference) {
  const Case c;
  const Tensor slopes = rand({c.Hq}, kFloat64);
  const std::vector<double> sl = slopes.to_vector();
  const Tensor bias = randn({c.Hq, c.L + c.S}, kFloat64);
  const std::vector<double> bv = bias.to_vector();
  const int64_t off = c.S;
  const MaskMod causal = causal_mask();
  const MaskFn cf = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    check(c, dt, &causal, cf, alibi(slopes),
          [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
    check(c, dt, nullptr, nullptr, softcap(0.7),
          [](double s, int64_t, int64_t, int64_t, int64_t) { return 0.7 * std::tanh(s / 0.7); });
    check(c, dt, &causal, cf, relative_position_bias(bias, off),
          [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * (c.L + c.S) + q - kv + off]; });
    // A mod using most of the IR: where, min, max, abs, exp, log, int division and modulo.
    const ScoreMod fancy([](Expr s, Expr bb, Expr hh, Expr q, Expr kv) {
      return where((q - kv) % 3 == 0, max(s, Expr(-0.5)), min(s * Expr(0.5), log(abs(s) + Expr(1.0)))) +
             exp(Expr(-0.1) * abs(q / 4 - kv / 4)) + hh - bb;
    });
    check(c, dt, nullptr, nullptr, fancy, [](double s, int64_t bb, int64_t hh, int64_t q, int64_t kv) {
      auto fdiv = [](int64_t x, int64_t y) { return (x >= 0 ? x / y : -((-x + y - 1) / y)); };
      auto fmod3 = [](int64_t x) { return ((x % 3) + 3) % 3; };
      const double base = fmod3(q - kv) == 0 ? std::max(s, -0.5) : std::min(s * 0.5, std::log(std::abs(s) + 1.0));
      return base + std::exp(-0.1 * std::abs(static_cast<double>(fdiv(q, 4) - fdiv(kv, 4)))) + double(hh - bb);
    });
  }
}

// Compiled mods are cached by expression while their captured tensors keep their versions: an
// in-place update of a captured bias (an optimizer step) must reach the next call.
TEST(FlexAttention, InPlaceChangeOfCapturedTensorIsSeen) {
  const Case c;
  Tensor bias = randn({c.Hq, c.L + c.S}, kFloat64);
  const int64_t off = c.S;
  const ScoreMod mod = relative_position_bias(bias, off);
  const MaskMod causal = causal_mask();
  const MaskFn cf = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
  auto expect_matches_bias = [&] {
    const std::vector<double> bv = bias.to_vector();
    check(c, kFloat64, &causal, cf, mod, [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
      return s + bv[h * (c.L + c.S) + q - kv + off];
    });
  };
  expect_matches_bias();
  {
    NoGradGuard ng;
    add_(bias, randn(bias.sizes(), kFloat64));
  }
  expect_matches_bias();
  {
    NoGradGuard ng;
    bias.copy_(randn(bias.sizes(), kFloat64));
  }
  expect_matches_bias();
}

TEST(FlexAttention, RandomCompositionsGqaRaggedLengths) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 6; ++trial) {
    Case c;
    c.B = 1 + rng() % 2;
    c.Hkv = 1 + rng() % 2;
    c.Hq = c.Hkv * (1 + rng() % 3);
    c.L = 5 + rng() % 60;
    c.S = 5 + rng() % 60;
    c.E = 4 + rng() % 12;
    c.Ev = 3 + rng() % 10;
    c.bs = std::vector<int64_t>{4, 8, 16, 128}[rng() % 4];
    const int64_t w = 1 + rng() % 20, ch = 2 + rng() % 10, pre = rng() % 10;
    const MaskMod m = or_masks({and_masks({sliding_window_mask(w), MaskMod([](Expr, Expr hh, Expr q, Expr) {
                                                                         return (q + hh) % 4 != 1;
                                                                       })}),
                                chunked_mask(ch), MaskMod([pre](Expr, Expr, Expr, Expr kv) { return kv < pre; })});
    const MaskFn f = [=](int64_t, int64_t hh, int64_t q, int64_t kv) {
      return (q >= kv && q - kv < w && (q + hh) % 4 != 1) || q / ch == kv / ch || kv < pre;
    };
    SCOPED_TRACE("trial " + std::to_string(trial));
    check(c, kFloat32, &m, f, softcap(2.0), [](double s, int64_t, int64_t, int64_t, int64_t) { return 2.0 * std::tanh(s / 2.0); });
  }
}

TEST(FlexAttention, LowPrecision) {
  const Case c;
  const MaskMod window = sliding_window_mask(20);
  const MaskFn f = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 20; };
  check(c, kBFloat16, &window, f, ScoreMod(), nullptr, 2e-2);
  check(c, kFloat16, &window, f, ScoreMod(), nullptr, 5e-3);
}

TEST(FlexAttention, FullyMaskedRowsGiveZeroAndNoNan) {
  Case c;
  c.L = c.S = 13;
  c.E = 4;
  c.Ev = 3;
  c.bs = 4;
  // Rows q < 3 attend nothing (kv < q - 2 is empty there).
  const MaskMod m([](Expr, Expr, Expr q, Expr kv) { return kv < q - 2; });
  const BlockMask bm = create_block_mask(m, 1, 1, c.L, c.S, c.bs);
  Tensor q = randn({1, 2, c.L, c.E}, kFloat64).requires_grad_(), k = randn({1, 2, c.S, c.E}, kFloat64).requires_grad_(),
         v = randn({1, 2, c.S, c.Ev}, kFloat64).requires_grad_();
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  const FlexOutput r = flex_attention(q, k, v, o);
  const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(lse[h * c.L + i], -INFINITY);
      for (int64_t e = 0; e < c.Ev; ++e) EXPECT_EQ(out[(h * c.L + i) * c.Ev + e], 0.0);
    }
  const auto [ref, ref_lse] = reference(q, k, v, nullptr, [](int64_t, int64_t, int64_t qi, int64_t kv) { return kv < qi - 2; });
  EXPECT_CLOSE(r.out, ref, 1e-12);
  EXPECT_CLOSE(r.lse, ref_lse, 1e-12);
  r.out.backward(randn(r.out.sizes(), kFloat64));
  for (const Tensor* t : {&q, &k, &v})
    for (double x : t->grad().to_vector()) ASSERT_TRUE(std::isfinite(x));
  const std::vector<double> gq = q.grad().to_vector();
  for (int64_t i = 0; i < 3 * c.E; ++i) EXPECT_EQ(gq[i], 0.0);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) { return flex_attention(in[0], in[1], in[2], o).out; },
      {q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()});
}

TEST(FlexAttention, GradcheckQkvWithMasksAndScoreMods) {
  const int64_t L = 9, S = 11;
  const MaskMod m = or_masks({sliding_window_mask(5), prefix_lm_mask(2)});
  const BlockMask bm = create_block_mask(m, 1, 1, L, S, 4);
  for (bool gqa : {false, true}) {
    const int64_t Hq = gqa ? 4 : 2, Hkv = 2;
    const Tensor q = randn({1, Hq, L, 4}, kFloat64).requires_grad_(), k = randn({1, Hkv, S, 4}, kFloat64).requires_grad_(),
                 v = randn({1, Hkv, S, 3}, kFloat64).requires_grad_();
    FlexOptions o;
    o.block_mask = &bm;
    o.score_mod = softcap(1.5);
    o.enable_gqa = gqa;
    expect_gradcheck([&](const std::vector<Tensor>& in) { return flex_attention(in[0], in[1], in[2], o).out; }, {q, k, v});
    // The logsumexp output is differentiable too.
    o.return_lse = true;
    expect_gradcheck([&](const std::vector<Tensor>& in) { return flex_attention(in[0], in[1], in[2], o).lse; }, {q, k, v});
  }
}

TEST(FlexAttention, GradcheckCapturedTensors) {
  const int64_t H = 2, L = 9, S = 10;
  const Tensor q = randn({1, H, L, 4}, kFloat64).requires_grad_(), k = randn({1, H, S, 4}, kFloat64).requires_grad_(),
               v = randn({1, H, S, 3}, kFloat64).requires_grad_();
  const Tensor bias = randn({H, L + S}, kFloat64).requires_grad_();
  const Tensor slopes = rand({H}, kFloat64).requires_grad_();
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, L, S, 4);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        FlexOptions o;
        o.block_mask = &bm;
        o.score_mod = relative_position_bias(in[3], S);
        return flex_attention(in[0], in[1], in[2], o).out;
      },
      {q, k, v, bias});
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        FlexOptions o;
        o.score_mod = alibi(in[3]);
        return flex_attention(in[0], in[1], in[2], o).out;
      },
      {q, k, v, slopes});
  // Bias read twice with a nonlinearity between (the reverse pass must add both uses).
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        Captured t = capture(in[3]);
        FlexOptions o;
        o.score_mod = ScoreMod([&](Expr s, Expr, Expr hh, Expr qi, Expr kv) {
          return tanh(s + t[hh][qi - kv + S]) * t[1 - hh][kv];
        });
        return flex_attention(in[0], in[1], in[2], o).out;
      },
      {q, k, v, bias});
}

// Gradients of q, k, v and a captured bias for a fixed problem, as raw bits.
std::vector<std::vector<double>> run_backward(const BlockMask& bm, uint64_t seed, bool with_score = true) {
  manual_seed(seed);
  const int64_t H = 4, L = 150, S = 170;
  Tensor q = randn({2, H, L, 32}).requires_grad_(), k = randn({2, 2, S, 32}).requires_grad_(),
         v = randn({2, 2, S, 24}).requires_grad_(), bias = randn({H, L + S}).requires_grad_();
  FlexOptions o;
  o.block_mask = &bm;
  o.enable_gqa = true;
  if (with_score) o.score_mod = relative_position_bias(bias, S);
  else bias.requires_grad_(false);
  const Tensor out = flex_attention(q, k, v, o);
  out.backward(randn(out.sizes()));
  return {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector(),
          with_score ? bias.grad().to_vector() : std::vector<double>()};
}

bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) != 0)
      return false;
  return true;
}

TEST(FlexAttention, BackwardIsBitwiseDeterministic) {
  const BlockMask bm = create_block_mask(sliding_window_mask(60), 1, 1, 150, 170, 32);
  const auto a = run_backward(bm, 5), b = run_backward(bm, 5);
  EXPECT_TRUE(same_bits(a, b)) << "two runs differ";
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run_backward(bm, 5);
  omp_set_num_threads(2);
  const auto two = run_backward(bm, 5);
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(one, two)) << "1 thread vs 2 threads differ";
  EXPECT_TRUE(same_bits(a, one));
  // The same mask with every listed block marked partial: identical bits (classification-free).
  const BlockMask partial = all_partial(bm, 32);
  EXPECT_TRUE(same_bits(a, run_backward(partial, 5))) << "full vs partial classification changes the result";
  // The two-pass backward (used where the fused one's dQ slots would be too large): same bits.
  cpu::set_fused_backward_limit(-1);
  const auto two_pass = run_backward(bm, 5), two_pass_partial = run_backward(partial, 5);
  cpu::set_fused_backward_limit(int64_t{32} << 20);
  EXPECT_TRUE(same_bits(a, two_pass)) << "fused vs two-pass backward differ";
  EXPECT_TRUE(same_bits(a, two_pass_partial)) << "fused vs two-pass backward differ (all partial)";
  // Without a score_mod the backward also skips the masked columns / rows of partial blocks.
  const auto plain = run_backward(bm, 6, false);
  EXPECT_TRUE(same_bits(plain, run_backward(partial, 6, false))) << "no score_mod: full vs partial differ";
  omp_set_num_threads(1);
  const auto plain_one = run_backward(bm, 6, false);
  omp_set_num_threads(threads);
  cpu::set_fused_backward_limit(-1);
  const auto plain_two_pass = run_backward(bm, 6, false);
  cpu::set_fused_backward_limit(int64_t{32} << 20);
  EXPECT_TRUE(same_bits(plain, plain_one)) << "no score_mod: 1 thread vs 2 threads differ";
  EXPECT_TRUE(same_bits(plain, plain_two_pass)) << "no score_mod: fused vs two-pass differ";
}

// AffineMask (runs of kept kv positions for affine index masks) against the row evaluator, on
// random compositions of comparisons, and/or/not/where, scaled and shifted indices, and loads.
TEST(FlexAttention, AffineMaskRowsMatchRowEval) {
  std::mt19937 rng(11);
  const Tensor offs = tensor(std::vector<double>{3, -2, 7, 0}, kInt64);
  const Captured off = capture(offs);
  auto leaf = [&](int pick, const Expr& b, const Expr& h, const Expr& q, const Expr& kv) -> Expr {
    const int64_t c = static_cast<int64_t>(rng() % 40) - 20;
    switch (pick) {
      case 0: return q - kv < Expr(c);
      case 1: return q >= kv;
      case 2: return kv * Expr(2) + Expr(c) <= q;
      case 3: return Expr(3) * q - kv * Expr(3) > Expr(c);
      case 4: return (q - kv) == Expr(c % 5);
      case 5: return kv != q + off[h] + b;
      case 6: return -kv + q / Expr(4) >= Expr(c) - h;
      default: return kv < Expr(c + 30);
    }
  };
  for (int trial = 0; trial < 40; ++trial) {
    const int p0 = static_cast<int>(rng() % 8), p1 = static_cast<int>(rng() % 8), p2 = static_cast<int>(rng() % 8),
              shape = static_cast<int>(rng() % 4);
    const MaskMod m([&](Expr b, Expr h, Expr q, Expr kv) {
      Expr x = leaf(p0, b, h, q, kv), y = leaf(p1, b, h, q, kv), z = leaf(p2, b, h, q, kv);
      switch (shape) {
        case 0: return x & y;
        case 1: return (x | y) & !z;
        case 2: return where(x, y, z);
        default: return (!(x & y)) | z;
      }
    });
    const detail::Program prog = detail::compile(m.expr);
    cpu::AffineMask affine(prog);
    ASSERT_TRUE(affine.ok()) << "trial " << trial;
    detail::RowEval<float> eval(prog, 48);
    std::vector<float> s(48);
    std::vector<int32_t> lo(100), hi(100);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t c0 = 0; c0 < 140; c0 += 48) {
          const bool cached = c0 == 48;  // rows from bounds() (cached), else evaluated one by one
          if (cached) {
            ASSERT_TRUE(affine.bounds(b, h, 0, 100, c0, 48, lo.data(), hi.data()));
          }
          for (int64_t q = 0; q < 100; q += 7) {
            std::fill(s.begin(), s.end(), 1.0f);
            ASSERT_TRUE(affine.apply(b, h, q, c0, 48, s.data())) << "trial " << trial;
            eval.run(b, h, q, c0, 48, nullptr);
            for (int64_t c = 0; c < 48; ++c) {
              const bool keep = eval.bool_result()[c] != 0;
              ASSERT_EQ(s[c] == 1.0f, keep) << "trial " << trial << " b " << b << " h " << h << " q " << q
                                            << " kv " << c0 + c;
              if (cached && keep) {
                ASSERT_TRUE(c >= lo[q] && c < hi[q]) << "trial " << trial << " q " << q;
              }
            }
          }
        }
  }
  // Masks that are not affine in kv (a kv-dependent division or gather) are left to RowEval.
  const detail::Program chunked = detail::compile(chunked_mask(16).expr);
  EXPECT_FALSE(cpu::AffineMask(chunked).ok() && cpu::AffineMask(chunked).apply(0, 0, 5, 0, 8, std::vector<float>(8).data()));
}

TEST(FlexAttention, BlockMaskBroadcastsOverBatchAndHeads) {
  Case c;
  c.B = 2;
  c.Hq = c.Hkv = 3;
  const MaskMod per_head([](Expr bb, Expr hh, Expr q, Expr kv) { return q - kv <= hh * 4 + bb; });
  check(c, kFloat64, &per_head, [](int64_t bb, int64_t hh, int64_t q, int64_t kv) { return q - kv <= hh * 4 + bb; },
        ScoreMod(), nullptr);
}

TEST(FlexAttention, NonContiguousInputs) {
  // [B, L, H, E] storage viewed as [B, H, L, E], as a projection usually produces.
  const Tensor q = randn({2, 19, 3, 8}).transpose(1, 2), k = randn({2, 23, 3, 8}).transpose(1, 2),
               v = randn({2, 23, 3, 5}).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, 19, 23, 8);
  FlexOptions o;
  o.block_mask = &bm;
  const auto [ref, ref_lse] = reference(q, k, v, nullptr, [](int64_t, int64_t, int64_t qi, int64_t kv) { return qi >= kv; });
  EXPECT_CLOSE(flex_attention(q, k, v, o).out, ref, tolerance(kFloat32));
}

TEST(FlexAttention, LowPrecisionGradientsTrackFloat64) {
  const Tensor q = randn({1, 2, 40, 16}, kFloat64), k = randn({1, 2, 40, 16}, kFloat64), v = randn({1, 2, 40, 16}, kFloat64);
  const Tensor cot = randn({1, 2, 40, 16}, kFloat64);
  const BlockMask bm = create_block_mask(sliding_window_mask(12), 1, 1, 40, 40, 16);
  auto grads = [&](DType dt) {
    Tensor a = q.to(dt).detach().clone().requires_grad_(), b2 = k.to(dt).detach().clone().requires_grad_(),
           c = v.to(dt).detach().clone().requires_grad_();
    FlexOptions o;
    o.block_mask = &bm;
    o.score_mod = softcap(5.0);
    const Tensor out = flex_attention(a, b2, c, o);
    return autograd::grad({out}, {a, b2, c}, {cot.to(dt)});
  };
  const auto ref = grads(kFloat64);
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto g = grads(dt);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(g[i].dtype(), dt);
      EXPECT_CLOSE(g[i], ref[i], dt == kFloat32 ? 1e-5 : 3e-2);
    }
  }
}

TEST(FlexAttention, Errors) {
  const Tensor q = randn({1, 2, 8, 64}), k = randn({1, 2, 8, 128}), v = randn({1, 2, 8, 64});
  try {
    flex_attention(q, k, v);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[flex_attention] q and k head dims differ: 64 vs 128");
  }
  const Tensor q4 = randn({1, 4, 8, 16}), k3 = randn({1, 3, 8, 16}), v3 = randn({1, 3, 8, 16});
  FlexOptions gqa;
  gqa.enable_gqa = true;
  EXPECT_THROW(flex_attention(q4, k3, v3, gqa), Error);
  const Tensor k2 = randn({1, 2, 8, 16}), v2 = randn({1, 2, 8, 16});
  try {
    flex_attention(q4, k2, v2);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("enable_gqa"), std::string::npos) << e.what();
  }
  try {
    flex_attention(q4, k2, randn({1, 2, 9, 16}), gqa);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] k and v"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1, 2, 9, 16]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(flex_attention(randn({2, 8, 16}), k2, v2), Error);
  EXPECT_THROW(flex_attention(q4, k2.to(kFloat64), v2, gqa), Error);
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, 16, 16);
  FlexOptions o;
  o.block_mask = &bm;
  o.enable_gqa = true;
  EXPECT_THROW(flex_attention(q4, k2, v2, o), Error);  // mask built for length 16, q has 8
  // A score_mod reading past its captured tensor raises after the kernel.
  FlexOptions bad;
  bad.score_mod = relative_position_bias(randn({4, 3}), 0);
  bad.enable_gqa = true;
  EXPECT_THROW(flex_attention(q4, k2, v2, bad), Error);
}

}  // namespace
}  // namespace kiln::flex
