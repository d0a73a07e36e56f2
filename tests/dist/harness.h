#pragma once
// Multi-process tests: a test (the parent) re-executes this binary once per rank with
// --gtest_filter=DistChild.Run and the scenario's name and rank as command-line arguments; the
// children run the scenario with gtest assertions and exit non-zero on a failure. The parent hosts
// the store (unless rank 0 should), bounds the run by a deadline, and always kills the children's
// process group when it ends early or fails; the children die with the parent (PR_SET_PDEATHSIG).
#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "support/testing.h"

namespace kiln::dist::testing {

// What a scenario sees in its child process.
struct Child {
  int rank = 0, world = 1;
  int store_port = 0;
  bool rank0_hosts = false;
  std::string dir;  // a scratch folder shared by the ranks of one run
  std::vector<std::pair<std::string, std::string>> args;

  std::string arg(const std::string& key, const std::string& dflt = "") const;
  int int_arg(const std::string& key, int dflt) const { return std::stoi(arg(key, std::to_string(dflt))); }
  // The run's store (rank 0 hosts it when rank0_hosts, else the parent does); one per process.
  std::shared_ptr<Store> store() const;
  // Options for new_comm: this rank, the store, a timeout, traces and log in dir.
  CommOptions options(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
};

using Scenario = void (*)(const Child&);
struct RegisterScenario {
  RegisterScenario(const char* name, Scenario fn);
};

// DIST_SCENARIO(name) { ... uses child ... }
#define DIST_SCENARIO(name)                                                                      \
  static void name##_scenario(const ::kiln::dist::testing::Child& child);                        \
  static const ::kiln::dist::testing::RegisterScenario name##_registered(#name, name##_scenario); \
  static void name##_scenario(const ::kiln::dist::testing::Child& child)

struct RunSpec {
  RunSpec(std::string scenario_name, int ranks, bool rank0_hosts_store = false)
      : scenario(std::move(scenario_name)), world(ranks), rank0_hosts(rank0_hosts_store) {}
  std::string scenario;
  int world = 2;
  bool rank0_hosts = false;
  std::vector<std::pair<std::string, std::string>> args;
  double deadline_s = 25;
  // Runs on a thread of the parent while the ranks run (the parent's store, the ranks' pids).
  std::function<void(Store*, const std::vector<pid_t>&)> during;
};

struct RunResult {
  std::vector<int> status;  // exit code, or 128 + signal
  std::vector<std::string> logs;
  bool deadline_hit = false;
  double seconds = 0;
  std::string dir;  // removed when the RunResult dies
  ~RunResult();
  RunResult() = default;
  RunResult(RunResult&&) = default;
};

RunResult run_ranks(const RunSpec& spec);
// Every rank exited 0 (or with `expected[r]` where given), before the deadline; the failing
// ranks' logs otherwise.
::testing::AssertionResult ranks_ended(const RunResult& r, const std::vector<int>& expected = {});

// Seeded test data: n values for (rank, salt), normal-ish floats or small integers of dtype.
Tensor make_input(DType dtype, int64_t n, int rank, int salt, bool for_product = false);

}  // namespace kiln::dist::testing
