// RMSNorm on the CPU. Forward: one pass per row for sum(x^2) in fp32 (fp64 for fp64), then
// y = x * rstd * w, keeping rstd per row for backward; add_rms_norm first writes h = x + residual
// in the same row loop (the row stays in L1 for the norm's passes), and its backward adds the
// residual stream's gradient into dx in the dx pass. Backward: rows are cut into fixed
// chunks (a function of the row count only); each chunk writes dx for its rows and a partial
// dweight, and the partials are added in chunk order, so dweight is bitwise identical for any
// thread count.
#include "ops/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {

// Rows per dweight partial: at least 32, and at most 256 partials in all.
int64_t chunk_rows(int64_t rows) { return std::max<int64_t>(32, (rows + 255) / 256); }

}  // namespace

namespace {

// One row: optionally h = x + residual first (the sum is what gets normalised), then
// y = h * rstd * w; returns rstd.
template <typename T, typename A>
A norm_row(const T* xr, const T* rr, T* hr, const T* wp, T* yr, int64_t H, double eps) {
  if (rr) {
    for (int64_t j = 0; j < H; ++j) hr[j] = T(static_cast<A>(xr[j]) + static_cast<A>(rr[j]));
    xr = hr;
  }
  A ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < H; ++j) {
    const A v = static_cast<A>(xr[j]);
    ss += v * v;
  }
  const A rs = static_cast<A>(1) / std::sqrt(ss / static_cast<A>(H) + static_cast<A>(eps));
  if (wp) {
    for (int64_t j = 0; j < H; ++j) yr[j] = T(static_cast<A>(xr[j]) * rs * static_cast<A>(wp[j]));
  } else {
    for (int64_t j = 0; j < H; ++j) yr[j] = T(static_cast<A>(xr[j]) * rs);
  }
  return rs;
}

void norm_rows(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h,
               const Tensor& y, const Tensor& rstd) {
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* xp = x.data_ptr<T>();
    const T* rp = residual.defined() ? residual.data_ptr<T>() : nullptr;
    T* hp = h.defined() ? h.data_ptr<T>() : nullptr;
    const T* wp = weight.defined() ? weight.data_ptr<T>() : nullptr;
    T* yp = y.data_ptr<T>();
    A* sp = rstd.data_ptr<A>();
    const int nt = threads_for(rows * H, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; ++r)
      sp[r] = norm_row<T, A>(xp + r * H, rp ? rp + r * H : nullptr, hp ? hp + r * H : nullptr, wp, yp + r * H, H,
                             eps);
  });
}

}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  norm_rows(x, Tensor(), weight, eps, Tensor(), y, rstd);
}

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& h,
                          const Tensor& y, const Tensor& rstd) {
  norm_rows(x, residual, weight, eps, h, y, rstd);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight, const Tensor& dpass) {
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* xp = x.data_ptr<T>();
    const T* gp = dy.data_ptr<T>();
    const T* wp = weight.defined() ? weight.data_ptr<T>() : nullptr;
    const A* rp = rstd.data_ptr<A>();
    T* dxp = dx.data_ptr<T>();
    const T* pp = dpass.defined() ? dpass.data_ptr<T>() : nullptr;
    const bool want_dw = dweight.defined();
    const int64_t per = chunk_rows(rows);
    const int64_t nchunks = (rows + per - 1) / per;
    std::vector<A> partial(want_dw ? static_cast<size_t>(nchunks * H) : 0, A(0));
    const A inv_h = static_cast<A>(1) / static_cast<A>(H);
    const int nt = threads_for(rows * H, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      A* pw = want_dw ? partial.data() + c * H : nullptr;
      for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
        const T* xr = xp + r * H;
        const T* gr = gp + r * H;
        T* dxr = dxp + r * H;
        const A rs = rp[r];
        // dot = sum_j (dy_j * w_j) * xhat_j
        A dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < H; ++j) {
          const A g = static_cast<A>(gr[j]) * (wp ? static_cast<A>(wp[j]) : A(1));
          dot += g * static_cast<A>(xr[j]) * rs;
        }
        const A k = dot * inv_h;
        for (int64_t j = 0; j < H; ++j) {
          const A xh = static_cast<A>(xr[j]) * rs;
          const A g = static_cast<A>(gr[j]) * (wp ? static_cast<A>(wp[j]) : A(1));
          dxr[j] = T(rs * (g - xh * k) + (pp ? static_cast<A>(pp[r * H + j]) : A(0)));
          if (pw) pw[j] += static_cast<A>(gr[j]) * xh;
        }
      }
    }
    if (want_dw) {
      T* dwp = dweight.data_ptr<T>();
      const int nt_w = threads_for(nchunks * H, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt_w) if (nt_w > 1)
      for (int64_t j = 0; j < H; ++j) {
        A s = 0;
        for (int64_t c = 0; c < nchunks; ++c) s += partial[c * H + j];
        dwp[j] = T(s);
      }
    }
  });
}

}  // namespace kiln::cpu
