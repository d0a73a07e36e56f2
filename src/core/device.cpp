#include "kiln/device.h"

#include <filesystem>

#include "core/device_check.h"
#include "kiln/cuda.h"
#include "kiln/error.h"

namespace kiln {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    type = DeviceType::CPU;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    if (spec.size() == 4) return;
    KILN_CHECK(spec[4] == ':' && spec.size() > 5, "device", "cannot parse device '", spec, "'");
    try {
      size_t used = 0;
      index = std::stoi(spec.substr(5), &used);
      KILN_CHECK(used == spec.size() - 5 && index >= 0, "device", "cannot parse device '", spec, "'");
    } catch (const std::logic_error&) {
      KILN_FAIL("device", "cannot parse device '", spec, "'");
    }
    return;
  }
  KILN_FAIL("device", "unknown device '", spec, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

void cuda::check_available(int device, const char* op) {
  const std::string why = detail::cuda_unavailable_reason(device);
  if (!why.empty()) KILN_FAIL(op, why);
}

namespace detail {
bool nvidia_driver_loaded() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/version", ec);
}
}  // namespace detail

#ifndef KILN_WITH_CUDA
bool cuda_is_available() { return false; }
int cuda_device_count() { return 0; }

namespace detail {
std::string cuda_unavailable_reason(int) {
  if (nvidia_driver_loaded())
    return "no CUDA device: this kiln was built without CUDA; rebuild it with KILN_CUDA=ON "
           "(make train KILN_CUDA=ON, or pip install . -C cmake.define.KILN_CUDA=ON)";
  return "no CUDA device: this machine has no NVIDIA driver / GPU (and this kiln was built without CUDA)";
}
}  // namespace detail
#endif

}  // namespace kiln
