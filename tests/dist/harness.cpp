#include "dist/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace kiln::dist::testing {

namespace {

namespace fs = std::filesystem;

std::map<std::string, Scenario>& scenarios() {
  static std::map<std::string, Scenario> m;
  return m;
}

// This process's command line (children get theirs from the parent, never from the environment).
std::vector<std::string> own_args() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string a;
  while (std::getline(f, a, '\0')) out.push_back(a);
  return out;
}

int free_port() {
  // Bound by a throwaway server, then released for rank 0 to take.
  TCPStore probe("127.0.0.1", 0, true, std::chrono::seconds(5));
  return probe.port();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

RegisterScenario::RegisterScenario(const char* name, Scenario fn) { scenarios()[name] = fn; }

std::string Child::arg(const std::string& key, const std::string& dflt) const {
  for (const auto& [k, v] : args)
    if (k == key) return v;
  return dflt;
}

std::shared_ptr<Store> Child::store() const {
  static std::shared_ptr<Store> s;
  if (!s) s = std::make_shared<TCPStore>("127.0.0.1", store_port, rank0_hosts && rank == 0, std::chrono::seconds(10));
  return s;
}

CommOptions Child::options(std::chrono::milliseconds timeout) const {
  CommOptions o;
  o.store = store();
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  o.trace_dir = dir + "/trace";
  o.log_path = dir + "/events.jsonl";
  return o;
}

RunResult::~RunResult() {
  if (!dir.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

RunResult run_ranks(const RunSpec& spec) {
  RunResult res;
  char tmpl[] = "/tmp/kiln_dist_XXXXXX";
  res.dir = ::mkdtemp(tmpl);
  std::shared_ptr<TCPStore> store;
  int port;
  if (spec.rank0_hosts) {
    port = free_port();
  } else {
    store = std::make_shared<TCPStore>("127.0.0.1", 0, true, std::chrono::seconds(30));
    port = store->port();
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids(static_cast<size_t>(spec.world), -1);
  pid_t group = 0;
  for (int r = 0; r < spec.world; ++r) {
    std::vector<std::string> a = kiln::testing::self_command();
    for (std::string arg : {std::string("--gtest_filter=DistChild.Run"), "--dist-scenario=" + spec.scenario,
                            "--dist-rank=" + std::to_string(r), "--dist-world=" + std::to_string(spec.world),
                            "--dist-port=" + std::to_string(port), "--dist-dir=" + res.dir})
      a.push_back(std::move(arg));
    if (spec.rank0_hosts) a.push_back("--dist-rank0-hosts");
    for (const auto& [k, v] : spec.args) a.push_back("--dist-arg=" + k + "=" + v);
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string log = res.dir + "/rank" + std::to_string(r) + ".log";
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, group);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execvp(argv[0], argv.data());  // the emulator, if any, is found on PATH
      ::_exit(127);
    }
    ::close(fd);
    ::setpgid(pid, group);
    if (group == 0) group = pid;
    pids[static_cast<size_t>(r)] = pid;
  }
  std::thread during;
  if (spec.during) during = std::thread([&] { spec.during(store.get(), pids); });
  res.status.assign(static_cast<size_t>(spec.world), -1);
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(spec.deadline_s * 1000));
  for (;;) {
    int live = 0;
    for (int r = 0; r < spec.world; ++r) {
      if (res.status[r] >= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r])
        res.status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      else
        ++live;
    }
    if (live == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      res.deadline_hit = true;
      ::kill(-group, SIGKILL);  // the whole process group: nothing outlives a failed run
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (during.joinable()) during.join();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < spec.world; ++r) res.logs.push_back(read_file(res.dir + "/rank" + std::to_string(r) + ".log"));
  return res;
}

::testing::AssertionResult ranks_ended(const RunResult& r, const std::vector<int>& expected) {
  std::string why;
  if (r.deadline_hit) why += "the run passed its deadline and was killed\n";
  for (size_t i = 0; i < r.status.size(); ++i) {
    const int want = i < expected.size() ? expected[i] : 0;
    if (r.status[i] != want || r.deadline_hit)
      why += "rank " + std::to_string(i) + " ended with " + std::to_string(r.status[i]) + " (expected " +
             std::to_string(want) + "); its log:\n" + r.logs[i] + "\n";
  }
  if (why.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << why;
}

Tensor make_input(DType dtype, int64_t n, int rank, int salt, bool for_product) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank * 7919 + salt * 104729 + 1);
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double u = static_cast<double>(x % 1000003) / 1000003.0;  // [0, 1)
    if (is_floating_point(dtype)) e = for_product ? 0.5 + u : 4.0 * u - 2.0;
    else if (for_product) e = 1 + static_cast<double>(x % 3);
    else if (dtype == kUInt8) e = static_cast<double>(x % 40);
    else e = static_cast<double>(static_cast<int64_t>(x % 41) - 20);
  }
  return tensor(v, dtype);
}

}  // namespace kiln::dist::testing

// The child half of every multi-process test: runs the scenario named on the command line.
TEST(DistChild, Run) {
  using namespace kiln::dist::testing;
  Child c;
  std::string scenario;
  for (const auto& a : own_args()) {
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--dist-scenario=")) scenario = v;
    else if (const char* v2 = value("--dist-rank=")) c.rank = std::atoi(v2);
    else if (const char* v3 = value("--dist-world=")) c.world = std::atoi(v3);
    else if (const char* v4 = value("--dist-port=")) c.store_port = std::atoi(v4);
    else if (const char* v5 = value("--dist-dir=")) c.dir = v5;
    else if (a == "--dist-rank0-hosts") c.rank0_hosts = true;
    else if (const char* v6 = value("--dist-arg=")) {
      const std::string kv = v6;
      c.args.emplace_back(kv.substr(0, kv.find('=')), kv.substr(kv.find('=') + 1));
    }
  }
  if (scenario.empty()) GTEST_SKIP() << "only runs as a rank of a multi-process dist test";
  auto it = scenarios().find(scenario);
  ASSERT_NE(it, scenarios().end()) << "unknown scenario " << scenario;
  it->second(c);
}
