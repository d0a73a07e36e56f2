// The mod IR (building, printing, kind errors) and BlockMask creation: classification checked
// against dense evaluation, the transposed lists, broadcasting, the 1M-token sliding window.
#include <chrono>
#include <random>

#include "flex/block_mask_impl.h"
#include "flex/ir.h"
#include "kiln/flex.h"
#include "reference.h"
#include "support/testing.h"

namespace kiln::flex {
namespace {

TEST(FlexIR, PrintsExpressions) {
  MaskMod m([](Expr, Expr, Expr q, Expr kv) { return (q >= kv) & (q - kv < 256); });
  EXPECT_EQ(m.to_string(), "((q_idx >= kv_idx) & ((q_idx - kv_idx) < 256))");
  Tensor bias = randn({2, 7}, kFloat32);
  EXPECT_EQ(relative_position_bias(bias, 3).to_string(), "(score + buf0[h][((q_idx - kv_idx) + 3)])");
  EXPECT_EQ(softcap(30).to_string(), "(30.0 * tanh((score / 30.0)))");
  EXPECT_EQ(to_string(where(q_idx() > 2, exp(score()), Expr(1))), "where((q_idx > 2), exp(score), float(1))");
  EXPECT_EQ(to_string(min(abs(q_idx() - kv_idx()), Expr(4)) % 3), "(min(abs((q_idx - kv_idx)), 4) % 3)");
}

TEST(FlexIR, KindErrors) {
  EXPECT_THROW(q_idx() & kv_idx(), Error);                 // & on ints
  EXPECT_THROW(MaskMod(q_idx() + kv_idx()), Error);         // mask must be bool
  EXPECT_THROW(MaskMod(score() > 0.0), Error);              // mask cannot read score
  EXPECT_THROW(score() & q_idx(), Error);                   // & on a float
  Captured t = capture(randn({3, 4}));
  EXPECT_THROW(t[q_idx()] + 1, Error);                      // partial load used as a value
  EXPECT_THROW(t[q_idx()][kv_idx()][b()], Error);           // too many indices
  EXPECT_THROW(t[score()], Error);                          // float index
  EXPECT_THROW(capture(randn({2, 2, 2, 2})), Error);        // 4-d
  try {
    (void)(q_idx() | Expr(1.0));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex]"), std::string::npos) << e.what();
  }
}

// Dense truth of a mask for (b, h).
std::vector<uint8_t> dense_mask(const testing::MaskFn& f, int64_t b, int64_t h, int64_t L, int64_t S) {
  std::vector<uint8_t> m(static_cast<size_t>(L * S));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) m[i * S + j] = f(b, h, i, j);
  return m;
}

// Every (b, h, q block, kv block) of bm's kv lists, row-major: 0 unlisted, 1 partial, 2 full.
// listed_twice (when given) is set if a block appears in both lists or twice in one.
std::vector<int> block_classes(const BlockMask& bm, bool* listed_twice = nullptr) {
  const int64_t nKV = bm.num_kv_blocks(), rows = bm.kv_num_blocks.numel();
  std::vector<int> cls(static_cast<size_t>(rows * nKV), 0);
  for (const auto& [num_t, idx_t, kind] : {std::tuple{bm.kv_num_blocks, bm.kv_indices, 1},
                                           std::tuple{bm.full_kv_num_blocks, bm.full_kv_indices, 2}}) {
    const std::vector<double> n = num_t.to_vector(), x = idx_t.to_vector();
    const int64_t m = idx_t.size(3);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n[r]; ++c) {
        int& slot = cls[r * nKV + static_cast<int64_t>(x[r * m + c])];
        if (slot != 0 && listed_twice) *listed_twice = true;
        slot = kind;
      }
  }
  return cls;
}

// Every full block all-true, every empty block all-false, every non-empty block listed once, and
// the q_* lists are the transpose. `exact`: partial blocks must be mixed (data-dependent masks).
void check_block_mask(const BlockMask& bm, const testing::MaskFn& f, int64_t B, int64_t H, int64_t L, int64_t S,
                      int64_t bs, bool exact) {
  const int64_t nQ = (L + bs - 1) / bs, nKV = (S + bs - 1) / bs;
  ASSERT_EQ(bm.kv_num_blocks.sizes(), (Shape{B, H, nQ}));
  ASSERT_EQ(bm.q_num_blocks.sizes(), (Shape{B, H, nKV}));
  bool listed_twice = false;
  const std::vector<int> cls = block_classes(bm, &listed_twice);  // [B, H, nQ, nKV]
  ASSERT_FALSE(listed_twice) << "a block is listed twice";
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<uint8_t> m = dense_mask(f, b, h, L, S);
      for (int64_t i = 0; i < nQ; ++i)
        for (int64_t j = 0; j < nKV; ++j) {
          int64_t ones = 0, total = 0;
          for (int64_t x = i * bs; x < std::min(L, (i + 1) * bs); ++x)
            for (int64_t y = j * bs; y < std::min(S, (j + 1) * bs); ++y) {
              ones += m[x * S + y];
              ++total;
            }
          const int c = cls[((b * H + h) * nQ + i) * nKV + j];
          if (c == 2) {
            EXPECT_EQ(ones, total) << "full block (" << i << ", " << j << ") has masked entries";
          } else if (c == 0) {
            EXPECT_EQ(ones, 0) << "empty block (" << i << ", " << j << ") has unmasked entries";
          } else if (exact) {
            EXPECT_TRUE(ones > 0 && ones < total) << "partial block (" << i << ", " << j << ")";
          }
        }
    }
  // The transpose: q lists hold exactly the (i, j) pairs of the kv lists, ascending.
  const std::vector<double> qn = bm.q_num_blocks.to_vector(), qi = bm.q_indices.to_vector(),
                            fqn = bm.full_q_num_blocks.to_vector(), fqi = bm.full_q_indices.to_vector();
  const int64_t qm = bm.q_indices.size(3), fqm = bm.full_q_indices.size(3);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < nKV; ++j) {
      const int64_t r = bh * nKV + j;
      for (int64_t c = 0; c < qn[r]; ++c) {
        EXPECT_EQ(cls[(bh * nQ + static_cast<int64_t>(qi[r * qm + c])) * nKV + j], 1);
        if (c > 0) {
          EXPECT_LT(qi[r * qm + c - 1], qi[r * qm + c]);
        }
      }
      for (int64_t c = 0; c < fqn[r]; ++c) EXPECT_EQ(cls[(bh * nQ + static_cast<int64_t>(fqi[r * fqm + c])) * nKV + j], 2);
    }
  int64_t listed = 0, qlisted = 0;
  for (int c : cls) listed += c != 0;
  for (double x : qn) qlisted += static_cast<int64_t>(x);
  for (double x : fqn) qlisted += static_cast<int64_t>(x);
  EXPECT_EQ(listed, qlisted);
}

TEST(FlexBlockMask, BuiltInMasksMatchDenseEvaluation) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t L = 20 + rng() % 90, S = 20 + rng() % 90, bs = std::vector<int64_t>{8, 16, 32}[rng() % 3];
    const int64_t w = 1 + rng() % 40, pre = rng() % 30, c = 1 + rng() % 25;
    check_block_mask(create_block_mask(causal_mask(), 1, 1, L, S, bs),
                     [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; }, 1, 1, L, S, bs, false);
    check_block_mask(create_block_mask(sliding_window_mask(w), 1, 1, L, S, bs),
                     [w](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < w; }, 1, 1, L, S, bs, false);
    check_block_mask(create_block_mask(prefix_lm_mask(pre), 1, 1, L, S, bs),
                     [pre](int64_t, int64_t, int64_t q, int64_t kv) { return kv < pre || q >= kv; }, 1, 1, L, S, bs, false);
    check_block_mask(create_block_mask(chunked_mask(c), 1, 1, L, S, bs),
                     [c](int64_t, int64_t, int64_t q, int64_t kv) { return q / c == kv / c; }, 1, 1, L, S, bs, false);
    // Sorted document ids (packing), shared by q and kv (L == S here).
    std::vector<double> ids(static_cast<size_t>(L));
    int64_t doc = 0;
    for (int64_t i = 0; i < L; ++i) {
      if (rng() % 12 == 0) ++doc;
      ids[i] = static_cast<double>(doc);
    }
    Tensor doc_ids = tensor(ids, kInt64);
    check_block_mask(create_block_mask(document_mask(doc_ids), 1, 1, L, L, bs),
                     [ids](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv]; }, 1, 1, L, L, bs, true);
  }
}

TEST(FlexBlockMask, RandomCompositionsAndHeadDependence) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t B = 1 + rng() % 2, H = 1 + rng() % 3, L = 10 + rng() % 70, S = 10 + rng() % 70;
    const int64_t bs = std::vector<int64_t>{4, 8, 16}[rng() % 3], w = 1 + rng() % 20, c = 1 + rng() % 9;
    const Tensor keep = randint(0, 2, {H, S}, kInt64);  // a data-dependent per-head kv mask
    const std::vector<double> kv_keep = keep.to_vector();
    Captured kk = capture(keep);
    const MaskMod a = sliding_window_mask(w), bmod = chunked_mask(c);
    const MaskMod per_head([](Expr, Expr hh, Expr q, Expr kv) { return (q + hh) % 3 != kv % 2; });
    const MaskMod data([&](Expr, Expr hh, Expr, Expr kv) { return kk[hh][kv] == 1; });
    const MaskMod batchy([](Expr bb, Expr, Expr q, Expr kv) { return abs(q - kv) <= bb * 3 + 2; });
    const testing::MaskFn fa = [w](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < w; };
    const testing::MaskFn fb = [c](int64_t, int64_t, int64_t q, int64_t kv) { return q / c == kv / c; };
    const testing::MaskFn fh = [](int64_t, int64_t hh, int64_t q, int64_t kv) { return (q + hh) % 3 != kv % 2; };
    const testing::MaskFn fd = [&](int64_t, int64_t hh, int64_t, int64_t kv) { return kv_keep[hh * S + kv] == 1; };
    const testing::MaskFn fbb = [](int64_t bb, int64_t, int64_t q, int64_t kv) { return std::abs(q - kv) <= bb * 3 + 2; };
    check_block_mask(create_block_mask(or_masks({a, bmod}), B, H, L, S, bs),
                     [&](int64_t x, int64_t y, int64_t q, int64_t kv) { return fa(x, y, q, kv) || fb(x, y, q, kv); }, B, H, L,
                     S, bs, false);
    check_block_mask(create_block_mask(and_masks({or_masks({a, per_head}), data}), B, H, L, S, bs),
                     [&](int64_t x, int64_t y, int64_t q, int64_t kv) { return (fa(x, y, q, kv) || fh(x, y, q, kv)) && fd(x, y, q, kv); },
                     B, H, L, S, bs, false);
    check_block_mask(create_block_mask(and_masks({batchy, causal_mask()}), B, H, L, S, bs),
                     [&](int64_t x, int64_t y, int64_t q, int64_t kv) { return fbb(x, y, q, kv) && q >= kv; }, B, H, L, S, bs,
                     false);
  }
}

// detail::halve_blocks (the CUDA path's 64-blocks for short rows): the halved mask, read with the
// parent's semantics (a full parent keeps everything, a partial one the mask, an unlisted one
// nothing), is a valid BlockMask of that effective mask at half the block size, and drops the
// sub-blocks interval analysis proves empty.
TEST(FlexBlockMask, HalvedBlocksKeepTheParentsElements) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t B = 1 + rng() % 2, H = 1 + rng() % 3, L = 20 + rng() % 90, S = 20 + rng() % 90;
    const int64_t bs = std::vector<int64_t>{8, 16, 32}[rng() % 3], w = 1 + rng() % 40;
    const Tensor keep = randint(0, 2, {H, S}, kInt64);
    const std::vector<double> kv_keep = keep.to_vector();
    Captured kk = capture(keep);
    const MaskMod window = sliding_window_mask(w);
    const MaskMod data([&](Expr, Expr hh, Expr q, Expr kv) { return (kk[hh][kv] == 1) & (q >= kv); });
    const testing::MaskFn fw = [w](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < w; };
    const testing::MaskFn fd = [&](int64_t, int64_t hh, int64_t q, int64_t kv) { return kv_keep[hh * S + kv] == 1 && q >= kv; };
    for (const auto& [mod, fn, heads] : {std::tuple{window, fw, int64_t{1}}, std::tuple{data, fd, H}}) {
      BlockMask parent = create_block_mask(mod, B, heads, L, S, bs);
      if (trial % 2 == 1) {  // a caller's subset: the last listed partial block of each row dropped
        Tensor num = parent.kv_num_blocks.clone();
        int32_t* n = num.data_ptr<int32_t>();
        for (int64_t r = 0; r < num.numel(); ++r) n[r] = std::max(0, n[r] - 1);
        parent = BlockMask::from_kv_blocks(num, parent.kv_indices, parent.full_kv_num_blocks, parent.full_kv_indices, L, S,
                                           bs, mod);
      }
      const int64_t nKV = (S + bs - 1) / bs, nQ = (L + bs - 1) / bs;
      const std::vector<int> kind = block_classes(parent);
      const int64_t hs = heads;
      const testing::MaskFn effective = [&, hs](int64_t b, int64_t h, int64_t q, int64_t kv) {
        const int k = kind[((b * hs + h) * nQ + q / bs) * nKV + kv / bs];
        return k == 2 || (k == 1 && fn(b, h, q, kv));
      };
      const detail::Program prog = detail::compile(mod.expr);
      for (const detail::Buffer& buf : prog.buffers) buf.build_pyramid();
      const BlockMask half = detail::halve_blocks(parent, prog);
      EXPECT_EQ(half.q_block_size, bs / 2);
      check_block_mask(half, effective, B, hs, L, S, bs / 2, false);
      if (trial % 2 == 0 && heads == 1) {  // a window's diagonal blocks lose their empty upper corner
        int64_t listed = 0, parents = 0;
        for (double x : half.kv_num_blocks.to_vector()) listed += static_cast<int64_t>(x);
        for (double x : half.full_kv_num_blocks.to_vector()) listed += static_cast<int64_t>(x);
        for (int k : kind) parents += k != 0;
        EXPECT_LT(listed, 4 * parents) << "nothing dropped at L " << L << ", S " << S << ", block " << bs;
      }
    }
  }
}

// detail::merge_block_lists (the CUDA kernels' one-list walk): each kv row and each q column lists
// every block the mask lists, ascending, as 2 * block + (1 if partial).
TEST(FlexBlockMask, MergedListsInterleaveFullAndPartialBlocks) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t B = 1 + rng() % 2, H = 1 + rng() % 2, L = 30 + rng() % 200, S = 30 + rng() % 200;
    const int64_t bs = std::vector<int64_t>{8, 16, 32}[rng() % 3], w = 1 + rng() % 60;
    const MaskMod mod = or_masks({sliding_window_mask(w), prefix_lm_mask(1 + rng() % 20)});
    const BlockMask bm = create_block_mask(mod, B, H, L, S, bs);
    const BlockMask merged = detail::merge_block_lists(bm);
    const std::vector<int> kind = block_classes(bm);  // [B, H, nQ, nKV]: 0 none, 1 partial, 2 full
    const int64_t nQ = (L + bs - 1) / bs, nKV = (S + bs - 1) / bs;
    // Row r of lists (num, idx) against the blocks class_of(x) lists for x < n, ascending.
    const auto expect_row = [](const Tensor& num, const Tensor& idx, int64_t r, int64_t n, const auto& class_of) {
      std::vector<double> want;
      for (int64_t x = 0; x < n; ++x)
        if (const int k = class_of(x)) want.push_back(static_cast<double>(2 * x + (k == 1)));
      const std::vector<double> nv = num.to_vector(), iv = idx.to_vector();
      const int64_t m = idx.size(3);
      ASSERT_EQ(nv[r], static_cast<double>(want.size())) << "row " << r;
      EXPECT_EQ(std::vector<double>(iv.begin() + r * m, iv.begin() + r * m + static_cast<int64_t>(nv[r])), want)
          << "row " << r;
    };
    for (int64_t bh = 0; bh < B * H; ++bh) {
      for (int64_t i = 0; i < nQ; ++i)
        expect_row(merged.kv_num_blocks, merged.kv_indices, bh * nQ + i, nKV,
                   [&](int64_t j) { return kind[(bh * nQ + i) * nKV + j]; });
      for (int64_t j = 0; j < nKV; ++j)
        expect_row(merged.q_num_blocks, merged.q_indices, bh * nKV + j, nQ,
                   [&](int64_t i) { return kind[(bh * nQ + i) * nKV + j]; });
    }
  }
}

TEST(FlexBlockMask, DenseSparsityAndPrinting) {
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, 256, 256, 64);
  const std::vector<double> d = bm.to_dense().to_vector();
  const std::vector<double> expect = {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  EXPECT_EQ(d, expect);
  EXPECT_NEAR(bm.sparsity(), 37.5, 1e-12);
  EXPECT_EQ(bm.kv_num_blocks.to_vector(), (std::vector<double>{1, 1, 1, 1}));     // the diagonal is partial
  EXPECT_EQ(bm.full_kv_num_blocks.to_vector(), (std::vector<double>{0, 1, 2, 3}));
  const std::string s = bm.to_string();
  EXPECT_NE(s.find("sparsity=37.50%"), std::string::npos) << s;
  EXPECT_NE(s.find("##+."), std::string::npos) << s;
  // noop: everything full; B/H given but mask independent of them: rows replicated.
  const BlockMask all = create_block_mask(noop_mask(), 2, 3, 100, 70, 32);
  EXPECT_EQ(all.kv_num_blocks.sizes(), (Shape{2, 3, 4}));
  for (double x : all.full_kv_num_blocks.to_vector()) EXPECT_EQ(x, 3);
  for (double x : all.kv_num_blocks.to_vector()) EXPECT_EQ(x, 0);
  EXPECT_EQ(all.sparsity(), 0);
}

TEST(FlexBlockMask, FromKvBlocksBuildsTranspose) {
  const BlockMask ref = create_block_mask(sliding_window_mask(40), 1, 2, 100, 100, 16);
  const BlockMask bm = BlockMask::from_kv_blocks(ref.kv_num_blocks, ref.kv_indices, ref.full_kv_num_blocks,
                                                 ref.full_kv_indices, 100, 100, 16, ref.mask_mod);
  EXPECT_EQ(bm.q_num_blocks.to_vector(), ref.q_num_blocks.to_vector());
  EXPECT_EQ(bm.full_q_indices.to_vector(), ref.full_q_indices.to_vector());
  EXPECT_THROW(BlockMask::from_kv_blocks(ref.kv_num_blocks, ref.kv_indices, Tensor(), Tensor(), 300, 100, 16), Error);
}

TEST(FlexBlockMask, MillionTokenSlidingWindowIsFastAndSmall) {
  const int64_t n = 1 << 20;
  create_block_mask(sliding_window_mask(256), 1, 1, 4096, 4096);  // warm the thread pool
  const auto t0 = std::chrono::steady_clock::now();
  const BlockMask bm = create_block_mask(sliding_window_mask(256), 1, 1, n, n);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 200.0) << "1M-token sliding-window BlockMask took " << ms << " ms";
  EXPECT_LT(bm.nbytes(), 4 << 20) << bm.nbytes() << " bytes";
  // Row i: partial blocks i-2 and i (the diagonal), full block i-1.
  const int32_t* pn = bm.kv_num_blocks.data_ptr<int32_t>();
  const int32_t* fn = bm.full_kv_num_blocks.data_ptr<int32_t>();
  EXPECT_EQ(pn[0], 1);
  EXPECT_EQ(fn[0], 0);
  EXPECT_EQ(pn[1], 1);
  EXPECT_EQ(fn[1], 1);
  EXPECT_EQ(pn[5000], 2);
  EXPECT_EQ(fn[5000], 1);
  EXPECT_EQ(bm.kv_indices.data_ptr<int32_t>()[5000 * bm.kv_indices.size(3)], 4998);
  EXPECT_GT(bm.sparsity(), 99.9);
  std::printf("[ info ] 1M-token sliding-window(256) BlockMask: %.1f ms, %lld bytes\n", ms,
              static_cast<long long>(bm.nbytes()));
}

TEST(FlexBlockMask, Errors) {
  EXPECT_THROW(create_block_mask(causal_mask(), 0, 1, 10, 10), Error);
  EXPECT_THROW(create_block_mask(causal_mask(), 1, 1, 10, 10, 0), Error);
  // A captured tensor too short for the sequence: raised, never read out of bounds.
  Tensor doc = zeros({5}, kInt64);
  try {
    create_block_mask(document_mask(doc), 1, 1, 16, 16, 4);
    ADD_FAILURE() << "a 5-entry document mask for 16 positions must raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[create_block_mask]"), std::string::npos);
  }
}

// Interval analysis proves the loads of the usual mods in range (the CUDA kernels then skip the
// host read of their out-of-range flag) and refuses when a tensor is too short for the lengths.
TEST(FlexIr, LoadsInBoundsByIntervalAnalysis) {
  using detail::compile;
  using detail::loads_in_bounds;
  const int64_t L = 300, S = 300, H = 3;
  const Tensor doc = randint(0, 4, {S}, kInt64);
  EXPECT_TRUE(loads_in_bounds(compile(document_mask(doc).expr), 2, H, L, S));
  EXPECT_FALSE(loads_in_bounds(compile(document_mask(doc).expr), 2, H, L + 1, S));
  const Tensor bias = randn({H, L + S - 1});
  EXPECT_TRUE(loads_in_bounds(compile(relative_position_bias(bias, S - 1).expr), 1, H, L, S));
  EXPECT_FALSE(loads_in_bounds(compile(relative_position_bias(bias, S).expr), 1, H, L, S));
  EXPECT_FALSE(loads_in_bounds(compile(alibi(randn({H})).expr), 1, H + 1, L, S));
  EXPECT_TRUE(loads_in_bounds(compile(causal_mask().expr), 1, H, L, S));  // no loads
}

// The ints the CUDA codegen may keep in 32 bits: those bounded under q, kv < 2^22, b, h < 2^16
// whatever the captured tensors hold (a load's value is unbounded, its index need not be).
TEST(FlexIr, Int32InstructionsUnderTheNarrowBounds) {
  using detail::int32_instructions;
  auto fits = [](const MaskMod& m) {
    const detail::Program p = detail::compile(m.expr);
    const std::vector<bool> f = int32_instructions(p);
    std::string s;  // per instruction: 'i' a 32-bit int, 'L' a 64-bit int, '.' not an int
    for (size_t k = 0; k < p.code.size(); ++k) s += p.code[k].kind != Kind::Int ? '.' : f[k] ? 'i' : 'L';
    return s;
  };
  EXPECT_EQ(fits(causal_mask()), "ii.");  // q, kv, q >= kv
  EXPECT_EQ(fits(sliding_window_mask(256)), "ii.ii..");
  // q * kv reaches 2^48; its remainder by 7 fits again; doc[q] is unbounded, q its index fits.
  EXPECT_EQ(fits(MaskMod([](Expr, Expr, Expr q, Expr kv) { return q * kv % Expr(7) == Expr(0); })), "iiLiii.");
  EXPECT_EQ(fits(document_mask(tensor({0, 0, 1}, kInt64))), "iLiL.");
  // b * h passes 2^31 already. h + 2^31 - 2^16 just fits, one more does not; at the low end
  // INT32_MIN is left out (its negation and division by -1 overflow).
  EXPECT_EQ(fits(MaskMod([](Expr b, Expr h, Expr q, Expr) { return b * h * q > Expr(0); })), "iiLiLi.");
  const int64_t top = int64_t{2147483647} - 65535;
  EXPECT_EQ(fits(MaskMod([&](Expr, Expr h, Expr, Expr) { return h + Expr(top) > Expr(0); })), "iiii.");
  EXPECT_EQ(fits(MaskMod([&](Expr, Expr h, Expr, Expr) { return h + Expr(top + 1) > Expr(0); })), "iiLi.");
  EXPECT_EQ(fits(MaskMod([&](Expr, Expr h, Expr, Expr) { return Expr(-top) - h > Expr(0); })), "iiii.");
  EXPECT_EQ(fits(MaskMod([&](Expr, Expr h, Expr, Expr) { return Expr(-top - 1) - h > Expr(0); })), "iiLi.");
}

// Score mods whose gradient is the identity (the CUDA backward's split P takes them): the score
// plus or minus terms free of it, with no captured tensor needing a gradient.
TEST(FlexIr, ScoreGradIsOneForAdditiveModsOnly) {
  auto one = [](const ScoreMod& m) { return detail::score_grad_is_one(detail::compile(m.expr)); };
  using F = Expr;
  const Tensor bias = randn({2, 64}), learned = randn({2, 64}).requires_grad_();
  EXPECT_TRUE(one(alibi(rand({2}))));
  EXPECT_TRUE(one(relative_position_bias(bias, 32)));
  EXPECT_FALSE(one(relative_position_bias(learned, 32)));  // its tensor needs a gradient
  EXPECT_FALSE(one(softcap(30.0)));
  EXPECT_TRUE(one(ScoreMod([](F s, F, F, F q, F kv) { return (s - q) + kv * Expr(0.5); })));
  EXPECT_FALSE(one(ScoreMod([](F s, F, F, F q, F) { return q - s; })));
  EXPECT_FALSE(one(ScoreMod([](F s, F, F, F, F) { return s + s; })));
  EXPECT_FALSE(one(ScoreMod([](F s, F, F, F, F) { return s * Expr(2.0); })));
  EXPECT_FALSE(one(ScoreMod([](F s, F, F, F q, F kv) { return where(q >= kv, s, Expr(0.0)); })));
  EXPECT_FALSE(one(ScoreMod([](F, F, F, F q, F) { return q * Expr(0.5); })));  // no score: gradient 0
}

}  // namespace
}  // namespace kiln::flex
