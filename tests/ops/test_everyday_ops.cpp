// The everyday tensor ops (min/argmin, var/std/norm, masks, split, topk/sort, einsum, in-place
// updates, Generator/multinomial, uint16/uint32) against float64 loops on fresh random inputs,
// with gradchecks for the differentiable ones and CPU-vs-CUDA checks (skipped without a GPU).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "support/testing.h"

namespace kiln {
namespace {

using testing::expect_cuda_matches_cpu;
using testing::expect_gradcheck;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Row-major float64 copy of a [R, C] tensor.
std::vector<std::vector<double>> rows_of(const Tensor& x) {
  const std::vector<double> v = x.to_vector();
  std::vector<std::vector<double>> out(static_cast<size_t>(x.size(0)));
  for (int64_t r = 0; r < x.size(0); ++r)
    out[static_cast<size_t>(r)].assign(v.begin() + r * x.size(1), v.begin() + (r + 1) * x.size(1));
  return out;
}

TEST(EverydayOps, MinAndArgminMatchLoops) {
  manual_seed(11);
  const Tensor x = randn({5, 7}, kFloat64);
  const auto rows = rows_of(x);
  auto [values, indices] = min(x, 1);
  for (int64_t r = 0; r < 5; ++r) {
    const auto& row = rows[static_cast<size_t>(r)];
    const auto it = std::min_element(row.begin(), row.end());
    EXPECT_EQ(values.to_vector()[static_cast<size_t>(r)], *it);
    EXPECT_EQ(indices.to_vector()[static_cast<size_t>(r)], static_cast<double>(it - row.begin()));
  }
  EXPECT_EQ(argmin(x, 1).to_vector(), indices.to_vector());
  const std::vector<double> flat = x.to_vector();
  EXPECT_EQ(min(x).item(), *std::min_element(flat.begin(), flat.end()));
  EXPECT_EQ(argmin(x).item(), static_cast<double>(std::min_element(flat.begin(), flat.end()) - flat.begin()));
  // Over dim 0 with keepdim, and the first of equal minima (integers, bf16).
  EXPECT_EQ(min(x, 0, true).first.sizes(), (Shape{1, 7}));
  const Tensor ints = tensor({3, 1, 2, 1, 5, 0, 0, 4}, kInt32).reshape({2, 4});
  EXPECT_EQ(argmin(ints, 1).to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(min(ints, 1).first.to_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(argmin(tensor({2, -1, -1}, kBFloat16)).item(), 1.0);
  // NaN is the minimum, as in PyTorch.
  EXPECT_EQ(argmin(tensor({1, kNan, -3})).item(), 1.0);
  EXPECT_THROW(min(empty({0})), Error);
}

TEST(EverydayOps, MinGradientGoesToTheArgmin) {
  manual_seed(12);
  expect_gradcheck([](const std::vector<Tensor>& in) { return min(in[0], 1).first; },
                   {randn({4, 6}, kFloat64).requires_grad_()});
  expect_gradcheck([](const std::vector<Tensor>& in) { return min(in[0]); }, {randn({3, 5}, kFloat64).requires_grad_()});
}

TEST(EverydayOps, VarStdMatchLoopsForEveryCorrection) {
  manual_seed(13);
  const Tensor x = randn({6, 9}, kFloat64) * 3.0 + 1.5;
  const auto rows = rows_of(x);
  for (double c : {0.0, 1.0, 2.0}) {
    std::vector<double> want_var;
    for (const auto& row : rows) {
      const double m = std::accumulate(row.begin(), row.end(), 0.0) / static_cast<double>(row.size());
      double s = 0;
      for (double v : row) s += (v - m) * (v - m);
      want_var.push_back(s / (static_cast<double>(row.size()) - c));
    }
    EXPECT_CLOSE(var(x, {1}, c), tensor(want_var, kFloat64), 1e-12);
    std::vector<double> want_std;
    for (double v : want_var) want_std.push_back(std::sqrt(v));
    EXPECT_CLOSE(std(x, {-1}, c), tensor(want_std, kFloat64), 1e-12);
  }
  // All dims against the flattened loop; keepdim keeps shape; 16-bit inputs within their tolerance.
  const std::vector<double> flat = x.to_vector();
  const double m = std::accumulate(flat.begin(), flat.end(), 0.0) / 54.0;
  double s = 0;
  for (double v : flat) s += (v - m) * (v - m);
  EXPECT_NEAR(var(x).item(), s / 53.0, 1e-12);
  EXPECT_EQ(var(x, {0, 1}, 1.0, true).sizes(), (Shape{1, 1}));
  EXPECT_CLOSE(var(x.to(kBFloat16), {1}).to(kFloat64), var(x, {1}), 2e-2);
  EXPECT_EQ(var(x.to(kBFloat16), {1}).dtype(), kBFloat16);
  EXPECT_TRUE(std::isnan(var(tensor({2.0}), {}, 1.0).item()));  // N - correction = 0
  EXPECT_THROW(var(ones({3}, kInt64)), Error);
}

TEST(EverydayOps, VarStdGradcheck) {
  manual_seed(14);
  expect_gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {1}); }, {randn({3, 5}, kFloat64).requires_grad_()});
  expect_gradcheck([](const std::vector<Tensor>& in) { return std(in[0], {0}, 0.0, true); },
                   {randn({4, 3}, kFloat64).requires_grad_()});
}

TEST(EverydayOps, NormMatchesLoopsForEveryOrder) {
  manual_seed(15);
  const Tensor x = randn({4, 8}, kFloat64);
  const auto rows = rows_of(x);
  for (double p : {1.0, 2.0, 3.0, 0.5, kInf, -kInf, 0.0}) {
    std::vector<double> want;
    for (const auto& row : rows) {
      double acc = p == -kInf ? kInf : 0;
      for (double v : row) {
        const double a = std::fabs(v);
        if (p == kInf) acc = std::max(acc, a);
        else if (p == -kInf) acc = std::min(acc, a);
        else if (p == 0) acc += a != 0;
        else acc += std::pow(a, p);
      }
      want.push_back(std::isinf(p) || p == 0 ? acc : std::pow(acc, 1.0 / p));
    }
    SCOPED_TRACE("p = " + std::to_string(p));
    EXPECT_CLOSE(norm(x, p, {1}), tensor(want, kFloat64), 1e-12);
  }
  EXPECT_NEAR(norm(x).item(), std::sqrt(sum(x * x).item()), 1e-12);
  EXPECT_EQ(norm(x, 2, {0}, true).sizes(), (Shape{1, 8}));
  EXPECT_CLOSE(norm(x.to(kBFloat16), 2, {1}).to(kFloat64), norm(x, 2, {1}), 1e-2);
}

TEST(EverydayOps, NormGradcheckAndZeroNormGradient) {
  manual_seed(16);
  for (double p : {2.0, 3.0, 1.5, 1.0, kInf}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    expect_gradcheck([p](const std::vector<Tensor>& in) { return norm(in[0], p, {1}); },
                     {randn({3, 4}, kFloat64).requires_grad_()});
  }
  const Tensor z = zeros({2, 3}, kFloat64).requires_grad_();
  sum(norm(z, 2, {1})).backward();
  EXPECT_EQ(z.grad().to_vector(), std::vector<double>(6, 0.0));
}

TEST(EverydayOps, TrilTriuMatchLoops) {
  manual_seed(17);
  const Tensor x = randn({2, 4, 5}, kFloat64);
  const std::vector<double> v = x.to_vector();
  for (int64_t diag : {-2, -1, 0, 1, 3}) {
    std::vector<double> lo(v.size()), up(v.size());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          const size_t k = static_cast<size_t>((b * 4 + i) * 5 + j);
          lo[k] = j - i <= diag ? v[k] : 0;
          up[k] = j - i >= diag ? v[k] : 0;
        }
    EXPECT_EQ(tril(x, diag).to_vector(), lo) << diag;
    EXPECT_EQ(triu(x, diag).to_vector(), up) << diag;
  }
  expect_gradcheck([](const std::vector<Tensor>& in) { return triu(in[0], 1); }, {randn({3, 3}, kFloat64).requires_grad_()});
  EXPECT_THROW(tril(randn({3})), Error);
}

TEST(EverydayOps, MaskedFillAndItsGradient) {
  manual_seed(18);
  const Tensor x = randn({3, 4}, kFloat64);
  const Tensor mask = gt(randn({1, 4}), 0.0);
  const std::vector<double> v = x.to_vector(), m = mask.to_vector();
  std::vector<double> want(v);
  for (size_t i = 0; i < v.size(); ++i)
    if (m[i % 4] != 0) want[i] = -7.5;
  EXPECT_EQ(masked_fill(x, mask, -7.5).to_vector(), want);
  Tensor y = x.clone();
  masked_fill_(y, mask, -7.5);
  EXPECT_EQ(y.to_vector(), want);
  const Tensor fill = tensor({2.0}, kFloat64).reshape({}).requires_grad_();
  const Tensor xin = x.clone().requires_grad_();
  sum(masked_fill(xin, mask, fill)).backward();
  const double masked = std::count_if(m.begin(), m.end(), [](double b) { return b != 0; }) * 3.0;
  EXPECT_EQ(fill.grad().item(), masked);
  EXPECT_EQ(sum(xin.grad()).item(), 12.0 - masked);
  EXPECT_THROW(masked_fill(x, ones({4}, kFloat32), 1.0), Error);  // not a bool mask
  EXPECT_THROW(masked_fill(x, ones({2, 3, 4}, kBool), 1.0), Error);  // does not broadcast to x
}

TEST(EverydayOps, PredicatesAndCloseness) {
  const Tensor x = tensor({1.0, kNan, kInf, -kInf, 0.0});
  EXPECT_EQ(isnan(x).to_vector(), (std::vector<double>{0, 1, 0, 0, 0}));
  EXPECT_EQ(isinf(x).to_vector(), (std::vector<double>{0, 0, 1, 1, 0}));
  EXPECT_EQ(isfinite(x).to_vector(), (std::vector<double>{1, 0, 0, 0, 1}));
  EXPECT_EQ(isfinite(ones({2}, kInt64)).to_vector(), (std::vector<double>{1, 1}));
  const Tensor a = tensor({1.0, 1.0, kNan, kInf, 1.0});
  const Tensor b = tensor({1.0 + 1e-6, 1.1, kNan, kInf, -kInf});
  EXPECT_EQ(isclose(a, b).to_vector(), (std::vector<double>{1, 0, 0, 1, 0}));
  EXPECT_EQ(isclose(a, b, 1e-5, 1e-8, true).to_vector(), (std::vector<double>{1, 0, 1, 1, 0}));
  EXPECT_TRUE(allclose(a.slice(0, 0, 1), b.slice(0, 0, 1)));
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(ones({3}), ones({2, 3}, kFloat64)));  // broadcast, promoted
  EXPECT_EQ(logical_xor(tensor({0, 1, 2}), tensor({0, 0, 3})).to_vector(), (std::vector<double>{0, 1, 0}));
  EXPECT_EQ(logical_and(tensor({0, 1, 2}), tensor({1, 0, 3})).to_vector(), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(logical_or(tensor({0, 1, 0}), tensor({0, 0, 3})).to_vector(), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(logical_not(tensor({0, 2})).to_vector(), (std::vector<double>{1, 0}));
  const Tensor g = tensor({1, 0, 1, 1}, kBool).reshape({2, 2});
  EXPECT_EQ(all(g, {1}).to_vector(), (std::vector<double>{0, 1}));
  EXPECT_EQ(any(g, {0}).to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(all(g).item(), 0.0);
}

TEST(EverydayOps, NonzeroAndMaskIndexing) {
  manual_seed(19);
  const Tensor x = randn({3, 4, 2}, kFloat64);
  const Tensor mask = gt(randn({3, 4}), 0.0);
  const std::vector<double> m = mask.to_vector(), v = x.to_vector();
  std::vector<double> want_rows, want_nz;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i] != 0) {
      want_rows.push_back(v[2 * i]), want_rows.push_back(v[2 * i + 1]);
      want_nz.push_back(static_cast<double>(i / 4)), want_nz.push_back(static_cast<double>(i % 4));
    }
  const int64_t count = static_cast<int64_t>(want_nz.size() / 2);
  EXPECT_EQ(nonzero(mask).to_vector(), want_nz);
  EXPECT_EQ(nonzero(mask).sizes(), (Shape{count, 2}));
  const Tensor picked = index_by_mask(x, mask);
  EXPECT_EQ(picked.sizes(), (Shape{count, 2}));
  EXPECT_EQ(picked.to_vector(), want_rows);
  EXPECT_EQ(masked_select(x, mask.unsqueeze(2)).to_vector(), want_rows);
  // Writes: a broadcast row, then one row per true element.
  Tensor y = x.clone();
  index_put_by_mask_(y, mask, tensor({5.0, 6.0}, kFloat64));
  Tensor z = x.clone();
  const Tensor rows = arange(static_cast<double>(2 * count), kFloat64).reshape({count, 2});
  index_put_by_mask_(z, mask, rows);
  const std::vector<double> yv = y.to_vector(), zv = z.to_vector();
  for (size_t i = 0, r = 0; i < m.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(yv[2 * i + k], m[i] != 0 ? 5.0 + static_cast<double>(k) : v[2 * i + k]);
      EXPECT_EQ(zv[2 * i + k], m[i] != 0 ? static_cast<double>(2 * r + k) : v[2 * i + k]);
    }
    r += m[i] != 0;
  }
  // The read is differentiable: the gradient lands on the selected rows.
  const Tensor xin = x.clone().requires_grad_();
  sum(index_by_mask(xin, mask)).backward();
  EXPECT_EQ(sum(xin.grad()).item(), static_cast<double>(2 * count));
  EXPECT_THROW(index_by_mask(x, ones({3, 5}, kBool)), Error);
}

TEST(EverydayOps, SplitChunkUnbindAreViews) {
  const Tensor x = arange(20.0, kFloat64).reshape({4, 5});
  const auto parts = split(x, 2, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].sizes(), (Shape{4, 1}));
  EXPECT_EQ(parts[1].to_vector(), (std::vector<double>{2, 3, 7, 8, 12, 13, 17, 18}));
  EXPECT_EQ(parts[0].storage(), x.storage());
  const auto sized = split(x, std::vector<int64_t>{1, 3}, 0);
  EXPECT_EQ(sized[1].sizes(), (Shape{3, 5}));
  EXPECT_THROW(split(x, std::vector<int64_t>{1, 2}, 0), Error);
  const auto chunks = chunk(x, 3, 1);  // 5 / 3 -> sizes 2, 2, 1
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].size(1), 1);
  EXPECT_EQ(chunk(x, 4, 0).size(), 4u);
  EXPECT_EQ(chunk(arange(6.0), 4).size(), 3u);  // torch: sizes 2, 2, 2
  const auto rows = unbind(x, 0);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3].to_vector(), (std::vector<double>{15, 16, 17, 18, 19}));
  expect_gradcheck([](const std::vector<Tensor>& in) {
    const auto c = chunk(in[0], 2, 1);
    return c[0] * 2.0 + c[1];
  }, {randn({3, 4}, kFloat64).requires_grad_()});
}

TEST(EverydayOps, TopkAndSortMatchStdSort) {
  manual_seed(20);
  const Tensor x = randn({4, 9}, kFloat64);
  const auto rows = rows_of(x);
  for (bool largest : {true, false}) {
    auto [values, indices] = topk(x, 3, 1, largest);
    const std::vector<double> vv = values.to_vector(), iv = indices.to_vector();
    for (size_t r = 0; r < 4; ++r) {
      std::vector<int64_t> order(9);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return largest ? rows[r][static_cast<size_t>(a)] > rows[r][static_cast<size_t>(b)]
                       : rows[r][static_cast<size_t>(a)] < rows[r][static_cast<size_t>(b)];
      });
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(iv[r * 3 + k], static_cast<double>(order[k]));
        EXPECT_EQ(vv[r * 3 + k], rows[r][static_cast<size_t>(order[k])]);
      }
    }
  }
  // Along dim 0, ties keep the lower index first; NaN sorts as the largest.
  auto [sv, si] = sort(tensor({3, 1, kNan, 1, 2}), 0);
  EXPECT_EQ(si.to_vector(), (std::vector<double>{1, 3, 4, 0, 2}));
  EXPECT_EQ(argsort(tensor({3, 1, kNan, 1, 2}), 0, true).to_vector(), (std::vector<double>{2, 0, 4, 1, 3}));
  EXPECT_EQ(topk(x, 2, 0).first.sizes(), (Shape{2, 9}));
  EXPECT_EQ(topk(tensor({3, 9, 4}, kInt64), 1).second.item(), 1.0);
  EXPECT_THROW(topk(x, 10, 1), Error);
  expect_gradcheck([](const std::vector<Tensor>& in) { return topk(in[0], 2, 1).first; },
                   {randn({3, 5}, kFloat64).requires_grad_()});
}

// [.., M, K] x [.., K, N] reference by loops, for einsum's checks.
Tensor ref_bmm(const Tensor& a, const Tensor& b) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  std::vector<double> out(static_cast<size_t>(B * M * N));
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += av[static_cast<size_t>((z * M + i) * K + k)] * bv[static_cast<size_t>((z * K + k) * N + j)];
        out[static_cast<size_t>((z * M + i) * N + j)] = s;
      }
  return tensor(out, kFloat64).reshape({B, M, N});
}

TEST(EverydayOps, EinsumMatchesLoops) {
  manual_seed(21);
  const Tensor a = randn({3, 4}, kFloat64), b = randn({4, 5}, kFloat64), sq = randn({4, 4}, kFloat64);
  const Tensor ab = ref_bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0);
  EXPECT_CLOSE(einsum("ij,jk->ik", {a, b}), ab, 1e-14);
  EXPECT_CLOSE(einsum("ij,jk", {a, b}), ab, 1e-14);  // implicit output
  EXPECT_CLOSE(einsum("ij,jk->ki", {a, b}), ab.t(), 1e-14);
  const Tensor ba = randn({2, 3, 4}, kFloat64), bb = randn({2, 4, 6}, kFloat64);
  EXPECT_CLOSE(einsum("bij,bjk->bik", {ba, bb}), ref_bmm(ba, bb), 1e-14);
  EXPECT_CLOSE(einsum("...ij,...jk->...ik", {ba, bb}), ref_bmm(ba, bb), 1e-14);
  EXPECT_CLOSE(einsum("bij,jk->bik", {ba, b}), ref_bmm(ba, b.unsqueeze(0).expand({2, 4, 5}).contiguous()), 1e-14);
  // One operand: transpose, sums, trace, diagonal.
  EXPECT_CLOSE(einsum("ij->ji", {a}), a.t(), 0.0);
  EXPECT_NEAR(einsum("ij->", {a}).item(), sum(a).item(), 1e-12);
  EXPECT_CLOSE(einsum("ij->j", {a}), sum(a, {0}), 1e-14);
  const std::vector<double> s = sq.to_vector();
  EXPECT_NEAR(einsum("ii", {sq}).item(), s[0] + s[5] + s[10] + s[15], 1e-12);
  EXPECT_EQ(einsum("ii->i", {sq}).to_vector(), (std::vector<double>{s[0], s[5], s[10], s[15]}));
  // Outer product, dot product, three operands.
  const Tensor u = randn({3}, kFloat64), w = randn({3}, kFloat64);
  EXPECT_CLOSE(einsum("i,j->ij", {u, w}), u.unsqueeze(1) * w.unsqueeze(0), 1e-14);
  EXPECT_NEAR(einsum("i,i->", {u, w}).item(), sum(u * w).item(), 1e-12);
  const Tensor c = randn({5, 2}, kFloat64);
  EXPECT_CLOSE(einsum("ij,jk,kl->il", {a, b, c}), matmul(ab, c), 1e-13);
  // Attention-style contraction over a shared batch and heads.
  const Tensor q = randn({2, 3, 5, 4}, kFloat64), k = randn({2, 3, 6, 4}, kFloat64);
  EXPECT_CLOSE(einsum("bhqd,bhkd->bhqk", {q, k}), matmul(q, k.transpose(-2, -1)), 1e-13);
  // Errors name the subscript.
  EXPECT_THROW(einsum("ij,jk->iz", {a, b}), Error);
  EXPECT_THROW(einsum("ij,jk->ii", {a, b}), Error);
  EXPECT_THROW(einsum("ij,jk->ik", {a, a}), Error);  // j: 4 vs 3
  EXPECT_THROW(einsum("ijk->i", {a}), Error);
  EXPECT_THROW(einsum("i1->i", {a}), Error);
}

TEST(EverydayOps, EinsumGradcheck) {
  manual_seed(22);
  expect_gradcheck([](const std::vector<Tensor>& in) { return einsum("bij,bjk->bik", {in[0], in[1]}); },
                   {randn({2, 3, 4}, kFloat64).requires_grad_(), randn({2, 4, 2}, kFloat64).requires_grad_()});
  expect_gradcheck([](const std::vector<Tensor>& in) { return einsum("ii->i", {in[0]}); },
                   {randn({3, 3}, kFloat64).requires_grad_()});
}

TEST(EverydayOps, InPlaceUpdatesMatchTheirFormulas) {
  manual_seed(23);
  const Tensor p = rand({7}, kFloat64) + 0.5, t1 = randn({7}, kFloat64), t2 = rand({7}, kFloat64) + 0.5;
  const std::vector<double> pv = p.to_vector(), av = t1.to_vector(), bv = t2.to_vector();
  Tensor x = p.clone();
  sqrt_(x);
  Tensor y = p.clone();
  addcmul_(y, t1, t2, 0.3);
  Tensor z = p.clone();
  addcdiv_(z, t1, t2, -2.0);
  Tensor l = p.clone();
  lerp_(l, t1, 0.25);
  Tensor lt = p.clone();
  lerp_(lt, t1, t2);
  Tensor c = t1.clone();
  clamp_(c, -0.5, 0.5);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_DOUBLE_EQ(x.to_vector()[i], std::sqrt(pv[i]));
    EXPECT_DOUBLE_EQ(y.to_vector()[i], pv[i] + 0.3 * av[i] * bv[i]);
    EXPECT_DOUBLE_EQ(z.to_vector()[i], pv[i] - 2.0 * av[i] / bv[i]);
    EXPECT_DOUBLE_EQ(l.to_vector()[i], pv[i] + 0.25 * (av[i] - pv[i]));
    EXPECT_DOUBLE_EQ(lt.to_vector()[i], pv[i] + bv[i] * (av[i] - pv[i]));
    EXPECT_DOUBLE_EQ(c.to_vector()[i], std::clamp(av[i], -0.5, 0.5));
  }
  Tensor leaf = ones({2}).requires_grad_();
  try {  // a leaf that requires grad, grad mode on: the error names the op
    sqrt_(leaf);
    ADD_FAILURE() << "sqrt_ wrote a leaf that requires grad";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sqrt_]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lerp_(leaf, ones({2}), 0.5), Error);
  EXPECT_THROW(masked_fill_(leaf, ones({2}, kBool), 0.0), Error);
  Tensor ints = ones({2}, kInt64);
  EXPECT_THROW(sqrt_(ints), Error);
  Tensor target = zeros({2});
  const Tensor src = arange(6.0, kFloat64).reshape({2, 3});
  set_data(target, src);
  EXPECT_EQ(target.sizes(), (Shape{2, 3}));
  EXPECT_EQ(target.dtype(), kFloat64);
  EXPECT_EQ(target.storage(), src.storage());
}

TEST(EverydayOps, GeneratorStreamsAreIndependentAndReplayable) {
  Generator g;
  g.manual_seed(42);
  const Tensor a = rand({100}, g), b = randn({100}, g);
  g.manual_seed(42);
  EXPECT_EQ(rand({100}, g).to_vector(), a.to_vector());
  const Tensor state = g.get_state();
  const Tensor next = randn({10}, g, kFloat64);
  g.set_state(state);
  EXPECT_EQ(randn({10}, g, kFloat64).to_vector(), next.to_vector());
  // The global stream is untouched by a generator, and another seed differs.
  manual_seed(42);
  const Tensor global = rand({100});
  EXPECT_EQ(global.to_vector(), a.to_vector());  // same seed, same Philox stream
  Generator other;
  other.manual_seed(43);
  EXPECT_NE(rand({100}, other).to_vector(), a.to_vector());
  const Tensor ints = randint(5, 9, {1000}, g);
  EXPECT_GE(amin(ints).item(), 5.0);
  EXPECT_LE(amax(ints).item(), 8.0);
  Tensor n = empty({20000}, kFloat64);
  normal_(n, 3.0, 2.0, &g);
  EXPECT_NEAR(mean(n).item(), 3.0, 0.1);
  EXPECT_NEAR(std(n).item(), 2.0, 0.1);
  Tensor u = empty({20000}, kFloat32);
  uniform_(u, -2.0, 4.0, &g);
  EXPECT_GE(amin(u).item(), -2.0);
  EXPECT_LT(amax(u).item(), 4.0);
  EXPECT_NEAR(mean(u).item(), 1.0, 0.1);
  EXPECT_THROW(rand({2}, Generator(Device("cuda:0"))), Error);  // a CUDA generator for a CPU tensor
}

TEST(EverydayOps, RandpermIsAPermutationAndFollowsTheGenerator) {
  Generator g;
  g.manual_seed(3);
  const Tensor p = randperm(1000, &g);
  std::vector<double> v = p.to_vector();
  const std::vector<double> first = v;
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<double>(i));
  EXPECT_NE(first, v);  // shuffled
  g.manual_seed(3);
  EXPECT_EQ(randperm(1000, &g).to_vector(), first);
  EXPECT_EQ(randperm(5, &g, kFloat32).dtype(), kFloat32);
  EXPECT_EQ(randperm(0).numel(), 0);
  // Every position sees every value about equally often.
  std::vector<double> at0(4, 0);
  for (int i = 0; i < 4000; ++i) at0[static_cast<size_t>(randperm(4, &g).to_vector()[0])] += 1;
  for (double c : at0) EXPECT_NEAR(c / 4000.0, 0.25, 0.03);
}

TEST(EverydayOps, MaskGradchecks) {
  manual_seed(25);
  const Tensor mask = gt(randn({3, 4}), 0.0);
  expect_gradcheck([mask](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, 0.5); },
                   {randn({3, 4}, kFloat64).requires_grad_()});
  expect_gradcheck([mask](const std::vector<Tensor>& in) { return index_by_mask(in[0], mask) * 3.0; },
                   {randn({3, 4, 2}, kFloat64).requires_grad_()});
  expect_gradcheck([mask](const std::vector<Tensor>& in) { return masked_select(in[0], mask.unsqueeze(0)); },
                   {randn({2, 3, 4}, kFloat64).requires_grad_()});
  expect_gradcheck([mask](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, in[1]); },
                   {randn({3, 4}, kFloat64).requires_grad_(), randn({}, kFloat64).requires_grad_()});
}

TEST(EverydayOps, MultinomialFrequenciesAndWithoutReplacement) {
  Generator g;
  g.manual_seed(7);
  const std::vector<double> w = {0.1, 0.0, 0.5, 0.4};
  const Tensor probs = tensor(w, kFloat32) * 3.0;  // unnormalised weights
  const int64_t n = 40000;
  const Tensor draws = multinomial(probs, n, true, &g);
  EXPECT_EQ(draws.sizes(), (Shape{n}));
  std::vector<double> counts(4, 0);
  for (double d : draws.to_vector()) counts[static_cast<size_t>(d)] += 1;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / static_cast<double>(n), w[i], 0.01) << i;
  EXPECT_EQ(counts[1], 0.0);
  // Without replacement: distinct categories, never a zero weight; rows independent.
  const Tensor batch = multinomial(tensor({1, 1, 0, 1, 1, 0, 1, 1}, kFloat64).reshape({2, 4}), 3, false, &g);
  EXPECT_EQ(batch.sizes(), (Shape{2, 3}));
  const auto rows = rows_of(batch);
  for (const auto& r : rows) {
    std::vector<double> sorted = r;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  }
  EXPECT_EQ(std::count(rows[0].begin(), rows[0].end(), 2.0), 0);
  EXPECT_EQ(std::count(rows[1].begin(), rows[1].end(), 1.0), 0);
  // The first draw without replacement follows the weights too.
  std::vector<double> first(4, 0);
  for (int i = 0; i < 4000; ++i) first[static_cast<size_t>(multinomial(probs, 1, false, &g).item())] += 1;
  EXPECT_NEAR(first[2] / 4000.0, 0.5, 0.03);
  g.manual_seed(7);
  EXPECT_EQ(multinomial(probs, n, true, &g).to_vector(), draws.to_vector());
  EXPECT_THROW(multinomial(probs, 4, false, &g), Error);  // only 3 nonzero weights
  EXPECT_THROW(multinomial(tensor({1.0, -1.0}), 1, true, &g), Error);
  EXPECT_THROW(multinomial(zeros({3}), 1, true, &g), Error);
}

TEST(EverydayOps, Uint16AndUint32Tensors) {
  const Tensor a = tensor({1, 40000, 65535}, kUInt16), b = tensor({2, 3, 0}, kUInt16);
  EXPECT_EQ(a.element_size(), 2u);
  EXPECT_EQ((a + b).dtype(), kUInt16);
  EXPECT_EQ((a + b).to_vector(), (std::vector<double>{3, 40003, 65535}));
  EXPECT_EQ((b * b).to_vector(), (std::vector<double>{4, 9, 0}));
  EXPECT_EQ(lt(a, b).to_vector(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(sum(a).item(), 105536.0);
  EXPECT_EQ(sum(a).dtype(), kInt64);
  EXPECT_EQ(amax(a).item(), 65535.0);
  const Tensor c = tensor({4000000000.0, 7.0}, kUInt32);
  EXPECT_EQ(c.element_size(), 4u);
  EXPECT_EQ(c.to(kInt64).to_vector(), (std::vector<double>{4000000000.0, 7.0}));
  EXPECT_EQ(c.to(kFloat64).to_vector(), (std::vector<double>{4000000000.0, 7.0}));
  EXPECT_EQ(argmax(c).item(), 0.0);
  EXPECT_EQ(std::string(dtype_name(kUInt32)), "uint32");
  // Promotion: the smallest type holding both ranges.
  EXPECT_EQ(promote_types(kUInt16, kUInt8), kUInt16);
  EXPECT_EQ(promote_types(kUInt16, kInt8), kInt32);
  EXPECT_EQ(promote_types(kUInt16, kInt32), kInt32);
  EXPECT_EQ(promote_types(kUInt32, kInt32), kInt64);
  EXPECT_EQ(promote_types(kUInt32, kUInt16), kUInt32);
  EXPECT_EQ(promote_types(kUInt32, kBool), kUInt32);
  EXPECT_EQ(promote_types(kUInt16, kBFloat16), kBFloat16);
  EXPECT_EQ((a + tensor({1, 1, 1}, kInt8)).dtype(), kInt32);
  EXPECT_EQ(randint(0, 65536, {8}, kUInt16).dtype(), kUInt16);
}

// Unsigned arithmetic wraps modulo 2^bits (a - b, a - 2, alpha = -1), as in C++ and PyTorch.
void check_unsigned_wraps(Device device) {
  for (DType dt : {kUInt8, kUInt16, kUInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    const double m = std::ldexp(1.0, static_cast<int>(element_size(dt)) * 8);
    const TensorOptions o = TensorOptions(dt).device(device);
    const Tensor a = tensor({5, 1, 7}, o), b = tensor({2, 3, 7}, o);
    EXPECT_EQ((a - b).to_vector(), (std::vector<double>{3, m - 2, 0}));
    EXPECT_EQ((a - 2).to_vector(), (std::vector<double>{3, m - 1, 5}));  // an int keeps the dtype
    EXPECT_EQ((a * -1).to_vector(), (std::vector<double>{m - 5, m - 1, m - 7}));
    EXPECT_EQ((a - 2.0).dtype(), kFloat32);  // a float promotes, as in PyTorch
    EXPECT_EQ((a - 2.0).to_vector(), (std::vector<double>{3, -1, 5}));
    Tensor c = a.clone();
    sub_(c, b, 2.0);
    EXPECT_EQ(c.to_vector(), (std::vector<double>{1, m - 5, m - 7}));
    EXPECT_EQ(clamp(a, -3.0, 6.0).to_vector(), (std::vector<double>{5, 1, 6}));  // bounds saturate
  }
}

TEST(EverydayOps, UnsignedArithmeticWraps) { check_unsigned_wraps(kCPU); }

TEST(EverydayOps, CudaMatchesCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(24);
  const Tensor x = randn({6, 33}, kFloat32).requires_grad_();
  expect_cuda_matches_cpu("var", [](const std::vector<Tensor>& in) { return var(in[0], {1}); }, {x});
  expect_cuda_matches_cpu("norm", [](const std::vector<Tensor>& in) { return norm(in[0], 3.0, {0}); }, {x});
  expect_cuda_matches_cpu("min", [](const std::vector<Tensor>& in) { return min(in[0], 1).first; }, {x});
  expect_cuda_matches_cpu("tril", [](const std::vector<Tensor>& in) { return tril(in[0], 2); }, {x});
  expect_cuda_matches_cpu("topk", [](const std::vector<Tensor>& in) { return topk(in[0], 4, 1).first; }, {x});
  expect_cuda_matches_cpu("einsum", [](const std::vector<Tensor>& in) {
    return einsum("ij,kj->ik", {in[0], in[0]});
  }, {x});
  expect_cuda_matches_cpu("index_by_mask", [](const std::vector<Tensor>& in) {
    return index_by_mask(in[0], gt(in[0].detach(), 0.0));
  }, {x});
  expect_cuda_matches_cpu("masked_fill", [](const std::vector<Tensor>& in) {
    return masked_fill(in[0], lt(in[0].detach(), 0.0), 1.5);
  }, {x});
  const Tensor xc = x.detach().cuda();
  EXPECT_EQ(argmin(xc, 1).cpu().to_vector(), argmin(x.detach(), 1).to_vector());
  EXPECT_EQ(isfinite(xc).cpu().to_vector(), isfinite(x.detach()).to_vector());
  Generator g(Device("cuda:0"));
  g.manual_seed(5);
  Generator h;
  h.manual_seed(5);
  EXPECT_EQ(rand({64}, g, TensorOptions().device(Device("cuda:0"))).cpu().to_vector(), rand({64}, h).to_vector());
  EXPECT_EQ(multinomial(ones({8}).cuda(), 8, false, &g).device(), xc.device());
  check_unsigned_wraps(Device("cuda:0"));
  const Tensor u16 = tensor({1, 2, 65535}, kUInt16).cuda();
  EXPECT_EQ((u16 + u16).cpu().to_vector(), (std::vector<double>{2, 4, 65534}));
  EXPECT_EQ(amax(tensor({3, 4000000000.0}, kUInt32).cuda()).item(), 4000000000.0);
}

}  // namespace
}  // namespace kiln
