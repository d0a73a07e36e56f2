// swiglu on the CPU: fixed chunks of elements over OpenMP threads (results independent of the
// thread count: elements are independent); fp32 takes the Highway rows, other dtypes a scalar loop
// in their accumulation type.
#include "ops/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 16384;

template <typename F>
void chunks(int64_t n, const F& f) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  const int nt = nchunks > 1 ? threads_for(n, grains().elementwise_grain) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t c = 0; c < nchunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk) - c * kChunk);
}

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  if (gate.dtype() == kFloat32) {
    const float *g = gate.data_ptr<float>(), *u = up.data_ptr<float>();
    float* o = out.data_ptr<float>();
    chunks(n, [&](int64_t i, int64_t len) { simd::swiglu_forward_f32(g + i, u + i, o + i, len); });
    return;
  }
  dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T *g = gate.data_ptr<T>(), *u = up.data_ptr<T>();
    T* o = out.data_ptr<T>();
    chunks(n, [&](int64_t i0, int64_t len) {
      for (int64_t i = i0; i < i0 + len; ++i) {
        const A x = static_cast<A>(g[i]);
        o[i] = T(x / (A(1) + std::exp(-x)) * static_cast<A>(u[i]));
      }
    });
  });
}

void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  const int64_t n = gate.numel();
  if (gate.dtype() == kFloat32) {
    const float *dy = grad.data_ptr<float>(), *g = gate.data_ptr<float>(), *u = up.data_ptr<float>();
    float *dg = dgate.data_ptr<float>(), *du = dup.data_ptr<float>();
    chunks(n, [&](int64_t i, int64_t len) { simd::swiglu_backward_f32(dy + i, g + i, u + i, dg + i, du + i, len); });
    return;
  }
  dispatch_floating(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T *dy = grad.data_ptr<T>(), *g = gate.data_ptr<T>(), *u = up.data_ptr<T>();
    T *dg = dgate.data_ptr<T>(), *du = dup.data_ptr<T>();
    chunks(n, [&](int64_t i0, int64_t len) {
      for (int64_t i = i0; i < i0 + len; ++i) {
        const A x = static_cast<A>(g[i]), s = A(1) / (A(1) + std::exp(-x)), gs = static_cast<A>(dy[i]) * s;
        dg[i] = T(gs * static_cast<A>(u[i]) * (A(1) + x * (A(1) - s)));
        du[i] = T(gs * x);
      }
    });
  });
}

}  // namespace kiln::cpu
