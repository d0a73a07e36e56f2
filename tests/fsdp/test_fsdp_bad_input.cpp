// Ranks that disagree on the model get the same clear error on every rank (no hang, no corrupt
// shards); a module cannot be sharded twice.
#include "dist/harness.h"
#include "fsdp/tiny_net.h"

namespace kiln::dist::testing {

DIST_SCENARIO(fsdp_shape_mismatch) {
  auto comm = new_comm("gloo", kCPU, "fsdp_bad", child.options());
  TinyNetConfig cfg;
  if (child.rank == 1) cfg.hidden += 1;
  TinyNet net(cfg);
  try {
    fully_shard(*net.blocks[0], comm);
    ADD_FAILURE() << "ranks with different models were sharded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on the parameters"), std::string::npos) << e.what();
  }
  // The communicator is still in step: a collective after the error completes.
  Tensor t = full({4}, 1.0);
  comm->all_reduce(t);
  EXPECT_EQ(t.to_vector(), std::vector<double>(4, child.world));
}

TEST(FullyShardBadInput, RanksDisagreeingOnModelShape) {
  RunSpec spec("fsdp_shape_mismatch", 2);
  EXPECT_TRUE(ranks_ended(run_ranks(spec)));
}

TEST(FullyShardBadInput, ShardingTwiceIsRefused) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  o.trace_dir = ::testing::TempDir() + "/kiln_fsdp_twice";
  auto comm = new_comm("gloo", kCPU, "fsdp_twice", o);
  TinyNet net(TinyNetConfig{});
  fully_shard(*net.blocks[0], comm);
  EXPECT_THROW(fully_shard(*net.blocks[0], comm), Error);
}

}  // namespace kiln::dist::testing
