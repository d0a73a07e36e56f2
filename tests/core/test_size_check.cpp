// Checked size arithmetic: shapes whose element count or byte size overflows are a clear error in
// every factory (never a wrapped product that allocates too little and is then overrun).
#include <gtest/gtest.h>

#include "core/size_check.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

template <typename F>
void expect_error(F&& f, const std::string& rule) {
  try {
    f();
    ADD_FAILURE() << "expected a kiln::Error naming '" << rule << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(rule), std::string::npos) << e.what() << "\nwanted: " << rule;
  }
}

constexpr int64_t k31 = int64_t{1} << 31;
constexpr int64_t k62 = int64_t{1} << 62;

TEST(SizeCheck, NumelAndBytes) {
  EXPECT_EQ(checked_numel({2, 3, 4}, "t"), 24);
  EXPECT_EQ(checked_numel({}, "t"), 1);
  EXPECT_EQ(checked_numel({k62, 4, 0}, "t"), 0);  // empty, whatever the other sizes
  EXPECT_EQ(checked_nbytes({k31, k31}, 8, "U8", "t"), uint64_t{1} << 62);
  EXPECT_EQ(checked_nbytes({8}, 4, "F4", "t"), 4u);
  expect_error([] { checked_numel({k62, 4}, "t"); }, "[t] shape [4611686018427387904, 4] has about 2^64 elements: overflows");
  expect_error([] { checked_numel({2, -1}, "t", "tensor 'x': "); }, "[t] tensor 'x': shape [2, -1] has a negative size");
  expect_error([] { checked_nbytes({k31, k31}, 32, "float32", "t"); },
               "shape [2147483648, 2147483648] of float32 is 4611686018427387904 elements x 4 bytes = "
               "18446744073709551616 bytes: overflows the 2^63 - 1 bytes a tensor may span");
  expect_error([] { checked_nbytes({3}, 4, "F4", "t"); }, "is not a whole number of bytes");
  expect_error([] { shape_numel({k62, 4}); }, "has more elements than an int64 can count");
}

TEST(SizeCheck, FactoriesRefuseOverflowingShapes) {
  expect_error([] { zeros({k31, k31}); }, "[allocate] shape [2147483648, 2147483648] of float32");
  expect_error([] { empty({k31, k31}, kFloat64); }, "overflows");
  expect_error([] { ones({k62, 4}); }, "overflows");  // once returned a tensor with numel() == 0
  expect_error([] { full({k62, 2, 2}, 1.0); }, "overflows");
  expect_error([] { randn({k31, k31}); }, "overflows");
  expect_error([] { zeros({3, -2}); }, "negative size");
  expect_error([] { arange(0.0, 1e30); }, "more elements than a tensor may hold");
  // A view may be large (its storage is one float); materialising it is refused, not overrun.
  const Tensor view = ones({1}).expand({k31, k31});
  EXPECT_EQ(view.numel(), k62);
  expect_error([&] { view.contiguous(); }, "overflows");
  expect_error([&] { view.clone(); }, "overflows");
  float x = 1;
  expect_error([&] { from_blob(&x, {k31, k31}, kFloat32, nullptr, {k62, k62}); }, "reaches past 2^63 elements");
  // Sizes that fit still work.
  EXPECT_EQ(zeros({0, k62}).numel(), 0);
  EXPECT_EQ(sum(ones({1}).expand({1000})).item(), 1000.0);
}

}  // namespace
}  // namespace kiln
