// Highway SIMD row kernels for reductions and softmax. Each function walks one contiguous run
// with four independent accumulators (sum) or one running vector (max), widening 16-bit inputs
// to fp32 on load; the tail is padded with the operation's identity into one full vector, so
// every element goes through the same SIMD math. Stores of 16-bit results round through kiln's
// scalar converters (round to nearest even) rather than the target's demotion.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/cpu/reduce_simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/reduce_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadAcc(D d, const T* p) {
  using A = hn::TFromD<D>;
  if constexpr (std::is_same_v<T, A>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    const hn::Rebind<hwy::bfloat16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  } else {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  }
}

// count (< Lanes) elements, the rest of the vector filled with `pad`.
template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadPad(D d, const T* p, size_t count, hn::TFromD<D> pad) {
  using A = hn::TFromD<D>;
  HWY_ALIGN A buf[HWY_MAX_BYTES / sizeof(A)];
  const size_t N = hn::Lanes(d);
  for (size_t j = 0; j < N; ++j) buf[j] = j < count ? cast_value<A>(p[j]) : pad;
  return hn::Load(d, buf);
}

// GCC cannot see that Store fills buf on the one-lane scalar target.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <class D, typename T>
HWY_INLINE void StoreAcc(D d, hn::Vec<D> v, T* p, size_t count) {
  using A = hn::TFromD<D>;
  if constexpr (std::is_same_v<T, A>) {
    if (count == hn::Lanes(d)) {
      hn::StoreU(v, d, p);
      return;
    }
  }
  HWY_ALIGN A buf[HWY_MAX_BYTES / sizeof(A)];
  hn::Store(v, d, buf);
  for (size_t j = 0; j < count; ++j) p[j] = cast_value<T>(buf[j]);
}
#pragma GCC diagnostic pop

template <typename T>
acc_t<T> SumImpl(const T* p, int64_t n64) {
  using A = acc_t<T>;
  const hn::ScalableTag<A> d;
  const size_t N = hn::Lanes(d), n = static_cast<size_t>(n64);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, LoadAcc(d, p + i));
    a1 = hn::Add(a1, LoadAcc(d, p + i + N));
    a2 = hn::Add(a2, LoadAcc(d, p + i + 2 * N));
    a3 = hn::Add(a3, LoadAcc(d, p + i + 3 * N));
  }
  for (; i + N <= n; i += N) a0 = hn::Add(a0, LoadAcc(d, p + i));
  if (i < n) a1 = hn::Add(a1, LoadPad(d, p + i, n - i, A(0)));
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

template <typename T, bool kMax>
acc_t<T> ExtremeImpl(const T* p, int64_t n64) {
  using A = acc_t<T>;
  const hn::ScalableTag<A> d;
  const size_t N = hn::Lanes(d), n = static_cast<size_t>(n64);
  const A ident = kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
  auto acc = hn::Set(d, ident);
  auto bad = hn::Zero(d);  // all-ones lanes where a NaN was seen
  auto step = [&](hn::Vec<decltype(d)> v) {
    acc = kMax ? hn::Max(acc, v) : hn::Min(acc, v);
    bad = hn::Or(bad, hn::VecFromMask(d, hn::Not(hn::Eq(v, v))));  // hwy Ne is ordered: false for NaN
  };
  size_t i = 0;
  for (; i + N <= n; i += N) step(LoadAcc(d, p + i));
  if (i < n) step(LoadPad(d, p + i, n - i, ident));
  if (!hn::AllFalse(d, hn::MaskFromVec(bad))) return std::numeric_limits<A>::quiet_NaN();
  return hn::GetLane(kMax ? hn::MaxOfLanes(d, acc) : hn::MinOfLanes(d, acc));
}

// sum exp(p - m) for a given m; -inf pads contribute exp(-inf) = 0.
template <typename T>
acc_t<T> SumExpImpl(const T* p, int64_t n64, acc_t<T> m) {
  using A = acc_t<T>;
  const hn::ScalableTag<A> d;
  const size_t N = hn::Lanes(d), n = static_cast<size_t>(n64);
  const auto vm = hn::Set(d, m);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    s0 = hn::Add(s0, hn::Exp(d, hn::Sub(LoadAcc(d, p + i), vm)));
    s1 = hn::Add(s1, hn::Exp(d, hn::Sub(LoadAcc(d, p + i + N), vm)));
  }
  for (; i + N <= n; i += N) s0 = hn::Add(s0, hn::Exp(d, hn::Sub(LoadAcc(d, p + i), vm)));
  if (i < n) s1 = hn::Add(s1, hn::Exp(d, hn::Sub(LoadPad(d, p + i, n - i, -std::numeric_limits<A>::infinity()), vm)));
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
}

template <typename T>
void MaxSumExpImpl(const T* p, int64_t n, acc_t<T>* m, acc_t<T>* s) {
  using A = acc_t<T>;
  *m = ExtremeImpl<T, true>(p, n);
  if (std::isnan(*m) || std::isinf(*m)) {
    // NaN propagates; all -inf gives log(n) + -inf = -inf; any +inf gives +inf.
    *s = *m == -std::numeric_limits<A>::infinity() ? static_cast<A>(n) : A(1);
    return;
  }
  *s = SumExpImpl(p, n, *m);
}

// Calls f(i, count, full) for each vector-sized step of [0, n); `full` is a compile-time flag,
// so the body loop carries no tail handling.
template <class D, class F>
HWY_INLINE void ForEachVec(D d, size_t n, F&& f) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) f(i, N, std::true_type{});
  if (i < n) f(i, n - i, std::false_type{});
}

template <bool kFull, class D, typename T>
HWY_INLINE hn::Vec<D> LoadSome(D d, const T* p, size_t count, std::bool_constant<kFull>) {
  if constexpr (kFull) {
    return LoadAcc(d, p);
  } else {
    return LoadPad(d, p, count, hn::TFromD<D>(0));
  }
}

template <bool kFull, class D, typename T>
HWY_INLINE void StoreSome(D d, hn::Vec<D> v, T* p, size_t count, std::bool_constant<kFull>) {
  if constexpr (kFull && std::is_same_v<T, hn::TFromD<D>>) {
    hn::StoreU(v, d, p);
  } else {
    StoreAcc(d, v, p, count);
  }
}

template <typename T>
void SoftmaxRowImpl(const T* x, T* y, int64_t n64, bool log) {
  using A = acc_t<T>;
  const hn::ScalableTag<A> d;
  const size_t n = static_cast<size_t>(n64);
  const A m = ExtremeImpl<T, true>(x, n64);
  const A s = SumExpImpl(x, n64, m);  // m NaN or -inf: s = 0 and every output becomes NaN
  if (log) {
    const auto vc = hn::Set(d, m + std::log(s));
    ForEachVec(d, n, [&](size_t i, size_t c, auto full) {
      StoreSome(d, hn::Sub(LoadSome(d, x + i, c, full), vc), y + i, c, full);
    });
  } else {
    const auto vm = hn::Set(d, m), vinv = hn::Set(d, A(1) / s);
    ForEachVec(d, n, [&](size_t i, size_t c, auto full) {
      StoreSome(d, hn::Mul(hn::Exp(d, hn::Sub(LoadSome(d, x + i, c, full), vm)), vinv), y + i, c, full);
    });
  }
}

template <typename T>
void SoftmaxBackwardRowImpl(const T* y, const T* g, T* gx, int64_t n64, bool log) {
  using A = acc_t<T>;
  const hn::ScalableTag<A> d;
  const size_t n = static_cast<size_t>(n64);
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  bool odd = false;  // alternate accumulators: two independent add chains
  ForEachVec(d, n, [&](size_t i, size_t c, auto full) {
    const auto vg = LoadSome(d, g + i, c, full);
    auto& acc = odd ? acc1 : acc0;
    odd = !odd;
    acc = log ? hn::Add(acc, vg) : hn::MulAdd(vg, LoadSome(d, y + i, c, full), acc);
  });
  const auto vs = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1))));
  ForEachVec(d, n, [&](size_t i, size_t c, auto full) {
    const auto vg = LoadSome(d, g + i, c, full);
    const auto vy = LoadSome(d, y + i, c, full);
    const auto r = log ? hn::NegMulAdd(hn::Exp(d, vy), vs, vg) : hn::Mul(vy, hn::Sub(vg, vs));
    StoreSome(d, r, gx + i, c, full);
  });
}

#define KILN_SIMD_DEFINE(T, A, tag)                                                                         \
  A Sum_##tag(const T* p, int64_t n) { return SumImpl(p, n); }                                              \
  A Max_##tag(const T* p, int64_t n) { return ExtremeImpl<T, true>(p, n); }                                 \
  A Min_##tag(const T* p, int64_t n) { return ExtremeImpl<T, false>(p, n); }                                \
  void MaxSumExp_##tag(const T* p, int64_t n, A* m, A* s) { MaxSumExpImpl(p, n, m, s); }                     \
  void Softmax_##tag(const T* x, T* y, int64_t n, bool log) { SoftmaxRowImpl(x, y, n, log); }               \
  void SoftmaxBwd_##tag(const T* y, const T* g, T* gx, int64_t n, bool log) {                               \
    SoftmaxBackwardRowImpl(y, g, gx, n, log);                                                               \
  }
KILN_SIMD_DEFINE(float, float, f32)
KILN_SIMD_DEFINE(double, double, f64)
KILN_SIMD_DEFINE(BFloat16, float, bf16)
KILN_SIMD_DEFINE(Half, float, f16)
#undef KILN_SIMD_DEFINE

}  // namespace HWY_NAMESPACE
}  // namespace kiln::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kiln::cpu::simd {

#define KILN_SIMD_EXPORT(T, A, tag)                                                                         \
  HWY_EXPORT(Sum_##tag);                                                                                    \
  HWY_EXPORT(Max_##tag);                                                                                    \
  HWY_EXPORT(Min_##tag);                                                                                    \
  HWY_EXPORT(MaxSumExp_##tag);                                                                              \
  HWY_EXPORT(Softmax_##tag);                                                                                \
  HWY_EXPORT(SoftmaxBwd_##tag);                                                                             \
  A sum(const T* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(Sum_##tag)(p, n); }                            \
  A max(const T* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(Max_##tag)(p, n); }                            \
  A min(const T* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(Min_##tag)(p, n); }                            \
  void max_sumexp(const T* p, int64_t n, A* m, A* s) { HWY_DYNAMIC_DISPATCH(MaxSumExp_##tag)(p, n, m, s); } \
  void softmax_row(const T* x, T* y, int64_t n, bool log) { HWY_DYNAMIC_DISPATCH(Softmax_##tag)(x, y, n, log); } \
  void softmax_backward_row(const T* y, const T* g, T* gx, int64_t n, bool log) {                           \
    HWY_DYNAMIC_DISPATCH(SoftmaxBwd_##tag)(y, g, gx, n, log);                                               \
  }
KILN_SIMD_EXPORT(float, float, f32)
KILN_SIMD_EXPORT(double, double, f64)
KILN_SIMD_EXPORT(BFloat16, float, bf16)
KILN_SIMD_EXPORT(Half, float, f16)
#undef KILN_SIMD_EXPORT

}  // namespace kiln::cpu::simd
#endif
