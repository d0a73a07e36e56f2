// Dropout on the CPU: one Philox block (4 x 32 bits) per 4 elements; element i keeps its value
// (times 1/(1-p)) when the 24-bit uniform of lane i % 4 of block offset + i / 4 is below 1 - p.
// The mask is never stored: backward regenerates it from the saved (seed, offset).
#include "ops/cpu/dropout.h"

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/philox.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {

void dropout_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  const int64_t n = x.numel();
  const int64_t nblocks = (n + 3) / 4;
  // keep iff (bits >> 8) < keep_below, i.e. uniform = (bits >> 8) / 2^24 < 1 - p.
  const double keep_below = (1.0 - p) * 16777216.0;
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A scale = p < 1.0 ? static_cast<A>(1.0 / (1.0 - p)) : A(0);
    const T* xp = x.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int nt = threads_for(n, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t b = 0; b < nblocks; ++b) {
      const philox::Block r = philox::generate(seed, offset + static_cast<uint64_t>(b));
      for (int k = 0; k < 4; ++k) {
        const int64_t i = b * 4 + k;
        if (i >= n) break;
        const bool keep = static_cast<double>(r.x[k] >> 8) < keep_below;
        op[i] = keep ? T(static_cast<A>(xp[i]) * scale) : T(A(0));
      }
    }
  });
}

}  // namespace kiln::cpu
