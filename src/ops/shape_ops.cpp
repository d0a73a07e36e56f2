// split / chunk / unbind (views via narrow / select) and topk / sort: the order is found on the host
// per row, then the values are gathered from x on its device, which gives them their gradient.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/dispatch.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

template <typename A>
bool nan_value(A v) {
  if constexpr (std::is_floating_point_v<A>) return std::isnan(v);
  return false;
}

// Indices of the k first elements of each row of `rows` ([R, n], contiguous, CPU) in the order
// `largest` asks for (nan counts as the largest; ties keep the lower index first) -> int64 [R, k].
Tensor select_order(const Tensor& rows, int64_t k, bool largest) {
  const int64_t r = rows.size(0), n = rows.size(1);
  Tensor out = empty({r, k}, kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  dispatch_all(rows.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* x = rows.data_ptr<T>();
    // Rows are independent (the result does not depend on the thread count); small inputs stay serial.
#pragma omp parallel for schedule(static) if (r > 1 && r * n >= (int64_t{1} << 16))
    for (int64_t i = 0; i < r; ++i) {
      std::vector<int64_t> idx(static_cast<size_t>(n));
      const T* row = x + i * n;
      auto first = [&](int64_t a, int64_t b) {
        const A va = cast_value<A>(row[a]), vb = cast_value<A>(row[b]);
        const bool na = nan_value(va), nb = nan_value(vb);
        if (na || nb) {
          if (na && nb) return a < b;
          return largest ? na : nb;
        }
        if (va != vb) return largest ? va > vb : va < vb;
        return a < b;
      };
      std::iota(idx.begin(), idx.end(), int64_t{0});
      if (k == n) {
        std::sort(idx.begin(), idx.end(), first);
      } else {
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), first);
      }
      std::copy(idx.begin(), idx.begin() + k, o + i * k);
    }
  });
  return out;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(x.defined() && x.dim() > 0, "split", "expected a tensor with at least one dim");
  KILN_CHECK(split_size >= 0, "split", "split_size must be non-negative, got ", split_size);
  const int64_t d = wrap_dim(dim, x.dim(), "split"), n = x.size(d);
  if (n == 0) return {x};
  KILN_CHECK(split_size > 0, "split", "split_size can only be 0 if dimension size is 0, but got dimension size ", n);
  std::vector<Tensor> out;
  for (int64_t start = 0; start < n; start += split_size) out.push_back(x.narrow(d, start, std::min(split_size, n - start)));
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  KILN_CHECK(x.defined() && x.dim() > 0, "split", "expected a tensor with at least one dim");
  const int64_t d = wrap_dim(dim, x.dim(), "split"), n = x.size(d);
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, "split", "split sizes must be non-negative, got ", s);
    total += s;
  }
  KILN_CHECK(total == n, "split", "split sizes sum to ", total, " but the tensor has ", n, " along dim ", d);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(x.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(x.defined() && x.dim() > 0, "chunk", "expected a tensor with at least one dim");
  KILN_CHECK(chunks > 0, "chunk", "number of chunks must be positive, got ", chunks);
  const int64_t d = wrap_dim(dim, x.dim(), "chunk"), n = x.size(d);
  if (n == 0) return std::vector<Tensor>(static_cast<size_t>(chunks), x);
  return split(x, (n + chunks - 1) / chunks, d);
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  KILN_CHECK(x.defined() && x.dim() > 0, "unbind", "expected a tensor with at least one dim");
  const int64_t d = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor> out;
  for (int64_t i = 0; i < x.size(d); ++i) out.push_back(x.select(d, i));
  return out;
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // the selection always comes back in order
  KILN_CHECK(x.defined(), "topk", "input is undefined");
  if (x.dim() == 0) {
    auto [v, i] = topk(x.reshape({1}), k, 0, largest, sorted);
    const Shape shape = k == 1 ? Shape{} : Shape{0};  // a 0-d input keeps its rank
    return {v.reshape(shape), i.reshape(shape)};
  }
  const int64_t d = wrap_dim(dim, x.dim(), "topk"), n = x.size(d);
  KILN_CHECK(k >= 0 && k <= n, "topk", "k (", k, ") is out of range for dimension ", d, " of size ", n);
  // Move dim last, find the order per row on the host, move it back.
  Shape perm;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  Tensor indices;
  {
    NoGradGuard ng;
    const Tensor moved = x.detach().permute(perm).to(kCPU).contiguous();
    const int64_t rows = n == 0 ? 0 : moved.numel() / n;
    Shape moved_shape = moved.sizes();
    moved_shape.back() = k;
    indices = select_order(moved.reshape({rows, n}), k, largest).reshape(moved_shape);
    Shape inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
    indices = indices.permute(inverse).contiguous().to(x.device());
  }
  return {gather(x, d, indices), indices};
}

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  KILN_CHECK(x.defined(), "sort", "input is undefined");
  const int64_t n = x.dim() == 0 ? 1 : x.size(wrap_dim(dim, x.dim(), "sort"));
  return topk(x, n, dim, descending, true);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) { return sort(x, dim, descending).second; }

}  // namespace kiln
