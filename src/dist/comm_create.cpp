// Making communicators: new_comm (rendezvous of every rank under a store prefix), split, shrink,
// and the process-wide registry behind dump_flight_recorders and the dump-on-signal request.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/env.h"
#include "dist/comm_state.h"

namespace kiln::dist {

namespace detail {

namespace {

using std::chrono::milliseconds;

std::mutex g_registry_mu;
std::vector<std::weak_ptr<CommState>>& registry() {
  static auto* r = new std::vector<std::weak_ptr<CommState>>;  // process lifetime
  return *r;
}

std::atomic<uint64_t> g_dump_requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the signal handler needs a lock-free counter");

void on_dump_signal(int) { g_dump_requests.fetch_add(1, std::memory_order_relaxed); }

// "0,2,5" -> a short stable tag for store prefixes (FNV-1a).
std::string list_tag(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * b));
      h *= 1099511628211ull;
    }
  }
  std::ostringstream os;
  os << std::hex << h;
  return os.str();
}

std::string listen_host(const CommOptions& o, const ::kiln::detail::LaunchEnv& env) {
  if (!o.hostname.empty()) return o.hostname;
  const std::string& m = env.master_addr;
  if (env.source == "none" || m == "localhost" || m.rfind("127.", 0) == 0 || m == "::1") return "127.0.0.1";
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "127.0.0.1";
  return host;
}

// Every rank announces itself; waits for all within the timeout, naming who is missing.
void join(const std::string& what, Store& store, const std::string& backend, int rank, int size, milliseconds timeout) {
  const std::string me = backend + " " + std::to_string(size);
  store.set("member/" + std::to_string(rank), me);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("member/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    const auto got = store.multi_get(keys);
    for (int r = 0; r < size; ++r)
      if (!got[r].first) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw TimeoutError("[new_comm] " + what + ": ranks [" + missing + "] did not join within " +
                       std::to_string(timeout.count()) + " ms");
  }
  const auto got = store.multi_get(keys);
  for (int r = 0; r < size; ++r)
    KILN_CHECK(got[r].second == me, "new_comm", what, ": rank ", r, " asked for '", got[r].second, "', rank ", rank,
               " for '", me, "' (backend and size must agree)");
}

}  // namespace

void register_comm(const std::shared_ptr<CommState>& s) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto& r = registry();
  r.erase(std::remove_if(r.begin(), r.end(), [](const auto& w) { return w.expired(); }), r.end());
  r.push_back(s);
}

uint64_t dump_requests() { return g_dump_requests.load(std::memory_order_relaxed); }

std::shared_ptr<Communicator> create_comm(const std::string& backend, const Device& device, const std::string& name,
                                          const std::string& prefix, int rank, int size,
                                          const std::shared_ptr<Store>& root_store, const CommOptions& options,
                                          std::unique_ptr<Backend> made) {
  const ::kiln::detail::LaunchEnv env = ::kiln::detail::launch_env();
  auto s = std::make_shared<CommState>(name, backend, prefix, rank, size, device, options);
  s->root_store = root_store;
  s->store = std::make_shared<PrefixStore>(prefix, root_store);
  auto wd = root_store->clone();
  wd->set_timeout(std::min(options.timeout, milliseconds(2000)));
  s->wd_store = std::make_shared<PrefixStore>(prefix, wd);
  const std::string what = s->describe();
  if (made) {
    s->backend = std::move(made);
  } else {
    join(what, *s->store, backend, rank, size, options.timeout);
    BackendInit init{name, rank, size, device, std::make_shared<PrefixStore>(backend, s->store), options.timeout,
                     listen_host(options, env), env.gloo_iface};
    try {
      s->backend = backend == "nccl" ? make_nccl_backend(init) : make_gloo_backend(init);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError("[new_comm] " + what + ": " + backend + " could not connect the ranks: " + e.what());
    }
  }
  s->start_threads();
  register_comm(s);
  s->log("create", {{"backend", backend}, {"device", device.str()}, {"prefix", prefix},
                    {"timeout_ms", options.timeout.count()}});
  return std::make_shared<Communicator>(s);
}

}  // namespace detail

std::shared_ptr<Communicator> new_comm(const std::string& backend, const Device& device, const std::string& name,
                                       const CommOptions& options) {
  constexpr const char* kOp = "new_comm";
  KILN_CHECK(backend == "gloo" || backend == "nccl", kOp, "unknown backend '", backend, "' (gloo or nccl)");
  KILN_CHECK(!name.empty(), kOp, "a communicator needs a name");
  KILN_CHECK(options.timeout.count() > 0, kOp, "the timeout must be positive");
  if (backend == "gloo")
    KILN_CHECK(device.is_cpu(), kOp, "gloo works on CPU tensors, got device ", device.str(), " (nccl: CUDA tensors)");
  else
    KILN_CHECK(device.is_cuda(), kOp, "nccl works on CUDA tensors, got device ", device.str());
#ifndef KILN_WITH_CUDA
  KILN_CHECK(backend != "nccl", kOp, "the nccl backend needs CUDA: kiln was built without CUDA");
#endif
  if (backend == "nccl")
    KILN_CHECK(device.index < cuda_device_count(), kOp, "nccl: no CUDA device ", device.str(), " (",
               cuda_device_count(), " visible)");
  int rank = options.rank, size = options.world_size;
  if (rank < 0 || size < 0) {
    const LaunchInfo li = launch_info();
    if (rank < 0) rank = li.rank;
    if (size < 0) size = li.world_size;
  }
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size, kOp, "rank ", rank, " is outside [0, ", size, ")");
  std::shared_ptr<Store> store = options.store ? options.store : default_store();
  // Ranks create communicators in the same order, so a per-name count makes the same prefix on all.
  static std::mutex mu;
  static std::map<std::string, int> generations;
  int gen;
  {
    std::lock_guard<std::mutex> lock(mu);
    gen = generations[name]++;
  }
  return detail::create_comm(backend, device, name, "kiln/" + name + "/" + std::to_string(gen), rank, size, store,
                             options);
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks, const std::string& name) {
  auto& s = *state_;
  constexpr const char* kOp = "split";
  KILN_CHECK(!name.empty(), kOp, s.describe(), ": the new communicator needs a name");
  KILN_CHECK(!ranks.empty(), kOp, s.describe(), ": no ranks given");
  std::vector<int> members = ranks;
  std::sort(members.begin(), members.end());
  for (size_t i = 0; i < members.size(); ++i) {
    KILN_CHECK(members[i] >= 0 && members[i] < s.size, kOp, s.describe(), ": rank ", members[i],
               " is outside the group [0, ", s.size, ")");
    KILN_CHECK(i == 0 || members[i] != members[i - 1], kOp, s.describe(), ": rank ", members[i], " is listed twice");
  }
  s.throw_if_aborted(kOp);
  const auto me = std::find(members.begin(), members.end(), s.rank);
  const bool member = me != members.end();
  const std::string key = name + "/" + detail::list_tag(members);
  int k;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    k = s.split_counts[key]++;
  }
  const CommOptions opts = get_options();
  const int new_rank = member ? static_cast<int>(me - members.begin()) : -1;
  const std::string prefix = s.prefix + "/split/" + key + "/" + std::to_string(k);
  std::unique_ptr<detail::Backend> made;
  if (s.backend->splits_through_parent()) {
    s.drain();  // the parent's collective split runs after the ops queued before it
    detail::BackendInit init{name, new_rank, static_cast<int>(members.size()), s.device, nullptr, opts.timeout, "", ""};
    made = s.backend->split(members, init);
  }
  if (!member) return nullptr;
  s.log("split", {{"child", name}, {"ranks", members}});
  return detail::create_comm(s.backend_name, s.device, name, prefix, new_rank, static_cast<int>(members.size()),
                             s.root_store, opts, std::move(made));
}

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude_ranks, const std::string& name) {
  auto& s = *state_;
  constexpr const char* kOp = "shrink";
  std::set<int> excluded;
  for (int r : exclude_ranks) {
    KILN_CHECK(r >= 0 && r < s.size, kOp, s.describe(), ": rank ", r, " is outside the group [0, ", s.size, ")");
    KILN_CHECK(excluded.insert(r).second, kOp, s.describe(), ": rank ", r, " is listed twice");
  }
  KILN_CHECK(!excluded.count(s.rank), kOp, s.describe(), ": this rank is in exclude_ranks (only survivors shrink)");
  std::vector<int> survivors;
  for (int r = 0; r < s.size; ++r)
    if (!excluded.count(r)) survivors.push_back(r);
  const int new_rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), s.rank) - survivors.begin());
  int k;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    k = s.shrink_count++;
  }
  const std::string new_name = name.empty() ? s.name + ".shrink" + std::to_string(k) : name;
  const std::vector<int> excl(excluded.begin(), excluded.end());
  const std::string prefix = s.prefix + "/shrink/" + std::to_string(k) + "/" + detail::list_tag(excl);
  const CommOptions opts = get_options();
  std::unique_ptr<detail::Backend> made;
  if (s.backend->splits_through_parent()) {
    if (!s.aborted) s.drain();  // a healthy parent shrinks after the ops queued before
    detail::BackendInit init{new_name, new_rank, static_cast<int>(survivors.size()), s.device,
                             std::make_shared<PrefixStore>(prefix + "/shrink", s.root_store), opts.timeout, "", ""};
    made = s.backend->shrink(excl, init);
  }
  s.log("shrink", {{"child", new_name}, {"excluded", excl}, {"new_rank", new_rank}});
  return detail::create_comm(s.backend_name, s.device, new_name, prefix, new_rank, static_cast<int>(survivors.size()),
                             s.root_store, opts, std::move(made));
}

void dump_flight_recorders() {
  std::vector<std::shared_ptr<detail::CommState>> live;
  {
    std::lock_guard<std::mutex> lock(detail::g_registry_mu);
    for (auto& w : detail::registry())
      if (auto s = w.lock()) live.push_back(s);
  }
  for (auto& s : live) s->dump(s->dump_path());
}

void enable_dump_on_signal(int signum) {
  struct sigaction sa {};
  sa.sa_handler = detail::on_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  KILN_CHECK(sigaction(signum, &sa, nullptr) == 0, "enable_dump_on_signal", "cannot handle signal ", signum);
}

}  // namespace kiln::dist
