// The benchmark's phase timer (see profile.h). CUDA: events recorded on the current stream, read
// back once per step; CPU: steady_clock (CPU ops are synchronous).
#include "profile.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>

#include "kiln/autograd.h"
#include "kiln/cuda.h"

namespace kiln::train {
namespace {
std::atomic<PhaseTimer*> g_active{nullptr};
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Per-op breakdown of the backward: each node runs as phase "bwd <op>" inside "backward", which
// keeps what lies between nodes (engine work, launch gaps). Names are interned: marks keep the
// pointer until collect().
const char* backward_phase_name(const std::string& op) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert("bwd " + op).first->c_str();
}

void observe_backward_node(const std::string& op, bool begin) {
  thread_local const char* outer = nullptr;
  PhaseTimer* t = PhaseTimer::active();
  if (!t) return;
  if (begin) {
    outer = t->current();
    t->begin(backward_phase_name(op));
  } else {
    t->end();
    if (outer) t->begin(outer);
  }
}
}  // namespace

struct PhaseTimer::Impl {
  struct Mark {
    const char* name;
    double t0 = 0, t1 = -1;  // CPU wall clock (ms)
    size_t ev = 0;           // CUDA: events ev (start) and ev + 1 (end) of the pool
  };
  Device device;
  std::vector<Mark> marks;
  std::vector<cuda::Event> pool;  // reused across steps
  const char* open = nullptr;
};

PhaseTimer::PhaseTimer(Device device) : impl_(std::make_unique<Impl>()) { impl_->device = device; }
PhaseTimer::~PhaseTimer() {
  PhaseTimer* self = this;
  g_active.compare_exchange_strong(self, nullptr);
}

PhaseTimer* PhaseTimer::active() { return g_active.load(std::memory_order_relaxed); }
void PhaseTimer::set_active(PhaseTimer* timer) {
  g_active.store(timer);
  autograd::set_backward_observer(timer ? &observe_backward_node : nullptr);
}
const char* PhaseTimer::current() const { return impl_->open; }

void PhaseTimer::begin(const char* name) {
  if (impl_->open) end();
  Impl::Mark m{name};
  if (impl_->device.is_cuda()) {
    m.ev = 2 * impl_->marks.size();
    while (impl_->pool.size() < m.ev + 2) impl_->pool.emplace_back();
    impl_->pool[m.ev].record(cuda::current_stream(impl_->device.index));
  } else {
    m.t0 = now_ms();
  }
  impl_->marks.push_back(m);
  impl_->open = name;
}

void PhaseTimer::end() {
  if (!impl_->open) return;
  Impl::Mark& m = impl_->marks.back();
  if (impl_->device.is_cuda()) {
    impl_->pool[m.ev + 1].record(cuda::current_stream(impl_->device.index));
  } else {
    m.t1 = now_ms();
  }
  impl_->open = nullptr;
}

void PhaseTimer::collect(std::map<std::string, double>& totals) {
  end();
  if (impl_->device.is_cuda() && !impl_->marks.empty()) impl_->pool[impl_->marks.back().ev + 1].synchronize();
  for (const Impl::Mark& m : impl_->marks) {
    const double ms = impl_->device.is_cuda() ? impl_->pool[m.ev].elapsed_ms(impl_->pool[m.ev + 1]) : m.t1 - m.t0;
    totals[m.name] += ms;
  }
  impl_->marks.clear();
}

Phase::Phase(const char* name) : timer_(PhaseTimer::active()), prev_(nullptr) {
  if (!timer_) return;
  prev_ = timer_->current();
  timer_->begin(name);
}

Phase::~Phase() {
  if (!timer_) return;
  timer_->end();
  if (prev_) timer_->begin(prev_);
}

}  // namespace kiln::train
