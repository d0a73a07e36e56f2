// Whether a CUDA device can be used: cudaGetDeviceCount's answer, asked once per process, turned
// into a message a user can act on (no driver, an old driver, no such index).
#include <cuda_runtime.h>

#include <string>

#include "core/device_check.h"

namespace kiln::detail {
namespace {

// The runtime reports a missing driver as "CUDA driver version is insufficient for CUDA runtime
// version", which sends users looking for a driver update on a machine that has no GPU at all.
std::string no_device_text(cudaError_t err) {
  const std::string what = cudaGetErrorString(err);
  if (err == cudaErrorInsufficientDriver && nvidia_driver_loaded())
    return "no CUDA device: the NVIDIA driver is older than the CUDA runtime kiln was built with (" + what + ")";
  if (err == cudaErrorNoDevice && nvidia_driver_loaded())
    return "no CUDA device: the NVIDIA driver is loaded but shows no GPU to this process (CUDA_VISIBLE_DEVICES "
           "empty or invalid?) (" + what + ")";
  return "no CUDA device: this machine has no NVIDIA driver / GPU (" + what + ")";
}

}  // namespace

std::string cuda_unavailable_reason(int index) {
  struct Probe {
    cudaError_t err = cudaSuccess;
    int count = 0;
  };
  static const Probe probe = [] {
    Probe p;
    p.err = cudaGetDeviceCount(&p.count);
    if (p.err != cudaSuccess) {
      cudaGetLastError();
      p.count = 0;
    }
    return p;
  }();
  if (probe.err != cudaSuccess) return no_device_text(probe.err);
  if (probe.count == 0) return "no CUDA device: this machine has no NVIDIA driver / GPU (the driver sees none)";
  if (index < 0 || index >= probe.count)
    return "no CUDA device cuda:" + std::to_string(index) + ": this machine has " + std::to_string(probe.count) +
           " (cuda:0 to cuda:" + std::to_string(probe.count - 1) + ")";
  return {};
}

}  // namespace kiln::detail
