// CPU copies with dtype conversion, fills, arange and Philox random fills.
#include "core/cpu/parallel.h"
#include <cstring>

#include "core/cpu/convert.h"
#include "core/cpu/loop.h"
#include "core/dispatch.h"
#include "core/kernels.h"

namespace kiln::cpu {
namespace {
// A bool tensor's bytes may be other than 0 and 1 (a checkpoint, from_blob, DLPack): read them
// as bytes, so any nonzero byte is true and no invalid bool is ever loaded (UB the fuzzer found).
template <typename S>
S load_element(const char* p) {
  if constexpr (std::is_same_v<S, bool>) {
    return *reinterpret_cast<const uint8_t*>(p) != 0;
  } else {
    return *reinterpret_cast<const S*>(p);
  }
}
}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  StridedOperands<2> ops({&dst, &src});
  if (dst.dtype() == src.dtype() && ops.inner_contiguous(0) && ops.inner_contiguous(1)) {
    const int64_t eb = static_cast<int64_t>(dst.element_size());
    ops.for_each_row([&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>&) {
      std::memcpy(p[0], p[1], static_cast<size_t>(n * eb));
    });
    return;
  }
  // The autocast casts: dense rows through the SIMD conversions (the same bits as the loop below).
  if (ops.inner_contiguous(0) && ops.inner_contiguous(1)) {
    if (dst.dtype() == kBFloat16 && src.dtype() == kFloat32) {
      ops.for_each_row([&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>&) {
        convert_f32_to_bf16(reinterpret_cast<const float*>(p[1]), reinterpret_cast<uint16_t*>(p[0]), n);
      });
      return;
    }
    if (dst.dtype() == kFloat32 && src.dtype() == kBFloat16) {
      ops.for_each_row([&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>&) {
        convert_bf16_to_f32(reinterpret_cast<const uint16_t*>(p[1]), reinterpret_cast<float*>(p[0]), n);
      });
      return;
    }
  }
  dispatch_all(dst.dtype(), "copy_", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_all(src.dtype(), "copy_", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      ops.for_each_row([&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& s) {
        char* d = p[0];
        const char* x = p[1];
        for (int64_t i = 0; i < n; ++i, d += s[0], x += s[1])
          *reinterpret_cast<D*>(d) = cast_value<D>(load_element<S>(x));
      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = cast_value<T>(value);
    StridedOperands<1> ops({&dst});
    ops.for_each_row([&](const std::array<char*, 1>& p, int64_t n, const std::array<int64_t, 1>& s) {
      char* d = p[0];
      for (int64_t i = 0; i < n; ++i, d += s[0]) *reinterpret_cast<T*>(d) = v;
    });
  });
}

void arange(const Tensor& dst, double start, double step) {
  dispatch_all(dst.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = dst.data_ptr<T>();
    const int64_t n = dst.numel();
    const int nt = threads_for(n, grains().elementwise_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; ++i) d[i] = cast_value<T>(start + static_cast<double>(i) * step);
  });
}

void random(const Tensor& dst, philox::Distribution dist, uint64_t seed, uint64_t offset, int64_t low,
            int64_t high) {
  dispatch_all(dst.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = dst.data_ptr<T>();
    const int64_t n = dst.numel();
    const int nt = threads_for(n, grains().elementwise_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; ++i)
      d[i] = cast_value<T>(philox::sample(seed, offset, static_cast<uint64_t>(i), dist, low, high));
  });
}

}  // namespace kiln::cpu
