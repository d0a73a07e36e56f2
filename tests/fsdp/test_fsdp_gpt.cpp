// `kiln train`'s sharded path: the micro GPT over 2 Gloo ranks follows the 1-process loss curve on
// the same global batches (fp32 reduction order apart), resuming it from a sharded checkpoint
// reproduces the uninterrupted run bit for bit, and one rank (Gloo here, NCCL on a GPU) takes the
// same training steps as the plain run.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/harness.h"
#include "support/testing.h"
#include "train.h"
#include "train/micro_config.h"

namespace kiln::dist::testing {

namespace {

namespace fs = std::filesystem;

// The training tests' micro run on synthetic data, one thread a rank.
train::TrainConfig gpt_config(const std::string& run_dir) {
  train::TrainConfig c = train::testing::micro_test_config("", run_dir);
  c.synthetic = true;
  c.threads = 1;
  return c;
}

std::vector<double> read_losses(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f).get<std::vector<double>>();
}

}  // namespace

// args: run (run folder), stop_after, resume (0/1), out (losses file, written by rank 0)
DIST_SCENARIO(gpt_sharded_run) {
  auto comm = new_comm("gloo", kCPU, "train", child.options(std::chrono::seconds(60)));
  train::TrainConfig c = gpt_config(child.arg("run"));
  c.comm = comm;
  c.stop_after = child.int_arg("stop_after", 0);
  c.resume = child.int_arg("resume", 0) != 0;
  std::ostringstream sink;
  const train::TrainResult r = train::train(c, sink);
  if (child.rank == 0) std::ofstream(child.arg("out")) << nlohmann::json(r.train_losses).dump();
}

TEST(FullyShardGpt, TwoRanksFollowOneProcessAndResumeBitExact) {
  const std::string base = ::testing::TempDir() + "/kiln_fsdp_gpt";
  fs::remove_all(base);
  fs::create_directories(base);
  std::ostringstream sink;
  const train::TrainResult one = train::train(gpt_config(base + "/one"), sink);
  ASSERT_EQ(one.train_losses.size(), 6u);

  auto run = [&](const std::string& name, int stop_after, bool resume) {
    RunSpec spec("gpt_sharded_run", 2);
    spec.deadline_s = 50;
    spec.args = {{"run", base + "/" + name}, {"stop_after", std::to_string(stop_after)},
                 {"resume", resume ? "1" : "0"}, {"out", base + "/" + name + (resume ? ".resumed" : "") + ".json"}};
    EXPECT_TRUE(ranks_ended(run_ranks(spec)));
    return read_losses(base + "/" + name + (resume ? ".resumed" : "") + ".json");
  };
  const std::vector<double> sharded = run("two", 0, false);
  ASSERT_EQ(sharded.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(sharded[i], one.train_losses[i], 1e-4 * one.train_losses[i]) << "step " << i + 1;
  EXPECT_TRUE(fs::exists(base + "/two/checkpoints/step-0000006/shards/shard-1-of-2.safetensors"));

  const std::vector<double> first = run("half", 3, false);
  const std::vector<double> rest = run("half", 0, true);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i], sharded[i]) << "step " << i + 1;
    EXPECT_EQ(rest[i], sharded[3 + i]) << "step " << i + 4;
  }
  fs::remove_all(base);
}

}  // namespace kiln::dist::testing

namespace kiln::dist::testing {

namespace {

// The sharded path on one rank (`kiln train --fsdp`) against the plain run: the same first loss
// bit for bit (the gather and reduce-scatter of one rank copy), the next ones within the
// clipping's summation order.
void expect_one_rank_sharded_equals_plain(const std::string& device) {
  const std::string base = ::testing::TempDir() + "/kiln_fsdp_gpt_one_" + device.substr(0, 4);
  fs::remove_all(base);
  train::TrainConfig c = gpt_config(base + "/plain");
  c.device = device;
  c.steps = 3;
  c.checkpoint_every = 0;
  c.eval_every = 0;
  std::ostringstream sink;
  const train::TrainResult plain = train::train(c, sink);
  c.run_dir = base + "/sharded";
  c.fsdp = true;
  const train::TrainResult sharded = train::train(c, sink);
  ASSERT_EQ(plain.train_losses.size(), 3u);
  ASSERT_EQ(sharded.train_losses.size(), 3u);
  EXPECT_EQ(sharded.train_losses[0], plain.train_losses[0]);
  for (size_t i = 1; i < 3; ++i)
    EXPECT_NEAR(sharded.train_losses[i], plain.train_losses[i], 1e-5 * plain.train_losses[i]) << "step " << i + 1;
  fs::remove_all(base);
}

}  // namespace

TEST(FullyShardGpt, OneRankGlooStepEqualsUnsharded) { expect_one_rank_sharded_equals_plain("cpu"); }

TEST(FullyShardGpt, OneRankNcclStepEqualsUnsharded) {
  KILN_REQUIRE_CUDA();
  expect_one_rank_sharded_equals_plain("cuda");
}

}  // namespace kiln::dist::testing
