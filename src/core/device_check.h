#pragma once
// Why a CUDA device cannot be used here (kiln::check_device_available builds its error from it).
#include <string>

namespace kiln::detail {

// Empty when cuda:<index> is usable; otherwise a message that opens with "no CUDA device".
// The CUDA build asks the runtime once per process; the CPU-only build says it has no CUDA.
std::string cuda_unavailable_reason(int index);

// True when an NVIDIA kernel driver is loaded (/proc/driver/nvidia/version exists).
bool nvidia_driver_loaded();

}  // namespace kiln::detail
