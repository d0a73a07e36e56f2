#pragma once
// The process environment, read here and nowhere else in kiln (src/core/env.cpp): the tuning
// values (kiln/tuning.h) and the few paths kiln takes from the environment.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::detail {

// The folder of kiln's disk caches (compiled kernels): $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
// else $HOME/.cache/kiln; empty when none is set. set_cache_dir_override's folder replaces them.
std::string cache_dir();

// Points cache_dir() at `dir` for this process (tests give the kernel cache a scratch folder); ""
// returns it to the environment's.
void set_cache_dir_override(std::string dir);

// Where this process sits in a multi-process job, from the launcher's variables: torchrun's (and
// `kiln run`'s) RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT, else
// Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE with the master taken
// from MASTER_ADDR / MASTER_PORT or the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST and
// 10000 + SLURM_JOB_ID % 20000; else a single process.
struct LaunchEnv {
  std::string source = "none";  // "env" (torchrun, kiln run), "slurm" or "none"
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // kiln's key-value store: KILN_STORE_PORT when the launcher hosts it (`kiln run`), else
  // MASTER_PORT + 1 hosted by rank 0 (MASTER_PORT stays free for torch.distributed's own store,
  // which torchrun's agent or torch's rank 0 holds).
  int store_port = 29501;
  bool store_hosted_by_launcher = false;
  std::string gloo_iface;  // GLOO_SOCKET_IFNAME: the interface Gloo listens on ("" = by host name)
};

// Reads the variables through `lookup` (nullptr or "" for unset): tests pass a map, launch_env()
// passes the process environment. A malformed value throws kiln::Error naming the variable.
LaunchEnv parse_launch_env(const std::function<const char*(const char*)>& lookup);
LaunchEnv launch_env();

// This process's environment as "NAME=value" strings with `overrides` replacing or adding
// variables: what a launcher (`kiln run`) hands its children.
std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& overrides);

}  // namespace kiln::detail
