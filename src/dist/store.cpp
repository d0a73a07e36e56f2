// HashStore, PrefixStore, and the process's default store from the launcher's variables.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "core/env.h"
#include "kiln/dist.h"

namespace kiln::dist {

using std::chrono::milliseconds;

// ---- HashStore ----

struct HashStore::State {
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<std::string, std::string> data;
};

HashStore::HashStore() : state_(std::make_shared<State>()) {}

void HashStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->data[key] = value;
  state_->cv.notify_all();
}

std::string HashStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->data.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::string& v = state_->data[key];
  char* end = nullptr;
  const long long old = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && *end != 0) throw CommError("[HashStore] add: the value of '" + key + "' is not an integer");
  v = std::to_string(old + delta);
  state_->cv.notify_all();
  return old + delta;
}

std::string HashStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->data.find(key);
  const std::string current = it == state_->data.end() ? std::string() : it->second;
  if (current != expected) return current;
  state_->data[key] = desired;
  state_->cv.notify_all();
  return desired;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (const auto& k : keys)
    if (!state_->data.count(k)) return false;
  return true;
}

void HashStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  const bool ok = state_->cv.wait_for(lock, timeout, [&] {
    for (const auto& k : keys)
      if (!state_->data.count(k)) return false;
    return true;
  });
  if (!ok) {
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
    throw TimeoutError("[HashStore] wait for " + list + " timed out after " + std::to_string(timeout.count()) + " ms");
  }
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->data.erase(key) > 0;
}

std::vector<std::pair<bool, std::string>> HashStore::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<std::pair<bool, std::string>> out;
  for (const auto& k : keys) {
    auto it = state_->data.find(k);
    out.emplace_back(it != state_->data.end(), it != state_->data.end() ? it->second : std::string());
  }
  return out;
}

std::shared_ptr<Store> HashStore::clone() const {
  auto c = std::make_shared<HashStore>();
  c->state_ = state_;
  c->timeout_ = timeout_;
  return c;
}

// ---- PrefixStore ----

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  KILN_CHECK(store_ != nullptr, "PrefixStore", "no underlying store");
  timeout_ = store_->timeout();
}

void PrefixStore::set(const std::string& k, const std::string& value) { store_->set(key(k), value); }
std::string PrefixStore::get(const std::string& k) { return store_->get(key(k)); }
int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }
std::string PrefixStore::compare_set(const std::string& k, const std::string& expected, const std::string& desired) {
  return store_->compare_set(key(k), expected, desired);
}
bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }

namespace {
std::vector<std::string> prefixed(const std::string& prefix, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(prefix + "/" + k);
  return out;
}
}  // namespace

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(prefixed(prefix_, keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  store_->wait(prefixed(prefix_, keys), timeout);
}
std::vector<std::pair<bool, std::string>> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return store_->multi_get(prefixed(prefix_, keys));
}
std::shared_ptr<Store> PrefixStore::clone() const {
  auto c = std::make_shared<PrefixStore>(prefix_, store_->clone());
  c->set_timeout(timeout_);
  return c;
}

// ---- launch ----

LaunchInfo launch_info() {
  const ::kiln::detail::LaunchEnv e = ::kiln::detail::launch_env();
  return {e.source, e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr, e.master_port, e.store_port};
}

std::shared_ptr<Store> default_store() {
  static std::mutex mu;
  static std::shared_ptr<Store> store;
  std::lock_guard<std::mutex> lock(mu);
  if (!store) {
    const ::kiln::detail::LaunchEnv e = ::kiln::detail::launch_env();
    if (e.world_size == 1 && e.source == "none") {
      store = std::make_shared<HashStore>();
    } else {
      const bool host = e.rank == 0 && !e.store_hosted_by_launcher;
      store = std::make_shared<TCPStore>(e.master_addr, e.store_port, host);
    }
  }
  return store;
}

}  // namespace kiln::dist
