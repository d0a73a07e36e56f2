// Optimizer kernels on the CPU. AdamW: one OpenMP loop over fixed chunks of every parameter
// (multi-tensor), each chunk a SIMD loop that reads p, g, m, v once and writes p, m, v in place;
// elements are independent, so the result does not depend on the thread count. grad_sumsq: fixed 64K-element chunks summed in fp64, partials added in chunk
// order (bitwise identical for any thread count).
#include "optim/cpu/kernels.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {
constexpr int64_t kChunk = 65536;
}

namespace {

template <typename P>
void adamw_range(const AdamWTensors& t, int64_t begin, int64_t end) {
  using S = acc_t<P>;
  const AdamWScalars& s = t.s;
  P* p = t.param.data_ptr<P>();
  const P* g = t.grad.data_ptr<P>();
  S* m = t.exp_avg.data_ptr<S>();
  S* v = t.exp_avg_sq.data_ptr<S>();
  const S decay = static_cast<S>(1.0 - s.lr * s.weight_decay);
  const S b1c = static_cast<S>(1.0 - s.beta1), b2 = static_cast<S>(s.beta2), b2c = static_cast<S>(1.0 - s.beta2);
  const S step_size = static_cast<S>(s.step_size), bc2 = static_cast<S>(s.bias_correction2_sqrt);
  const S eps = static_cast<S>(s.eps);
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const S gi = static_cast<S>(g[i]);
    const S mi = m[i] + b1c * (gi - m[i]);  // exp_avg.lerp_(grad, 1 - beta1)
    const S vi = b2 * v[i] + b2c * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const S denom = std::sqrt(vi) / bc2 + eps;
    p[i] = P(static_cast<S>(p[i]) * decay - step_size * mi / denom);
  }
}

constexpr int64_t kAdamChunk = 16384;

}  // namespace

void adamw_step(const std::vector<AdamWTensors>& params) {
  struct Piece {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    const int64_t n = params[t].param.numel();
    total += n;
    for (int64_t b = 0; b < n; b += kAdamChunk) pieces.push_back({t, b, std::min(n, b + kAdamChunk)});
  }
  const int64_t np = static_cast<int64_t>(pieces.size());
  const int nt = np > 1 ? threads_for(total, grains().elementwise_grain) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < np; ++i) {
    const Piece& pc = pieces[static_cast<size_t>(i)];
    const AdamWTensors& t = params[pc.tensor];
    dispatch_floating(t.param.dtype(), "adamw", [&](auto tag) {
      adamw_range<typename decltype(tag)::type>(t, pc.begin, pc.end);
    });
  }
}

double grad_sumsq(const Tensor& grad) {
  const int64_t n = grad.numel();
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(nchunks), 0.0);
  dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data_ptr<T>();
    const int nt = nchunks > 1 ? threads_for(n, grains().reduce_grain) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      double acc = 0;
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        const double x = static_cast<double>(static_cast<acc_t<T>>(g[i]));
        acc += x * x;
      }
      partial[c] = acc;
    }
  });
  double total = 0;
  for (double v : partial) total += v;
  return total;
}

void scale_(const Tensor& grad, double factor) {
  const int64_t n = grad.numel();
  dispatch_floating(grad.dtype(), "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* g = grad.data_ptr<T>();
    const A f = static_cast<A>(factor);
    const int nt = threads_for(n, grains().elementwise_grain);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; ++i) g[i] = T(static_cast<A>(g[i]) * f);
  });
}

}  // namespace kiln::cpu
