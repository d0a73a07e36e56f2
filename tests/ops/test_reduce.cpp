// Reductions: float64 references on fresh random inputs for every dtype, dim set and layout;
// thread-count determinism; gradchecks; CPU-vs-CUDA; error messages.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "kiln/cpu.h"
#include "ops/reduce_ref.h"
#include "support/testing.h"

namespace kiln {
namespace {

using testing::ref_reduce;
using testing::RefKind;
using testing::tolerance;

const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kBFloat16, kFloat16};
const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {1}, {-1}, {0, 2}, {2, 0}, {1, 2}, {0, 1}, {0, 1, 2}};

Tensor apply(RefKind kind, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  switch (kind) {
    case RefKind::Sum: return sum(x, dims, keepdim);
    case RefKind::Mean: return mean(x, dims, keepdim);
    case RefKind::Max: return amax(x, dims, keepdim);
    case RefKind::Min: return amin(x, dims, keepdim);
    case RefKind::LogSumExp: return logsumexp(x, dims, keepdim);
    default: return Tensor();
  }
}

const char* name_of(RefKind kind) {
  switch (kind) {
    case RefKind::Sum: return "sum";
    case RefKind::Mean: return "mean";
    case RefKind::Max: return "amax";
    case RefKind::Min: return "amin";
    case RefKind::LogSumExp: return "logsumexp";
    default: return "?";
  }
}

// Every kind x dtype x dim set x keepdim on a contiguous input and on three strided views.
void check_kind(RefKind kind) {
  manual_seed(1234 + static_cast<int>(kind));
  for (DType dt : kFloatTypes) {
    const Tensor base = randn({6, 7, 9}, dt);
    const Tensor views[] = {
        base,
        randn({9, 7, 6}, dt).permute({2, 1, 0}),         // reversed strides
        randn({6, 14, 9}, dt).slice(1, 0, 14, 2),         // stepped slice
        randn({7, 6, 18}, dt).transpose(0, 1).slice(2, 3, 12),  // transpose + narrow
        randn({6, 1, 9}, dt).expand({6, 7, 9}),          // stride-0 dim
    };
    for (const Tensor& x : views)
      for (const auto& dims : kDimSets)
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(name_of(kind)) + " " + dtype_name(dt) + " dims " + shape_str(dims) +
                       " keepdim " + std::to_string(keepdim) + " strides " + shape_str(x.strides()));
          const Tensor out = apply(kind, x, dims, keepdim);
          EXPECT_EQ(out.dtype(), dt);
          EXPECT_CLOSE(out, ref_reduce(kind, x, dims, keepdim), tolerance(dt));
        }
  }
}

TEST(Reduce, SumMatchesReference) { check_kind(RefKind::Sum); }
TEST(Reduce, MeanMatchesReference) { check_kind(RefKind::Mean); }
TEST(Reduce, AmaxMatchesReference) { check_kind(RefKind::Max); }
TEST(Reduce, AminMatchesReference) { check_kind(RefKind::Min); }
TEST(Reduce, LogsumexpMatchesReference) { check_kind(RefKind::LogSumExp); }

TEST(Reduce, LargeReductionsUseChunksCorrectly) {
  manual_seed(7);
  // Full reduction over several chunks with a ragged tail; column reduction with r > chunk.
  const Tensor a = randn({1000003});
  EXPECT_CLOSE(sum(a), ref_reduce(RefKind::Sum, a, {}, false), 1e-5);
  EXPECT_CLOSE(amax(a), ref_reduce(RefKind::Max, a, {}, false), 0);
  EXPECT_CLOSE(logsumexp(a, {0}), ref_reduce(RefKind::LogSumExp, a, {0}, false), 1e-6);
  const Tensor b = randn({40000, 3}, kBFloat16);
  EXPECT_CLOSE(sum(b, {0}), ref_reduce(RefKind::Sum, b, {0}, false), tolerance(kBFloat16));
  EXPECT_CLOSE(amin(b, {0}), ref_reduce(RefKind::Min, b, {0}, false), 0);
  const auto mv = max(b, 0);
  EXPECT_EQ(mv.second.to_vector(), ref_reduce(RefKind::ArgMax, b, {0}, false).to_vector());
  const Tensor c = randn({3, 50000}).t();  // [50000, 3] with the reduced dim strided
  EXPECT_CLOSE(mean(c, {0}), ref_reduce(RefKind::Mean, c, {0}, false), 1e-5);
}

TEST(Reduce, PeakedLogsumexpIsStable) {
  manual_seed(11);
  for (DType dt : kFloatTypes) {
    const Tensor x = (randn({8, 300}, kFloat64) * 30.0).to(dt);
    EXPECT_CLOSE(logsumexp(x, {1}), ref_reduce(RefKind::LogSumExp, x, {1}, false), tolerance(dt));
    EXPECT_CLOSE(logsumexp(x, {0}, true), ref_reduce(RefKind::LogSumExp, x, {0}, true), tolerance(dt));
  }
  // Values that overflow exp in any dtype.
  const Tensor big = tensor({1000, 1000, -1000}, kFloat32);
  EXPECT_NEAR(logsumexp(big, {0}).item(), 1000 + std::log(2.0), 1e-3);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(logsumexp(tensor({-inf, -inf}), {0}).item(), -inf);
  EXPECT_EQ(logsumexp(tensor({1.0, inf}), {0}).item(), inf);
}

TEST(Reduce, NanPropagates) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kFloatTypes) {
    Tensor x = randn({3, 37}, dt);
    x.select(0, 1).select(0, 20).fill_(nan);
    const std::vector<double> mx = amax(x, {1}).to_vector(), mn = amin(x, {1}).to_vector();
    EXPECT_FALSE(std::isnan(mx[0]));
    EXPECT_TRUE(std::isnan(mx[1]));
    EXPECT_TRUE(std::isnan(mn[1]));
    EXPECT_TRUE(std::isnan(sum(x, {1}).to_vector()[1]));
    EXPECT_EQ(argmax(x, 1).to_vector()[1], 20);
  }
}

TEST(Reduce, MaxDimAndArgmaxGiveFirstMaximum) {
  manual_seed(3);
  for (DType dt : {kFloat32, kBFloat16, kFloat64, kInt64, kInt32}) {
    // Small integers: many ties, so "first maximum" is exercised.
    const Tensor x = randint(-3, 4, {5, 6, 7}, dt);
    for (int64_t d : {0, 1, 2, -1})
      for (bool keepdim : {false, true}) {
        const auto [values, indices] = max(x, d, keepdim);
        EXPECT_EQ(values.dtype(), dt);
        EXPECT_EQ(indices.dtype(), kInt64);
        EXPECT_EQ(values.to_vector(), ref_reduce(RefKind::Max, x, {d}, keepdim).to_vector());
        EXPECT_EQ(indices.to_vector(), ref_reduce(RefKind::ArgMax, x, {d}, keepdim).to_vector());
        EXPECT_EQ(argmax(x, d, keepdim).to_vector(), indices.to_vector());
      }
    const Tensor xt = x.transpose(0, 2);
    EXPECT_EQ(argmax(xt, 1).to_vector(), ref_reduce(RefKind::ArgMax, xt, {1}, false).to_vector());
    EXPECT_EQ(argmax(xt).item(), ref_reduce(RefKind::ArgMax, xt.contiguous().reshape({-1}), {}, false).item());
    EXPECT_EQ(max(x).item(), ref_reduce(RefKind::Max, x, {}, false).item());
  }
  const Tensor k = argmax(randn({2, 3}), std::nullopt, true);
  EXPECT_EQ(k.sizes(), (Shape{1, 1}));
}

TEST(Reduce, IntegerInputs) {
  const Tensor x = randint(-100, 100, {4, 9}, kInt32);
  const Tensor s = sum(x, {1});
  EXPECT_EQ(s.dtype(), kInt64);
  EXPECT_EQ(s.to_vector(), ref_reduce(RefKind::Sum, x, {1}, false).to_vector());
  EXPECT_EQ(amax(x, {0}).dtype(), kInt32);
  EXPECT_EQ(amax(x, {0}).to_vector(), ref_reduce(RefKind::Max, x, {0}, false).to_vector());
  EXPECT_EQ(amin(x).to_vector(), ref_reduce(RefKind::Min, x, {}, false).to_vector());
  const Tensor b = randint(0, 2, {50}, kBool);
  EXPECT_EQ(sum(b).dtype(), kInt64);
}

TEST(Reduce, EmptyAndScalarCases) {
  const Tensor e = randn({3, 0, 4});
  EXPECT_EQ(sum(e, {1}).sizes(), (Shape{3, 4}));
  for (double v : sum(e, {1}).to_vector()) EXPECT_EQ(v, 0.0);
  for (double v : mean(e, {1}).to_vector()) EXPECT_TRUE(std::isnan(v));
  for (double v : logsumexp(e, {1}).to_vector()) EXPECT_EQ(v, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(sum(e, {0}).sizes(), (Shape{0, 4}));
  EXPECT_EQ(amax(e, {0}).numel(), 0);
  const Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(sum(s).item(), 2.5);
  EXPECT_EQ(amax(s).item(), 2.5);
  EXPECT_EQ(argmax(s).item(), 0);
  EXPECT_EQ(max(s, 0).second.item(), 0);
  // The empty dims list means "all dims".
  const Tensor x = randn({3, 4});
  EXPECT_EQ(sum(x, {}, true).sizes(), (Shape{1, 1}));
  EXPECT_CLOSE(sum(x, {}), ref_reduce(RefKind::Sum, x, {}, false), 1e-6);
}

void expect_error(const std::function<void()>& f, const std::string& op) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error from " << op;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[" + op + "]"), std::string::npos) << e.what();
  }
}

TEST(Reduce, Errors) {
  const Tensor x = randn({2, 3, 4});
  expect_error([&] { sum(x, {3}); }, "sum");
  expect_error([&] { mean(x, {-4}); }, "mean");
  expect_error([&] { amax(x, {1, -2}); }, "amax");
  expect_error([&] { logsumexp(x, {5}); }, "logsumexp");
  expect_error([&] { max(x, 3); }, "max");
  expect_error([&] { argmax(x, -4); }, "argmax");
  expect_error([&] { argmax(randn({0, 3})); }, "argmax");
  expect_error([&] { argmax(randn({0, 3}), 0); }, "argmax");
  expect_error([&] { max(randn({0})); }, "max");
  expect_error([&] { amax(randn({2, 0}), {1}); }, "amax");
  expect_error([&] { mean(randint(0, 3, {4})); }, "mean");
  expect_error([&] { logsumexp(randint(0, 3, {4}), {0}); }, "logsumexp");
  expect_error([&] { sum_to_size(x, {5, 4}); }, "sum_to_size");
  expect_error([&] { sum_to_size(x, {1, 2, 3, 4}); }, "sum_to_size");
}

TEST(Reduce, SumToSize) {
  const Tensor x = randn({4, 3, 5}, kFloat64);
  for (const Shape& target : {Shape{3, 5}, Shape{3, 1}, Shape{1, 5}, Shape{4, 1, 5}, Shape{1}, Shape{}, Shape{4, 3, 5}}) {
    const Tensor r = sum_to_size(x, target);
    EXPECT_EQ(r.sizes(), target);
    // Reference: broadcast target back and sum the matching elements.
    std::vector<int64_t> dims;
    const int64_t lead = x.dim() - static_cast<int64_t>(target.size());
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d < lead || (target[d - lead] == 1 && x.size(d) != 1)) dims.push_back(d);
    if (dims.empty()) continue;
    EXPECT_CLOSE(r, ref_reduce(RefKind::Sum, x, dims, true).reshape(target), 1e-12);
  }
}

// Bitwise identical results for 1, 2 and 3 threads. The SIMD sums keep per-lane partials, so
// their order (and the last bits) depends on the vector width: bitwise determinism holds at one
// width (one Highway target); every width stays within tolerance of the float64 references.
TEST(Reduce, DeterministicAcrossThreadCounts) {
  SCOPED_TRACE("Highway target " + cpu_simd_info().target);
  manual_seed(99);
  const Tensor big = randn({2100000});
  const Tensor col = randn({60000, 7}, kBFloat16);
  const Tensor rows = randn({5, 70001});
  auto run = [&] {
    std::vector<std::vector<uint8_t>> r;
    r.push_back(testing::bytes_of(sum(big)));
    r.push_back(testing::bytes_of(mean(big, {0})));
    r.push_back(testing::bytes_of(logsumexp(big, {0})));
    r.push_back(testing::bytes_of(sum(col, {0})));
    r.push_back(testing::bytes_of(logsumexp(col, {0})));
    r.push_back(testing::bytes_of(sum(rows, {1})));
    r.push_back(testing::bytes_of(max(rows, 1).second));
    r.push_back(testing::bytes_of(sum(rows.t(), {0})));
    return r;
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  omp_set_num_threads(2);
  const auto two = run();
  omp_set_num_threads(3);
  const auto three = run();
  omp_set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i], two[i]) << "result " << i << " differs between 1 and 2 threads";
    EXPECT_EQ(one[i], three[i]) << "result " << i << " differs between 1 and 3 threads";
  }
}

// ---- gradients ----

Tensor leaf(const Shape& s) { return randn(s, kFloat64).requires_grad_(); }

TEST(ReduceGrad, SumMean) {
  manual_seed(5);
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}})
    for (bool keepdim : {false, true}) {
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return sum(in[0], dims, keepdim); }, {leaf({3, 4, 5})});
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return mean(in[0], dims, keepdim); }, {leaf({3, 4, 5})});
    }
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return sum_to_size(in[0], {4, 1}); }, {leaf({3, 4, 5})});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return sum(in[0].t(), {1}); }, {leaf({4, 5})});
}

TEST(ReduceGrad, AmaxAminLogsumexpMax) {
  manual_seed(6);
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}})
    for (bool keepdim : {false, true}) {
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return amax(in[0], dims, keepdim); }, {leaf({3, 4, 5})});
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return amin(in[0], dims, keepdim); }, {leaf({3, 4, 5})});
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return logsumexp(in[0], dims, keepdim); },
                                {leaf({3, 4, 5})});
    }
  for (int64_t d : {0, 1, -1})
    for (bool keepdim : {false, true})
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return max(in[0], d, keepdim).first; },
                                {leaf({3, 4, 5})});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return max(in[0]); }, {leaf({3, 4})});
}

TEST(ReduceGrad, TiesSplitEvenly) {
  for (DType dt : kFloatTypes) {
    Tensor x = tensor({1, 3, 3, 2, 3, -1}, dt).reshape({2, 3}).requires_grad_();
    amax(x).backward();
    EXPECT_CLOSE(x.grad(), tensor({0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0}, kFloat64).reshape({2, 3}), tolerance(dt));
    Tensor y = tensor({1, 3, 3, 2, 3, -1}, dt).reshape({2, 3}).requires_grad_();
    amax(y, {1}).backward(ones({2}, dt));
    EXPECT_EQ(y.grad().to_vector(), (std::vector<double>{0, 0.5, 0.5, 0, 1, 0}));
    Tensor z = tensor({1, 3, 3, 2, 3, -1}, dt).reshape({2, 3}).requires_grad_();
    max(z, 1).first.backward(ones({2}, dt));  // max(dim): the first maximum takes it all
    EXPECT_EQ(z.grad().to_vector(), (std::vector<double>{0, 1, 0, 0, 1, 0}));
  }
}

TEST(ReduceGrad, LowPrecisionBackwardMatchesReference) {
  manual_seed(8);
  for (DType dt : {kBFloat16, kFloat16, kFloat32}) {
    const Tensor x0 = randn({6, 33}, dt);
    const Tensor g = randn({6}, dt);
    Tensor x = x0.detach().clone().requires_grad_();
    logsumexp(x, {1}).backward(g);
    // d lse / dx = softmax(x) * g
    const Tensor sm = testing::ref_softmax(x0, 1, false);
    std::vector<double> ref = sm.to_vector();
    const std::vector<double> gv = g.to_vector();
    for (size_t i = 0; i < ref.size(); ++i) ref[i] *= gv[i / 33];
    EXPECT_CLOSE(x.grad(), tensor(ref, kFloat64).reshape({6, 33}), tolerance(dt));
    Tensor xm = x0.detach().clone().requires_grad_();
    mean(xm, {0}).backward(ones({33}, dt));
    for (double v : xm.grad().to_vector()) EXPECT_NEAR(v, 1.0 / 6, 1e-3);
  }
}

// ---- CUDA ----

TEST(ReduceCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(21);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<Tensor> inputs[] = {
        {randn({6, 7, 9}, dt).requires_grad_()},
        {randn({37, 1000}, dt).requires_grad_()},      // row kernel, ragged vectors
        {randn({3, 70000}, dt).requires_grad_()},      // row kernel, chunked
        {randn({20000, 3}, dt).requires_grad_()},      // column kernel, chunked
    };
    for (const auto& in : inputs)
      for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}})
        for (bool keepdim : {false, true}) {
          using testing::expect_cuda_matches_cpu;
          // Two fp32 summation orders over 2e5 random values differ by ~n*eps*|x|/|sum| ~ 2e-5
          // relative (measured 1.5e-5 on the H200): each backend is within that of the truth.
          const double sum_tol = dt == kFloat32 ? 1e-4 : -1;
          expect_cuda_matches_cpu("sum", [&](const std::vector<Tensor>& t) { return sum(t[0], dims, keepdim); }, in,
                                  sum_tol);
          expect_cuda_matches_cpu("mean", [&](const std::vector<Tensor>& t) { return mean(t[0], dims, keepdim); }, in,
                                  sum_tol);
          expect_cuda_matches_cpu("amax", [&](const std::vector<Tensor>& t) { return amax(t[0], dims, keepdim); }, in);
          expect_cuda_matches_cpu("amin", [&](const std::vector<Tensor>& t) { return amin(t[0], dims, keepdim); }, in);
          expect_cuda_matches_cpu("logsumexp",
                                  [&](const std::vector<Tensor>& t) { return logsumexp(t[0], dims, keepdim); }, in);
        }
    for (const auto& in : inputs)
      for (int64_t d : {0, -1}) {
        using testing::expect_cuda_matches_cpu;
        expect_cuda_matches_cpu("max.values", [&](const std::vector<Tensor>& t) { return max(t[0], d).first; }, in);
        expect_cuda_matches_cpu("max.indices", [&](const std::vector<Tensor>& t) { return max(t[0], d, true).second; }, in);
        expect_cuda_matches_cpu("argmax", [&](const std::vector<Tensor>& t) { return argmax(t[0], d); }, in);
      }
    testing::expect_cuda_matches_cpu("max()", [](const std::vector<Tensor>& t) { return max(t[0]); },
                                     {randn({301, 7}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("argmax()", [](const std::vector<Tensor>& t) { return argmax(t[0]); },
                                     {randn({301, 7}, dt)});
    testing::expect_cuda_matches_cpu("sum strided", [](const std::vector<Tensor>& t) { return sum(t[0].t(), {1}); },
                                     {randn({50, 33}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("sum (R)(K)(R)", [](const std::vector<Tensor>& t) { return sum(t[0], {0, 2}); },
                                     {randn({5, 6, 7}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("sum_to_size", [](const std::vector<Tensor>& t) { return sum_to_size(t[0], {6, 1}); },
                                     {randn({4, 6, 9}, dt).requires_grad_()});
  }
  // Ties and integer dtypes: indices must agree exactly.
  const Tensor ti = randint(-2, 3, {64, 129}, kInt32);
  testing::expect_cuda_matches_cpu("argmax int", [](const std::vector<Tensor>& t) { return argmax(t[0], 1); }, {ti});
  testing::expect_cuda_matches_cpu("sum int", [](const std::vector<Tensor>& t) { return sum(t[0], {0}); }, {ti});
  testing::expect_cuda_matches_cpu("amax int", [](const std::vector<Tensor>& t) { return amax(t[0], {1}); }, {ti});
  const Tensor tf = randint(-2, 3, {64, 129}, kFloat32).requires_grad_();
  testing::expect_cuda_matches_cpu("amax ties", [](const std::vector<Tensor>& t) { return amax(t[0], {1}); }, {tf});
  testing::expect_cuda_matches_cpu("argmax ties", [](const std::vector<Tensor>& t) { return argmax(t[0], 0); }, {tf});
}

TEST(ReduceCuda, DeterministicRunToRun) {
  KILN_REQUIRE_CUDA();
  manual_seed(22);
  const Tensor x = randn({3000000}, TensorOptions(kFloat32).device(Device("cuda")));
  const Tensor c = randn({100000, 5}, TensorOptions(kBFloat16).device(Device("cuda")));
  EXPECT_EQ(testing::bytes_of(sum(x)), testing::bytes_of(sum(x)));
  EXPECT_EQ(testing::bytes_of(logsumexp(x, {0})), testing::bytes_of(logsumexp(x, {0})));
  EXPECT_EQ(testing::bytes_of(sum(c, {0})), testing::bytes_of(sum(c, {0})));
  EXPECT_CLOSE(sum(x).cpu(), ref_reduce(RefKind::Sum, x.cpu(), {}, false), 1e-5);
  EXPECT_CLOSE(sum(c, {0}).cpu(), ref_reduce(RefKind::Sum, c.cpu(), {0}, false), tolerance(kBFloat16));
}

}  // namespace
}  // namespace kiln
