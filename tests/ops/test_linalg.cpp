// mm, bmm, matmul, linear and the raw gemm entry points against float64 triple-loop references.
#include <cblas.h>
#include <omp.h>

#include <cmath>

#include "kiln/autocast.h"
#include "ops/cpu/gemm.h"
#include "support/testing.h"
#ifdef KILN_WITH_CUDA
#include "ops/cuda/gemm.h"
#endif

namespace kiln {
namespace {

using testing::rel_error;
using testing::tolerance;

const DType kAllFloats[] = {kFloat32, kFloat64, kBFloat16, kFloat16};

// float64 reference: a [B, M, K] @ b [B, K, N] -> [B, M, N], plain loops over the values.
Tensor ref_bmm(const Tensor& a, const Tensor& b) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  std::vector<double> out(static_cast<size_t>(B * M * N), 0.0);
  for (int64_t p = 0; p < B; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[(p * M + i) * K + k] * bv[(p * K + k) * N + j];
        out[(p * M + i) * N + j] = s;
      }
  return tensor(out, kFloat64).reshape({B, M, N});
}

Tensor ref_mm(const Tensor& a, const Tensor& b) { return ref_bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0); }

// torch.matmul semantics built from views + ref_bmm (independent of kiln::matmul).
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const Tensor a3 = a.dim() == 1 ? a.unsqueeze(0) : a, b3 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const Shape ba(a3.sizes().begin(), a3.sizes().end() - 2), bb(b3.sizes().begin(), b3.sizes().end() - 2);
  const Shape batch = broadcast_shapes(ba, bb);
  const int64_t m = a3.size(-2), k = a3.size(-1), n = b3.size(-1);
  Shape ea = batch, eb = batch, os = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  os.insert(os.end(), {m, n});
  const int64_t nb = shape_numel(batch);
  Tensor out = ref_bmm(a3.expand(ea).reshape({nb, m, k}), b3.expand(eb).reshape({nb, k, n})).reshape(os);
  if (a.dim() == 1) out = out.squeeze(-2);
  if (b.dim() == 1) out = out.squeeze(-1);
  return out;
}

Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  NoGradGuard no_grad;
  Tensor out = ref_matmul(x, w.t());
  if (bias.defined()) out = out + bias.to(kFloat64);
  return out;
}

template <typename F>
void expect_throws_naming(F&& f, const std::string& op, const std::vector<std::string>& parts = {}) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error naming [" << op << "]";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[" + op + "]"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  }
}

TEST(Linalg, MmAllDtypes) {
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = randn({37, 256}, dt), b = randn({256, 53}, dt);
    const Tensor out = mm(a, b);
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.sizes(), (Shape{37, 53}));
    EXPECT_CLOSE(out, ref_mm(a, b), tolerance(dt));
  }
}

TEST(Linalg, MmTransposedAndSlicedOperands) {
  for (DType dt : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor at = randn({64, 40}, dt).t();                       // column-major [40, 64]
    const Tensor bs = randn({64, 90}, dt).slice(1, 5, 85);           // row stride 90 > 80
    const Tensor as = randn({80, 64}, dt).slice(0, 0, 80, 2);        // every other row
    const Tensor bstep = randn({64, 160}, dt).slice(1, 0, 160, 2);   // column stride 2: copied
    const Tensor bt = randn({30, 70}, dt).slice(1, 3, 67).t();       // transposed slice, ld 70
    EXPECT_CLOSE(mm(at, bs), ref_mm(at, bs), tolerance(dt));
    EXPECT_CLOSE(mm(as, bstep), ref_mm(as, bstep), tolerance(dt));
    EXPECT_CLOSE(mm(at, bt), ref_mm(at, bt), tolerance(dt));
    EXPECT_CLOSE(mm(at.t().t(), bs), ref_mm(at, bs), tolerance(dt));
  }
}

TEST(Linalg, TransposedOperandsAreNotCopied) {
  // The peak over the call is the output alone: transposes and row slices go to BLAS as flags/ld.
  const Tensor at = randn({64, 40}).t(), bt = randn({30, 70}).slice(1, 3, 67).t();
  const int64_t base = memory_allocated(kCPU);
  reset_peak_memory_stats(kCPU);
  const Tensor out = mm(at, bt);
  EXPECT_EQ(max_memory_allocated(kCPU) - base, static_cast<int64_t>(out.nbytes()));
}

TEST(Linalg, MmVectorsAndSingleRows) {
  const Tensor row = randn({1, 33}), col = randn({33, 1}), mat = randn({33, 7});
  EXPECT_CLOSE(mm(row, col), ref_mm(row, col), 1e-5);
  EXPECT_CLOSE(mm(col, row), ref_mm(col, row), 1e-5);
  EXPECT_CLOSE(mm(row, mat), ref_mm(row, mat), 1e-5);
  const Tensor r2 = randn({5, 33}).slice(0, 2, 3);  // one row of a bigger matrix
  EXPECT_CLOSE(mm(r2, mat), ref_mm(r2, mat), 1e-5);
}

TEST(Linalg, BmmAllDtypesAndLayouts) {
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = randn({3, 17, 64}, dt), b = randn({3, 64, 9}, dt);
    EXPECT_CLOSE(bmm(a, b), ref_bmm(a, b), tolerance(dt));
    const Tensor bt = randn({3, 9, 64}, dt).transpose(1, 2);
    EXPECT_CLOSE(bmm(a, bt), ref_bmm(a, bt), tolerance(dt));
    const Tensor be = randn({1, 64, 9}, dt).expand({3, 64, 9});  // batch stride 0
    EXPECT_CLOSE(bmm(a, be), ref_bmm(a, be), tolerance(dt));
    const Tensor ap = randn({17, 3, 64}, dt).transpose(0, 1);    // batch stride 64, row stride 192
    EXPECT_CLOSE(bmm(ap, b), ref_bmm(ap, b), tolerance(dt));
  }
}

TEST(Linalg, MatmulOneDimensionalCases) {
  const Tensor v = randn({12}), w = randn({12}), m = randn({5, 12}), mt = randn({12, 4});
  const Tensor b3 = randn({3, 5, 12}), c3 = randn({3, 12, 4});
  const std::vector<std::pair<Tensor, Tensor>> cases = {{v, w}, {m, v}, {v, mt}, {m, mt}, {b3, v},
                                                        {v, c3}, {b3, mt}, {m, c3}, {b3, c3}};
  for (const auto& [x, y] : cases) {
    SCOPED_TRACE(shape_str(x.sizes()) + " @ " + shape_str(y.sizes()));
    const Tensor out = matmul(x, y), ref = ref_matmul(x, y);
    EXPECT_EQ(out.sizes(), ref.sizes());
    EXPECT_CLOSE(out, ref, 1e-5);
  }
  EXPECT_EQ(matmul(v, w).dim(), 0);
}

TEST(Linalg, MatmulBroadcastBatches) {
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = randn({2, 1, 3, 4}, dt), b = randn({5, 4, 6}, dt);
    const Tensor out = matmul(a, b);
    EXPECT_EQ(out.sizes(), (Shape{2, 5, 3, 6}));
    EXPECT_CLOSE(out, ref_matmul(a, b), tolerance(dt));
    const Tensor c = randn({7, 1, 4, 3}, dt).transpose(-2, -1), d = randn({2, 4, 5}, dt);  // [7,1,3,4] @ [2,4,5]
    EXPECT_EQ(matmul(c, d).sizes(), (Shape{7, 2, 3, 5}));
    EXPECT_CLOSE(matmul(c, d), ref_matmul(c, d), tolerance(dt));
  }
}

TEST(Linalg, EmptyDims) {
  const Tensor a = randn({3, 0}), b = randn({0, 4});
  const Tensor out = mm(a, b);
  EXPECT_EQ(out.sizes(), (Shape{3, 4}));
  for (double v : out.to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(mm(randn({0, 5}), randn({5, 4})).sizes(), (Shape{0, 4}));
  EXPECT_EQ(bmm(randn({0, 2, 3}), randn({0, 3, 4})).sizes(), (Shape{0, 2, 4}));
  EXPECT_EQ(matmul(randn({0}), randn({0})).item(), 0.0);
  for (DType dt : kAllFloats) {  // linear with no input features: the bias alone
    const Tensor bias = randn({6}, dt);
    const Tensor y = linear(randn({2, 3, 0}, dt), randn({6, 0}, dt), bias);
    EXPECT_EQ(y.sizes(), (Shape{2, 3, 6}));
    EXPECT_CLOSE(y, bias.expand({2, 3, 6}).to(kFloat64), 0.0);
  }
  // Gradients of an empty-K product are empty tensors of the right shape.
  Tensor x = randn({3, 0}).requires_grad_(), y = randn({0, 4}).requires_grad_();
  mm(x, y).backward(randn({3, 4}));
  EXPECT_EQ(x.grad().sizes(), (Shape{3, 0}));
  EXPECT_EQ(y.grad().sizes(), (Shape{0, 4}));
}

TEST(Linalg, LinearAllDtypes) {
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = randn({2, 5, 96}, dt), w = randn({24, 96}, dt), bias = randn({24}, dt);
    const Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.sizes(), (Shape{2, 5, 24}));
    EXPECT_CLOSE(y, ref_linear(x, w, bias), tolerance(dt));
    EXPECT_CLOSE(linear(x, w), ref_linear(x, w, Tensor()), tolerance(dt));
    const Tensor v = randn({96}, dt);
    EXPECT_EQ(linear(v, w, bias).sizes(), (Shape{24}));
    EXPECT_CLOSE(linear(v, w, bias), ref_linear(v, w, bias), tolerance(dt));
    const Tensor xt = randn({96, 7}, dt).t();  // transposed input
    EXPECT_CLOSE(linear(xt, w, bias), ref_linear(xt, w, bias), tolerance(dt));
  }
}

TEST(Linalg, Bf16LongReductionError) {
  // K = 256 in bf16 with fp32 accumulation: the error is the output rounding, ~1e-3 relative.
  const Tensor a = randn({64, 256}, kBFloat16), b = randn({256, 64}, kBFloat16);
  const double err = rel_error(mm(a, b), ref_mm(a, b));
  EXPECT_GT(err, 1e-4);
  EXPECT_LT(err, 1e-2);
}

TEST(Linalg, Deterministic) {
  const Tensor a = randn({3, 70, 130}), b = randn({3, 130, 90});
  EXPECT_EQ(bmm(a, b).to_vector(), bmm(a, b).to_vector());
  const Tensor x = randn({200, 300}), w = randn({100, 300}), bias = randn({100});
  EXPECT_EQ(linear(x, w, bias).to_vector(), linear(x, w, bias).to_vector());
}

TEST(Linalg, CpuResultsIndependentOfThreadCount) {
  // C is cut into fixed tiles over OpenMP threads, each a single-threaded OpenBLAS call; OpenBLAS's
  // own threading (which changes the bits) is switched back off even if someone turned it on.
  const Tensor a = randn({8, 40, 60}), b = randn({8, 60, 50});
  const Tensor x = randn({300, 280}), w = randn({280, 1100});
  const int omp_before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<double> small1 = bmm(a, b).to_vector(), big1 = mm(x, w).to_vector();
  omp_set_num_threads(std::max(3, omp_before));
  openblas_set_num_threads(2);
  const std::vector<double> small2 = bmm(a, b).to_vector(), big2 = mm(x, w).to_vector();
  EXPECT_EQ(openblas_get_num_threads(), 1);
  omp_set_num_threads(omp_before);
  EXPECT_EQ(small1, small2);
  EXPECT_EQ(big1, big2);
}

// ---- gradients (float64 finite differences) ----

Tensor f64(const Shape& s) { return randn(s, kFloat64).requires_grad_(); }

TEST(LinalgGrad, Mm) {
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return mm(in[0], in[1]); }, {f64({3, 4}), f64({4, 5})});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return mm(in[0].t(), in[1].t()); },
                            {f64({4, 3}), f64({5, 4})});
}

TEST(LinalgGrad, Bmm) {
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); },
                            {f64({2, 3, 4}), f64({2, 4, 3})});
  testing::expect_gradcheck([](const std::vector<Tensor>& in) { return bmm(in[0], in[1].expand({3, 4, 2})); },
                            {f64({3, 2, 4}), f64({1, 4, 2})});
}

TEST(LinalgGrad, Matmul) {
  auto f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  testing::expect_gradcheck(f, {f64({2, 1, 3, 4}), f64({5, 4, 2})});
  testing::expect_gradcheck(f, {f64({2, 3, 4}), f64({4, 2})});
  testing::expect_gradcheck(f, {f64({4}), f64({2, 4, 3})});
  testing::expect_gradcheck(f, {f64({2, 3, 4}), f64({4})});
  testing::expect_gradcheck(f, {f64({5}), f64({5})});
  testing::expect_gradcheck(f, {f64({3, 4}), f64({2, 4, 3})});
}

TEST(LinalgGrad, Linear) {
  auto with_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  auto no_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
  testing::expect_gradcheck(with_bias, {f64({2, 3, 4}), f64({5, 4}), f64({5})});
  testing::expect_gradcheck(no_bias, {f64({2, 3, 4}), f64({5, 4})});
  testing::expect_gradcheck(with_bias, {f64({4}), f64({3, 4}), f64({3})});
  // Only the weight requires grad (the frozen-input case).
  testing::expect_gradcheck(with_bias, {randn({3, 4}, kFloat64), f64({2, 4}), randn({2}, kFloat64)});
}

TEST(LinalgGrad, LowPrecisionMatchesFloat64) {
  for (DType dt : {kFloat32, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = randn({6, 64}, dt), w0 = randn({16, 64}, dt), b0 = randn({16}, dt), g = randn({6, 16}, dt);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    linear(x, w, b).backward(g);
    Tensor xr = x0.to(kFloat64).requires_grad_(), wr = w0.to(kFloat64).requires_grad_(),
           br = b0.to(kFloat64).requires_grad_();
    linear(xr, wr, br).backward(g.to(kFloat64));
    EXPECT_CLOSE(x.grad(), xr.grad(), tolerance(dt));
    EXPECT_CLOSE(w.grad(), wr.grad(), tolerance(dt));
    EXPECT_CLOSE(b.grad(), br.grad(), tolerance(dt));
  }
}

// ---- errors ----

TEST(LinalgErrors, ShapesDtypesDims) {
  expect_throws_naming([] { mm(randn({2, 3}), randn({4, 5})); }, "mm", {"[2, 3]", "[4, 5]"});
  expect_throws_naming([] { bmm(randn({2, 2, 3}), randn({2, 4, 5})); }, "bmm", {"[2, 2, 3]", "[2, 4, 5]"});
  expect_throws_naming([] { bmm(randn({2, 2, 3}), randn({3, 3, 5})); }, "bmm", {"batch"});
  expect_throws_naming([] { matmul(randn({2, 3}), randn({4, 5})); }, "matmul", {"[2, 3]", "[4, 5]"});
  expect_throws_naming([] { matmul(randn({7}), randn({2, 6, 5})); }, "matmul", {"[7]", "[2, 6, 5]"});
  expect_throws_naming([] { linear(randn({2, 3}), randn({4, 5})); }, "linear", {"[2, 3]", "[4, 5]"});
  expect_throws_naming([] { linear(randn({2, 5}), randn({4, 5}), randn({3})); }, "linear", {"bias"});
  expect_throws_naming([] { mm(randn({2, 3}), randn({3, 4}, kFloat64)); }, "mm", {"float32", "float64"});
  expect_throws_naming([] { matmul(randn({2, 3}, kBFloat16), randn({3, 4})); }, "matmul", {"bfloat16"});
  expect_throws_naming([] { mm(randint(0, 5, {2, 3}), randint(0, 5, {3, 4})); }, "mm", {"int64"});
  expect_throws_naming([] { matmul(scalar_tensor(2.0), randn({3})); }, "matmul", {"at least 1 dimension"});
  expect_throws_naming([] { matmul(randn({3}), scalar_tensor(2.0)); }, "matmul", {"at least 1 dimension"});
  expect_throws_naming([] { linear(scalar_tensor(2.0), randn({3, 1})); }, "linear");
  expect_throws_naming([] { mm(randn({2, 3, 4}), randn({4, 5})); }, "mm", {"2-D"});
  expect_throws_naming([] { bmm(randn({3, 4}), randn({4, 5})); }, "bmm", {"3-D"});
  expect_throws_naming([] { matmul(randn({2, 3, 4}), randn({3, 4, 5})); }, "matmul", {"not broadcastable"});
  expect_throws_naming([] { set_float32_matmul_precision("medium-ish"); }, "set_float32_matmul_precision");
}

TEST(LinalgErrors, DeviceMismatch) {
  KILN_REQUIRE_CUDA();
  expect_throws_naming([] { mm(randn({2, 3}), randn({3, 4}).cuda()); }, "mm", {"cpu", "cuda"});
  expect_throws_naming([] { linear(randn({2, 3}).cuda(), randn({4, 3}).cuda(), randn({4})); }, "linear", {"cpu"});
}

TEST(Linalg, Float32PrecisionSwitch) {
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  set_float32_matmul_precision("high");
  EXPECT_EQ(get_float32_matmul_precision(), "high");
  set_float32_matmul_precision("highest");
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
}

// ---- raw CPU gemm ----

TEST(LinalgRawGemm, CpuTransposesLeadingDimsAlphaBeta) {
  const int64_t m = 7, n = 5, k = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("trans_a=") + (ta ? "1" : "0") + " trans_b=" + (tb ? "1" : "0"));
      // Stored operands with padded rows (ld > row length).
      const Tensor as = randn(ta ? Shape{k, m + 3} : Shape{m, k + 3}), bs = randn(tb ? Shape{n, k + 2} : Shape{k, n + 2});
      const Tensor a = ta ? as.slice(1, 0, m).t() : as.slice(1, 0, k);
      const Tensor b = tb ? bs.slice(1, 0, k).t() : bs.slice(1, 0, n);
      Tensor c = randn({m, n + 4});
      const Tensor c0 = c.slice(1, 0, n).to(kFloat64);
      cpu::gemm(ta, tb, m, n, k, 0.5f, as.data_ptr<float>(), as.size(1), bs.data_ptr<float>(), bs.size(1), 2.0f,
                c.data_ptr<float>(), n + 4);
      const Tensor ref = ref_mm(a, b) * 0.5 + c0 * 2.0;
      EXPECT_CLOSE(c.slice(1, 0, n), ref, 1e-5);
    }
  // k == 0 with beta == 0 overwrites garbage with zeros.
  std::vector<float> c(6, NAN);
  cpu::gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f, c.data(), 3);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(LinalgRawGemm, CpuBatchedSmallProblems) {
  const Tensor a = randn({16, 6, 5}, kFloat64), b = randn({16, 5, 4}, kFloat64);
  Tensor c = empty({16, 6, 4}, kFloat64);
  cpu::gemm_batched(false, false, 16, 6, 4, 5, 1.0, a.data_ptr<double>(), 5, 30, b.data_ptr<double>(), 4, 20, 0.0,
                    c.data_ptr<double>(), 4, 24);
  EXPECT_CLOSE(c, ref_bmm(a, b), 1e-12);
}

// ---- CUDA vs CPU ----

TEST(LinalgCuda, Mm) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    auto f = [](const std::vector<Tensor>& in) { return mm(in[0], in[1]); };
    testing::expect_cuda_matches_cpu("mm", f, {randn({65, 256}, dt).requires_grad_(), randn({256, 47}, dt).requires_grad_()});
    auto ft = [](const std::vector<Tensor>& in) { return mm(in[0].t(), in[1].slice(1, 1, 40)); };
    testing::expect_cuda_matches_cpu("mm transposed", ft,
                                     {randn({128, 33}, dt).requires_grad_(), randn({128, 48}, dt).requires_grad_()});
  }
}

TEST(LinalgCuda, Bmm) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    auto f = [](const std::vector<Tensor>& in) { return bmm(in[0], in[1].transpose(1, 2)); };
    testing::expect_cuda_matches_cpu("bmm", f,
                                     {randn({4, 31, 64}, dt).requires_grad_(), randn({4, 17, 64}, dt).requires_grad_()});
    auto fe = [](const std::vector<Tensor>& in) { return bmm(in[0], in[1].expand({4, 64, 17})); };
    testing::expect_cuda_matches_cpu("bmm expanded", fe,
                                     {randn({4, 31, 64}, dt).requires_grad_(), randn({1, 64, 17}, dt).requires_grad_()});
  }
}

TEST(LinalgCuda, Matmul) {
  KILN_REQUIRE_CUDA();
  auto f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    testing::expect_cuda_matches_cpu("matmul broadcast", f,
                                     {randn({2, 1, 3, 4}, dt).requires_grad_(), randn({5, 4, 6}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("matmul fold", f,
                                     {randn({3, 9, 64}, dt).requires_grad_(), randn({64, 20}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("matmul vec", f, {randn({64}, dt).requires_grad_(), randn({64}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("matmul mat-vec", f,
                                     {randn({2, 7, 64}, dt).requires_grad_(), randn({64}, dt).requires_grad_()});
  }
}

TEST(LinalgCuda, Linear) {
  KILN_REQUIRE_CUDA();
  auto with_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  auto no_bias = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
  for (DType dt : kAllFloats) {
    SCOPED_TRACE(dtype_name(dt));
    testing::expect_cuda_matches_cpu(
        "linear bias", with_bias,
        {randn({2, 33, 128}, dt).requires_grad_(), randn({72, 128}, dt).requires_grad_(), randn({72}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu("linear", no_bias,
                                     {randn({40, 128}, dt).requires_grad_(), randn({72, 128}, dt).requires_grad_()});
    testing::expect_cuda_matches_cpu(  // odd sizes: unaligned leading dims for 16-bit types
        "linear odd", with_bias,
        {randn({5, 33}, dt).requires_grad_(), randn({7, 33}, dt).requires_grad_(), randn({7}, dt).requires_grad_()});
  }
}

// Under CUDA autocast an fp32 weight's gradient comes out of the GEMM in fp32 (no bf16 product and
// cast): against float64 on the bf16-rounded operands, with and without a bias, fp32 weight grads.
TEST(LinalgCuda, AutocastWeightGradientInFp32FromTheGemm) {
  KILN_REQUIRE_CUDA();
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    manual_seed(41);
    const Tensor x = randn({3, 50, 96}).cuda().requires_grad_(true), w = randn({40, 96}).cuda().requires_grad_(true);
    const Tensor b = with_bias ? randn({40}).cuda().requires_grad_(true) : Tensor();
    const Tensor go = randn({3, 50, 40}).to(kBFloat16);
    Tensor y;
    {
      AutocastGuard ac(DeviceType::CUDA, kBFloat16);
      y = linear(x, w, b);
    }
    EXPECT_EQ(y.dtype(), kBFloat16);
    y.backward(go.cuda());
    ASSERT_EQ(w.grad().dtype(), kFloat32);
    // The reference: the product of the bf16-rounded operands in float64.
    const Tensor x64 = x.detach().cpu().to(kBFloat16).to(kFloat64), go64 = go.to(kFloat64).reshape({150, 40});
    const Tensor w64 = w.detach().cpu().to(kBFloat16).to(kFloat64);
    EXPECT_LE(rel_error(w.grad().cpu(), mm(go64.t(), x64.reshape({150, 96}))), 1e-5);  // fp32 accumulate of exact products
    EXPECT_LE(rel_error(x.grad().cpu(), mm(go64, w64).reshape({3, 50, 96})), tolerance(kBFloat16));
    if (with_bias) {
      EXPECT_LE(rel_error(b.grad().cpu(), sum(go64, {0})), tolerance(kBFloat16));
    }
  }
}

TEST(LinalgCuda, EmptyKAndTf32) {
  KILN_REQUIRE_CUDA();
  const Tensor bias = randn({6});
  const Tensor y = linear(randn({4, 0}).cuda(), randn({6, 0}).cuda(), bias.cuda());
  EXPECT_CLOSE(y.cpu(), bias.expand({4, 6}).to(kFloat64), 0.0);
  const Tensor a = randn({128, 256}), b = randn({256, 64});
  set_float32_matmul_precision("high");
  const Tensor tf32 = mm(a.cuda(), b.cuda()).cpu();
  set_float32_matmul_precision("highest");
  EXPECT_CLOSE(tf32, ref_mm(a, b), 5e-3);
  EXPECT_CLOSE(mm(a.cuda(), b.cuda()).cpu(), ref_mm(a, b), 1e-5);
}

TEST(LinalgCuda, DeterministicCachedAndNoCopies) {
  KILN_REQUIRE_CUDA();
  const Device dev("cuda");
  const Tensor a = randn({512, 256}, kBFloat16).cuda().t(), b = randn({384, 512}, kBFloat16).cuda().t();
  mm(a, b);  // first call creates the handle, plan and workspace
#ifdef KILN_WITH_CUDA
  const size_t plans = cuda::gemm_cached_plans();
#endif
  const int64_t before = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  Tensor out = mm(a, b);
  EXPECT_EQ(max_memory_allocated(dev) - before, static_cast<int64_t>(out.nbytes()));  // transposes: op flags
  EXPECT_EQ(out.to_vector(), mm(a, b).to_vector());
  out = Tensor();
  EXPECT_EQ(memory_allocated(dev), before);  // steady state: nothing extra held
#ifdef KILN_WITH_CUDA
  EXPECT_EQ(cuda::gemm_cached_plans(), plans);  // repeated calls reuse the cached plan
#endif
}

#ifdef KILN_WITH_CUDA
TEST(LinalgCuda, RawGemmBf16ToFp32WithBiasAndBeta) {
  KILN_REQUIRE_CUDA();
  const int64_t m = 40, n = 24, k = 96;
  const Tensor a = randn({k, m}, kBFloat16), b = randn({n, k}, kBFloat16), bias = randn({n});
  const Tensor c0 = randn({m, n});
  const Tensor ga = a.cuda(), gb = b.cuda(), gbias = bias.cuda();
  Tensor gc = c0.cuda();
  cuda::GemmParams p;
  p.trans_a = true;  // A stored [k, m]
  p.trans_b = true;  // B stored [n, k]
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = ga.data_ptr();
  p.lda = m;
  p.b = gb.data_ptr();
  p.ldb = k;
  p.c = gc.data_ptr();
  p.ldc = n;
  p.ab_type = kBFloat16;
  p.c_type = kFloat32;
  p.alpha = 0.5;
  p.beta = -1.0;
  p.bias = gbias.data_ptr();
  p.bias_type = kFloat32;
  p.device = 0;
  p.stream = cuda::current_stream(0).handle();
  cuda::gemm(p);
  const Tensor ref = ref_mm(a.t(), b.t()) * 0.5 + c0.to(kFloat64) * -1.0 + bias.to(kFloat64);
  EXPECT_CLOSE(gc.cpu(), ref, 1e-5);
}

// KILN_GEMM_PICK's grammar (no device needed).
TEST(LinalgRawGemm, GemmPickSpecParsesAndRejects) {
  const auto picks = cuda::parse_gemm_picks("2752,128256,4096,0,1=3;;128256,4096,2752,1,0=0;2752,128256,4096,0,1=5");
  ASSERT_EQ(picks.size(), 2u);
  EXPECT_EQ(picks.at({2752, 128256, 4096, 0, 1}), 5);  // the later entry wins
  EXPECT_EQ(picks.at({128256, 4096, 2752, 1, 0}), 0);
  EXPECT_TRUE(cuda::parse_gemm_picks("").empty());
  for (const char* bad : {"1,2,3,0,1", "1,2,3,0,1=", "1,2,3,0,1=-1", "1,2,3,0,2=1", "0,2,3,0,1=1", "1,2,3,0,1=1x",
                          "a,2,3,0,1=1", "1;2,3,0,1=1"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(cuda::parse_gemm_picks(bad), Error);
  }
}

// Every algorithm the heuristic ranks computes the product (bench_lce --variants algos times them);
// rank 0 is what gemm() runs, bit for bit.
TEST(LinalgCuda, RankedCandidatesAllComputeTheProduct) {
  KILN_REQUIRE_CUDA();
  const int64_t m = 384, n = 256, k = 1024;
  const Tensor a = randn({m, k}, kBFloat16), b = randn({n, k}, kBFloat16);
  const Tensor ga = a.cuda(), gb = b.cuda();
  const Tensor ref = ref_mm(a, b.t());
  auto params = [&](const Tensor& c) {
    cuda::GemmParams p;
    p.trans_b = true;
    p.m = m, p.n = n, p.k = k;
    p.a = ga.data_ptr(), p.lda = k, p.b = gb.data_ptr(), p.ldb = k, p.c = c.data_ptr(), p.ldc = n;
    p.ab_type = kBFloat16, p.c_type = kFloat32;
    p.stream = cuda::current_stream(0).handle();
    return p;
  };
  Tensor plain = empty({m, n}, TensorOptions().dtype(kFloat32).device(Device("cuda")));
  cuda::gemm(params(plain));
  const auto candidates = cuda::gemm_candidates(params(plain), 8);
  ASSERT_FALSE(candidates.empty());
  for (const cuda::GemmCandidate& c : candidates) {
    SCOPED_TRACE(c.config);
    Tensor out = full({m, n}, 7.0f, TensorOptions().dtype(kFloat32).device(Device("cuda")));  // beta 0 ignores it
    cuda::gemm_with_candidate(params(out), c.rank);
    EXPECT_LE(c.workspace, cuda::gemm_workspace_bytes());
    EXPECT_CLOSE(out.cpu(), ref, 1e-4);
    if (c.rank == 0) {
      EXPECT_EQ(out.to_vector(), plain.to_vector());
    }
  }
  EXPECT_THROW(cuda::gemm_with_candidate(params(plain), 1000), Error);
}
#endif

}  // namespace
}  // namespace kiln
