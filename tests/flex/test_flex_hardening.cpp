// Edge cases of flex_attention and create_block_mask on the CPU: captured tensors read out of
// range always raise, and a row whose scores hold a NaN propagates it as PyTorch does.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "flex/ir.h"
#include "kiln/flex.h"
#include "reference.h"
#include "support/testing.h"

namespace kiln::flex {
namespace {

// The message of the kiln::Error `f` raises ("" when it raises nothing).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every block of a Q_LEN x KV_LEN mask listed as full (full = true) or partial, with `mod`: the
// lists do not come from create_block_mask, so they say nothing of the mod's reads.
BlockMask listed_blocks(const MaskMod& mod, int64_t L, int64_t S, int64_t bs, bool full) {
  const int64_t nQ = (L + bs - 1) / bs, nKV = (S + bs - 1) / bs;
  Tensor num = kiln::full({1, 1, nQ}, static_cast<double>(nKV), kInt32);
  Tensor idx = zeros({1, 1, nQ, nKV}, kInt32);
  for (int64_t i = 0; i < nQ; ++i)
    for (int64_t j = 0; j < nKV; ++j) idx.data_ptr<int32_t>()[i * nKV + j] = static_cast<int32_t>(j);
  Tensor none = zeros({1, 1, nQ}, kInt32), none_idx = zeros({1, 1, nQ, 1}, kInt32);
  return full ? BlockMask::from_kv_blocks(none, none_idx, num, idx, L, S, bs, mod)
              : BlockMask::from_kv_blocks(num, idx, none, none_idx, L, S, bs, mod);
}

void expect_out_of_range_message(const std::string& msg, const char* op) {
  EXPECT_NE(msg.find(std::string("[") + op + "]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("captured tensor buf0 (shape [10])"), std::string::npos) << msg;
  EXPECT_NE(msg.find("valid 0..9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("spans [0, 127]"), std::string::npos) << msg;
}

// A 10-entry document mask for 128 positions: equal ids (interval analysis then calls every
// block full from clamped reads) and distinct ids raise alike.
TEST(FlexHardening, ShortCapturedTensorRaisesFromCreateBlockMask) {
  for (bool equal_ids : {true, false}) {
    const Tensor doc = equal_ids ? zeros({10}, kInt64) : arange(0, 10, 1, kInt64);
    for (int64_t bs : {128, 16}) {
      const std::string msg = error_of([&] { create_block_mask(document_mask(doc), 1, 1, 128, 128, bs); });
      expect_out_of_range_message(msg, "create_block_mask");
    }
  }
  // The same mask at the tensor's own length is fine.
  EXPECT_NO_THROW(create_block_mask(document_mask(zeros({10}, kInt64)), 1, 1, 10, 10, 4));
}

TEST(FlexHardening, ShortCapturedTensorRaisesFromFlexAttention) {
  const Tensor q = randn({1, 1, 128, 16}), k = randn({1, 1, 128, 16}), v = randn({1, 1, 128, 16});
  for (bool equal_ids : {true, false})
    for (bool full : {true, false}) {
      const Tensor doc = equal_ids ? zeros({10}, kInt64) : arange(0, 10, 1, kInt64);
      const BlockMask bm = listed_blocks(document_mask(doc), 128, 128, 32, full);
      FlexOptions o;
      o.block_mask = &bm;
      expect_out_of_range_message(error_of([&] { flex_attention(q, k, v, o); }), "flex_attention");
    }
}

// Reads the interval analysis cannot prove in range but that are: no error, and the mask is the
// one evaluated densely. where(q < 10, q, 0) spans [0, 127] as an interval over the whole domain.
TEST(FlexHardening, GuardedReadsOfAShortTensorPass) {
  const Tensor doc = arange(0, 10, 1, kInt64);
  const Captured d = capture(doc);
  const Expr qi = where(q_idx() < 10, q_idx(), Expr(0)), ki = where(kv_idx() < 10, kv_idx(), Expr(0));
  const MaskMod mod(d[qi] == d[ki]);
  const BlockMask bm = create_block_mask(mod, 1, 1, 128, 128, 16);
  const Tensor dense = bm.to_dense();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j)
      EXPECT_EQ(dense.data_ptr<int32_t>()[i * 8 + j], 1) << i << ", " << j;  // every block holds some q == kv
  const Tensor q = randn({1, 1, 128, 8}, kFloat64), k = randn({1, 1, 128, 8}, kFloat64), v = randn({1, 1, 128, 8}, kFloat64);
  FlexOptions o;
  o.block_mask = &bm;
  const Tensor out = flex_attention(q, k, v, o);
  auto ref_mask = [](int64_t, int64_t, int64_t qq, int64_t kk) { return (qq < 10 ? qq : 0) == (kk < 10 ? kk : 0); };
  const auto [ref, lse] = testing::reference(q, k, v, nullptr, ref_mask);
  EXPECT_LT(kiln::testing::rel_error(out, ref), 1e-12);
}

// Rows of out [B, H, L, Ev] and lse [B, H, L] against the float64 reference: rows listed in
// `nan_rows` (flat b, h, q) must be all NaN, the others finite and within tol of the reference.
void expect_nan_rows(const FlexOutput& got, const Tensor& ref_out, const Tensor& ref_lse,
                     const std::vector<int64_t>& nan_rows, double tol) {
  const std::vector<double> o = got.out.to_vector(), l = got.lse.to_vector(), ro = ref_out.to_vector(),
                            rl = ref_lse.to_vector();
  const int64_t rows = static_cast<int64_t>(l.size()), ev = static_cast<int64_t>(o.size()) / rows;
  double err = 0, norm = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const bool nan = std::find(nan_rows.begin(), nan_rows.end(), r) != nan_rows.end();
    EXPECT_EQ(std::isnan(l[r]), nan) << "lse row " << r << " = " << l[r];
    if (!nan) err = std::max(err, std::fabs(l[r] - rl[r]));
    for (int64_t e = 0; e < ev; ++e) {
      const double x = o[r * ev + e];
      if (nan) {
        EXPECT_TRUE(std::isnan(x)) << "row " << r << " col " << e << " = " << x;
        continue;
      }
      ASSERT_TRUE(std::isfinite(x)) << "row " << r << " col " << e;
      err = std::max(err, std::fabs(x - ro[r * ev + e]));
      norm = std::max(norm, std::fabs(ro[r * ev + e]));
    }
  }
  EXPECT_LE(err, tol * std::max(norm, 1.0));
}

// A NaN query row: PyTorch's softmax gives NaN output and lse for that row only. Dense, and with a
// causal BlockMask (full and partial blocks), in fp32 and fp64.
TEST(FlexHardening, NanQueryRowPropagatesNan) {
  const int64_t L = 48, E = 8;
  for (DType dt : {kFloat32, kFloat64})
    for (bool masked : {false, true}) {
      Tensor q = randn({1, 2, L, E}, kFloat64), k = randn({1, 2, L, E}, kFloat64), v = randn({1, 2, L, E}, kFloat64);
      q.select(1, 1).select(1, 5).fill_(std::nan(""));  // head 1, row 5
      const BlockMask bm = create_block_mask(causal_mask(), 1, 1, L, L, 16);
      FlexOptions o;
      o.return_lse = true;
      if (masked) o.block_mask = &bm;
      const FlexOutput got = flex_attention(q.to(dt), k.to(dt), v.to(dt), o);
      testing::MaskFn mask = nullptr;
      if (masked) mask = [](int64_t, int64_t, int64_t qq, int64_t kk) { return qq >= kk; };
      const auto [ref, lse] = testing::reference(q, k, v, nullptr, mask);
      expect_nan_rows(got, ref, lse, {L + 5}, kiln::testing::tolerance(dt));
    }
}

// A score_mod that makes one score NaN: the row goes NaN when that position is kept, and stays
// finite when the mask drops it (the mask applies after the score_mod, as in PyTorch).
TEST(FlexHardening, NanScoreIsMaskedOrPropagated) {
  const int64_t L = 40, E = 8;
  const Tensor q = randn({1, 1, L, E}, kFloat64), k = randn({1, 1, L, E}, kFloat64), v = randn({1, 1, L, E}, kFloat64);
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, L, L, 8);
  for (int64_t kv : {1, 30}) {  // row 3: kv 1 is kept, kv 30 masked
    FlexOptions o;
    o.return_lse = true;
    o.block_mask = &bm;
    o.score_mod = ScoreMod(where((q_idx() == 3) & (kv_idx() == Expr(kv)), Expr(std::nan("")), score()));
    const FlexOutput got = flex_attention(q, k, v, o);
    auto ref_mask = [](int64_t, int64_t, int64_t qq, int64_t kk) { return qq >= kk; };
    const auto [ref, lse] = testing::reference(q, k, v, nullptr, ref_mask);
    expect_nan_rows(got, ref, lse, kv == 1 ? std::vector<int64_t>{3} : std::vector<int64_t>{}, 1e-12);
  }
}

}  // namespace
}  // namespace kiln::flex
