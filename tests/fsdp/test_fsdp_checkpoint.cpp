// Sharded checkpoints: written by 4 ranks, read back by 2 ranks (re-sharded) and unsharded, with
// identical tensors; a checkpoint missing a shard fails with a clear error.
#include <filesystem>

#include "dist/harness.h"
#include "fsdp/tiny_net.h"
#include "kiln/autograd.h"

namespace kiln::dist::testing {

namespace {

namespace fs = std::filesystem;
TinyNetConfig ckpt_config() { return TinyNetConfig{/*in=*/5, /*dim=*/10, /*hidden=*/14, /*out=*/3, /*blocks=*/2}; }

// Parameters that differ from any fresh init: a seeded perturbation of every weight.
void perturb(nn::Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  manual_seed(seed);
  for (auto& [name, p] : m.named_parameters()) p.copy_(add(p, randn(p.sizes())));
}

std::shared_ptr<FSDPModule> shard_net(TinyNet& net, const std::shared_ptr<Communicator>& comm) {
  for (auto& b : net.blocks) fully_shard(*b, comm);
  return fully_shard(net, comm);
}

}  // namespace

// args: out (folder). Saves the perturbed model from every rank.
DIST_SCENARIO(fsdp_ckpt_save) {
  auto comm = new_comm("gloo", kCPU, "fsdp_ckpt", child.options());
  manual_seed(1);
  TinyNet net(ckpt_config());
  perturb(net, 99);
  auto root = shard_net(net, comm);
  save_sharded(child.arg("out"), root->shard_specs(), *comm, {{"step", "12"}});
}

// args: in (folder). Loads into a freshly initialised sharded model and checks every gathered
// parameter against the perturbed model built in this process.
DIST_SCENARIO(fsdp_ckpt_load) {
  auto comm = new_comm("gloo", kCPU, "fsdp_ckpt", child.options());
  manual_seed(1);
  TinyNet want(ckpt_config());
  perturb(want, 99);
  manual_seed(2);
  TinyNet net(ckpt_config());
  auto root = shard_net(net, comm);
  load_sharded(child.arg("in"), root->shard_specs(), *comm);
  EXPECT_EQ(sharded_metadata(child.arg("in")).at("step"), "12");
  const auto full = root->full_parameters();
  const auto ref = want.named_parameters();
  ASSERT_EQ(full.size(), ref.size());
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(full[i].first, ref[i].first);
    EXPECT_EQ(full[i].second.to_vector(), ref[i].second.to_vector()) << full[i].first;
  }
}

TEST(FullyShardCheckpoint, FourRanksWriteTwoRanksAndUnshardedRead) {
  const std::string dir = ::testing::TempDir() + "/kiln_fsdp_ckpt4";
  fs::remove_all(dir);
  RunSpec save("fsdp_ckpt_save", 4);
  save.args = {{"out", dir}};
  ASSERT_TRUE(ranks_ended(run_ranks(save)));
  EXPECT_TRUE(fs::exists(dir + "/index.json"));
  EXPECT_TRUE(fs::exists(dir + "/shard-3-of-4.safetensors"));

  RunSpec load("fsdp_ckpt_load", 2);
  load.args = {{"in", dir}};
  EXPECT_TRUE(ranks_ended(run_ranks(load)));

  // Unsharded: the whole tensors into a plain model.
  manual_seed(1);
  TinyNet want(ckpt_config());
  perturb(want, 99);
  const io::TensorDict whole = load_sharded_full(dir);
  manual_seed(3);
  TinyNet plain(ckpt_config());
  {
    NoGradGuard no_grad;
    for (auto& [name, p] : plain.named_parameters()) p.copy_(whole.at(name));
  }
  const auto got = plain.named_parameters(), ref = want.named_parameters();
  ASSERT_EQ(whole.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i].second.to_vector(), ref[i].second.to_vector()) << ref[i].first;

  // A missing shard: a clear error naming the file.
  fs::remove(dir + "/shard-2-of-4.safetensors");
  try {
    load_sharded_full(dir);
    ADD_FAILURE() << "a checkpoint without shard 2 loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing shard-2-of-4.safetensors"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(FullyShardCheckpoint, FolderWithoutIndexIsNotACheckpoint) {
  const std::string dir = ::testing::TempDir() + "/kiln_fsdp_noindex";
  fs::create_directories(dir);
  EXPECT_THROW(load_sharded_full(dir), Error);
  fs::remove_all(dir);
}

}  // namespace kiln::dist::testing
