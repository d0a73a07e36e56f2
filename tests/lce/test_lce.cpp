// Fused linear cross-entropy against the float64 reference (every option combination, random and
// peaked inputs, f32 and bf16, both strategies), gradchecks, determinism, the memory proof,
// edge cases, errors, weight tying, and CUDA variants (skipped without a GPU).
#include <omp.h>

#include <cmath>
#include <cstring>

#include "kiln/cpu.h"
#include "kiln/kiln.h"
#include "kiln/lce.h"
#include "lce/lce_internal.h"
#include "lce_reference.h"
#include "support/testing.h"

namespace kiln {
namespace {

using lce_test::RefIn;
using lce_test::RefOut;
using nn::functional::LceStrategy;
using nn::functional::LinearCrossEntropyOptions;
using nn::functional::Reduction;
using testing::rel_error;
using testing::tolerance;

Tensor from(const std::vector<double>& v, const Shape& s, DType dt, Device dev = kCPU) {
  return tensor(v, kFloat64).reshape(s).to(dev, dt);
}

// Positive class weights in [0.5, 1.5).
std::vector<double> shifted_rand(int64_t n) {
  std::vector<double> v = rand({n}, kFloat64).to_vector();
  for (double& e : v) e += 0.5;
  return v;
}

struct Case {
  int64_t n = 13, h = 16, v = 37;
  bool bias = false, cw = false, ignore = false, peaked = false;
  Reduction red = Reduction::Mean;
  double eps = 0, z = 0, cap = 0;
};

// Inputs drawn in f64 and rounded to `dt`, so the reference sees exactly what the op sees.
RefIn make_inputs(const Case& c, DType dt) {
  RefIn in;
  in.n = c.n;
  in.h = c.h;
  in.v = c.v;
  auto rounded = [&](const Tensor& t) { return t.to(dt).to(kFloat64).to_vector(); };
  const double ws = 1.0 / std::sqrt(static_cast<double>(c.h));
  in.w = rounded(randn({c.v, c.h}, kFloat64) * ws);
  std::vector<double> yd = randint(0, c.v, {c.n}).to_vector();
  in.y.assign(yd.begin(), yd.end());
  if (c.ignore)
    for (int64_t i = 0; i < c.n; i += 3) in.y[i] = -100;
  std::vector<double> x = randn({c.n, c.h}, kFloat64).to_vector();
  if (c.peaked)  // most probability on the target: x aligned with its target's weight row
    for (int64_t i = 0; i < c.n; ++i)
      if (in.y[i] >= 0)
        for (int64_t k = 0; k < c.h; ++k) x[i * c.h + k] = 0.2 * x[i * c.h + k] + 8.0 * in.w[in.y[i] * c.h + k];
  in.x = rounded(tensor(x, kFloat64));
  if (c.bias) in.b = rounded(randn({c.v}, kFloat64) * 0.5);
  if (c.cw) in.cw = shifted_rand(c.v);
  in.o.reduction = c.red;
  in.o.label_smoothing = c.eps;
  in.o.z_loss = c.z;
  in.o.logit_softcap = c.cap;
  return in;
}

struct LceRun {
  Tensor loss, lse, dx, dw, db;
  LceStrategy strategy;
};

LceRun run(const RefIn& in, DType dt, LceStrategy strategy, const std::vector<double>& cot, Device dev = kCPU,
        int64_t chunk_n = 5, int64_t chunk_v = 16) {
  Tensor x = from(in.x, {in.n, in.h}, dt, dev).requires_grad_(true);
  Tensor w = from(in.w, {in.v, in.h}, dt, dev).requires_grad_(true);
  LinearCrossEntropyOptions o = in.o;
  if (!in.b.empty()) o.linear_bias = from(in.b, {in.v}, dt, dev).requires_grad_(true);
  if (!in.cw.empty()) o.weight = from(in.cw, {in.v}, kFloat32, dev);
  o.strategy = strategy;
  o.chunk_tokens = chunk_n;
  o.chunk_vocab = chunk_v;
  std::vector<double> yd(in.y.begin(), in.y.end());
  Tensor y = tensor(yd, kInt64).to(dev);
  auto r = nn::functional::linear_cross_entropy_with_stats(x, w, y, o);
  LceRun out;
  out.loss = r.loss;
  out.lse = r.lse;
  out.strategy = r.strategy;
  Tensor g = tensor(cot, kFloat64).reshape(r.loss.sizes()).to(dev, dt);
  std::vector<Tensor> wrt{x, w};
  if (o.linear_bias.defined()) wrt.push_back(o.linear_bias);
  auto grads = autograd::grad({r.loss}, wrt, {g});
  out.dx = grads[0];
  out.dw = grads[1];
  if (grads.size() > 2) out.db = grads[2];
  return out;
}

std::vector<double> cotangent(const Case& c, DType dt) {
  if (c.red == Reduction::None)
    return randn({c.n}, kFloat64).to(dt).to(kFloat64).to_vector();
  return {1.25};
}

void expect_matches(const LceRun& got, const RefIn& in, const RefOut& ref, DType dt, const std::string& what) {
  SCOPED_TRACE(what);
  const double tol = dt == kFloat32 ? 2e-5 : tolerance(dt);
  const Shape ls = in.o.reduction == Reduction::None ? Shape{in.n} : Shape{};
  EXPECT_CLOSE(got.loss.to(kFloat64).cpu(), tensor(ref.loss, kFloat64).reshape(ls), tol);
  EXPECT_CLOSE(got.lse.to(kFloat64).cpu(), tensor(ref.lse, kFloat64), dt == kFloat32 ? 1e-6 : 5e-3);
  EXPECT_CLOSE(got.dx.to(kFloat64).cpu(), tensor(ref.dx, kFloat64).reshape({in.n, in.h}), tol);
  EXPECT_CLOSE(got.dw.to(kFloat64).cpu(), tensor(ref.dw, kFloat64).reshape({in.v, in.h}), tol);
  if (!in.b.empty()) EXPECT_CLOSE(got.db.to(kFloat64).cpu(), tensor(ref.db, kFloat64), tol);
}

std::string describe(const Case& c) {
  return detail::str_cat("red=", static_cast<int>(c.red), " bias=", c.bias, " cw=", c.cw, " ignore=", c.ignore,
                         " eps=", c.eps, " z=", c.z, " cap=", c.cap, " peaked=", c.peaked);
}

// Every combination of smoothing x z-loss x softcap x ignore x reduction x bias x class weights.
std::vector<Case> all_cases(bool peaked) {
  std::vector<Case> cases;
  for (int red = 0; red < 3; ++red)
    for (int bits = 0; bits < 64; ++bits) {
      Case c;
      c.red = red == 0 ? Reduction::Mean : red == 1 ? Reduction::Sum : Reduction::None;
      c.eps = bits & 1 ? 0.1 : 0.0;
      c.z = bits & 2 ? 1e-2 : 0.0;
      c.cap = bits & 4 ? 4.0 : 0.0;
      c.ignore = bits & 8;
      c.bias = bits & 16;
      c.cw = bits & 32;
      c.peaked = peaked;
      cases.push_back(c);
    }
  return cases;
}

// What the reference rounds the logits to (RefIn::logits): what the op's tiles hold. On CUDA,
// 16-bit inputs get 16-bit tiles: each logit rounded once, |dz| <= 2^-8 |z|
// for bf16, as torch's unfused bf16 linear rounds it. A peaked token's loss l ~ sum_{v!=y} p_v
// then moves by sum_{v!=y} p_v (dz_v - dz_y): relative ~|z_y| 2^-8, and its gradients alike (an
// emulation of these cases, |z_y| ~ 8: 0.016-0.027 against exact logits, over the bf16 tolerance
// 1e-2; 0.007 against rounded ones, as fp32 tiles against exact). So the reference rounds the
// logits as it rounds the inputs and the tolerances stay: they bound the op's own error, and the
// distance to exact logits is at most that plus the rounding torch's unfused path makes too.
DType ref_logits(DType dt, const Device& dev) { return dev.is_cuda() && is_low_precision(dt) ? dt : kFloat64; }

void check_all(DType dt, LceStrategy strategy, bool peaked, Device dev = kCPU) {
  manual_seed(peaked ? 11 : 7);
  for (const Case& c : all_cases(peaked)) {
    RefIn in = make_inputs(c, dt);
    in.logits = ref_logits(dt, dev);
    const std::vector<double> cot = cotangent(c, dt);
    const RefOut ref = lce_test::reference(in, cot);
    const LceRun got = run(in, dt, strategy, cot, dev);
    expect_matches(got, in, ref, dt, describe(c));
    if (::testing::Test::HasFailure()) return;  // one failing combination is enough to read
  }
}

TEST(LinearCrossEntropy, MemoryF32Random) { check_all(kFloat32, LceStrategy::Memory, false); }
TEST(LinearCrossEntropy, MemoryF32Peaked) { check_all(kFloat32, LceStrategy::Memory, true); }
TEST(LinearCrossEntropy, SpeedF32Random) { check_all(kFloat32, LceStrategy::Speed, false); }
TEST(LinearCrossEntropy, SpeedF32Peaked) { check_all(kFloat32, LceStrategy::Speed, true); }
TEST(LinearCrossEntropy, MemoryBF16Random) { check_all(kBFloat16, LceStrategy::Memory, false); }
TEST(LinearCrossEntropy, MemoryBF16Peaked) { check_all(kBFloat16, LceStrategy::Memory, true); }
TEST(LinearCrossEntropy, SpeedBF16Random) { check_all(kBFloat16, LceStrategy::Speed, false); }
TEST(LinearCrossEntropy, SpeedBF16Peaked) { check_all(kBFloat16, LceStrategy::Speed, true); }

TEST(LinearCrossEntropy, ThreeDimInputAndInt32Target) {
  manual_seed(3);
  Tensor x = randn({2, 3, 8}).requires_grad_(true);
  Tensor w = randn({11, 8}).requires_grad_(true);
  Tensor y = randint(0, 11, {2, 3}, kInt32);
  LinearCrossEntropyOptions o;
  o.reduction = Reduction::None;
  Tensor l = nn::functional::linear_cross_entropy(x, w, y, o);
  EXPECT_EQ(l.sizes(), (Shape{2, 3}));
  Tensor l2 = nn::functional::linear_cross_entropy(x.reshape({6, 8}), w, y.reshape({6}).to(kInt64), o);
  EXPECT_EQ(l.to_vector(), l2.to_vector());
  auto g = autograd::grad({l}, {x}, {ones({2, 3})});
  EXPECT_EQ(g[0].sizes(), x.sizes());
}

TEST(LinearCrossEntropy, GradcheckF64) {
  manual_seed(5);
  for (int strategy = 0; strategy < 2; ++strategy)
    for (int red = 0; red < 3; ++red) {
      Tensor x = randn({6, 4}, kFloat64).requires_grad_(true);
      Tensor w = randn({7, 4}, kFloat64).requires_grad_(true);
      Tensor b = randn({7}, kFloat64).requires_grad_(true);
      Tensor y = tensor({0, 3, -100, 6, 2, 2}, kInt64);
      LinearCrossEntropyOptions o;
      o.reduction = red == 0 ? Reduction::Mean : red == 1 ? Reduction::Sum : Reduction::None;
      o.label_smoothing = 0.2;
      o.z_loss = 0.05;
      o.logit_softcap = 3.0;
      o.weight = tensor(shifted_rand(7), kFloat64);
      o.strategy = strategy == 0 ? LceStrategy::Memory : LceStrategy::Speed;
      o.chunk_tokens = 4;
      o.chunk_vocab = 3;
      testing::expect_gradcheck(
          [&](const std::vector<Tensor>& in) {
            LinearCrossEntropyOptions oo = o;
            oo.linear_bias = in[2];
            return nn::functional::linear_cross_entropy(in[0], in[1], y, oo);
          },
          {x, w, b});
    }
}

TEST(LinearCrossEntropy, AutoPicksSpeedOnlyWhenGradientsAreNeeded) {
  Tensor x = randn({64, 16}), w = randn({100, 16});
  Tensor y = randint(0, 100, {64});
  EXPECT_EQ(nn::functional::linear_cross_entropy_with_stats(x, w, y).strategy, LceStrategy::Memory);
  x.requires_grad_(true);
  EXPECT_EQ(nn::functional::linear_cross_entropy_with_stats(x, w, y).strategy, LceStrategy::Speed);
  LinearCrossEntropyOptions o;
  o.reduction = Reduction::None;
  EXPECT_EQ(nn::functional::linear_cross_entropy_with_stats(x, w, y, o).strategy, LceStrategy::Memory);
  o.reduction = Reduction::Mean;
  o.memory_budget = 1024;  // too small for a chunk of speed
  EXPECT_EQ(nn::functional::linear_cross_entropy_with_stats(x, w, y, o).strategy, LceStrategy::Memory);
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  std::vector<uint8_t> b(c.nbytes());
  std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

// The SIMD row passes (sum of exp, the label-smoothing logit sum) keep partial sums per vector
// lane, so the bits depend on the vector width: determinism holds per width (Highway target),
// tolerance of the float64 reference at every width.
TEST(LinearCrossEntropy, BitwiseDeterministicAcrossRunsAndThreads) {
  SCOPED_TRACE("Highway target " + cpu_simd_info().target);
  for (DType dt : {kFloat32, kBFloat16})
    for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
      Case c;
      c.n = 300;
      c.h = 64;
      c.v = 700;
      c.bias = c.cw = c.ignore = true;
      c.eps = 0.1;
      c.z = 1e-3;
      c.cap = 10;
      manual_seed(9);
      const RefIn in = make_inputs(c, dt);
      const std::vector<double> cot = {1.0};
      const int saved = omp_get_max_threads();
      std::vector<std::vector<uint8_t>> first;
      for (int threads : {1, 2, 3, 2}) {
        omp_set_num_threads(threads);
        const LceRun r = run(in, dt, s, cot, kCPU, 128, 256);
        std::vector<std::vector<uint8_t>> now{bytes(r.loss), bytes(r.lse), bytes(r.dx), bytes(r.dw), bytes(r.db)};
        if (first.empty()) {
          first = now;
        } else {
          EXPECT_TRUE(now == first) << "results differ with " << threads << " threads (dtype "
                                    << dtype_name(dt) << ", strategy " << static_cast<int>(s) << ")";
        }
      }
      omp_set_num_threads(saved);
    }
}

// Working memory = peak - baseline - the results themselves (loss, lse, gradients).
struct Measured {
  int64_t fwd = 0, bwd = 0;
};

Measured measure(int64_t V, DType dt, Device dev) {
  const int64_t N = 256, H = 64;
  manual_seed(1);
  Tensor x = randn({N, H}, TensorOptions().dtype(dt).device(dev)).requires_grad_(true);
  Tensor w = randn({V, H}, TensorOptions().dtype(dt).device(dev)).requires_grad_(true);
  Tensor y = randint(0, V, {N}, TensorOptions().dtype(kInt64).device(dev));
  LinearCrossEntropyOptions o;
  o.strategy = LceStrategy::Memory;
  o.chunk_tokens = 64;
  o.chunk_vocab = 128;
  o.z_loss = 1e-4;
  o.label_smoothing = 0.1;
  Measured m;
  const int64_t base = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  auto r = nn::functional::linear_cross_entropy_with_stats(x, w, y, o);
  m.fwd = max_memory_allocated(dev) - base -
          static_cast<int64_t>(r.loss.nbytes() + r.lse.nbytes() + r.z_loss.nbytes());
  const int64_t before = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  auto g = autograd::grad({r.loss}, {x, w});
  m.bwd = max_memory_allocated(dev) - before - static_cast<int64_t>(g[0].nbytes() + g[1].nbytes());
  return m;
}

TEST(LinearCrossEntropy, WorkingMemoryIndependentOfVocabulary) {
  for (DType dt : {kFloat32, kBFloat16}) {
    const Measured a = measure(2048, dt, kCPU), b = measure(4096, dt, kCPU);
    SCOPED_TRACE(dtype_name(dt));
    EXPECT_EQ(a.fwd, b.fwd);
    EXPECT_EQ(a.bwd, b.bwd);
    EXPECT_LT(b.bwd, 256 * 2048 * 4) << "working memory as large as the logits";
    EXPECT_GT(b.bwd, 0);
  }
}

TEST(LinearCrossEntropy, AllIgnoredMeanIsNaN) {
  Tensor x = randn({4, 8}).requires_grad_(true), w = randn({5, 8}).requires_grad_(true);
  Tensor y = full({4}, -100, kInt64);
  for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
    LinearCrossEntropyOptions o;
    o.strategy = s;
    Tensor l = nn::functional::linear_cross_entropy(x, w, y, o);
    EXPECT_TRUE(std::isnan(l.item()));
    o.reduction = Reduction::Sum;
    Tensor ls = nn::functional::linear_cross_entropy(x, w, y, o);
    EXPECT_EQ(ls.item(), 0.0);
    auto g = autograd::grad({ls}, {x, w});
    for (double v : g[0].to_vector()) EXPECT_EQ(v, 0.0);
    for (double v : g[1].to_vector()) EXPECT_EQ(v, 0.0);
  }
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[linear_cross_entropy]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(LinearCrossEntropy, Errors) {
  using nn::functional::linear_cross_entropy;
  Tensor x = randn({4, 8}), w = randn({5, 8}), y = randint(0, 5, {4});
  expect_error([&] { linear_cross_entropy(x, randn({5, 7}), y); }, "[4, 8]");
  expect_error([&] { linear_cross_entropy(x, randn({5, 7}), y); }, "[5, 7]");
  expect_error([&] { linear_cross_entropy(x, w, randn({4})); }, "int64 or int32");
  expect_error([&] { linear_cross_entropy(x, w, randint(0, 5, {3})); }, "target [3]");
  expect_error([&] { linear_cross_entropy(x, w.to(kBFloat16), y); }, "dtypes differ");
  LinearCrossEntropyOptions o;
  o.linear_bias = randn({6});
  expect_error([&] { linear_cross_entropy(x, w, y, o); }, "linear_bias [6]");
  o = {};
  o.weight = randn({4});
  expect_error([&] { linear_cross_entropy(x, w, y, o); }, "class weight");
  o = {};
  o.label_smoothing = 1.5;
  expect_error([&] { linear_cross_entropy(x, w, y, o); }, "label_smoothing");
  expect_error([&] { linear_cross_entropy(x, w, tensor({0, 1, 7, 2}, kInt64)); }, "target 7");
}

TEST(LinearCrossEntropy, DeviceMismatchCuda) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({4, 8}), w = randn({5, 8}).cuda(), y = randint(0, 5, {4});
  expect_error([&] { nn::functional::linear_cross_entropy(x, w, y); }, "cuda");
}

// The projection tied to an embedding table: both uses' gradients land in the one parameter.
TEST(LinearCrossEntropy, WeightTyingWithEmbedding) {
  manual_seed(4);
  const int64_t N = 9, H = 8, V = 13;
  for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
    Tensor w = randn({V, H}).requires_grad_(true);
    Tensor ids = tensor({1, 4, 4, 12, 0}, kInt64);
    Tensor x = randn({N, H});
    Tensor y = randint(0, V, {N});
    LinearCrossEntropyOptions o;
    o.strategy = s;
    auto head = nn::LinearCrossEntropyLoss::tied(w, Tensor(), o);
    Tensor emb = nn::functional::embedding(ids, w);
    Tensor total = head(x, y) + sum(emb);
    total.backward();
    RefIn in;
    in.n = N;
    in.h = H;
    in.v = V;
    in.x = x.to_vector();
    in.w = w.detach().to_vector();
    for (double v : y.to_vector()) in.y.push_back(static_cast<int64_t>(v));
    RefOut ref = lce_test::reference(in, {1.0});
    for (int64_t id : {1, 4, 4, 12, 0})
      for (int64_t k = 0; k < H; ++k) ref.dw[id * H + k] += 1.0;
    ASSERT_TRUE(w.grad().defined());
    EXPECT_CLOSE(w.grad().to(kFloat64), tensor(ref.dw, kFloat64).reshape({V, H}), 2e-5);
  }
}

TEST(LinearCrossEntropy, ModuleOwnsItsParameters) {
  nn::LinearCrossEntropyLoss m(8, 10, /*bias=*/true);
  EXPECT_EQ(m.parameters().size(), 2u);
  EXPECT_EQ(m.weight().sizes(), (Shape{10, 8}));
  Tensor loss = m(randn({5, 8}), randint(0, 10, {5}));
  loss.backward();
  EXPECT_TRUE(m.weight().grad().defined());
  EXPECT_TRUE(m.bias().grad().defined());
}

// ---- CUDA: the same checks against the float64 reference on the host ----

TEST(LinearCrossEntropyCuda, AllCombinations) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kFloat32, kBFloat16})
    for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed})
      for (bool peaked : {false, true}) check_all(dt, s, peaked, Device("cuda"));
}

TEST(LinearCrossEntropyCuda, BitwiseDeterministic) {
  KILN_REQUIRE_CUDA();
  Case c;
  c.n = 300;
  c.h = 64;
  c.v = 700;
  c.bias = c.cw = true;
  c.eps = 0.1;
  c.z = 1e-3;
  c.cap = 10;
  manual_seed(9);
  const RefIn in = make_inputs(c, kBFloat16);
  for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
    const LceRun a = run(in, kBFloat16, s, {1.0}, Device("cuda"), 128, 256);
    const LceRun b = run(in, kBFloat16, s, {1.0}, Device("cuda"), 128, 256);
    EXPECT_TRUE(bytes(a.loss) == bytes(b.loss) && bytes(a.dx) == bytes(b.dx) && bytes(a.dw) == bytes(b.dw) &&
                bytes(a.db) == bytes(b.db));
  }
}

TEST(LinearCrossEntropyCuda, WorkingMemoryIndependentOfVocabulary) {
  KILN_REQUIRE_CUDA();
  const Device dev("cuda");
  measure(2048, kBFloat16, dev);  // warm-up: the cuBLASLt workspace is allocated once per stream
  const Measured a = measure(2048, kBFloat16, dev), b = measure(4096, kBFloat16, dev);
  EXPECT_EQ(a.fwd, b.fwd);
  EXPECT_EQ(a.bwd, b.bwd);
}

TEST(LinearCrossEntropyCuda, AllIgnoredMeanIsNaN) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({4, 8}).cuda(), w = randn({5, 8}).cuda();
  Tensor y = full({4}, -100, kInt64).cuda();
  EXPECT_TRUE(std::isnan(nn::functional::linear_cross_entropy(x, w, y).item()));
}

// Both strategies on CUDA against float64 in f32 and bf16 (chunk 0: the op's own choice).
void check_cuda_chunks(const Case& c, int64_t chunk_n, int64_t chunk_v, const char* what) {
  for (DType dt : {kFloat32, kBFloat16})
    for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
      RefIn in = make_inputs(c, dt);
      in.logits = ref_logits(dt, Device("cuda"));
      const std::vector<double> cot = cotangent(c, dt);
      const RefOut ref = lce_test::reference(in, cot);
      const LceRun got = run(in, dt, s, cot, Device("cuda"), chunk_n, chunk_v);
      expect_matches(got, in, ref, dt, detail::str_cat(what, ", ", dtype_name(dt), ", strategy ", static_cast<int>(s)));
    }
}

// The benchmark's shape family (a 128k vocabulary, default chunk sizes): the other tests pin tiny
// chunks, so this is where the automatic tiling and long rows are checked against float64.
TEST(LinearCrossEntropyCuda, LargeVocabularyDefaultChunks) {
  KILN_REQUIRE_CUDA();
  manual_seed(5);
  Case c;
  c.n = 64;
  c.h = 64;
  c.v = 128256;
  c.ignore = true;
  check_cuda_chunks(c, /*chunk_n=*/0, /*chunk_v=*/0, "large vocabulary");
}

// Several token and vocabulary chunks with long rows: the memory strategy's fp32 dW slices summed
// over token chunks, the speed strategy's dW summed in the weight dtype over chunks, and the
// in-place 16-bit dz written over rows that span several kernel segments with a ragged tail.
TEST(LinearCrossEntropyCuda, SeveralTokenChunksLongRows) {
  KILN_REQUIRE_CUDA();
  manual_seed(6);
  Case c;
  c.n = 300;
  c.h = 64;
  c.v = 5003;
  c.ignore = true;
  check_cuda_chunks(c, /*chunk_n=*/128, /*chunk_v=*/2048, "several chunks");
}

// The speed strategy scales its forward-computed gradients in place only when the graph is freed
// after the backward: a retained graph gives the same gradients on every backward.
void check_speed_retain_graph(const Device& dev) {
  manual_seed(7);
  Tensor x = randn({20, 8}, TensorOptions().device(dev)).requires_grad_(true);
  Tensor w = randn({11, 8}, TensorOptions().device(dev)).requires_grad_(true);
  Tensor y = randint(0, 11, {20}, TensorOptions().dtype(kInt64).device(dev));
  LinearCrossEntropyOptions o;
  o.strategy = LceStrategy::Speed;
  Tensor loss = nn::functional::linear_cross_entropy(x, w, y, o) * 3.0;
  const auto g1 = autograd::grad({loss}, {x, w}, {}, /*retain_graph=*/true);
  const auto g2 = autograd::grad({loss}, {x, w}, {}, /*retain_graph=*/true);
  const auto g3 = autograd::grad({loss}, {x, w});  // frees the graph: may scale in place
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(g1[i].cpu().to_vector(), g2[i].cpu().to_vector()) << dev.str() << " input " << i;
    EXPECT_EQ(g1[i].cpu().to_vector(), g3[i].cpu().to_vector()) << dev.str() << " input " << i;
  }
  Tensor loss1 = nn::functional::linear_cross_entropy(x, w, y, o);
  const auto g0 = autograd::grad({loss1}, {x, w});
  EXPECT_LT(kiln::testing::rel_error(g1[1], g0[1] * 3.0), 1e-6) << dev.str();
}

TEST(LinearCrossEntropy, SpeedRetainGraphGivesSameGradients) { check_speed_retain_graph(kCPU); }

// The plan at the benchmark's shape (8192 x 4096 x 128256), checked without a GPU: on CUDA 16-bit
// tiles hold twice the logits of fp32 ones in the same budget (speed: equal chunks in 64s within
// 768 MiB, 2752 tokens of bf16 logits, 1408 of fp32; memory: 8192 tokens x the classes whose
// logits fit 88 MiB, 5632 bf16, 2816 fp32); the side stream only where dW is needed over several
// chunks; on the CPU 32 MiB hold 65 tokens of fp32 logits, under speed's 256-token minimum: memory,
// 2048 x 1024 tiles.
TEST(LinearCrossEntropy, PlanAtTheBenchmarkShape) {
  const lce::Dims d{8192, 4096, 128256};
  lce::Needs all;
  all.dx = all.dw = true;
  LinearCrossEntropyOptions o;
  for (DType dt : {kBFloat16, kFloat32}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool b16 = dt == kBFloat16;
    const lce::Plan sp = lce::plan(d, dt, /*cuda=*/true, o, all);
    EXPECT_EQ(sp.strategy, LceStrategy::Speed);
    EXPECT_EQ(sp.chunk_n, b16 ? 2752 : 1408);
    EXPECT_TRUE(sp.side_stream);
    o.strategy = LceStrategy::Memory;
    const lce::Plan mp = lce::plan(d, dt, true, o, all);
    EXPECT_EQ(mp.strategy, LceStrategy::Memory);
    EXPECT_EQ(mp.chunk_n, 8192);
    EXPECT_EQ(mp.chunk_v, b16 ? 5632 : 2816);
    EXPECT_FALSE(mp.side_stream);
    o.strategy = LceStrategy::Auto;
  }
  lce::Needs dx_only;
  dx_only.dx = true;
  EXPECT_FALSE(lce::plan(d, kBFloat16, true, o, dx_only).side_stream);  // no dW GEMMs to move
  o.chunk_tokens = 8192;
  EXPECT_FALSE(lce::plan(d, kBFloat16, true, o, all).side_stream);  // one chunk: nothing to overlap
  o.chunk_tokens = 0;
  EXPECT_EQ(lce::plan(d, kBFloat16, true, o, {}).strategy, LceStrategy::Memory);  // no gradients
  const lce::Plan cpu = lce::plan(d, kFloat32, /*cuda=*/false, o, all);
  EXPECT_EQ(cpu.strategy, LceStrategy::Memory);
  EXPECT_EQ(cpu.chunk_n, 2048);
  EXPECT_EQ(cpu.chunk_v, 1024);
  EXPECT_FALSE(cpu.side_stream);
}

// The plan's chunks are within [1, max(N, 1)] x [1, V] whatever the options ask, and the result
// reports them.
TEST(LinearCrossEntropy, PlanClampsChunksToTheProblem) {
  LinearCrossEntropyOptions o;
  o.chunk_tokens = 1000;
  o.chunk_vocab = 1000;
  for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed}) {
    o.strategy = s;
    const lce::Plan p = lce::plan({10, 8, 37}, kFloat32, false, o, lce::Needs{true, true, false});
    EXPECT_EQ(p.chunk_n, 10);
    EXPECT_EQ(p.chunk_v, 37);
    EXPECT_EQ(lce::plan({0, 8, 37}, kFloat32, false, o, {}).chunk_n, 1);
  }
  Tensor x = randn({10, 8}).requires_grad_(true), w = randn({37, 8});
  o.strategy = LceStrategy::Memory;
  const auto r = nn::functional::linear_cross_entropy_with_stats(x, w, randint(0, 37, {10}), o);
  EXPECT_EQ(r.chunk_tokens, 10);
  EXPECT_EQ(r.chunk_vocab, 37);
}

// At the benchmark's vocabulary with the default chunks, the speed forward's working memory (peak
// minus inputs' gradients and outputs) stays within the 768 MiB budget plus cuBLASLt's workspace,
// and the chunks that ran are the plan's (PlanAtTheBenchmarkShape).
TEST(LinearCrossEntropyCuda, DefaultSpeedChunksStayWithinTheBudget) {
  KILN_REQUIRE_CUDA();
  const Device dev("cuda");
  const int64_t N = 8192, H = 64, V = 128256;
  manual_seed(8);
  const TensorOptions bf = TensorOptions().dtype(kBFloat16).device(dev);
  Tensor x = randn({N, H}, bf).requires_grad_(true);
  Tensor w = (randn({V, H}, bf) * 0.125).detach().requires_grad_(true);
  Tensor y = randint(0, V, {N}, TensorOptions().dtype(kInt64).device(dev));
  LinearCrossEntropyOptions opt;
  opt.strategy = LceStrategy::Speed;
  nn::functional::linear_cross_entropy_with_stats(x, w, y, opt);  // warm-up: cuBLASLt plans, workspace
  const int64_t base = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  const auto r = nn::functional::linear_cross_entropy_with_stats(x, w, y, opt);
  const int64_t grads = (N + V) * H * 2, outs = static_cast<int64_t>(r.loss.nbytes() + r.lse.nbytes());
  EXPECT_EQ(r.chunk_tokens, 2752);
  EXPECT_LE(max_memory_allocated(dev) - base - grads - outs, (int64_t{768} << 20) + (int64_t{33} << 20));
  opt.strategy = LceStrategy::Memory;
  EXPECT_EQ(nn::functional::linear_cross_entropy_with_stats(x, w, y, opt).chunk_vocab, 5632);
}

// bf16 and fp16: every option combination, both strategies, random and peaked, against logits
// rounded once to T (ref_logits).
TEST(LinearCrossEntropyCuda, SixteenBitInputsAgainstReference) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {kBFloat16, kFloat16})
    for (LceStrategy s : {LceStrategy::Memory, LceStrategy::Speed})
      for (bool peaked : {false, true}) {
        SCOPED_TRACE(dtype_name(dt));
        check_all(dt, s, peaked, Device("cuda"));
        if (::testing::Test::HasFailure()) return;
      }
}

// Long ragged rows (V = 100003: the last vector partial) over several token chunks of 32: the
// speed strategy's dW GEMMs on the side stream and its joins, against float64, the same bits run
// to run.
TEST(LinearCrossEntropyCuda, LongRowsSeveralChunksAgainstReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(12);
  for (int bits = 0; bits < 8; ++bits) {
    const LceStrategy st = bits & 4 ? LceStrategy::Memory : LceStrategy::Speed;
    Case c;
    c.n = 70;
    c.h = 32;
    c.v = 100003;
    c.ignore = true;
    c.bias = bits & 1;
    c.cw = bits & 1;
    c.eps = bits & 2 ? 0.1 : 0.0;
    c.cap = bits & 2 ? 20.0 : 0.0;
    c.z = bits & 2 ? 1e-3 : 0.0;
    RefIn in = make_inputs(c, kBFloat16);
    in.logits = ref_logits(kBFloat16, Device("cuda"));
    const std::vector<double> cot = cotangent(c, kBFloat16);
    const RefOut ref = lce_test::reference(in, cot);
    const LceRun got = run(in, kBFloat16, st, cot, Device("cuda"), 32, 0);
    expect_matches(got, in, ref, kBFloat16,
                   detail::str_cat("long rows, strategy ", static_cast<int>(st), " ", describe(c)));
    const LceRun again = run(in, kBFloat16, st, cot, Device("cuda"), 32, 0);
    EXPECT_TRUE(bytes(got.loss) == bytes(again.loss) && bytes(got.dx) == bytes(again.dx) &&
                bytes(got.dw) == bytes(again.dw) && bytes(got.lse) == bytes(again.lse));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(LinearCrossEntropyCuda, SpeedRetainGraphGivesSameGradients) {
  KILN_REQUIRE_CUDA();
  check_speed_retain_graph(Device("cuda"));
}

}  // namespace
}  // namespace kiln
