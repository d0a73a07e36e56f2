// The only file of kiln that reads the process environment (core/env.h, kiln/tuning.h).
#include "core/env.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <mutex>
#include <string>

#include "kiln/error.h"
#include "kiln/tuning.h"

namespace kiln {

namespace {

constexpr const char* kOp = "tuning";

const char* env(const char* var) {
  const char* v = std::getenv(var);
  return v && *v ? v : nullptr;
}

// KILN_X=MxN into (m, n); both positive.
void read_pair(const char* var, int& m, int& n) {
  const char* v = env(var);
  if (!v) return;
  int a = 0, b = 0;
  char tail = 0;
  KILN_CHECK(std::sscanf(v, "%dx%d%c", &a, &b, &tail) == 2 && a > 0 && b > 0, kOp, var, " must read MxN, got '", v,
             "'");
  m = a;
  n = b;
}

std::mutex g_mu;

Tuning& current() {
  static Tuning t = tuning_from_env();  // read once, on first use
  return t;
}

}  // namespace

Tuning tuning_from_env() {
  Tuning t;
  read_pair("KILN_FLEX_FWD_TILE", t.flex.fwd_tile_m, t.flex.fwd_tile_n);
  {  // KILN_FLEX_FWD_MIN_BLOCKS=N, KILN_FLEX_BWD_MIN_BLOCKS=DKDV,DQ: each from 1 to 8
    auto counts = [](const char* var, int n, int* out) {
      const char* v = env(var);
      if (!v) return;
      int c[2] = {0, 0};
      char tail = 0;
      const int got = n == 1 ? std::sscanf(v, "%d%c", &c[0], &tail) : std::sscanf(v, "%d,%d%c", &c[0], &c[1], &tail);
      KILN_CHECK(got == n && c[0] >= 1 && c[0] <= 8 && (n == 1 || (c[1] >= 1 && c[1] <= 8)), kOp, var,
                 n == 1 ? " must be a count from 1 to 8" : " must read DKDV,DQ, counts from 1 to 8", ", got '", v, "'");
      for (int i = 0; i < n; ++i) out[i] = c[i];
    };
    counts("KILN_FLEX_FWD_MIN_BLOCKS", 1, &t.flex.fwd_min_blocks);
    int bwd[2] = {t.flex.bwd_dkdv_min_blocks, t.flex.bwd_dq_min_blocks};
    counts("KILN_FLEX_BWD_MIN_BLOCKS", 2, bwd);
    t.flex.bwd_dkdv_min_blocks = bwd[0];
    t.flex.bwd_dq_min_blocks = bwd[1];
  }
  if (const char* v = env("KILN_GEMM_PICK")) t.gemm.pick = v;
  if (const char* v = env("KILN_JIT_WORKERS")) {
    char tail = 0;
    KILN_CHECK(std::sscanf(v, "%d%c", &t.jit.workers, &tail) == 1 && t.jit.workers >= 1 && t.jit.workers <= 256, kOp,
               "KILN_JIT_WORKERS must be a count from 1 to 256, got '", v, "'");
  }
  if (const char* v = env("KILN_JIT_TIMEOUT")) {
    char tail = 0;
    KILN_CHECK(std::sscanf(v, "%lf%c", &t.jit.timeout_s, &tail) == 1 && t.jit.timeout_s > 0, kOp,
               "KILN_JIT_TIMEOUT must be a positive number of seconds, got '", v, "'");
  }
  if (const char* v = env("KILN_CPU_GRAIN")) {  // elementwise=N,reduce=N,rows=N,gemm=N (any subset)
    const std::string spec = v;
    size_t pos = 0;
    while (pos < spec.size()) {
      const size_t end = std::min(spec.find(',', pos), spec.size());
      const std::string item = spec.substr(pos, end - pos);
      const size_t eq = item.find('=');
      char* tail = nullptr;
      const long long n = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &tail, 10);
      const std::string key = item.substr(0, eq);
      int64_t* field = key == "elementwise" ? &t.cpu.elementwise_grain
                       : key == "reduce"    ? &t.cpu.reduce_grain
                       : key == "rows"      ? &t.cpu.rows_grain
                       : key == "gemm"      ? &t.cpu.gemm_grain
                                            : nullptr;
      KILN_CHECK(field && n > 0 && tail && *tail == 0, kOp,
                 "KILN_CPU_GRAIN must read elementwise=N,reduce=N,rows=N,gemm=N with positive counts, got '", v, "'");
      *field = n;
      pos = end + 1;
    }
  }
  return t;
}

Tuning tuning() {
  std::lock_guard<std::mutex> lock(g_mu);
  return current();
}

void set_tuning(const Tuning& t) {
  std::lock_guard<std::mutex> lock(g_mu);
  current() = t;
}

TuningGuard::TuningGuard(const Tuning& t) : saved_(tuning()) { set_tuning(t); }
TuningGuard::~TuningGuard() { set_tuning(saved_); }

namespace detail {

namespace {
std::mutex g_cache_dir_mutex;
std::string g_cache_dir_override;  // guarded by g_cache_dir_mutex
}  // namespace

void set_cache_dir_override(std::string dir) {
  std::lock_guard<std::mutex> lock(g_cache_dir_mutex);
  g_cache_dir_override = std::move(dir);
}

std::string cache_dir() {
  {
    std::lock_guard<std::mutex> lock(g_cache_dir_mutex);
    if (!g_cache_dir_override.empty()) return g_cache_dir_override;
  }
  if (const char* d = env("KILN_CACHE_DIR")) return d;
  if (const char* x = env("XDG_CACHE_HOME")) return std::string(x) + "/kiln";
  if (const char* home = env("HOME")) return std::string(home) + "/.cache/kiln";
  return {};
}

namespace {

constexpr const char* kLaunchOp = "launch_env";

int parse_int(const char* var, const char* v, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  KILN_CHECK(errno == 0 && end != v && *end == 0 && x >= lo && x <= hi, kLaunchOp, var,
             " must be an integer in [", lo, ", ", hi, "], got '", v, "'");
  return static_cast<int>(x);
}

// The first host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& list) {
  const size_t cut = list.find_first_of(",[");
  if (cut == std::string::npos || list[cut] == ',') return list.substr(0, cut);
  const size_t end = list.find_first_of(",-]", cut + 1);
  return list.substr(0, cut) + list.substr(cut + 1, end - cut - 1);
}

}  // namespace

LaunchEnv parse_launch_env(const std::function<const char*(const char*)>& lookup) {
  auto get = [&](const char* var) -> const char* {
    const char* v = lookup(var);
    return v && *v ? v : nullptr;
  };
  constexpr int kMaxRanks = 1 << 24;
  LaunchEnv e;
  const char* master_port = get("MASTER_PORT");
  // torchrun's and Slurm's names for the same four numbers.
  struct Names {
    const char *source, *rank, *world, *local_rank, *local_world;
  };
  constexpr Names kTorchrun{"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  constexpr Names kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  auto read_ranks = [&](const Names& n) {
    if (!get(n.rank) || !get(n.world)) return false;
    e.source = n.source;
    e.world_size = parse_int(n.world, get(n.world), 1, kMaxRanks);
    e.rank = parse_int(n.rank, get(n.rank), 0, e.world_size - 1);
    if (const char* v = get(n.local_rank)) e.local_rank = parse_int(n.local_rank, v, 0, kMaxRanks);
    e.local_world_size = e.world_size;
    if (const char* v = get(n.local_world)) e.local_world_size = parse_int(n.local_world, v, 1, kMaxRanks);
    return true;
  };
  if (!read_ranks(kTorchrun) && read_ranks(kSlurm)) {
    const char* nodes = get("SLURM_STEP_NODELIST") ? get("SLURM_STEP_NODELIST") : get("SLURM_JOB_NODELIST");
    if (nodes) e.master_addr = first_slurm_host(nodes);
    if (!master_port)
      if (const char* job = get("SLURM_JOB_ID")) e.master_port = 10000 + parse_int("SLURM_JOB_ID", job, 0, 1 << 30) % 20000;
  }
  if (const char* v = get("MASTER_ADDR")) e.master_addr = v;
  if (master_port) e.master_port = parse_int("MASTER_PORT", master_port, 1, 65534);
  e.store_port = e.master_port + 1;
  if (const char* v = get("KILN_STORE_PORT")) {
    e.store_port = parse_int("KILN_STORE_PORT", v, 1, 65535);
    e.store_hosted_by_launcher = true;
  }
  if (const char* v = get("GLOO_SOCKET_IFNAME")) e.gloo_iface = v;
  return e;
}

LaunchEnv launch_env() {
  return parse_launch_env([](const char* var) { return std::getenv(var); });
}

std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, v] : overrides) replaced = replaced || k == name;
    if (!replaced) out.push_back(kv);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

}  // namespace detail

}  // namespace kiln
