// The flight recorder and `kiln trace`: a seeded desync found by the analysis (right rank, right
// sequence number), the Chrome export, the bounded ring, dumps on request and on a signal, and the
// life-cycle log.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "dist/harness.h"

namespace kiln::dist::testing {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

CommOptions one_rank_options(const std::string& dir) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  o.trace_dir = dir;
  o.log_path = dir + "/events.jsonl";
  return o;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/kiln_trace_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

// At seq `bad_seq`, rank `bad_rank` calls a different size (or a different op): every rank gets the
// same clear error, the communicator stays usable, and each rank dumps its flight recorder.
DIST_SCENARIO(seeded_desync) {
  const int bad_rank = child.int_arg("bad_rank", 0), bad_seq = child.int_arg("bad_seq", 0);
  const bool op_desync = child.arg("kind") == "op";
  auto comm = new_comm("gloo", kCPU, "main", child.options());
  for (int s = 0; s < bad_seq; ++s) {
    Tensor t = full({64}, 1, kFloat32);
    comm->all_reduce(t);
  }
  const bool bad = child.rank == bad_rank;
  Tensor t = full({bad && !op_desync ? 63 : 64}, 1, kFloat32);
  try {
    if (bad && op_desync) comm->broadcast(t, 0);
    else comm->all_reduce(t);
    ADD_FAILURE() << "the desynchronised collective succeeded";
  } catch (const CommError& e) {
    ADD_FAILURE() << "a disagreement must not abort the communicator: " << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("seq " + std::to_string(bad_seq)), std::string::npos) << msg;
    const std::string odd = "rank " + std::to_string(bad_rank) + (op_desync ? " broadcast float32 numel 64 root 0"
                                                                             : " all_reduce(sum) float32 numel 63");
    EXPECT_NE(msg.find(odd), std::string::npos) << msg;
  }
  EXPECT_FALSE(comm->is_aborted());
  Tensor after = full({5}, 2, kFloat32);
  comm->all_reduce(after);  // still usable
  EXPECT_EQ(after.to_vector()[0], 2.0 * child.world);
  if (child.rank != bad_rank) comm->dump_flight_recorder();  // the bad rank's dump is the one made at its error
}

void check_desync_found(const std::string& kind, uint32_t seed) {
  std::mt19937 rng(seed);
  const int world = 3;
  const int bad_rank = static_cast<int>(rng() % world);
  const int bad_seq = 2 + static_cast<int>(rng() % 4);
  SCOPED_TRACE("seed " + std::to_string(seed) + ": rank " + std::to_string(bad_rank) + " at seq " +
               std::to_string(bad_seq));
  RunSpec spec{"seeded_desync", world};
  spec.args = {{"bad_rank", std::to_string(bad_rank)}, {"bad_seq", std::to_string(bad_seq)}, {"kind", kind}};
  const auto r = run_ranks(spec);
  ASSERT_TRUE(ranks_ended(r));
  const TraceReport report = analyze_traces(r.dir + "/trace");
  bool found = false;
  for (const auto& f : report.findings)
    if (f.kind == "desync") {
      EXPECT_EQ(f.ranks, std::vector<int>{bad_rank}) << report.text;
      EXPECT_EQ(f.seq, bad_seq) << report.text;
      found = true;
    }
  EXPECT_TRUE(found) << report.text;
  EXPECT_NE(report.text.find("desync at seq " + std::to_string(bad_seq)), std::string::npos) << report.text;

  // The Chrome export: one process track per rank, every started op as a complete event.
  const std::string out = r.dir + "/trace.json";
  export_chrome_trace(r.dir + "/trace", out);
  const auto j = read_json(out);
  int processes = 0, ops = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] == "X") ++ops;
  }
  EXPECT_EQ(processes, world);
  EXPECT_EQ(ops, (world - 1) * (bad_seq + 2) + (bad_seq + 1));  // the bad rank dumped before its last op
}

TEST(DistTrace, AnalyzeNamesTheRankAndSeqOfASizeDesync) { check_desync_found("size", 7); }
TEST(DistTrace, AnalyzeNamesTheRankAndSeqOfAnOpDesync) { check_desync_found("op", 1234); }

TEST(DistTrace, RingKeepsTheLastOpsAndDumpsThemOnRequest) {
  const std::string dir = fresh_dir("ring");
  CommOptions o = one_rank_options(dir);
  o.trace_capacity = 8;
  auto comm = new_comm("gloo", kCPU, "ring", o);
  for (int i = 0; i < 20; ++i) {
    Tensor t = full({3 + i}, 1, kFloat64);
    comm->all_reduce(t, ReduceOp::MAX);
  }
  const std::string path = comm->dump_flight_recorder();
  EXPECT_EQ(path, dir + "/ring.rank0.json");
  const auto j = read_json(path);
  EXPECT_EQ(j["comm"], "ring");
  EXPECT_EQ(j["world_size"], 1);
  const auto& entries = j["entries"];
  ASSERT_EQ(entries.size(), 8u);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    EXPECT_EQ(e["seq_id"], 12 + static_cast<int>(i));
    EXPECT_EQ(e["profiling_name"], "all_reduce");
    EXPECT_EQ(e["state"], "completed");
    EXPECT_EQ(e["reduce_op"], "max");
    EXPECT_EQ(e["input_sizes"][0][0], 15 + static_cast<int>(i));
    EXPECT_EQ(e["input_dtypes"][0], "float64");
    EXPECT_GT(e["time_completed_ns"].get<int64_t>(), 0);
    EXPECT_GE(e["time_completed_ns"].get<int64_t>(), e["time_started_ns"].get<int64_t>());
    EXPECT_GE(e["time_started_ns"].get<int64_t>(), e["time_created_ns"].get<int64_t>());
    if (i > 0) {
      EXPECT_GT(e["record_id"], entries[i - 1]["record_id"]);
    }
  }
  const TraceReport report = analyze_traces(dir);
  EXPECT_NE(report.text.find("no desync"), std::string::npos) << report.text;
}

TEST(DistTrace, SignalRequestsADump) {
  const std::string dir = fresh_dir("signal");
  auto comm = new_comm("gloo", kCPU, "sig", one_rank_options(dir));
  comm->barrier();
  enable_dump_on_signal(SIGUSR1);
  ::raise(SIGUSR1);
  const std::string path = dir + "/sig.rank0.json";
  for (int i = 0; i < 300 && !fs::exists(path); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(fs::exists(path)) << "no dump 3 s after SIGUSR1";
  signal(SIGUSR1, SIG_DFL);
}

TEST(DistTrace, LifeCycleEventsAreLoggedAsJsonLines) {
  const std::string dir = fresh_dir("log");
  {
    auto comm = new_comm("gloo", kCPU, "life", one_rank_options(dir));
    auto sub = comm->split({0}, "sub");
    comm->abort();
    EXPECT_TRUE(comm->is_aborted());
    EXPECT_THROW(comm->barrier(), CommError);
    auto small = comm->shrink({});
    Tensor t = full({2}, 3, kFloat32);
    small->all_reduce(t);
    EXPECT_EQ(t.to_vector(), (std::vector<double>{3, 3}));
    EXPECT_EQ(small->get_name(), "life.shrink0");
  }
  std::ifstream f(dir + "/events.jsonl");
  std::vector<std::string> events;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("ts") && j.contains("comm") && j.contains("rank")) << line;
    events.push_back(j["event"].get<std::string>() + ":" + j["comm"].get<std::string>());
  }
  for (const char* want : {"create:life", "split:life", "create:sub", "abort:life", "shrink:life", "create:life.shrink0",
                           "destroy:life"}) {
    EXPECT_NE(std::find(events.begin(), events.end(), want), events.end()) << want;
  }
}

}  // namespace kiln::dist::testing
