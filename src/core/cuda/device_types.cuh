#pragma once
// Host element types -> CUDA element types, and conversions between them on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kiln/dtype.h"

namespace kiln::cuda {

template <typename T> struct device_type { using type = T; };
template <> struct device_type<BFloat16> { using type = __nv_bfloat16; };
template <> struct device_type<Half> { using type = __half; };
template <typename T> using device_t = typename device_type<T>::type;

template <typename T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// fp32 for 16-bit floats, T otherwise: the type kernels compute in.
template <typename T> struct dacc { using type = T; };
template <> struct dacc<__nv_bfloat16> { using type = float; };
template <> struct dacc<__half> { using type = float; };
template <typename T> using dacc_t = typename dacc<T>::type;

template <typename To, typename From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Launch shape for a flat grid-stride loop over n items.
inline unsigned int blocks_for(int64_t n, int threads, int max_blocks = 65535 * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned int>(b);
}

}  // namespace kiln::cuda
