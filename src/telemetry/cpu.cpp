// CPU telemetry from procfs and sysfs: /proc/meminfo, /proc/self/statm, /proc/stat (busy/total
// jiffies, as deltas), cpufreq scaling_cur_freq or /proc/cpuinfo "cpu MHz", thermal zones and
// hwmon temp*_input (the hottest), RAPL package energy_uj (as a delta). Missing or unreadable
// files leave the value empty.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "kiln/telemetry.h"

namespace fs = std::filesystem;

namespace kiln::telemetry {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return ss.str();
}

std::optional<double> read_number(const std::string& path) {
  const auto t = read_text(path);
  if (!t) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(*t, &used);
    return used > 0 ? std::optional<double>(v) : std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// busy and total jiffies of the aggregate "cpu" line.
bool read_stat(uint64_t& busy, uint64_t& total) {
  std::ifstream f("/proc/stat");
  std::string label;
  if (!(f >> label) || label != "cpu") return false;
  uint64_t v[10] = {};
  int n = 0;
  while (n < 10 && (f >> v[n])) ++n;
  if (n < 4) return false;
  total = 0;
  for (int i = 0; i < n; ++i) total += v[i];
  // idle + iowait are not busy; guest time is already inside user.
  const uint64_t idle = v[3] + (n > 4 ? v[4] : 0);
  if (n > 8) total -= v[8] + (n > 9 ? v[9] : 0);
  busy = total - idle;
  return true;
}

std::optional<uint64_t> rapl_energy_uj() {
  std::error_code ec;
  std::optional<uint64_t> sum;
  for (const auto& e : fs::directory_iterator("/sys/class/powercap", ec)) {
    const std::string name = e.path().filename().string();
    // Package domains only ("intel-rapl:0"), not their sub-domains ("intel-rapl:0:0").
    if (name.rfind("intel-rapl:", 0) != 0 || name.find(':', 11) != std::string::npos) continue;
    const auto v = read_number((e.path() / "energy_uj").string());
    if (v) sum = sum.value_or(0) + static_cast<uint64_t>(*v);
  }
  return sum;
}

std::optional<double> cpu_clock_mhz() {
  double sum = 0;
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("cpu", 0) != 0 || name.size() < 4 || !std::isdigit(static_cast<unsigned char>(name[3]))) continue;
    if (const auto khz = read_number((e.path() / "cpufreq/scaling_cur_freq").string())) sum += *khz / 1000.0, ++n;
  }
  if (n > 0) return sum / n;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        try {
          sum += std::stod(line.substr(colon + 1));
          ++n;
        } catch (...) {
        }
      }
    }
  }
  return n > 0 ? std::optional<double>(sum / n) : std::nullopt;
}

std::optional<double> cpu_temperature_c() {
  std::optional<double> hottest;
  auto consider = [&](const std::optional<double>& milli) {
    // Sensors report millidegrees; discard absurd values (disconnected sensors read 0 or -273).
    if (milli && *milli > 1000.0 && *milli < 150000.0) hottest = std::max(hottest.value_or(-1e9), *milli / 1000.0);
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/class/thermal", ec))
    if (e.path().filename().string().rfind("thermal_zone", 0) == 0) consider(read_number((e.path() / "temp").string()));
  for (const auto& e : fs::directory_iterator("/sys/class/hwmon", ec)) {
    std::error_code ec2;
    for (const auto& s : fs::directory_iterator(e.path(), ec2)) {
      const std::string n = s.path().filename().string();
      if (n.rfind("temp", 0) == 0 && n.size() > 6 && n.substr(n.size() - 6) == "_input") consider(read_number(s.path().string()));
    }
  }
  return hottest;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "cpu";
}

}  // namespace

CpuSampler::CpuSampler() = default;

Reading CpuSampler::sample() {
  Reading r;
  r.device = "cpu";
  r.name = cpu_model_name();
  r.available = true;
  if (const auto mem = read_text("/proc/meminfo")) {
    std::istringstream in(*mem);
    std::string key, unit;
    int64_t value = 0;
    std::optional<int64_t> total, avail;
    while (in >> key >> value) {
      std::getline(in, unit);
      if (key == "MemTotal:") total = value * 1024;
      if (key == "MemAvailable:") avail = value * 1024;
    }
    r.memory_total_bytes = total;
    if (total && avail) r.memory_used_bytes = *total - *avail;
  }
  if (const auto statm = read_text("/proc/self/statm")) {
    std::istringstream in(*statm);
    int64_t size = 0, resident = 0;
    if (in >> size >> resident) r.process_memory_bytes = resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  uint64_t busy = 0, total = 0;
  if (!have_prev_) {
    // First sample: measure over a short interval so the rate is real, not since boot.
    if (read_stat(prev_busy_, prev_total_)) {
      prev_energy_uj_ = rapl_energy_uj();
      prev_time_s_ = now_s();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      have_prev_ = true;
    }
  }
  if (have_prev_ && read_stat(busy, total)) {
    if (total > prev_total_) r.utilization_percent = 100.0 * static_cast<double>(busy - prev_busy_) / static_cast<double>(total - prev_total_);
    const double t = now_s();
    const auto energy = rapl_energy_uj();
    if (energy && prev_energy_uj_ && *energy >= *prev_energy_uj_ && t > prev_time_s_)
      r.power_watts = static_cast<double>(*energy - *prev_energy_uj_) * 1e-6 / (t - prev_time_s_);
    prev_busy_ = busy, prev_total_ = total, prev_energy_uj_ = energy, prev_time_s_ = t;
  }
  r.clock_mhz = cpu_clock_mhz();
  r.temperature_c = cpu_temperature_c();
  return r;
}

Reading cpu() {
  CpuSampler s;
  return s.sample();
}

std::string summary(const Reading& r) {
  if (!r.available) return r.device + " n/a";
  char buf[64];
  std::string s = r.device;
  if (r.utilization_percent) std::snprintf(buf, sizeof(buf), " %.0f%%", *r.utilization_percent), s += buf;
  if (r.clock_mhz) std::snprintf(buf, sizeof(buf), " %.1fGHz", *r.clock_mhz / 1000.0), s += buf;
  if (r.temperature_c) std::snprintf(buf, sizeof(buf), " %.0fC", *r.temperature_c), s += buf;
  if (r.power_watts) std::snprintf(buf, sizeof(buf), " %.0fW", *r.power_watts), s += buf;
  if (r.memory_used_bytes && r.memory_total_bytes)
    std::snprintf(buf, sizeof(buf), " %.1f/%.1fGiB", *r.memory_used_bytes / 1073741824.0, *r.memory_total_bytes / 1073741824.0), s += buf;
  return s;
}

std::string to_json(const Reading& r) {
  std::string s = "{\"device\":\"" + r.device + "\",\"available\":" + (r.available ? "true" : "false");
  char buf[96];
  auto num = [&](const char* key, const std::optional<double>& v) {
    if (v && std::isfinite(*v)) std::snprintf(buf, sizeof(buf), ",\"%s\":%.6g", key, *v), s += buf;
  };
  auto integer = [&](const char* key, const std::optional<int64_t>& v) {
    if (v) std::snprintf(buf, sizeof(buf), ",\"%s\":%lld", key, static_cast<long long>(*v)), s += buf;
  };
  integer("memory_used_bytes", r.memory_used_bytes);
  integer("memory_total_bytes", r.memory_total_bytes);
  integer("process_memory_bytes", r.process_memory_bytes);
  num("utilization_percent", r.utilization_percent);
  num("power_watts", r.power_watts);
  num("clock_mhz", r.clock_mhz);
  num("temperature_c", r.temperature_c);
  return s + "}";
}

}  // namespace kiln::telemetry
