#include "kiln/device.h"

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

#ifndef KILN_WITH_CUDA
bool cuda_is_available() { return false; }
int cuda_device_count() { return 0; }
#endif

}  // namespace kiln
