// CPU kernels for index_select / gather / embedding (gathers) and their deterministic
// accumulating backwards (index_add over a CSR of positions per destination row, scatter_add
// one line per task).
// - Gathers are pure data movement, dispatched on the element size only: contiguous rows go
//   through memcpy, everything else through a strided 3-operand loop (out, x restrided with
//   stride 0 along dim, index restrided to out's shape).
// - index_add_rows: a stable counting sort of the k indices gives, per destination row j, the
//   increasing list of source positions; rows are split over OpenMP threads and each row sums
//   its sources in that fixed order, so the result is bitwise identical for any thread count.
// - scatter_add_lines: the destinations of one line (all coordinates but dim fixed) never meet
//   another line's, so lines run in parallel and each adds its sources in increasing order.
#include "ops/cpu/indexing.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/cpu/loop.h"
#include "core/dispatch.h"
#include "core/tensor_impl.h"

namespace kiln::cpu {
namespace {

// Element type of the same width as dtype: gathers only move bits.
template <typename F>
void dispatch_width(size_t width, const char* op, F&& f) {
  switch (width) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    default: KILN_FAIL(op, "unsupported element size ", width);
  }
}

// Stable counting sort of index values in [0, n): offsets [n + 1], perm [k] (positions).
template <typename I>
void build_csr(const I* idx, int64_t k, int64_t n, std::vector<int64_t>& offsets, std::vector<int64_t>& perm) {
  offsets.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t t = static_cast<int64_t>(idx[i]);
    if (t >= 0 && t < n) ++offsets[t + 1];
  }
  for (int64_t j = 0; j < n; ++j) offsets[j + 1] += offsets[j];
  perm.assign(static_cast<size_t>(offsets[n]), 0);
  std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t t = static_cast<int64_t>(idx[i]);
    if (t >= 0 && t < n) perm[cursor[t]++] = i;
  }
}

}  // namespace

int64_t find_bad_index(const Tensor& index, int64_t bound) {
  return dispatch_index(index.dtype(), "index", [&](auto tag) -> int64_t {
    using I = typename decltype(tag)::type;
    const I* p = index.data_ptr<I>();
    const int64_t k = index.numel();
    for (int64_t i = 0; i < k; ++i)
      if (static_cast<int64_t>(p[i]) < 0 || static_cast<int64_t>(p[i]) >= bound) return i;
    return -1;
  });
}

void index_select_rows(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n,
                       int64_t inner) {
  const int64_t k = index.numel();
  const size_t row_bytes = static_cast<size_t>(inner) * x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  dispatch_index(index.dtype(), "index_select", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* idx = index.data_ptr<I>();
    const int64_t rows = outer * k;
    const int nt = threads_for(rows * inner, grains().rows_grain);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r / k, i = r % k;
      const int64_t t = static_cast<int64_t>(idx[i]);
      if (t < 0 || t >= n) continue;
      std::memcpy(dst + r * row_bytes, src + (o * n + t) * row_bytes, row_bytes);
    }
  });
}

void index_gather(const Tensor& out, const Tensor& x_r, const Tensor& index_r, int64_t x_dim_stride, int64_t bound) {
  if (out.numel() == 0) return;
  StridedOperands<3> ops({&out, &x_r, &index_r});
  dispatch_width(out.element_size(), "gather", [&](auto wtag) {
    using E = typename decltype(wtag)::type;
    dispatch_index(index_r.dtype(), "gather", [&](auto itag) {
      using I = typename decltype(itag)::type;
      const int64_t xs = x_dim_stride * static_cast<int64_t>(sizeof(E));
      ops.for_each_row([&](const std::array<char*, 3>& p, int64_t len, const std::array<int64_t, 3>& bs) {
        for (int64_t e = 0; e < len; ++e) {
          const int64_t t = static_cast<int64_t>(*reinterpret_cast<const I*>(p[2] + e * bs[2]));
          if (t < 0 || t >= bound) continue;
          *reinterpret_cast<E*>(p[0] + e * bs[0]) = *reinterpret_cast<const E*>(p[1] + e * bs[1] + t * xs);
        }
      });
    });
  });
}

void index_add_rows(const Tensor& grad_x, const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t k,
                    int64_t inner) {
  std::vector<int64_t> offsets, perm;
  dispatch_index(index.dtype(), "index_add", [&](auto tag) {
    using I = typename decltype(tag)::type;
    build_csr(index.data_ptr<I>(), k, n, offsets, perm);
  });
  dispatch_floating(g.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* src = g.data_ptr<T>();
    T* dst = grad_x.data_ptr<T>();
    const int64_t rows = outer * n;
    const int nt = threads_for(rows * inner, grains().rows_grain);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      std::vector<A> acc(std::is_same_v<A, T> ? 0 : static_cast<size_t>(inner));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r / n, j = r % n;
        T* out_row = dst + r * inner;
        const int64_t begin = offsets[j], end = offsets[j + 1];
        if constexpr (std::is_same_v<A, T>) {
          for (int64_t c = 0; c < inner; ++c) out_row[c] = T(0);
          for (int64_t p = begin; p < end; ++p) {
            const T* in_row = src + (o * k + perm[p]) * inner;
            for (int64_t c = 0; c < inner; ++c) out_row[c] += in_row[c];
          }
        } else {
          for (int64_t c = 0; c < inner; ++c) acc[c] = A(0);
          for (int64_t p = begin; p < end; ++p) {
            const T* in_row = src + (o * k + perm[p]) * inner;
            for (int64_t c = 0; c < inner; ++c) acc[c] += static_cast<A>(in_row[c]);
          }
          for (int64_t c = 0; c < inner; ++c) out_row[c] = T(acc[c]);
        }
      }
    }
  });
}

void scatter_add_lines(const Tensor& out_l, const Tensor& index_l, const Tensor& src_l, int64_t m, int64_t out_sd,
                       int64_t index_sd, int64_t src_sd, int64_t bound) {
  if (index_l.numel() == 0 || m == 0) return;
  StridedOperands<3> ops({&out_l, &index_l, &src_l});
  dispatch_all(src_l.dtype(), "scatter_add", [&](auto stag) {
    using S = typename decltype(stag)::type;
    using A = acc_t<S>;
    dispatch_index(index_l.dtype(), "scatter_add", [&](auto itag) {
      using I = typename decltype(itag)::type;
      // One line per task (lines never share a destination); offsets decoded per line.
      const auto& shape = ops.geom.shape;
      const auto& st = ops.geom.strides;
      const int64_t lines = ops.numel();
      A* out = out_l.data_ptr<A>();
      const I* idx = index_l.data_ptr<I>();
      const S* src = src_l.data_ptr<S>();
      const int nt = lines > 1 ? threads_for(lines * m, grains().rows_grain) : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
      for (int64_t l = 0; l < lines; ++l) {
        int64_t rem = l, oo = 0, io = 0, so = 0;
        for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
          const int64_t c = rem % shape[d];
          rem /= shape[d];
          oo += c * st[0][d];
          io += c * st[1][d];
          so += c * st[2][d];
        }
        for (int64_t i = 0; i < m; ++i) {
          const int64_t t = static_cast<int64_t>(idx[io + i * index_sd]);
          if (t < 0 || t >= bound) continue;
          A& dst = out[oo + t * out_sd];
          dst = static_cast<A>(dst + cast_value<A>(src[so + i * src_sd]));
        }
      }
    });
  });
}

}  // namespace kiln::cpu
