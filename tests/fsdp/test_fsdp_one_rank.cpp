// One rank (Gloo on the CPU; NCCL on a GPU when present): the sharded path runs training steps
// with the same losses and parameters as the unsharded model, and a parameter on another device
// than the communicator's is refused.
#include <chrono>

#include "dist/harness.h"
#include "fsdp/tiny_net.h"
#include "kiln/optim.h"
#include "support/testing.h"

namespace kiln::dist::testing {

namespace {

std::shared_ptr<Communicator> one_rank_comm(const std::string& backend, const Device& device) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(60);
  o.trace_dir = ::testing::TempDir() + "/kiln_fsdp_one";
  return new_comm(backend, device, "fsdp_one_" + backend, o);
}

// Three AdamW steps on the same batches: sharded and plain give the same losses and parameters.
void expect_sharded_step_equals_plain(const std::string& backend, const Device& device) {
  auto comm = one_rank_comm(backend, device);
  TinyNetConfig cfg;
  manual_seed(11);
  TinyNet plain(cfg);
  plain.to(device);
  manual_seed(11);
  TinyNet net(cfg);
  net.to(device);
  for (auto& b : net.blocks) fully_shard(*b, comm);
  auto root = fully_shard(net, comm);
  optim::AdamW plain_opt(plain.parameters()), opt(net.parameters());
  for (int step = 0; step < 3; ++step) {
    manual_seed(70 + step);
    const Tensor x = randn({8, cfg.in}).to(device), y = randn({8, cfg.out}).to(device);
    Tensor want = plain.loss(x, y);
    want.backward();
    plain_opt.step();
    plain_opt.zero_grad();
    Tensor got = net.loss(x, y);
    got.backward();
    root->finish_grad_sync();
    opt.step();
    opt.zero_grad();
    EXPECT_EQ(got.item(), want.item()) << "step " << step;
  }
  const auto full = root->full_parameters(), ref = plain.named_parameters();
  ASSERT_EQ(full.size(), ref.size());
  for (size_t i = 0; i < full.size(); ++i)
    EXPECT_EQ(full[i].second.cpu().to_vector(), ref[i].second.cpu().to_vector()) << ref[i].first;
}

}  // namespace

TEST(FullyShardOneRank, GlooStepsEqualUnsharded) { expect_sharded_step_equals_plain("gloo", kCPU); }

TEST(FullyShardOneRank, NcclStepsEqualUnsharded) {
  KILN_REQUIRE_CUDA();
  expect_sharded_step_equals_plain("nccl", Device("cuda:0"));
}

TEST(FullyShardOneRank, ParameterOnAnotherDeviceIsRefused) {
  KILN_REQUIRE_CUDA();
  auto comm = one_rank_comm("gloo", kCPU);
  TinyNet net(TinyNetConfig{});
  net.blocks[1]->up->to(Device("cuda:0"));
  try {
    fully_shard(*net.blocks[1], comm);
    ADD_FAILURE() << "a CUDA parameter was sharded over a CPU communicator";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different devices"), std::string::npos) << e.what();
  }
}

}  // namespace kiln::dist::testing
