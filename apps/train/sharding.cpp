// Sharded training helpers: the communicator and fully_shard layout of the GPT, the rank's slice
// of a batch, and the re-launch of `kiln train --nproc N` as N ranks.
#include "sharding.h"

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace kiln::train {

Sharding shard_model(GPT& model, const Device& device, bool force, std::shared_ptr<dist::Communicator> comm) {
  Sharding sh;
  if (!comm && dist::launch_info().world_size <= 1 && !force) return sh;
  dist::CommOptions o;
  o.timeout = std::chrono::minutes(5);  // ranks wait for each other through data preparation
  sh.comm = comm ? std::move(comm) : dist::new_comm(device.is_cuda() ? "nccl" : "gloo", device, "train", o);
  sh.rank = sh.comm->get_rank();
  sh.world = sh.comm->get_size();
  for (const auto& blk : model.blocks()) dist::fully_shard(*blk, sh.comm);
  sh.root = dist::fully_shard(model, sh.comm);
  return sh;
}

Batch local_part(const Batch& global, int rank, int world) {
  const int64_t rows = global.input.size(0);
  KILN_CHECK(rows % world == 0, "train", "--batch-size ", rows, " does not divide over ", world, " ranks");
  const int64_t n = rows / world;
  Batch b;
  b.input = global.input.narrow(0, rank * n, n).contiguous();
  b.target = global.target.narrow(0, rank * n, n).contiguous();
  b.doc_ids = global.doc_ids.narrow(0, rank * n, n).contiguous();
  const std::vector<double> t = b.target.to_vector();
  b.tokens = 0;
  for (double v : t) b.tokens += v != -100;
  return b;
}

double mean_over_ranks(const Sharding& sh, double value) {
  if (!sh.active()) return value;
  Tensor t = tensor({value}, TensorOptions().dtype(kFloat64).device(sh.comm->get_device()));
  sh.comm->all_reduce(t, dist::ReduceOp::AVG);
  return t.cpu().item();
}

int spawn_ranks(int nproc) {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  dist::LaunchOptions lo;
  lo.nproc = nproc;
  lo.command.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  size_t start = all.find('\0') + 1;  // argv[0] replaced by the executable itself
  while (start < all.size()) {
    const size_t end = all.find('\0', start);
    lo.command.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return dist::run_local(lo);
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

namespace {

// The parameters' specs in the optimizer's order (opt_names), plus the moments' specs where set.
std::vector<dist::ShardSpec> train_specs(const Sharding& sh, const optim::AdamW& opt,
                                         const std::vector<std::string>& opt_names, bool with_moments) {
  std::map<std::string, dist::ShardSpec> by_name;
  for (dist::ShardSpec& sp : sh.root->shard_specs()) by_name[sp.name] = sp;
  std::vector<dist::ShardSpec> out;
  for (size_t i = 0; i < opt_names.size(); ++i) {
    const dist::ShardSpec& p = by_name.at(opt_names[i]);
    out.push_back({"model." + p.name, p.full_shape, p.shard});
    if (!with_moments) continue;
    const optim::AdamWState& st = opt.state()[i];
    if (st.exp_avg.defined()) {
      out.push_back({"exp_avg." + p.name, p.full_shape, st.exp_avg});
      out.push_back({"exp_avg_sq." + p.name, p.full_shape, st.exp_avg_sq});
    }
  }
  return out;
}

}  // namespace

void save_shards(const std::string& ckpt_dir, const Sharding& sh, const optim::AdamW& opt,
                 const std::vector<std::string>& opt_names) {
  dist::save_sharded((std::filesystem::path(ckpt_dir) / "shards").string(), train_specs(sh, opt, opt_names, true),
                     *sh.comm, {{"format", "kiln-gpt"}});
}

void load_shards(const std::string& ckpt_dir, const Sharding& sh, optim::AdamW& opt,
                 const std::vector<std::string>& opt_names, const std::vector<int64_t>& adam_steps) {
  const std::string dir = (std::filesystem::path(ckpt_dir) / "shards").string();
  KILN_CHECK(adam_steps.size() == opt_names.size(), "train", "optimizer state for ", adam_steps.size(),
             " parameters, the model has ", opt_names.size());
  std::vector<dist::ShardSpec> specs = train_specs(sh, opt, opt_names, false);
  std::vector<optim::AdamWState> state(opt_names.size());
  for (size_t i = 0; i < opt_names.size(); ++i) {
    state[i].step = adam_steps[i];
    if (adam_steps[i] == 0) continue;
    const dist::ShardSpec p = specs[i];  // a copy: specs grows below
    state[i].exp_avg = zeros(p.shard.sizes(), p.shard.options());
    state[i].exp_avg_sq = zeros(p.shard.sizes(), p.shard.options());
    const std::string name = p.name.substr(6);  // without "model."
    specs.push_back({"exp_avg." + name, p.full_shape, state[i].exp_avg});
    specs.push_back({"exp_avg_sq." + name, p.full_shape, state[i].exp_avg_sq});
  }
  dist::load_sharded(dir, specs, *sh.comm);
  opt.load_state(state);
}

}  // namespace kiln::train
