// CUDA telemetry through NVML, opened with dlopen("libnvidia-ml.so.1") on first use so kiln has no
// link dependency on the driver: only the handful of entry points below are declared, with the
// ABI of nvml.h (nvmlReturn_t is an int enum, 0 = NVML_SUCCESS). Each value that fails to read is
// left empty.
#include <dlfcn.h>

#include <mutex>

#include "kiln/telemetry.h"

namespace kiln::telemetry {
namespace {

using nvmlReturn_t = int;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
constexpr int kNvmlClockSm = 1;           // NVML_CLOCK_SM
constexpr int kNvmlTemperatureGpu = 0;    // NVML_TEMPERATURE_GPU

struct Nvml {
  void* lib = nullptr;
  std::string error;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  bool ok = false;
};

template <typename F>
bool bind(void* lib, const char* sym, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, sym));
  return fn != nullptr;
}

Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.lib) {
      const char* e = dlerror();
      n.error = std::string("NVML not found (libnvidia-ml.so.1: ") + (e ? e : "dlopen failed") + ")";
      return;
    }
    const bool all = bind(n.lib, "nvmlInit_v2", n.init) && bind(n.lib, "nvmlDeviceGetCount_v2", n.device_count) &&
                     bind(n.lib, "nvmlDeviceGetHandleByIndex_v2", n.handle_by_index) &&
                     bind(n.lib, "nvmlDeviceGetName", n.name) && bind(n.lib, "nvmlDeviceGetMemoryInfo", n.memory) &&
                     bind(n.lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
                     bind(n.lib, "nvmlDeviceGetPowerUsage", n.power) && bind(n.lib, "nvmlDeviceGetClockInfo", n.clock) &&
                     bind(n.lib, "nvmlDeviceGetTemperature", n.temperature) &&
                     bind(n.lib, "nvmlErrorString", n.error_string);
    if (!all) {
      n.error = "NVML is missing an entry point";
      return;
    }
    const nvmlReturn_t rc = n.init();
    if (rc != 0) {
      n.error = std::string("nvmlInit failed: ") + n.error_string(rc);
      return;
    }
    n.ok = true;  // nvmlShutdown is left to process exit: readers may run until then
  });
  return n;
}

}  // namespace

bool nvml_available() { return nvml().ok; }
std::string nvml_error() { return nvml().ok ? std::string() : nvml().error; }

int cuda_device_count() {
  Nvml& n = nvml();
  unsigned int count = 0;
  if (!n.ok || n.device_count(&count) != 0) return 0;
  return static_cast<int>(count);
}

Reading cuda(int index) {
  Reading r;
  r.device = "cuda:" + std::to_string(index);
  Nvml& n = nvml();
  if (!n.ok) {
    r.reason = n.error;
    return r;
  }
  nvmlDevice_t dev = nullptr;
  if (index < 0 || n.handle_by_index(static_cast<unsigned int>(index), &dev) != 0) {
    r.reason = "no CUDA device " + std::to_string(index) + " (NVML sees " + std::to_string(cuda_device_count()) + ")";
    return r;
  }
  r.available = true;
  char name[96] = {};
  if (n.name(dev, name, sizeof(name)) == 0) r.name = name;
  nvmlMemory_t mem{};
  if (n.memory(dev, &mem) == 0) {
    r.memory_used_bytes = static_cast<int64_t>(mem.used);
    r.memory_total_bytes = static_cast<int64_t>(mem.total);
  }
  nvmlUtilization_t util{};
  if (n.utilization(dev, &util) == 0) r.utilization_percent = util.gpu;
  unsigned int v = 0;
  if (n.power(dev, &v) == 0) r.power_watts = v / 1000.0;  // milliwatts
  if (n.clock(dev, kNvmlClockSm, &v) == 0) r.clock_mhz = v;
  if (n.temperature(dev, kNvmlTemperatureGpu, &v) == 0) r.temperature_c = v;
  return r;
}

}  // namespace kiln::telemetry
