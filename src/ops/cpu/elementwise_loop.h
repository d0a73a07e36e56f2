#pragma once
// Generic CPU elementwise launcher, reusable by any op family:
//   elementwise_loop<Out, In...>(out, {&in0, &in1}, f)  computes out[i] = f(in0[i], in1[i]) with
// inputs converted to their compute type (acc_t) and the result converted to Out. Operands must
// already have out's sizes (expand() first); strides are free. Fully contiguous operands run as a
// flat range split into fixed chunks over OpenMP; the rest go through StridedOperands rows.
// Each element is computed independently, so results never depend on the thread count.
#include <algorithm>
#include <array>
#include <initializer_list>
#include <cstdint>
#include <utility>

#include "core/cpu/loop.h"
#include "core/dispatch.h"

namespace kiln::cpu {

// Elements per OpenMP chunk of a flat range: big enough to amortise scheduling, small enough
// to spread a few MiB over every core.
constexpr int64_t kElementwiseChunk = 16384;

// fn(begin, end) over [0, n) in fixed chunks, over threads at or above the elementwise grain.
template <typename F>
void parallel_chunks(int64_t n, F&& fn) {
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
  const int nt = chunks > 1 ? threads_for(n, grains().elementwise_grain) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kElementwiseChunk;
    fn(begin, std::min(n, begin + kElementwiseChunk));
  }
}

inline bool all_contiguous(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!t->is_contiguous()) return false;
  return true;
}

namespace detail {

template <typename Out, typename... In, typename F, size_t... K>
inline void elementwise_row(const F& f, const std::array<char*, 1 + sizeof...(In)>& p, int64_t n,
                            const std::array<int64_t, 1 + sizeof...(In)>& s, std::index_sequence<K...>) {
  const bool dense = s[0] == static_cast<int64_t>(sizeof(Out)) &&
                     ((s[K + 1] == static_cast<int64_t>(sizeof(In))) && ...);
  if (dense) {  // plain indexing lets the compiler vectorise simple functors
    Out* o = reinterpret_cast<Out*>(p[0]);
    for (int64_t i = 0; i < n; ++i)
      o[i] = cast_value<Out>(f(cast_value<acc_t<In>>(reinterpret_cast<const In*>(p[K + 1])[i])...));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    *reinterpret_cast<Out*>(p[0] + i * s[0]) =
        cast_value<Out>(f(cast_value<acc_t<In>>(*reinterpret_cast<const In*>(p[K + 1] + i * s[K + 1]))...));
}

}  // namespace detail

template <typename Out, typename... In, typename F>
void elementwise_loop(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& ins, const F& f) {
  constexpr int N = 1 + static_cast<int>(sizeof...(In));
  const int64_t n = out.numel();
  if (n == 0) return;
  std::array<const Tensor*, N> all{};
  all[0] = &out;
  bool flat = out.is_contiguous();
  for (size_t i = 0; i < ins.size(); ++i) {
    all[i + 1] = ins[i];
    flat = flat && ins[i]->is_contiguous();
  }
  using Seq = std::make_index_sequence<sizeof...(In)>;
  if (flat) {
    std::array<char*, N> base{};
    std::array<int64_t, N> es{};
    for (int i = 0; i < N; ++i) {
      base[i] = static_cast<char*>(all[i]->data_ptr());
      es[i] = static_cast<int64_t>(all[i]->element_size());
    }
    parallel_chunks(n, [&](int64_t begin, int64_t end) {
      std::array<char*, N> p = base;
      for (int i = 0; i < N; ++i) p[i] += begin * es[i];
      detail::elementwise_row<Out, In...>(f, p, end - begin, es, Seq{});
    });
    return;
  }
  StridedOperands<N> ops(all);
  ops.for_each_row([&](const std::array<char*, N>& p, int64_t len, const std::array<int64_t, N>& s) {
    detail::elementwise_row<Out, In...>(f, p, len, s, Seq{});
  });
}

}  // namespace kiln::cpu
