// Tensor factories and the Philox generator state.
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/generator.h"
#include "core/kernels.h"
#include "core/size_check.h"
#include "core/tensor_impl.h"
#include "kiln/cuda.h"

namespace kiln {
namespace {

constexpr uint64_t kDefaultSeed = 0x6b696c6eULL;  // "kiln"

struct Generator {
  std::mutex mu;
  uint64_t seed = kDefaultSeed;
  std::unordered_map<int, uint64_t> offsets;  // key: -1 for the CPU, device index for CUDA
  std::unordered_map<int, uint64_t> seeds;    // per-device seeds from set_rng_state (else `seed`)
};
Generator& generator() {
  static Generator g;
  return g;
}

Tensor with_grad_flag(Tensor t, const TensorOptions& options) {
  if (options.requires_grad()) t.requires_grad_(true);
  return t;
}

void random_fill(const Tensor& t, philox::Distribution dist, int64_t low, int64_t high) {
  const PhiloxState st = reserve_philox(t.device(), t.numel());
  if (t.device().is_cpu()) {
    cpu::random(t, dist, st.seed, st.offset, low, high);
  } else {
    KILN_CUDA_ONLY("random", cuda::random(t, dist, st.seed, st.offset, low, high));
  }
}

}  // namespace

PhiloxState reserve_philox(Device device, int64_t numel) {
  Generator& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  const int key = device.is_cpu() ? -1 : device.index;
  uint64_t& off = g.offsets[key];
  const auto s = g.seeds.find(key);
  const PhiloxState st{s != g.seeds.end() ? s->second : g.seed, off};
  off += static_cast<uint64_t>((numel + 3) / 4);
  return st;
}

void manual_seed(uint64_t seed) {
  Generator& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.seed = seed;
  g.offsets.clear();
  g.seeds.clear();
}

namespace {
Tensor rng_state_of(int key) {
  Generator& g = generator();
  uint64_t seed = 0, offset = 0;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    const auto s = g.seeds.find(key);
    seed = s != g.seeds.end() ? s->second : g.seed;
    const auto o = g.offsets.find(key);
    offset = o != g.offsets.end() ? o->second : 0;
  }
  Tensor t = make_tensor({2}, kInt64, kCPU);
  int64_t* p = t.data_ptr<int64_t>();
  std::memcpy(&p[0], &seed, sizeof(seed));
  std::memcpy(&p[1], &offset, sizeof(offset));
  return t;
}

void set_rng_state_of(int key, const Tensor& state, const char* op) {
  KILN_CHECK(state.defined() && state.dtype() == kInt64 && state.dim() == 1 && state.numel() == 2, op,
             "expected an int64 [2] state {seed, offset}, got ",
             state.defined() ? std::string(dtype_name(state.dtype())) + " " + shape_str(state.sizes()) : std::string("undefined"));
  const Tensor c = state.to(kCPU).contiguous();
  uint64_t seed = 0, offset = 0;
  std::memcpy(&seed, &c.data_ptr<int64_t>()[0], sizeof(seed));
  std::memcpy(&offset, &c.data_ptr<int64_t>()[1], sizeof(offset));
  Generator& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.seeds[key] = seed;
  g.offsets[key] = offset;
}

int cuda_key(int device, const char* op) {
  if (device < 0) device = cuda::current_device();
  KILN_CHECK(device >= 0, op, "invalid CUDA device index ", device);
  return device;
}
}  // namespace

Tensor get_rng_state() { return rng_state_of(-1); }
void set_rng_state(const Tensor& state) { set_rng_state_of(-1, state, "set_rng_state"); }
namespace cuda {
Tensor get_rng_state(int device) { return rng_state_of(cuda_key(device, "cuda::get_rng_state")); }
void set_rng_state(const Tensor& state, int device) {
  set_rng_state_of(cuda_key(device, "cuda::set_rng_state"), state, "cuda::set_rng_state");
}
}  // namespace cuda

Tensor empty(const Shape& shape, TensorOptions options) {
  return with_grad_flag(make_tensor(shape, options.dtype(), options.device()), options);
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  t.fill_(value);
  return with_grad_flag(t, options);
}
Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.sizes(), value, t.options()); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  KILN_CHECK(step != 0, "arange", "step must be nonzero");
  KILN_CHECK(std::isfinite(start) && std::isfinite(end), "arange", "start and end must be finite");
  const double span = std::ceil(std::max((end - start) / step, 0.0));
  KILN_CHECK(span < 0x1p63, "arange", "(", end, " - ", start, ") / ", step, " is more elements than a tensor may hold");
  const auto n = static_cast<int64_t>(span);
  Tensor t = make_tensor({n}, options.dtype(), options.device());
  if (n > 0) {
    if (t.device().is_cpu()) {
      cpu::arange(t, start, step);
    } else {
      KILN_CUDA_ONLY("arange", cuda::arange(t, start, step));
    }
  }
  return with_grad_flag(t, options);
}
Tensor arange(double end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor rand(const Shape& shape, TensorOptions options) {
  KILN_CHECK(is_floating_point(options.dtype()), "rand", "expects a floating-point dtype, got ",
             dtype_name(options.dtype()));
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  random_fill(t, philox::Distribution::Uniform, 0, 0);
  return with_grad_flag(t, options);
}

Tensor randn(const Shape& shape, TensorOptions options) {
  KILN_CHECK(is_floating_point(options.dtype()), "randn", "expects a floating-point dtype, got ",
             dtype_name(options.dtype()));
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  random_fill(t, philox::Distribution::Normal, 0, 0);
  return with_grad_flag(t, options);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options) {
  KILN_CHECK(high > low, "randint", "high (", high, ") must be greater than low (", low, ")");
  Tensor t = make_tensor(shape, options.dtype(), options.device());
  random_fill(t, philox::Distribution::Integer, low, high);
  return t;
}

Tensor rand_like(const Tensor& t) { return rand(t.sizes(), t.options()); }
Tensor randn_like(const Tensor& t) { return randn(t.sizes(), t.options()); }

Tensor from_blob(void* data, const Shape& shape, TensorOptions options, std::function<void(void*)> deleter,
                 const Shape& strides) {
  const int64_t numel = checked_numel(shape, "from_blob");
  KILN_CHECK(data != nullptr || numel == 0, "from_blob", "null data pointer");
  const Shape st = strides.empty() ? contiguous_strides(shape) : strides;
  KILN_CHECK(st.size() == shape.size(), "from_blob", "strides ", shape_str(st), " do not match shape ",
             shape_str(shape));
  // The elements reachable from data: 1 + sum (size - 1) x stride, checked like any size.
  __extension__ typedef unsigned __int128 u128;
  u128 last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_CHECK(st[d] >= 0, "from_blob", "negative strides are not supported");
    if (shape[d] > 0) last += static_cast<u128>(shape[d] - 1) * static_cast<uint64_t>(st[d]);
    KILN_CHECK(last < static_cast<uint64_t>(INT64_MAX), "from_blob", "shape ", shape_str(shape), " with strides ",
               shape_str(st), " reaches past 2^63 elements");
  }
  const size_t nbytes = numel == 0 ? 0
                                   : static_cast<size_t>(checked_nbytes({static_cast<int64_t>(last) + 1},
                                                                        element_size(options.dtype()) * 8,
                                                                        dtype_name(options.dtype()), "from_blob"));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, nbytes, options.device(), std::move(deleter));
  impl->sizes = shape;
  impl->strides = st;
  impl->dtype = options.dtype();
  return with_grad_flag(Tensor(std::move(impl)), options);
}

Tensor tensor(const std::vector<double>& values, TensorOptions options) {
  auto host = std::make_shared<std::vector<double>>(values);
  Tensor src = from_blob(host->data(), {static_cast<int64_t>(values.size())}, kFloat64,
                         [host](void*) mutable { host.reset(); });
  Tensor t = make_tensor(src.sizes(), options.dtype(), options.device());
  t.copy_(src);
  return with_grad_flag(t, options);
}

}  // namespace kiln
