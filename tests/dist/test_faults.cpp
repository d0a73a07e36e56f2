// Failures never hang and never end the process: a rank that sleeps past the timeout, a rank killed
// with SIGKILL (the survivors raise within timeout + 1 s, shrink, and go on), wait(timeout), abort().
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "dist/flight_recorder.h"
#include "dist/harness.h"

namespace kiln::dist::testing {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Ranks 0, 1 enter seq 2 while rank 2 sleeps past the timeout: they raise TimeoutError at the
// timeout naming rank 2 and seq 2; rank 2 then raises CommError at once (never a hang).
DIST_SCENARIO(one_rank_sleeps) {
  const milliseconds timeout(1500);
  auto comm = new_comm("gloo", kCPU, "main", child.options(timeout));
  for (int i = 0; i < 2; ++i) {
    Tensor t = full({64}, 1, kFloat32);
    comm->all_reduce(t);
    ASSERT_EQ(t.to_vector()[0], child.world);
  }
  Tensor t = full({64}, 1, kFloat32);
  if (child.rank == 2) {
    std::this_thread::sleep_for(milliseconds(3500));
    const auto start = Clock::now();
    try {
      comm->all_reduce(t);
      ADD_FAILURE() << "the late rank's all_reduce succeeded";
    } catch (const CommError& e) {
      EXPECT_LT(seconds_since(start), 1.0) << e.what();
    }
    EXPECT_TRUE(comm->is_aborted());
    return;
  }
  const auto start = Clock::now();
  try {
    comm->all_reduce(t);
    ADD_FAILURE() << "all_reduce returned although rank 2 never joined";
  } catch (const TimeoutError& e) {
    const double took = seconds_since(start);
    EXPECT_GE(took, 1.4) << e.what();
    EXPECT_LE(took, 1.5 + 1.0) << e.what();
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "communicator 'main'")) << msg;
    EXPECT_TRUE(contains(msg, "all_reduce seq 2")) << msg;
    EXPECT_TRUE(contains(msg, "did not arrive: [2]")) << msg;
  }
  // The next call raises the same TimeoutError at once.
  EXPECT_THROW(comm->barrier(), TimeoutError);
  EXPECT_TRUE(comm->is_aborted());
}

TEST(DistFaults, SleepingRankTimesOutOnEveryOtherRank) {
  const auto r = run_ranks({"one_rank_sleeps", 3});
  ASSERT_TRUE(ranks_ended(r));
  // Every rank dumped its flight recorder on the abort; the analysis names the late rank.
  const TraceReport report = analyze_traces(r.dir + "/trace");
  bool named = false;
  for (const auto& f : report.findings)
    if (f.kind == "behind" && f.ranks == std::vector<int>{2} && f.seq == 2) named = true;
  EXPECT_TRUE(named) << report.text;
  // The JSON-lines log has the life cycle: create, timeout, abort.
  std::ifstream log(r.dir + "/events.jsonl");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(all, "\"event\":\"create\"")) << all;
  EXPECT_TRUE(contains(all, "\"event\":\"timeout\"")) << all;
  EXPECT_TRUE(contains(all, "\"event\":\"abort\"")) << all;
}

// 4 ranks all-reduce in a loop; the parent kills rank 1 with SIGKILL. The survivors raise within
// timeout + 1 s of the kill, shrink to 3, and their next all-reduces give the 3-rank answer.
DIST_SCENARIO(kill_and_shrink) {
  const milliseconds timeout(2000);
  auto store = child.store();
  auto comm = new_comm("gloo", kCPU, "train", child.options(timeout));
  int64_t failed_ns = 0;
  for (int i = 0;; ++i) {
    Tensor t = full({4096}, child.rank + 1, kFloat32);
    try {
      comm->all_reduce(t);
    } catch (const CommError& e) {
      failed_ns = detail::wall_ns();
      std::printf("rank %d: iteration %d raised: %s\n", child.rank, i, e.what());
      break;
    }
    ASSERT_EQ(t.to_vector()[0], 1 + 2 + 3 + 4) << "iteration " << i;
    store->set("iter/" + std::to_string(child.rank), std::to_string(i));
    ASSERT_LT(i, 100000) << "rank 1 was never killed";
  }
  const int64_t killed_ns = std::stoll(store->get("killed_at_ns"));
  EXPECT_LE(static_cast<double>(failed_ns - killed_ns) * 1e-9, 2.0 + 1.0);
  auto small = comm->shrink({1});
  ASSERT_EQ(small->get_size(), 3);
  const int expect_rank = child.rank == 0 ? 0 : child.rank - 1;
  EXPECT_EQ(small->get_rank(), expect_rank);
  for (int i = 0; i < 5; ++i) {
    Tensor t = full({4096}, child.rank + 1, kFloat32);
    small->all_reduce(t);
    EXPECT_EQ(t.to_vector()[0], 1 + 3 + 4) << "after the shrink, iteration " << i;
  }
  Tensor g = empty({3}, kInt64);
  small->all_gather_single(g, full({1}, child.rank, kInt64));
  EXPECT_EQ(g.to_vector(), (std::vector<double>{0, 2, 3}));
}

TEST(DistFaults, KilledRankRaisesOnSurvivorsWhoShrinkAndGoOn) {
  RunSpec spec{"kill_and_shrink", 4};
  spec.during = [](Store* store, const std::vector<pid_t>& pids) {
    try {
      store->wait({"iter/1"}, milliseconds(15000));
      // A few more iterations, then kill rank 1 wherever it is.
      while (std::stoi(store->get("iter/1")) < 8) std::this_thread::sleep_for(milliseconds(2));
      ::kill(pids[1], SIGKILL);
      store->set("killed_at_ns", std::to_string(detail::wall_ns()));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the ranks never got going: " << e.what();
      store->set("killed_at_ns", "0");
    }
  };
  const auto r = run_ranks(spec);
  EXPECT_TRUE(ranks_ended(r, {0, 128 + SIGKILL, 0, 0}));
}

// wait(timeout) gives up on an op a peer never joins: TimeoutError from the wait, and the peer's
// late op fails at once.
DIST_SCENARIO(wait_with_timeout) {
  auto comm = new_comm("gloo", kCPU, "main", child.options(milliseconds(20000)));
  Tensor t = full({8}, 1, kFloat64);
  if (child.rank == 1) {
    std::this_thread::sleep_for(milliseconds(1500));
    EXPECT_THROW(comm->all_reduce(t), CommError);
    return;
  }
  auto w = comm->all_reduce(t, ReduceOp::SUM, true);
  const auto start = Clock::now();
  try {
    w->wait(milliseconds(300));
    ADD_FAILURE() << "wait(300 ms) returned";
  } catch (const TimeoutError& e) {
    EXPECT_LT(seconds_since(start), 1.0) << e.what();
    EXPECT_TRUE(contains(e.what(), "wait() gave up after 300 ms")) << e.what();
  }
  EXPECT_EQ(w->status(), WorkStatus::TIMED_OUT);
  EXPECT_TRUE(w->is_completed());
}

TEST(DistFaults, WaitWithTimeoutRaises) { EXPECT_TRUE(ranks_ended(run_ranks({"wait_with_timeout", 2}))); }

// abort() on one rank fails the peers blocked on it well before their (long) timeout.
DIST_SCENARIO(user_abort) {
  auto comm = new_comm("gloo", kCPU, "main", child.options(milliseconds(20000)));
  comm->barrier();
  if (child.rank == 0) {
    std::this_thread::sleep_for(milliseconds(500));
    comm->abort();
    EXPECT_THROW(comm->barrier(), CommError);
    return;
  }
  const auto start = Clock::now();
  Tensor t = full({8}, 1, kFloat32);
  try {
    comm->all_reduce(t);
    ADD_FAILURE() << "all_reduce succeeded without rank 0";
  } catch (const CommError& e) {
    EXPECT_LT(seconds_since(start), 3.0) << e.what();
    EXPECT_TRUE(contains(e.what(), "aborted by the user on rank 0")) << e.what();
  }
}

TEST(DistFaults, AbortFailsBlockedPeers) { EXPECT_TRUE(ranks_ended(run_ranks({"user_abort", 3}))); }

}  // namespace kiln::dist::testing

namespace kiln::dist::testing {

// abort_process_on_error (opted in on rank 1): the failure ends rank 1's process with status 75
// after its flight recorder is dumped.
DIST_SCENARIO(abort_process) {
  auto comm = new_comm("gloo", kCPU, "main", child.options(std::chrono::milliseconds(20000)));
  comm->barrier();
  if (child.rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm->abort();
    return;
  }
  comm->set_abort_process_on_error(true);
  Tensor t = full({8}, 1, kFloat32);
  comm->all_reduce(t);
  ADD_FAILURE() << "the process went on after the communicator failed";
}

TEST(DistFaults, AbortProcessOnErrorEndsTheProcess) {
  const auto r = run_ranks({"abort_process", 2});
  EXPECT_TRUE(ranks_ended(r, {0, 75}));
  EXPECT_NE(r.logs[1].find("ending the process (abort_process_on_error)"), std::string::npos) << r.logs[1];
  std::ifstream dump(r.dir + "/trace/main.rank1.json");
  EXPECT_TRUE(dump.good()) << "no flight-recorder dump from the ended rank";
}

}  // namespace kiln::dist::testing
