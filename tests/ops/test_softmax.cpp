// softmax / log_softmax: float64 references (random and peaked inputs, -inf masks), every dim
// and layout, thread-count determinism, fused backward vs gradcheck, CPU-vs-CUDA, errors.
#include <omp.h>

#include <cmath>
#include <limits>

#include "kiln/cpu.h"
#include "ops/reduce_ref.h"
#include "support/testing.h"

namespace kiln {
namespace {

using testing::ref_softmax;
using testing::tolerance;

const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kBFloat16, kFloat16};

Tensor sm(const Tensor& x, int64_t dim, bool log) { return log ? log_softmax(x, dim) : softmax(x, dim); }

TEST(Softmax, MatchesReference) {
  manual_seed(31);
  for (DType dt : kFloatTypes)
    for (bool log : {false, true}) {
      const Tensor inputs[] = {
          randn({4, 6, 33}, dt),
          randn({3, 2500}, dt),                       // long rows: SIMD body + tail
          randn({5, 7}, dt).t(),                      // non-contiguous
          (randn({6, 129}, kFloat64) * 30.0).to(dt),  // peaked
          randn({17}, dt),
      };
      for (const Tensor& x : inputs)
        for (int64_t d = -x.dim(); d < x.dim(); ++d) {
          SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + dtype_name(dt) + " " + shape_str(x.sizes()) +
                       " dim " + std::to_string(d));
          const Tensor y = sm(x, d, log);
          EXPECT_EQ(y.dtype(), dt);
          EXPECT_EQ(y.sizes(), x.sizes());
          EXPECT_CLOSE(y, ref_softmax(x, d, log), tolerance(dt));
        }
    }
}

TEST(Softmax, ExtremeInputs) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : kFloatTypes) {
    // -inf entries (attention masks) get probability 0 and log-probability -inf.
    const Tensor x = tensor({1, -inf, 2, -inf, 0.5, 3, 1e4, -1e4}, dt).reshape({2, 4});
    const std::vector<double> p = softmax(x, 1).to_vector();
    EXPECT_EQ(p[1], 0.0);
    EXPECT_EQ(p[3], 0.0);
    EXPECT_NEAR(p[0] + p[2], 1.0, 1e-2);
    EXPECT_EQ(log_softmax(x, 1).to_vector()[1], -inf);
    EXPECT_NEAR(p[6], 1.0, 1e-6);  // a 1e4 spike takes everything, nothing overflows
    EXPECT_EQ(p[7], 0.0);
    // Scalars and single-element dims.
    EXPECT_EQ(softmax(scalar_tensor(3.0, dt), 0).item(), 1.0);
    EXPECT_EQ(log_softmax(randn({4, 1}, dt), 1).to_vector(), std::vector<double>(4, 0.0));
  }
  EXPECT_EQ(softmax(randn({0, 5}), 1).numel(), 0);
}

// The row sums of exp run in vector lanes: bitwise identical across threads at one vector width,
// not across widths (SVE 128 vs 512 bits sum in another order; each is checked against float64).
TEST(Softmax, DeterministicAcrossThreadCounts) {
  SCOPED_TRACE("Highway target " + cpu_simd_info().target);
  manual_seed(32);
  const Tensor rows = randn({300, 517}, kBFloat16);
  const Tensor cols = randn({64, 40, 70});
  auto run = [&] {
    return std::vector<std::vector<uint8_t>>{testing::bytes_of(softmax(rows, 1)), testing::bytes_of(log_softmax(cols, 1)),
                                             testing::bytes_of(softmax(cols, 0))};
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = run();
  omp_set_num_threads(3);
  const auto b = run();
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
}

TEST(Softmax, Gradcheck) {
  manual_seed(33);
  for (bool log : {false, true})
    for (int64_t d : {0, 1, 2, -1})
      testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return sm(in[0], d, log); },
                                {randn({3, 4, 5}, kFloat64).requires_grad_()});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0].t(), 1); },
                            {randn({6, 5}, kFloat64).requires_grad_()});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); },
                            {(randn({40}, kFloat64) * 10.0).requires_grad_()});
}

// The fused backward in 16-bit dtypes against the float64 formulas.
TEST(Softmax, LowPrecisionBackward) {
  manual_seed(34);
  for (DType dt : {kBFloat16, kFloat16, kFloat32})
    for (bool log : {false, true})
      for (int64_t d : {0, 1}) {
        const Tensor x0 = randn({7, 300}, dt), g = randn({7, 300}, dt);
        Tensor x = x0.detach().clone().requires_grad_();
        sm(x, d, log).backward(g);
        const std::vector<double> y = ref_softmax(x0, d, false).to_vector(), gv = g.to_vector();
        std::vector<double> ref(y.size());
        for (const auto& grp : testing::reduce_groups(x0.sizes(), {d})) {
          double s = 0;
          for (int64_t i : grp) s += log ? gv[i] : gv[i] * y[i];
          for (int64_t i : grp) ref[i] = log ? gv[i] - y[i] * s : y[i] * (gv[i] - s);
        }
        EXPECT_CLOSE(x.grad(), tensor(ref, kFloat64).reshape(x0.sizes()), 2 * tolerance(dt));
      }
}

void expect_error(const std::function<void()>& f, const std::string& op) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error from " << op;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[" + op + "]"), std::string::npos) << e.what();
  }
}

TEST(Softmax, Errors) {
  expect_error([] { softmax(randint(0, 5, {3, 4}), 1); }, "softmax");
  expect_error([] { log_softmax(randint(0, 5, {3, 4}, kInt32), 0); }, "log_softmax");
  expect_error([] { softmax(randn({3, 4}), 2); }, "softmax");
  expect_error([] { log_softmax(randn({3, 4}), -3); }, "log_softmax");
}

TEST(SoftmaxCuda, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  manual_seed(35);
  for (DType dt : kFloatTypes)
    for (bool log : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (log ? " log_softmax" : " softmax"));
      // Rows for each CUDA path: warp per row (64, 33), registers with 1-8 vectors a thread
      // (1000, 999, 4096, 4097, 8192, 3000 = 375 vectors; 3001 rows of 1024: many blocks), a
      // block per row re-reading (20000).
      const Shape shapes[] = {{8, 64},   {5, 1000},  {3, 4097},    {2, 3, 999}, {4, 6, 33},
                              {64, 8192}, {7, 4096}, {3001, 1024}, {3, 20000}, {9, 3000}};
      for (const Shape& s : shapes)
        for (int64_t d : {0, -1}) {
          testing::expect_cuda_matches_cpu(log ? "log_softmax" : "softmax",
                                           [&](const std::vector<Tensor>& t) { return sm(t[0], d, log); },
                                           {randn(s, dt).requires_grad_()});
        }
      testing::expect_cuda_matches_cpu("peaked", [&](const std::vector<Tensor>& t) { return sm(t[0], -1, log); },
                                       {(randn({16, 300}, kFloat64) * 30.0).to(dt).requires_grad_()});
      testing::expect_cuda_matches_cpu("transposed", [&](const std::vector<Tensor>& t) { return sm(t[0].t(), 1, log); },
                                       {randn({70, 9}, dt).requires_grad_()});
    }
}

}  // namespace
}  // namespace kiln
