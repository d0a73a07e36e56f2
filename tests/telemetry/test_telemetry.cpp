// Telemetry: CPU values are plausible or absent; without NVML, CUDA readings say so cleanly.
#include <gtest/gtest.h>

#include <string>

#include "kiln/telemetry.h"

using namespace kiln;

TEST(Telemetry, CpuValuesArePlausibleOrAbsent) {
  telemetry::CpuSampler s;
  const telemetry::Reading r = s.sample();
  EXPECT_TRUE(r.available);
  EXPECT_EQ(r.device, "cpu");
  if (r.memory_total_bytes) {
    EXPECT_GT(*r.memory_total_bytes, int64_t{64} << 20);
    ASSERT_TRUE(r.memory_used_bytes.has_value());
    EXPECT_GT(*r.memory_used_bytes, 0);
    EXPECT_LE(*r.memory_used_bytes, *r.memory_total_bytes);
  }
  if (r.process_memory_bytes) {
    EXPECT_GT(*r.process_memory_bytes, int64_t{1} << 20);
  }
  if (r.utilization_percent) {
    EXPECT_GE(*r.utilization_percent, 0.0);
    EXPECT_LE(*r.utilization_percent, 100.0);
  }
  if (r.clock_mhz) {
    EXPECT_GT(*r.clock_mhz, 100.0);
    EXPECT_LT(*r.clock_mhz, 10000.0);
  }
  if (r.temperature_c) {
    EXPECT_GT(*r.temperature_c, 1.0);
    EXPECT_LT(*r.temperature_c, 150.0);
  }
  if (r.power_watts) {
    EXPECT_GE(*r.power_watts, 0.0);
    EXPECT_LT(*r.power_watts, 5000.0);
  }
  // Linux always has procfs memory figures.
  EXPECT_TRUE(r.memory_total_bytes.has_value());
  // A second sample measures since the first.
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + i * 1e-9;
  const telemetry::Reading r2 = s.sample();
  if (r2.utilization_percent) {
    EXPECT_LE(*r2.utilization_percent, 100.0);
  }
  const std::string json = telemetry::to_json(r2);
  EXPECT_EQ(json.rfind("{\"device\":\"cpu\"", 0), 0u);
  EXPECT_EQ(json.back(), '}');
  EXPECT_EQ(telemetry::summary(r2).rfind("cpu", 0), 0u);
}

TEST(Telemetry, CudaWithoutNvmlIsUnavailable) {
  if (telemetry::nvml_available()) {
    // A GPU machine: device 0 must read, with plausible values where present.
    ASSERT_GT(telemetry::cuda_device_count(), 0);
    const telemetry::Reading r = telemetry::cuda(0);
    EXPECT_TRUE(r.available);
    if (r.memory_total_bytes) {
      EXPECT_GT(*r.memory_total_bytes, int64_t{1} << 30);
    }
    if (r.utilization_percent) {
      EXPECT_LE(*r.utilization_percent, 100.0);
    }
    if (r.temperature_c) {
      EXPECT_LT(*r.temperature_c, 150.0);
    }
    const telemetry::Reading bad = telemetry::cuda(1 << 20);
    EXPECT_FALSE(bad.available);
    return;
  }
  EXPECT_FALSE(telemetry::nvml_error().empty());
  EXPECT_EQ(telemetry::cuda_device_count(), 0);
  const telemetry::Reading r = telemetry::cuda(0);
  EXPECT_FALSE(r.available);
  EXPECT_FALSE(r.reason.empty());
  EXPECT_FALSE(r.memory_used_bytes.has_value());
  EXPECT_FALSE(r.power_watts.has_value());
  EXPECT_EQ(telemetry::to_json(r), "{\"device\":\"cuda:0\",\"available\":false}");
  EXPECT_EQ(telemetry::summary(r), "cuda:0 n/a");
}
