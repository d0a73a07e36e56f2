// kiln::Generator (an independent Philox stream), the random functions that take one, in-place
// normal_ / uniform_, and multinomial (sampled on the host from uniforms drawn on probs' device).
#include "kiln/random.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>

#include "core/dispatch.h"
#include "core/generator.h"
#include "core/kernels.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/writable.h"

namespace kiln {

struct Generator::State {
  std::mutex mu;
  uint64_t seed = 67280421310721ULL;  // torch.Generator's default seed
  uint64_t offset = 0;
  Device device;
};

Generator::Generator(Device device) : state_(std::make_shared<State>()) { state_->device = device; }

Generator& Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->seed = seed;
  state_->offset = 0;
  return *this;
}

uint64_t Generator::seed() {
  std::random_device rd;
  const uint64_t s = (static_cast<uint64_t>(rd()) << 32) | rd();
  manual_seed(s);
  return s;
}

uint64_t Generator::initial_seed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->seed;
}

Device Generator::device() const { return state_->device; }

Tensor Generator::get_state() const {
  Tensor t = make_tensor({2}, kInt64, kCPU);
  std::lock_guard<std::mutex> lock(state_->mu);
  std::memcpy(t.data_ptr<int64_t>(), &state_->seed, sizeof(uint64_t));
  std::memcpy(t.data_ptr<int64_t>() + 1, &state_->offset, sizeof(uint64_t));
  return t;
}

Generator& Generator::set_state(const Tensor& state) {
  KILN_CHECK(state.defined() && state.dtype() == kInt64 && state.numel() == 2 && state.dim() == 1,
             "Generator.set_state", "expected an int64 [2] state {seed, offset}");
  const Tensor c = state.to(kCPU).contiguous();
  std::lock_guard<std::mutex> lock(state_->mu);
  std::memcpy(&state_->seed, c.data_ptr<int64_t>(), sizeof(uint64_t));
  std::memcpy(&state_->offset, c.data_ptr<int64_t>() + 1, sizeof(uint64_t));
  return *this;
}

std::pair<uint64_t, uint64_t> Generator::reserve(int64_t numel) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  const uint64_t off = state_->offset;
  state_->offset += static_cast<uint64_t>((numel + 3) / 4);
  return {state_->seed, off};
}

namespace {

// Fills a fresh contiguous tensor from `generator` (or the global stream when null).
void fill_random(const Tensor& t, philox::Distribution dist, int64_t low, int64_t high, const Generator* generator,
                 const char* op) {
  uint64_t seed = 0, offset = 0;
  if (generator) {
    KILN_CHECK(generator->device().type == t.device().type, op, "a generator for ", generator->device().str(),
               " cannot draw numbers for a tensor on ", t.device().str());
    std::tie(seed, offset) = generator->reserve(t.numel());
  } else {
    const PhiloxState st = reserve_philox(t.device(), t.numel());
    seed = st.seed, offset = st.offset;
  }
  if (t.numel() == 0) return;
  if (t.device().is_cpu()) {
    cpu::random(t, dist, seed, offset, low, high);
  } else {
    KILN_CUDA_ONLY(op, cuda::random(t, dist, seed, offset, low, high));
  }
}

Tensor drawn(const Shape& shape, TensorOptions options, philox::Distribution dist, const Generator* g, const char* op) {
  KILN_CHECK(is_floating_point(options.dtype()), op, "expects a floating-point dtype, got ", dtype_name(options.dtype()));
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  fill_random(t, dist, 0, 0, g, op);
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

// Uniforms or normals of self's shape in a dtype that keeps them exact, scaled, written into self.
Tensor& fill_inplace(Tensor& self, philox::Distribution dist, double scale, double shift, const Generator* g,
                     const char* op) {
  check_writable(self, op);
  KILN_CHECK(is_floating_point(self.dtype()), op, "expects a floating-point tensor, got ", dtype_name(self.dtype()));
  const DType dt = self.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor r = make_tensor(self.sizes(), dt, self.device());
  fill_random(r, dist, 0, 0, g, op);
  {
    NoGradGuard ng;
    r = add(mul(r, scale), shift);
  }
  return self.copy_(r);
}

}  // namespace

Tensor rand(const Shape& shape, const Generator& generator, TensorOptions options) {
  return drawn(shape, options, philox::Distribution::Uniform, &generator, "rand");
}
Tensor randn(const Shape& shape, const Generator& generator, TensorOptions options) {
  return drawn(shape, options, philox::Distribution::Normal, &generator, "randn");
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, const Generator& generator, TensorOptions options) {
  KILN_CHECK(high > low, "randint", "high (", high, ") must be greater than low (", low, ")");
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  fill_random(t, philox::Distribution::Integer, low, high, &generator, "randint");
  return t;
}

Tensor& normal_(Tensor& self, double mean, double stddev, const Generator* generator) {
  KILN_CHECK(stddev >= 0, "normal_", "expects std >= 0.0, but found std ", stddev);
  return fill_inplace(self, philox::Distribution::Normal, stddev, mean, generator, "normal_");
}

Tensor& uniform_(Tensor& self, double from, double to, const Generator* generator) {
  KILN_CHECK(from <= to, "uniform_", "expects to return a [from, to) range, but found from=", from, " > to=", to);
  return fill_inplace(self, philox::Distribution::Uniform, to - from, from, generator, "uniform_");
}

Tensor randperm(int64_t n, const Generator* generator, TensorOptions options) {
  KILN_CHECK(n >= 0, "randperm", "n must be non-negative, got ", n);
  Tensor keys = make_tensor({n}, kInt64, options.device());
  fill_random(keys, philox::Distribution::Integer, 0, int64_t{1} << 53, generator, "randperm");
  keys = keys.to(kCPU).contiguous();
  const int64_t* k = keys.data_ptr<int64_t>();
  Tensor out = make_tensor({n}, kInt64, kCPU);
  int64_t* o = out.data_ptr<int64_t>();
  std::iota(o, o + n, int64_t{0});
  std::sort(o, o + n, [k](int64_t a, int64_t b) { return k[a] != k[b] ? k[a] < k[b] : a < b; });
  return out.to(options.device(), options.dtype());
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, const Generator* generator) {
  constexpr const char* kOp = "multinomial";
  KILN_CHECK(probs.defined() && is_floating_point(probs.dtype()), kOp, "expects a floating-point probability tensor");
  KILN_CHECK(probs.dim() == 1 || probs.dim() == 2, kOp, "prob_dist must be 1 or 2 dim, got ", probs.dim());
  KILN_CHECK(num_samples > 0, kOp, "cannot sample n_sample <= 0 samples");
  const int64_t rows = probs.dim() == 2 ? probs.size(0) : 1, n = probs.size(-1);
  KILN_CHECK(n > 0, kOp, "number of categories cannot be zero");
  KILN_CHECK(replacement || num_samples <= n, kOp,
             "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  Tensor u = make_tensor({rows, num_samples}, kFloat64, probs.device());
  fill_random(u, philox::Distribution::Uniform, 0, 0, generator, kOp);
  u = u.to(kCPU).contiguous();
  const Tensor p = probs.detach().to(kCPU, kFloat64).reshape({rows, n}).contiguous();
  Tensor out = make_tensor({rows, num_samples}, kInt64, kCPU);
  const double* pu = u.data_ptr<double>();
  int64_t* po = out.data_ptr<int64_t>();
  std::vector<double> w(static_cast<size_t>(n)), cdf(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const double* pr = p.data_ptr<double>() + r * n;
    double total = 0;
    int64_t positive = 0;
    for (int64_t i = 0; i < n; ++i) {
      KILN_CHECK(std::isfinite(pr[i]) && pr[i] >= 0, kOp, "probability tensor contains either inf, nan or element < 0");
      w[static_cast<size_t>(i)] = pr[i];
      total += pr[i];
      cdf[static_cast<size_t>(i)] = total;
      positive += pr[i] > 0;
    }
    KILN_CHECK(total > 0, kOp, "invalid multinomial distribution (sum of probabilities <= 0)");
    KILN_CHECK(replacement || positive >= num_samples, kOp, "invalid multinomial distribution (with replacement=False, "
               "not enough non-negative category to sample)");
    for (int64_t s = 0; s < num_samples; ++s) {
      const double target = pu[r * num_samples + s];
      int64_t pick = -1;
      if (replacement) {  // first category whose cumulative weight passes target * total
        pick = std::upper_bound(cdf.begin(), cdf.end(), target * total) - cdf.begin();
      } else {
        double left = 0;
        for (double v : w) left += v;
        double acc = 0;
        for (int64_t i = 0; i < n && pick < 0; ++i) {
          acc += w[static_cast<size_t>(i)];
          if (w[static_cast<size_t>(i)] > 0 && acc > target * left) pick = i;
        }
      }
      if (pick < 0 || pick >= n) {  // rounding at the very top: the last positive category
        for (int64_t i = n - 1; i >= 0 && (pick < 0 || pick >= n); --i)
          if (w[static_cast<size_t>(i)] > 0) pick = i;
      }
      po[r * num_samples + s] = pick;
      if (!replacement) w[static_cast<size_t>(pick)] = 0;
    }
  }
  if (probs.dim() == 1) out = out.reshape({num_samples});
  return out.to(probs.device());
}

}  // namespace kiln
