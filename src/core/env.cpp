// The only file of kiln that reads the process environment (core/env.h, kiln/tuning.h).
#include "core/env.h"

#include <cstdio>
#include <cstdlib>
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

std::string cache_dir() {
  if (const char* d = env("KILN_CACHE_DIR")) return d;
  if (const char* x = env("XDG_CACHE_HOME")) return std::string(x) + "/kiln";
  if (const char* home = env("HOME")) return std::string(home) + "/.cache/kiln";
  return {};
}

}  // namespace detail

}  // namespace kiln

namespace kiln::detail {

const char* env_switch(const char* op, const char* var, const char* a, const char* b) {
  const char* v = std::getenv(var);
  KILN_CHECK(!v || !std::strcmp(v, a) || !std::strcmp(v, b), op, var, " must be ", a, " or ", b, ", got '",
             v ? v : "", "'");
  return v;
}

bool env_flag(const char* op, const char* var, bool dflt) {
  const char* v = env_switch(op, var, "0", "1");
  return v ? v[0] == '1' : dflt;
}

}  // namespace kiln::detail
