// The overlap fully_shard promises, read from `kiln trace export`: with a separate reduce-scatter
// communicator some all-gather and reduce-scatter intervals of a rank overlap; on one communicator
// they never do (its operations run one at a time).
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dist/harness.h"
#include "fsdp/tiny_net.h"
#include "kiln/optim.h"

namespace kiln::dist::testing {

// args: separate_rs (0/1)
DIST_SCENARIO(fsdp_trace_step) {
  auto comm = new_comm("gloo", kCPU, "fsdp_ag", child.options());
  std::shared_ptr<Communicator> rs_comm;
  if (child.int_arg("separate_rs", 0) != 0) rs_comm = new_comm("gloo", kCPU, "fsdp_rs", child.options());
  TinyNetConfig cfg{/*in=*/64, /*dim=*/256, /*hidden=*/1024, /*out=*/8, /*blocks=*/4};
  manual_seed(3);
  TinyNet net(cfg);
  for (auto& b : net.blocks) fully_shard(*b, comm);
  auto root = fully_shard(net, comm);
  if (rs_comm) root->set_separate_reduce_scatter_group(rs_comm);
  optim::AdamW opt(net.parameters());
  for (int step = 0; step < 2; ++step) {
    manual_seed(50 + step);
    Tensor loss = net.loss(randn({16, cfg.in}), randn({16, cfg.out}));
    loss.backward();
    root->finish_grad_sync();
    opt.step();
    opt.zero_grad();
  }
  comm->dump_flight_recorder();
  if (rs_comm) rs_comm->dump_flight_recorder();
}

namespace {

struct Interval {
  double start, end;
};

// Per process: whether an all-gather and a reduce-scatter interval overlap.
std::map<int64_t, bool> overlaps_per_rank(const std::string& trace_json) {
  std::ifstream f(trace_json);
  const auto j = nlohmann::json::parse(f);
  std::map<int64_t, std::vector<Interval>> ag, rs;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    const Interval iv{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    if (name.find("all_gather") != std::string::npos) ag[e["pid"]].push_back(iv);
    if (name.find("reduce_scatter") != std::string::npos) rs[e["pid"]].push_back(iv);
  }
  std::map<int64_t, bool> out;
  for (auto& [pid, list] : ag) {
    EXPECT_FALSE(rs[pid].empty()) << "no reduce-scatter recorded";
    bool any = false;
    for (const Interval& a : list)
      for (const Interval& r : rs[pid]) any = any || (a.start < r.end && r.start < a.end);
    out[pid] = any;
  }
  return out;
}

std::map<int64_t, bool> run_and_export(bool separate_rs) {
  RunSpec spec("fsdp_trace_step", 2);
  spec.args = {{"separate_rs", separate_rs ? "1" : "0"}};
  auto r = run_ranks(spec);
  EXPECT_TRUE(ranks_ended(r));
  const std::string out = r.dir + "/trace.json";
  export_chrome_trace(r.dir + "/trace", out);
  return overlaps_per_rank(out);
}

}  // namespace

TEST(FullyShardTrace, SeparateReduceScatterGroupOverlapsAllGather) {
  const auto overlap = run_and_export(true);
  ASSERT_EQ(overlap.size(), 2u);
  bool any = false;
  for (auto& [pid, o] : overlap) any = any || o;
  EXPECT_TRUE(any) << "no all-gather overlapped a reduce-scatter on any rank";
}

TEST(FullyShardTrace, OneCommunicatorNeverOverlaps) {
  const auto overlap = run_and_export(false);
  ASSERT_EQ(overlap.size(), 2u);
  for (auto& [pid, o] : overlap) EXPECT_FALSE(o) << "pid " << pid;
}

}  // namespace kiln::dist::testing
