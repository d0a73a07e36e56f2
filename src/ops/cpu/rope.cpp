// Rotary embedding on the CPU: for each (b, t, h) row and pair i < D/2,
//   out[i] = x[i] cos - s x[i + D/2] sin,  out[i + D/2] = x[i + D/2] cos + s x[i] sin,
// with s = +1 forward and -1 backward. Rows are independent, split over OpenMP threads.
#include "ops/cpu/rope.h"

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {

// One row of D = 2 * half values: dst = rotation of src by s * theta_t (c, sn: the row's tables).
template <typename X, typename A>
inline void rotate_row(const X* src, X* dst, const A* c, const A* sn, int64_t half, A s) {
  for (int64_t i = 0; i < half; ++i) {
    const A x1 = static_cast<A>(src[i]), x2 = static_cast<A>(src[i + half]);
    const A si = s * sn[i];
    dst[i] = X(x1 * c[i] - x2 * si);
    dst[i + half] = X(x2 * c[i] + x1 * si);
  }
}

}  // namespace

void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int sign, const Tensor& out) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const int64_t rows = B * T * H;
  dispatch_floating(x.dtype(), "apply_rotary_emb", [&](auto tag) {
    using X = typename decltype(tag)::type;
    using A = acc_t<X>;
    const X* xp = x.data_ptr<X>();
    X* op = out.data_ptr<X>();
    const A* cp = cos.data_ptr<A>();
    const A* sp = sin.data_ptr<A>();
    const A s = static_cast<A>(sign);
    const int nt = threads_for(rows * D, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = (r / H) % T;
      const X* xr = xp + r * D;
      X* orow = op + r * D;
      rotate_row(xr, orow, cp + t * half, sp + t * half, half, s);
    }
  });
}

void qkv_rotary(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                const Tensor& sin, bool split) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), half = D / 2;
  dispatch_floating(qkv.dtype(), "qkv_rotary_split", [&](auto tag) {
    using X = typename decltype(tag)::type;
    using A = acc_t<X>;
    X* packed = qkv.data_ptr<X>();
    X* heads[3] = {q.data_ptr<X>(), k.data_ptr<X>(), v.data_ptr<X>()};
    const A* cp = cos.data_ptr<A>();
    const A* sp = sin.data_ptr<A>();
    const A s = split ? A(1) : A(-1);
    const int nt = threads_for(B * T * H * D, grains().rows_grain);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < 3; ++j)
          for (int64_t h = 0; h < H; ++h) {
            X* pr = packed + (((b * T + t) * 3 + j) * H + h) * D;  // qkv[b, t, j, h, :]
            X* hr = heads[j] + ((b * H + h) * T + t) * D;          // q/k/v[b, h, t, :]
            const X* src = split ? pr : hr;
            X* dst = split ? hr : pr;
            if (j == 2) {
              std::copy(src, src + D, dst);
              continue;
            }
            rotate_row(src, dst, cp + t * half, sp + t * half, half, s);
          }
  });
}

}  // namespace kiln::cpu
