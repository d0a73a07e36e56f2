#pragma once
// Where a tensor lives: the CPU or one CUDA device ("cpu", "cuda", "cuda:1").
#include <cstdint>
#include <ostream>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}  // NOLINT: kCUDA converts like torch
  Device(const std::string& spec);                         // NOLINT
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline const Device kCPU{DeviceType::CPU, 0};
std::ostream& operator<<(std::ostream& os, const Device& d);

// True when kiln was built with CUDA and a device is present.
bool cuda_is_available();
int cuda_device_count();

}  // namespace kiln
