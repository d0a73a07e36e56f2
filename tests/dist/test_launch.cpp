// Launchers: torchrun's and Slurm's variables, and run_local (`kiln run`): children with those
// variables and the launcher's store, a communicator made from them alone, the first failure's
// exit status with the other children ended.
#include <signal.h>

#include <chrono>
#include <map>
#include <thread>

#include "core/env.h"
#include "dist/harness.h"

namespace kiln::dist::testing {

namespace {

using ::kiln::detail::LaunchEnv;
using ::kiln::detail::parse_launch_env;

LaunchEnv parse(const std::map<std::string, std::string>& vars) {
  return parse_launch_env([&](const char* k) -> const char* {
    auto it = vars.find(k);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(DistLaunch, TorchrunVariables) {
  const LaunchEnv e = parse({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                             {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29400"}, {"GLOO_SOCKET_IFNAME", "eth1"}});
  EXPECT_EQ(e.source, "env");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_EQ(e.store_port, 29401);  // MASTER_PORT stays torch's
  EXPECT_FALSE(e.store_hosted_by_launcher);
  EXPECT_EQ(e.gloo_iface, "eth1");
}

TEST(DistLaunch, SlurmVariables) {
  const LaunchEnv e = parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                             {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_STEP_NODELIST", "gpu[03-05,9],cpu1"},
                             {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu03");
  EXPECT_EQ(e.master_port, 10000 + 123456 % 20000);
  EXPECT_EQ(parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a1,b2"}}).master_addr, "a1");
  // torchrun's variables win over Slurm's (torchrun started inside an allocation).
  EXPECT_EQ(parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}).source, "env");
}

TEST(DistLaunch, NoLauncherIsOneProcess) {
  const LaunchEnv e = parse({});
  EXPECT_EQ(e.source, "none");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(DistLaunch, LauncherHostedStoreAndBadValues) {
  const LaunchEnv e = parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}, {"KILN_STORE_PORT", "4711"}});
  EXPECT_TRUE(e.store_hosted_by_launcher);
  EXPECT_EQ(e.store_port, 4711);
  EXPECT_THROW(parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), Error);
  EXPECT_THROW(parse({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), Error);
  try {
    parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
    ADD_FAILURE() << "MASTER_PORT 70000 accepted";
  } catch (const Error& e2) {
    EXPECT_NE(std::string(e2.what()).find("MASTER_PORT"), std::string::npos) << e2.what();
  }
}

// A child of run_local: everything from the launcher's variables (launch_info, default_store, new_comm).
DIST_SCENARIO(launched_by_run_local) {
  const LaunchInfo li = launch_info();
  EXPECT_EQ(li.source, "env");
  EXPECT_EQ(li.world_size, 3);
  EXPECT_EQ(li.local_rank, li.rank);
  EXPECT_EQ(li.master_addr, "127.0.0.1");
  EXPECT_GT(li.master_port, 0);
  CommOptions o;
  o.trace_dir = child.dir + "/trace";
  o.timeout = std::chrono::seconds(10);
  auto comm = new_comm("gloo", kCPU, "main", o);
  EXPECT_EQ(comm->get_rank(), li.rank);
  Tensor t = full({10}, li.rank + 1, kInt64);
  comm->all_reduce(t);
  EXPECT_EQ(t.to_vector()[0], 1 + 2 + 3);
  comm->barrier();
}

DIST_SCENARIO(rank1_fails) {
  if (launch_info().rank == 1) {
    std::fflush(nullptr);
    ::_exit(3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));  // ended by the launcher
}

namespace {
std::vector<std::string> child_command(const std::string& scenario, const std::string& dir) {
  std::vector<std::string> command = kiln::testing::self_command();
  for (std::string arg : {std::string("--gtest_filter=DistChild.Run"), "--dist-scenario=" + scenario, "--dist-dir=" + dir})
    command.push_back(std::move(arg));
  return command;
}
}  // namespace

TEST(DistLaunch, RunLocalGivesChildrenTheirRanksAndAStore) {
  const std::string dir = ::testing::TempDir() + "/kiln_run_local";
  LaunchOptions o;
  o.nproc = 3;
  o.command = child_command("launched_by_run_local", dir);
  EXPECT_EQ(run_local(o), 0);
}

TEST(DistLaunch, RunLocalEndsTheOthersAndReturnsTheFirstFailure) {
  LaunchOptions o;
  o.nproc = 3;
  o.command = child_command("rank1_fails", ::testing::TempDir());
  o.kill_grace = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(run_local(o), 3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  LaunchOptions missing;
  missing.nproc = 2;
  missing.command = {"/nonexistent/program"};
  EXPECT_EQ(run_local(missing), 127);
}

}  // namespace kiln::dist::testing

namespace kiln::dist::testing {

// The harness itself: a failing rank and a hanging rank are reported, and nothing outlives the run.
DIST_SCENARIO(harness_fails_or_hangs) {
  if (child.rank == 0) ADD_FAILURE() << "deliberate failure";
  if (child.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST(DistHarness, ReportsFailuresAndKillsHangingRanks) {
  RunSpec spec("harness_fails_or_hangs", 3);
  spec.deadline_s = 2;
  const auto r = run_ranks(spec);
  EXPECT_TRUE(r.deadline_hit);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_EQ(r.status[0], 1);
  EXPECT_EQ(r.status[1], 128 + SIGKILL);
  EXPECT_EQ(r.status[2], 0);
  EXPECT_FALSE(ranks_ended(r));
  EXPECT_NE(r.logs[0].find("deliberate failure"), std::string::npos) << r.logs[0];
}

}  // namespace kiln::dist::testing
