// fully_shard against plain training: ranks train on their slices of a global batch, a reference
// model in the same process trains on the whole batch; after N AdamW steps the gathered parameters
// match the reference within fp32 reduction-order tolerance (float64 norms).
#include <algorithm>
#include <cmath>
#include <map>

#include "dist/harness.h"
#include "fsdp/tiny_net.h"
#include "kiln/autograd.h"
#include "kiln/optim.h"

namespace kiln::dist::testing {

namespace {

double rel_err(const Tensor& out, const Tensor& ref) {
  const std::vector<double> a = out.to_vector(), b = ref.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Batch {
  Tensor x, y;
};

// The step's global batch: the same on every rank.
Batch global_batch(int step, int64_t rows, const TinyNetConfig& c) {
  manual_seed(1000 + step);
  return {randn({rows, c.in}), randn({rows, c.out})};
}

}  // namespace

// args: steps, per_rank (rows), separate_rs, reshard (0/1), bf16 (0/1)
DIST_SCENARIO(fsdp_train) {
  const int steps = child.int_arg("steps", 3);
  const int64_t per_rank = child.int_arg("per_rank", 4);
  const bool bf16 = child.int_arg("bf16", 0) != 0;
  auto comm = new_comm("gloo", kCPU, "fsdp", child.options());
  std::shared_ptr<Communicator> rs_comm;
  if (child.int_arg("separate_rs", 0) != 0) rs_comm = new_comm("gloo", kCPU, "fsdp_rs", child.options());

  TinyNetConfig cfg;
  manual_seed(7);
  TinyNet ref(cfg);
  manual_seed(7);
  TinyNet net(cfg);
  FullyShardOptions opts;
  opts.reshard_after_forward = child.int_arg("reshard", 1) != 0;
  if (bf16) opts.mp_policy = {kBFloat16, kFloat32};
  for (auto& b : net.blocks) fully_shard(*b, comm, opts);
  auto root = fully_shard(net, comm, opts);
  if (rs_comm) root->set_separate_reduce_scatter_group(rs_comm);
  ASSERT_TRUE(root->is_root());
  // Between steps the module's parameters are this rank's shards.
  const auto shards = net.named_parameters();
  ASSERT_EQ(shards.size(), ref.named_parameters().size());
  EXPECT_EQ(shards[0].second.size(0), (cfg.dim + child.world - 1) / child.world);

  optim::AdamWOptions ao;
  ao.lr = 1e-2;
  optim::AdamW ref_opt(ref.parameters(), ao), opt(net.parameters(), ao);
  const double tol = bf16 ? 3e-2 : 2e-5;
  // bf16 compute against the fp32 reference: a one-element shard (a bias row) summed in bf16 over
  // the batch with cancellation lands near 7%; the parameters after the steps are held to `tol`.
  const double grad_tol = bf16 ? 0.15 : 2e-5;
  for (int s = 0; s < steps; ++s) {
    Batch b = global_batch(s, per_rank * child.world, cfg);
    Tensor ref_loss = ref.loss(b.x, b.y);
    ref_loss.backward();

    Tensor x = b.x.narrow(0, child.rank * per_rank, per_rank);
    Tensor loss = net.loss(bf16 ? x.to(kBFloat16) : x, b.y.narrow(0, child.rank * per_rank, per_rank));
    loss.backward();
    root->finish_grad_sync();
    // Each shard's gradient: its rows of the global-batch gradient (Adam would hide a wrong scale).
    std::map<std::string, Tensor> ref_grads;
    for (auto& [name, p] : ref.named_parameters()) ref_grads[name] = p.grad();
    for (const ShardSpec& sp : root->shard_specs()) {
      ASSERT_TRUE(sp.shard.grad().defined()) << sp.name << " got no gradient";
      const int64_t c = sp.shard.size(0);
      const int64_t n = std::clamp<int64_t>(sp.full_shape.empty() ? 1 : sp.full_shape[0] - child.rank * c, 0, c);
      if (n == 0) continue;
      const Tensor want = ref_grads.at(sp.name).reshape(sp.shard.dim() == 1 && sp.full_shape.empty() ? Shape{1} : sp.full_shape);
      EXPECT_LT(rel_err(sp.shard.grad().narrow(0, 0, n), want.narrow(0, child.rank * c, n)), grad_tol) << sp.name;
    }
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
    Tensor mean_loss = loss.detach().to(kFloat32).reshape({1}).contiguous();
    comm->all_reduce(mean_loss, ReduceOp::AVG);
    EXPECT_NEAR(mean_loss.item(), ref_loss.item(), bf16 ? 2e-2 * std::abs(ref_loss.item()) : 1e-5 * std::abs(ref_loss.item()));
  }
  manual_seed(7);
  TinyNet initial(cfg);
  const auto init = initial.named_parameters();
  const auto full = root->full_parameters();
  const auto want = ref.named_parameters();
  ASSERT_EQ(full.size(), want.size());
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(full[i].first, want[i].first);
    ASSERT_EQ(full[i].second.sizes(), want[i].second.sizes()) << full[i].first;
    EXPECT_LT(rel_err(full[i].second, want[i].second), tol) << full[i].first;
    EXPECT_GT(rel_err(want[i].second, init[i].second), 1e-4) << full[i].first << " did not train";
  }
}

namespace {

void expect_ranks_match(int world, std::vector<std::pair<std::string, std::string>> args) {
  RunSpec spec("fsdp_train", world);
  spec.args = std::move(args);
  spec.deadline_s = 40;
  auto r = run_ranks(spec);
  EXPECT_TRUE(ranks_ended(r));
}

}  // namespace

TEST(FullyShard, MatchesUnshardedTwoRanks) { expect_ranks_match(2, {}); }
TEST(FullyShard, MatchesUnshardedFourRanks) { expect_ranks_match(4, {}); }
TEST(FullyShard, MatchesWithoutReshardAfterForward) { expect_ranks_match(2, {{"reshard", "0"}}); }
TEST(FullyShard, MatchesWithSeparateReduceScatterGroup) { expect_ranks_match(4, {{"separate_rs", "1"}}); }
TEST(FullyShard, MixedPrecisionBf16ComputeFp32Reduce) { expect_ranks_match(2, {{"bf16", "1"}}); }

}  // namespace kiln::dist::testing
