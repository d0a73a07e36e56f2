#pragma once
// Division by a run-time constant through a multiply-high and a shift (Granlund-Montgomery),
// for index arithmetic in CUDA kernels: a 64-bit `/` or `%` is ~100 instructions on the GPU,
// this is 3. Valid for divisors 1..2^31 and dividends below 2^31. Host and device (the host side
// computes the magic number and is what the tests check against plain division).
#include <cstdint>

#include "kiln/error.h"

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::cuda {

struct IntDivider {
  uint32_t divisor = 1, magic = 1, shift = 0;

  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    KILN_CHECK(d >= 1 && d <= (uint32_t{1} << 31), "IntDivider", "divisor must be in [1, 2^31], got ", d);
    while ((uint64_t{1} << shift) < d) ++shift;  // shift = ceil(log2 d)
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / divisor for n < 2^31.
  KILN_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
  // n / divisor and n % divisor.
  KILN_HOST_DEVICE void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace kiln::cuda
