#pragma once
// Sharded data-parallel training for `kiln train`: each rank holds 1/world of every parameter
// (fully_shard per block, the embedding and final norm in the root) and trains on its part of
// every global batch; `--nproc N` starts the ranks (as `kiln run` does) when no launcher did.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data.h"
#include "kiln/fsdp.h"
#include "kiln/optim.h"
#include "model.h"

namespace kiln::train {

struct Sharding {
  int rank = 0, world = 1;
  std::shared_ptr<dist::Communicator> comm;
  std::shared_ptr<dist::FSDPModule> root;
  bool active() const { return root != nullptr; }
};

// Shards the model over `comm` when given, else when this process is one of several launched
// ranks, or `force` (one rank: the sharded code path on its own). Gloo on the CPU, NCCL on CUDA.
Sharding shard_model(GPT& model, const Device& device, bool force, std::shared_ptr<dist::Communicator> comm = nullptr);
// The rank's rows of a global micro-batch: batch_size / world sequences.
Batch local_part(const Batch& global, int rank, int world);
// The mean of `value` over the ranks (value itself when not sharded).
double mean_over_ranks(const Sharding& sh, double value);
// Re-executes this command (/proc/self/cmdline) as nproc ranks under kiln's launcher; the exit
// status as `kiln run` gives it.
int spawn_ranks(int nproc);
// The process's peak resident memory (getrusage), bytes.
int64_t peak_rss_bytes();

// Sharded checkpoints: every rank writes its shards of the parameters and of the AdamW moments
// (dist::save_sharded: one file per rank, the index last) into <ckpt>/shards; rank 0 writes the
// rest of the checkpoint as a single-process run does (save_checkpoint without the tensor files).
void save_shards(const std::string& ckpt_dir, const Sharding& sh, const optim::AdamW& opt,
                 const std::vector<std::string>& opt_names);
// Loads them back at this run's world size (which may differ from the writer's).
void load_shards(const std::string& ckpt_dir, const Sharding& sh, optim::AdamW& opt,
                 const std::vector<std::string>& opt_names, const std::vector<int64_t>& adam_steps);

}  // namespace kiln::train
