// swiglu on the CPU: fixed chunks of elements over OpenMP threads (results independent of the
// thread count: elements are independent); fp32 takes the Highway rows, bf16 the same rows on fp32
// copies of kStage-element blocks (widened and rounded by the SIMD conversions), other dtypes a
// scalar loop in their accumulation type.
#include "ops/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/convert.h"
#include "core/cpu/parallel.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 16384;
constexpr int64_t kStage = 1024;  // bf16 elements staged as fp32 at a time (4 KB a stream: L1)

const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* mutable_bits(const Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }

// Runs row(in..., out...) over [i0, i0 + len) of bf16 streams through fp32 stage buffers.
template <int kIn, int kOut, typename Row>
void staged_bf16(const uint16_t* const (&in)[kIn], uint16_t* const (&out)[kOut], int64_t i0, int64_t len, const Row& row) {
  float fin[kIn][kStage], fout[kOut][kStage];
  for (int64_t s = i0; s < i0 + len; s += kStage) {
    const int64_t m = std::min(kStage, i0 + len - s);
    for (int k = 0; k < kIn; ++k) convert_bf16_to_f32(in[k] + s, fin[k], m);
    row(fin, fout, m);
    for (int k = 0; k < kOut; ++k) convert_f32_to_bf16(fout[k], out[k] + s, m);
  }
}

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
  if (gate.dtype() == kBFloat16) {
    const uint16_t* const in[2] = {bits(gate), bits(up)};
    uint16_t* const out_bits[1] = {mutable_bits(out)};
    chunks(n, [&](int64_t i, int64_t len) {
      staged_bf16<2, 1>(in, out_bits, i, len, [](const float (*fi)[kStage], float (*fo)[kStage], int64_t m) {
        simd::swiglu_forward_f32(fi[0], fi[1], fo[0], m);
      });
    });
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
  if (gate.dtype() == kBFloat16) {
    const uint16_t* const in[3] = {bits(grad), bits(gate), bits(up)};
    uint16_t* const out_bits[2] = {mutable_bits(dgate), mutable_bits(dup)};
    chunks(n, [&](int64_t i, int64_t len) {
      staged_bf16<3, 2>(in, out_bits, i, len, [](const float (*fi)[kStage], float (*fo)[kStage], int64_t m) {
        simd::swiglu_backward_f32(fi[0], fi[1], fi[2], fo[0], fo[1], m);
      });
    });
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
