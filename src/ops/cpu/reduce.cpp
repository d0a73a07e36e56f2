// CPU reductions over [outer, r, inner] (see ops/reduce_geom.h).
// Determinism: the r axis of every output is cut into chunks of kChunk (kColChunk) elements, a fixed split
// that depends only on r; each chunk is reduced by one thread in a fixed order (SIMD lanes for a
// contiguous run, a plain loop otherwise) and chunk partials are combined in index order. Threads
// only decide WHO computes a chunk, never how, so results are bitwise identical for any
// OMP_NUM_THREADS. Work items are (output row or inner block) x chunk, so a full reduction of a
// large tensor and a reduction of many short rows both keep every thread busy.
#include "ops/cpu/reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/cpu/loop.h"
#include "core/dispatch.h"
#include "ops/cpu/reduce_simd.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 16384;      // r elements per partial (rows): amortises SIMD setup
constexpr int64_t kColChunk = 2048;    // r elements per partial (columns): more work items to share
constexpr int64_t kInnerBlock = 1024;  // inner outputs per work item: long unit-stride runs per page

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

template <typename A>
bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return std::isnan(v);
  return false;
}

// x beats a for the maximum (kMax) or minimum; NaN beats everything.
template <bool kMax, typename A>
bool beats(A x, A a) {
  if (is_nan(x)) return !is_nan(a);
  return kMax ? x > a : x < a;
}

template <typename A>
A lowest() {
  if constexpr (std::numeric_limits<A>::has_infinity) return -std::numeric_limits<A>::infinity();
  return std::numeric_limits<A>::lowest();
}
template <typename A>
A highest() {
  if constexpr (std::numeric_limits<A>::has_infinity) return std::numeric_limits<A>::infinity();
  return std::numeric_limits<A>::max();
}

template <typename T>
using sum_acc_t = std::conditional_t<kIsFloat<T>, acc_t<T>, int64_t>;

template <typename T>
struct SumOp {
  using A = sum_acc_t<T>;
  using Acc = A;
  static Acc init() { return A(0); }
  static void add(Acc& a, T v, int64_t) { a += cast_value<A>(v); }
  static void merge(Acc& a, const Acc& b) { a += b; }
  static Acc run(const T* p, int64_t n) {
    if constexpr (kIsFloat<T>) return simd::sum(p, n);
    Acc a = init();
    for (int64_t i = 0; i < n; ++i) add(a, p[i], i);
    return a;
  }
};

template <typename T, bool kMax>
struct ExtremeOp {
  using A = acc_t<T>;
  using Acc = A;
  static Acc init() { return kMax ? lowest<A>() : highest<A>(); }
  static void add(Acc& a, T v, int64_t) {
    const A x = cast_value<A>(v);
    if (beats<kMax>(x, a)) a = x;
  }
  static void merge(Acc& a, const Acc& b) {
    if (beats<kMax>(b, a)) a = b;
  }
  static Acc run(const T* p, int64_t n) {
    if constexpr (kIsFloat<T>) return kMax ? simd::max(p, n) : simd::min(p, n);
    Acc a = init();
    for (int64_t i = 0; i < n; ++i) add(a, p[i], i);
    return a;
  }
};

template <typename T, bool kMax = true>
struct ArgMaxOp {
  using A = acc_t<T>;
  static constexpr bool kIsArg = true;
  struct Acc {
    A v;
    int64_t i;  // -1: nothing seen yet
  };
  static Acc init() { return {kMax ? lowest<A>() : highest<A>(), -1}; }
  static void add(Acc& a, T v, int64_t idx) {
    const A x = cast_value<A>(v);
    if (a.i < 0 || beats<kMax>(x, a.v)) a = {x, idx};
  }
  // b always covers later indices than a, so ties keep a (the first extreme).
  static void merge(Acc& a, const Acc& b) {
    if (b.i >= 0 && (a.i < 0 || beats<kMax>(b.v, a.v))) a = b;
  }
  static Acc run(const T* p, int64_t n) {
    Acc a = init();
    for (int64_t i = 0; i < n; ++i) add(a, p[i], i);
    return a;
  }
};

// Running (max, sum of exp(x - max)) in fp32 (fp64 for fp64).
template <typename T>
struct LseOp {
  using A = acc_t<T>;
  struct Acc {
    A m, s;
  };
  static Acc init() { return {-std::numeric_limits<A>::infinity(), A(0)}; }
  static void add(Acc& a, T v, int64_t) {
    const A x = cast_value<A>(v);
    if (std::isnan(x) || std::isnan(a.m)) {
      a = {std::numeric_limits<A>::quiet_NaN(), A(1)};
    } else if (x > a.m) {
      a.s = a.s * std::exp(a.m - x) + A(1);
      a.m = x;
    } else if (x == a.m) {
      a.s += A(1);
    } else {
      a.s += std::exp(x - a.m);
    }
  }
  static void merge(Acc& a, const Acc& b) {
    if (std::isnan(a.m) || std::isnan(b.m)) {
      a = {std::numeric_limits<A>::quiet_NaN(), A(1)};
      return;
    }
    const A m = std::max(a.m, b.m);
    if (m == -std::numeric_limits<A>::infinity()) {
      a.s += b.s;
      return;
    }
    a.s = a.s * std::exp(a.m - m) + b.s * std::exp(b.m - m);
    a.m = m;
  }
  static Acc run(const T* p, int64_t n) {
    Acc a;
    simd::max_sumexp(p, n, &a.m, &a.s);
    return a;
  }
  static A result(const Acc& a) { return a.s == A(0) ? -std::numeric_limits<A>::infinity() : a.m + std::log(a.s); }
};

// Reduces the chunk [r0, r1) of output (o, i); rows with unit stride use the op's SIMD path.
template <typename Op, typename T>
typename Op::Acc reduce_row_chunk(const T* x, const ReduceGeom& g, int64_t o, int64_t r0, int64_t r1) {
  const T* p = x + o * g.so + r0 * g.sr;
  if (g.sr == 1) {
    auto a = Op::run(p, r1 - r0);
    if constexpr (requires { Op::kIsArg; }) a.i += r0;
    return a;
  }
  auto a = Op::init();
  for (int64_t r = r0; r < r1; ++r, p += g.sr) Op::add(a, *p, r);
  return a;
}

// Generic driver: partials[(o * nchunks + c) * inner + i], combined in chunk order by `finish`.
template <typename Op, typename T, typename Finish>
void reduce_impl(const T* x, const ReduceGeom& g, Finish finish) {
  using Acc = typename Op::Acc;
  const int64_t chunk = g.inner == 1 ? kChunk : kColChunk;
  const int64_t nchunks = (g.r + chunk - 1) / chunk;
  const int nt = threads_for(g.outer * g.r * g.inner, grains().reduce_grain);
  if (g.inner == 1) {
    const int64_t items = g.outer * nchunks;
    std::vector<Acc> part(static_cast<size_t>(nchunks > 1 ? items : 0));
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && items > 1)
    for (int64_t w = 0; w < items; ++w) {
      const int64_t o = w / nchunks, c = w % nchunks;
      const Acc a = reduce_row_chunk<Op>(x, g, o, c * chunk, std::min(g.r, (c + 1) * chunk));
      if (nchunks == 1) {
        finish(o * g.oo, a);
      } else {
        part[static_cast<size_t>(w)] = a;
      }
    }
    if (nchunks == 1) return;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && g.outer > 1)
    for (int64_t o = 0; o < g.outer; ++o) {
      Acc a = part[static_cast<size_t>(o * nchunks)];
      for (int64_t c = 1; c < nchunks; ++c) Op::merge(a, part[static_cast<size_t>(o * nchunks + c)]);
      finish(o * g.oo, a);
    }
    return;
  }
  // Column reduction: each work item owns a block of inner outputs and one chunk of r, and walks
  // r in the outer loop so unit-stride inner runs are read sequentially.
  const int64_t nblocks = (g.inner + kInnerBlock - 1) / kInnerBlock;
  const int64_t items = g.outer * nblocks * nchunks;
  std::vector<Acc> part(static_cast<size_t>(nchunks > 1 ? g.outer * nchunks * g.inner : 0));
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && items > 1)
  for (int64_t w = 0; w < items; ++w) {
    const int64_t c = w % nchunks, b = (w / nchunks) % nblocks, o = w / (nchunks * nblocks);
    const int64_t i0 = b * kInnerBlock, i1 = std::min(g.inner, i0 + kInnerBlock);
    const int64_t r0 = c * chunk, r1 = std::min(g.r, r0 + chunk);
    Acc acc[kInnerBlock];
    for (int64_t i = i0; i < i1; ++i) acc[i - i0] = Op::init();
    for (int64_t r = r0; r < r1; ++r) {
      const T* p = x + o * g.so + r * g.sr;
      if (g.si == 1) {  // unit stride: lets the compiler vectorise across the inner block
        for (int64_t i = i0; i < i1; ++i) Op::add(acc[i - i0], p[i], r);
      } else {
        for (int64_t i = i0; i < i1; ++i) Op::add(acc[i - i0], p[i * g.si], r);
      }
    }
    for (int64_t i = i0; i < i1; ++i) {
      if (nchunks == 1) {
        finish(o * g.oo + i * g.oi, acc[i - i0]);
      } else {
        part[static_cast<size_t>((o * nchunks + c) * g.inner + i)] = acc[i - i0];
      }
    }
  }
  if (nchunks == 1) return;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && g.outer * g.inner > 1)
  for (int64_t q = 0; q < g.outer * g.inner; ++q) {
    const int64_t o = q / g.inner, i = q % g.inner;
    Acc a = part[static_cast<size_t>(o * nchunks * g.inner + i)];
    for (int64_t c = 1; c < nchunks; ++c) Op::merge(a, part[static_cast<size_t>((o * nchunks + c) * g.inner + i)]);
    finish(o * g.oo + i * g.oi, a);
  }
}

template <typename T>
void reduce_typed(ReduceKind kind, const Tensor& xt, const ReduceGeom& g, const Tensor& out, const Tensor& indices) {
  const T* x = xt.data_ptr<T>();
  switch (kind) {
    case ReduceKind::Sum:
    case ReduceKind::Mean: {
      using A = sum_acc_t<T>;
      const bool mean = kind == ReduceKind::Mean;
      const A inv_r = A(1) / static_cast<A>(g.r);
      dispatch_all(out.dtype(), "sum", [&](auto otag) {
        using O = typename decltype(otag)::type;
        O* y = out.data_ptr<O>();
        reduce_impl<SumOp<T>>(x, g, [&](int64_t off, A a) {
          if constexpr (kIsFloat<T>) {
            if (mean) a = a * inv_r;
          }
          y[off] = cast_value<O>(a);
        });
      });
      return;
    }
    case ReduceKind::Max:
    case ReduceKind::Min: {
      T* y = out.data_ptr<T>();
      auto fin = [&](int64_t off, acc_t<T> a) { y[off] = cast_value<T>(a); };
      if (kind == ReduceKind::Max) {
        reduce_impl<ExtremeOp<T, true>>(x, g, fin);
      } else {
        reduce_impl<ExtremeOp<T, false>>(x, g, fin);
      }
      return;
    }
    case ReduceKind::ArgMax:
    case ReduceKind::ArgMin: {
      T* y = out.defined() ? out.data_ptr<T>() : nullptr;
      int64_t* idx = indices.data_ptr<int64_t>();
      auto fin = [&](int64_t off, const auto& a) {
        idx[off] = a.i;
        if (y) y[off] = cast_value<T>(a.v);
      };
      if (kind == ReduceKind::ArgMax) {
        reduce_impl<ArgMaxOp<T, true>>(x, g, fin);
      } else {
        reduce_impl<ArgMaxOp<T, false>>(x, g, fin);
      }
      return;
    }
    case ReduceKind::LogSumExp: {
      if constexpr (kIsFloat<T>) {
        acc_t<T>* y = out.data_ptr<acc_t<T>>();
        reduce_impl<LseOp<T>>(x, g, [&](int64_t off, typename LseOp<T>::Acc a) { y[off] = LseOp<T>::result(a); });
      }
      return;
    }
  }
}

}  // namespace

void reduce(ReduceKind kind, const Tensor& x, const ReduceGeom& g, const Tensor& out, const Tensor& indices) {
  dispatch_all(x.dtype(), "reduce", [&](auto tag) { reduce_typed<typename decltype(tag)::type>(kind, x, g, out, indices); });
}

// ---- backward helpers: strided loops over dst's shape ----

void scale_broadcast(const Tensor& dst, const Tensor& src, double scale) {
  dispatch_floating(dst.dtype(), "mean", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A s = static_cast<A>(scale);
    StridedOperands<2>({&dst, &src}).for_each_row([&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& st) {
      for (int64_t k = 0; k < n; ++k)
        *reinterpret_cast<T*>(p[0] + k * st[0]) = cast_value<T>(cast_value<A>(*reinterpret_cast<const T*>(p[1] + k * st[1])) * s);
    });
  });
}

void ties_mask(const Tensor& mask, const Tensor& x, const Tensor& y) {
  dispatch_floating(x.dtype(), "amax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    StridedOperands<3>({&mask, &x, &y}).for_each_row([&](const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
      for (int64_t k = 0; k < n; ++k) {
        const A a = cast_value<A>(*reinterpret_cast<const T*>(p[1] + k * st[1]));
        const A b = cast_value<A>(*reinterpret_cast<const T*>(p[2] + k * st[2]));
        *reinterpret_cast<A*>(p[0] + k * st[0]) = (a == b || (std::isnan(a) && std::isnan(b))) ? A(1) : A(0);
      }
    });
  });
}

void ties_grad(const Tensor& dst, const Tensor& mask, const Tensor& g, const Tensor& cnt) {
  dispatch_floating(dst.dtype(), "amax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    StridedOperands<4>({&dst, &mask, &g, &cnt}).for_each_row([&](const std::array<char*, 4>& p, int64_t n, const std::array<int64_t, 4>& st) {
      for (int64_t k = 0; k < n; ++k) {
        const A m = *reinterpret_cast<const A*>(p[1] + k * st[1]);
        const A gv = cast_value<A>(*reinterpret_cast<const T*>(p[2] + k * st[2]));
        const A c = *reinterpret_cast<const A*>(p[3] + k * st[3]);
        *reinterpret_cast<T*>(p[0] + k * st[0]) = cast_value<T>(m != A(0) ? gv / c : A(0));
      }
    });
  });
}

void argmax_grad(const Tensor& dst, const Tensor& idx, const Tensor& iota, const Tensor& g) {
  dispatch_floating(dst.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    StridedOperands<4>({&dst, &idx, &iota, &g}).for_each_row([&](const std::array<char*, 4>& p, int64_t n, const std::array<int64_t, 4>& st) {
      for (int64_t k = 0; k < n; ++k) {
        const bool hit = *reinterpret_cast<const int64_t*>(p[1] + k * st[1]) == *reinterpret_cast<const int64_t*>(p[2] + k * st[2]);
        *reinterpret_cast<T*>(p[0] + k * st[0]) = hit ? *reinterpret_cast<const T*>(p[3] + k * st[3]) : cast_value<T>(0.0f);
      }
    });
  });
}

void lse_grad(const Tensor& dst, const Tensor& x, const Tensor& y, const Tensor& g) {
  dispatch_floating(dst.dtype(), "logsumexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    StridedOperands<4>({&dst, &x, &y, &g}).for_each_row([&](const std::array<char*, 4>& p, int64_t n, const std::array<int64_t, 4>& st) {
      for (int64_t k = 0; k < n; ++k) {
        const A xv = cast_value<A>(*reinterpret_cast<const T*>(p[1] + k * st[1]));
        const A yv = *reinterpret_cast<const A*>(p[2] + k * st[2]);
        const A gv = cast_value<A>(*reinterpret_cast<const T*>(p[3] + k * st[3]));
        *reinterpret_cast<T*>(p[0] + k * st[0]) = cast_value<T>(gv * std::exp(xv - yv));
      }
    });
  });
}

}  // namespace kiln::cpu
