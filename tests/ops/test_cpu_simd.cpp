// kiln::cpu_simd_info() (what `kiln info` prints) names the Highway target the CPU kernels run on,
// and asking does not move them. scripts/arm.sh runs this under qemu at SVE 128/256/512 and NEON.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "kiln/cpu.h"
#include "kiln/kiln.h"

namespace {

// The target of Highway's process-wide dispatch-table entry, the one HWY_DYNAMIC_DISPATCH calls.
std::string chosen_target() {
  const size_t index = hwy::GetChosenTarget().GetIndex();
  for (int64_t targets = HWY_TARGETS; targets != 0; targets &= targets - 1) {
    const int64_t bit = targets & -targets;
    if (hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(bit))) == index)
      return hwy::TargetName(bit);
  }
  return "none";
}

}  // namespace

TEST(CpuSimd, ReportsTheTargetTheKernelsRunOn) {
  using namespace kiln;
  manual_seed(5);
  const Tensor x = randn({4099});
  const double first = sum(x).item();  // the first dispatch: Highway picks the target now
  const std::string kernels = chosen_target();
  const CpuSimdInfo info = cpu_simd_info();
  std::cout << "kernels dispatched to " << info.target << ", " << info.vector_bits << "-bit vectors\n";
  EXPECT_EQ(info.target, kernels);
  EXPECT_EQ(chosen_target(), kernels) << "cpu_simd_info() moved the kernels to another target";
  EXPECT_EQ(sum(x).item(), first);
  ASSERT_FALSE(info.runnable.empty());
  EXPECT_EQ(info.target, info.runnable.front()) << "not the best target this CPU runs";
  for (const std::string& t : info.runnable)
    EXPECT_NE(std::find(info.compiled.begin(), info.compiled.end(), t), info.compiled.end()) << t;
  if (info.target != "SCALAR") {
    EXPECT_GE(info.vector_bits, 128);
    EXPECT_EQ(info.vector_bits % 128, 0) << info.vector_bits;
  }
}
