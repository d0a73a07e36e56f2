// Reports the Highway target the CPU kernels dispatch to. This file is compiled for every target
// (foreach_target) like the kernel families, and with the same flags, so its HWY_TARGETS is
// theirs; HWY_DYNAMIC_DISPATCH indexes every family's table by Highway's one process-wide chosen
// target (hwy::GetChosenTarget), so the entry it calls here is the one each family calls.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cpu.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/cpu/simd_targets.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t DispatchedTarget() { return HWY_TARGET; }
size_t VectorBytes() { return hn::Lanes(hn::ScalableTag<uint8_t>()); }

}  // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln {
namespace cpu {
HWY_EXPORT(DispatchedTarget);
HWY_EXPORT(VectorBytes);
}  // namespace cpu

namespace {
// Target bits, best (lowest bit) first.
std::vector<std::string> target_names(int64_t targets) {
  std::vector<std::string> names;
  for (; targets != 0; targets &= targets - 1) names.emplace_back(hwy::TargetName(targets & -targets));
  return names;
}
}  // namespace

CpuSimdInfo cpu_simd_info() {
  CpuSimdInfo info;
  const int64_t supported = hwy::SupportedTargets();
  // On Arm, Highway 1.0.3's SupportedTargets() leaves the chosen target set from the targets it
  // found before its vector-length checks (which add SVE2_128, SVE_256); set it from the final
  // answer, as the first HWY_DYNAMIC_DISPATCH of a process does, so the kernels still get those.
  hwy::GetChosenTarget().Update(supported);
  info.compiled = target_names(HWY_TARGETS);
  info.runnable = target_names(HWY_TARGETS & supported);
  info.target = hwy::TargetName(HWY_DYNAMIC_DISPATCH(cpu::DispatchedTarget)());
  info.vector_bits = static_cast<int>(HWY_DYNAMIC_DISPATCH(cpu::VectorBytes)() * 8);
  // The files built with foreach_target: src/ops/cpu/elementwise_{unary,binary}_simd.cpp,
  // src/ops/cpu/reduce_simd.cpp, src/lce/cpu/lce_rows.cpp.
  info.families = {"elementwise unary", "elementwise binary and pow", "reductions and softmax",
                   "fused linear cross-entropy rows"};
  return info;
}

}  // namespace kiln
#endif  // HWY_ONCE
