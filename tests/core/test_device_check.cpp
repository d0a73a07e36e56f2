// Asking for a CUDA device that is not there fails at once with a message that says what is
// missing, on every path a user takes first: a tensor on "cuda", memory statistics, the device calls.
#include <filesystem>
#include <functional>
#include <string>

#include "kiln/cuda.h"
#include "support/testing.h"

namespace kiln {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DeviceCheck, NoGpuIsSaidPlainly) {
  if (cuda_is_available()) GTEST_SKIP() << "a GPU is present";
  if (std::filesystem::exists("/proc/driver/nvidia/version")) GTEST_SKIP() << "an NVIDIA driver is loaded";
  const std::string want = "no CUDA device: this machine has no NVIDIA driver / GPU";
  const Device gpu("cuda");
  for (const auto& [what, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"check_available", [] { cuda::check_available(0, "train"); }},
           {"empty", [&] { empty({4}, TensorOptions().device(gpu)); }},
           {"to", [&] { randn({2, 3}).to(gpu); }},
           {"memory_allocated", [&] { memory_allocated(gpu); }},
           {"reset_peak_memory_stats", [&] { reset_peak_memory_stats(gpu); }},
           {"current_device", [] { cuda::current_device(); }},
           {"set_device", [] { cuda::set_device(0); }},
           {"synchronize", [] { cuda::synchronize(); }}}) {
    const std::string msg = error_of(call);
    EXPECT_NE(msg.find(want), std::string::npos) << what << ": " << msg;
    EXPECT_EQ(msg.find("failed:"), std::string::npos) << what << " reports a failed runtime call instead: " << msg;
  }
  EXPECT_EQ(error_of([] { cuda::check_available(0, "train"); }).rfind("[train] no CUDA device", 0), 0u);
}

TEST(DeviceCheck, CpuNeedsNoCheckAndAMissingIndexIsNamed) {
  EXPECT_EQ(memory_allocated(kCPU), memory_allocated(kCPU));  // no throw on the CPU
  if (!cuda_is_available()) GTEST_SKIP() << "no GPU: the index check needs one";
  const std::string msg = error_of([] { cuda::check_available(cuda_device_count(), "op"); });
  EXPECT_NE(msg.find("no CUDA device cuda:" + std::to_string(cuda_device_count())), std::string::npos) << msg;
}

}  // namespace
}  // namespace kiln
