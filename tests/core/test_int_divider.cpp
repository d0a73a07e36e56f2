// IntDivider (the CUDA kernels' index division) against plain division: every divisor up to 2^16
// on edge and random dividends, random divisors up to 2^31, and the largest dividend.
#include <gtest/gtest.h>

#include <random>

#include "core/cuda/int_divider.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

void check(uint32_t d, uint32_t n) {
  const IntDivider div(d);
  uint32_t q = 0, r = 0;
  div.divmod(n, q, r);
  ASSERT_EQ(q, n / d) << "n = " << n << ", d = " << d;
  ASSERT_EQ(r, n % d) << "n = " << n << ", d = " << d;
}

TEST(IntDivider, MatchesDivision) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> any_n(0, (uint32_t{1} << 31) - 1), any_d(1, uint32_t{1} << 31);
  const uint32_t max_n = (uint32_t{1} << 31) - 1;
  for (uint32_t d = 1; d <= (1u << 16); ++d) {
    for (uint32_t n : {0u, d - 1, d, d + 1, 2 * d - 1, max_n, max_n - d, max_n / d * d, max_n / d * d - 1}) check(d, n);
    check(d, any_n(rng));
  }
  for (int i = 0; i < 200000; ++i) {
    const uint32_t d = any_d(rng);
    check(d, any_n(rng));
    check(d, max_n);
    if (d <= max_n) check(d, d - 1), check(d, d);
  }
}

TEST(IntDivider, RejectsZeroAndHugeDivisors) {
  EXPECT_THROW(IntDivider(0), Error);
  EXPECT_THROW(IntDivider((1u << 31) + 1), Error);
}

}  // namespace
}  // namespace kiln::cuda
