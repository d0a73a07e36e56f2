#pragma once
// Device telemetry: memory used, utilisation, power draw, clock and temperature, for the CPU
// (procfs, sysfs, RAPL powercap) and for CUDA devices (NVML, loaded with dlopen at run time, so
// kiln never links against the driver). A value the machine cannot give is std::nullopt, never a
// guess. Readings are cheap (a few small file reads / NVML calls), fine once per training step.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::telemetry {

struct Reading {
  std::string device;                          // "cpu", "cuda:0"
  std::string name;                            // model name ("AMD EPYC ...", "NVIDIA H200")
  bool available = false;                      // false: nothing could be read (see `reason`)
  std::string reason;                          // why unavailable (e.g. "NVML not found")
  std::optional<int64_t> memory_used_bytes;    // CPU: system RAM in use (total - available)
  std::optional<int64_t> memory_total_bytes;
  std::optional<int64_t> process_memory_bytes; // CPU: this process's resident set
  std::optional<double> utilization_percent;   // CPU: busy share of all cores since the last sample
  std::optional<double> power_watts;           // CPU: RAPL package energy delta / time
  std::optional<double> clock_mhz;             // CPU: mean current frequency; CUDA: SM clock
  std::optional<double> temperature_c;         // CPU: hottest thermal zone / hwmon sensor
};

// Samples the CPU. Utilisation and power are rates: the first sample of a sampler measures over
// a short internal interval (~50 ms); later samples measure since the previous one.
class CpuSampler {
 public:
  CpuSampler();
  Reading sample();

 private:
  bool have_prev_ = false;
  uint64_t prev_busy_ = 0, prev_total_ = 0;
  std::optional<uint64_t> prev_energy_uj_;
  double prev_time_s_ = 0;
};

// One CPU reading (measures utilisation over ~50 ms).
Reading cpu();

// NVML, opened once per process on first use. nvml_available() is false (with nvml_error()
// saying why) when libnvidia-ml.so.1 cannot be loaded or initialised.
bool nvml_available();
std::string nvml_error();
int cuda_device_count();  // through NVML; 0 when unavailable
// A CUDA device's reading; `available` false (and a reason) when NVML or the device is missing.
Reading cuda(int index);

// "cpu 83% 2.9GHz 61C 12.3/31.2GiB" — only the values present, for progress lines.
std::string summary(const Reading& r);
// {"device":"cpu","utilization_percent":83.1,...} — absent values are omitted.
std::string to_json(const Reading& r);

}  // namespace kiln::telemetry
