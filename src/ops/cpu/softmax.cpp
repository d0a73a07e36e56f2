// CPU softmax / log_softmax, forward and backward, over contiguous [outer, n, inner].
// inner == 1 (softmax over the last dim, the common case): one row per task, Highway kernels
// (max pass, exp-sum pass, write pass: the row sits in cache, so a third read is cheaper than
// the second exp an online max/sum would need). inner > 1: blocks of kBlock adjacent columns
// walked row by row, so each pass reads unit-stride memory. Each output depends only on its own
// row, so results do not depend on the thread count.
#include "ops/cpu/softmax.h"

#include <cmath>
#include <limits>

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "ops/cpu/reduce_simd.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kBlock = 64;

template <typename T>
void columns_forward(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
  const int nt = threads_for(outer * n * inner, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t w = 0; w < outer * nblocks; ++w) {
    const int64_t o = w / nblocks, i0 = (w % nblocks) * kBlock, len = std::min(kBlock, inner - i0);
    const T* xb = x + o * n * inner + i0;
    T* yb = y + o * n * inner + i0;
    A m[kBlock], s[kBlock];
    for (int64_t i = 0; i < len; ++i) m[i] = -std::numeric_limits<A>::infinity(), s[i] = 0;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < len; ++i) {
        const A v = cast_value<A>(xb[k * inner + i]);
        m[i] = (v > m[i] || std::isnan(v)) ? v : m[i];
      }
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < len; ++i) s[i] += std::exp(cast_value<A>(xb[k * inner + i]) - m[i]);
    for (int64_t i = 0; i < len; ++i) s[i] = log ? m[i] + std::log(s[i]) : A(1) / s[i];
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < len; ++i) {
        const A v = cast_value<A>(xb[k * inner + i]);
        yb[k * inner + i] = cast_value<T>(log ? v - s[i] : std::exp(v - m[i]) * s[i]);
      }
  }
}

template <typename T>
void columns_backward(const T* y, const T* g, T* gx, int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
  const int nt = threads_for(outer * n * inner, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t w = 0; w < outer * nblocks; ++w) {
    const int64_t o = w / nblocks, i0 = (w % nblocks) * kBlock, len = std::min(kBlock, inner - i0);
    const int64_t base = o * n * inner + i0;
    A s[kBlock];
    for (int64_t i = 0; i < len; ++i) s[i] = 0;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < len; ++i) {
        const int64_t j = base + k * inner + i;
        s[i] += log ? cast_value<A>(g[j]) : cast_value<A>(g[j]) * cast_value<A>(y[j]);
      }
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < len; ++i) {
        const int64_t j = base + k * inner + i;
        const A yv = cast_value<A>(y[j]), gv = cast_value<A>(g[j]);
        gx[j] = cast_value<T>(log ? gv - std::exp(yv) * s[i] : yv * (gv - s[i]));
      }
  }
}

}  // namespace

void softmax_forward(const Tensor& xt, const Tensor& yt, int64_t outer, int64_t n, int64_t inner, bool log) {
  dispatch_floating(xt.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = xt.data_ptr<T>();
    T* y = yt.data_ptr<T>();
    if (inner > 1) return columns_forward(x, y, outer, n, inner, log);
    const int nt = outer == 1 ? 1 : threads_for(outer * n, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t o = 0; o < outer; ++o) simd::softmax_row(x + o * n, y + o * n, n, log);
  });
}

void softmax_backward(const Tensor& yt, const Tensor& gt, const Tensor& gxt, int64_t outer, int64_t n, int64_t inner,
                      bool log) {
  dispatch_floating(yt.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* y = yt.data_ptr<T>();
    const T* g = gt.data_ptr<T>();
    T* gx = gxt.data_ptr<T>();
    if (inner > 1) return columns_backward(y, g, gx, outer, n, inner, log);
    const int nt = outer == 1 ? 1 : threads_for(outer * n, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t o = 0; o < outer; ++o) simd::softmax_backward_row(y + o * n, g + o * n, gx + o * n, n, log);
  });
}

}  // namespace kiln::cpu
