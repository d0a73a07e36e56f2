// bf16 on the host for the wgmma probes (probe.cu, fused_probe.cu): a 16-bit pattern and back.
#pragma once
#include <cstdint>
#include <cstring>

static float bf(uint16_t x) {
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_bf(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
