#pragma once
// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), shared by the
// CPU and CUDA generators so that one seed gives the same numbers on both. Element i of a
// random tensor takes lane i % 4 of the block at counter (offset + i / 4); normals come from
// Box-Muller on lane pairs, computed in double so both backends round to the same float.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln::philox {

struct Block {
  uint32_t x[4];
};

KILN_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

KILN_HD Block generate(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

enum class Distribution : int { Uniform, Normal, Integer };

// Value of element `i` of a random tensor as a double (integers exact up to 2^32 ranges).
KILN_HD double sample(uint64_t seed, uint64_t offset, uint64_t i, Distribution dist, int64_t low, int64_t high) {
  const Block b = generate(seed, offset + i / 4);
  const int lane = static_cast<int>(i % 4);
  if (dist == Distribution::Uniform) return static_cast<double>(b.x[lane] >> 8) * (1.0 / 16777216.0);
  if (dist == Distribution::Integer) {
    const uint64_t range = static_cast<uint64_t>(high - low);
    const uint64_t wide = (static_cast<uint64_t>(b.x[lane]) << 32) | b.x[(lane + 1) % 4];
    return static_cast<double>(low + static_cast<int64_t>(wide % range));
  }
  const int pair = lane & ~1;
  const double u1 = (static_cast<double>(b.x[pair]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(b.x[pair + 1]) * (1.0 / 4294967296.0);
  const double r = sqrt(-2.0 * log(u1));
  const double theta = 6.283185307179586 * u2;
  return (lane & 1) ? r * sin(theta) : r * cos(theta);
}

}  // namespace kiln::philox
