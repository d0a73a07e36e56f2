// Rotary embedding on the CPU: for each (b, t, h) row and pair i < D/2,
//   out[i] = x[i] cos - s x[i + D/2] sin,  out[i + D/2] = x[i + D/2] cos + s x[i] sin,
// with s = +1 forward and -1 backward. Rows are independent, split over OpenMP threads.
#include "ops/cpu/rope.h"

#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {

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
#pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = (r / H) % T;
      const X* xr = xp + r * D;
      X* orow = op + r * D;
      const A* c = cp + t * half;
      const A* sn = sp + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const A x1 = static_cast<A>(xr[i]), x2 = static_cast<A>(xr[i + half]);
        const A si = s * sn[i];
        orow[i] = X(x1 * c[i] - x2 * si);
        orow[i + half] = X(x2 * c[i] + x1 * si);
      }
    }
  });
}

}  // namespace kiln::cpu
