// Every operation of a Gloo communicator against a float64 reference, in 2-4 processes over
// 127.0.0.1: several dtypes, odd sizes, every reduction; async works on two communicators at once
// (the FSDP pattern); split.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dist/harness.h"
#include "support/testing.h"

namespace kiln::dist::testing {

namespace {

const std::vector<DType> kDTypes = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kUInt8};
const std::vector<int64_t> kSizes = {1, 5, 777, 40001};
const std::vector<ReduceOp> kOps = {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::PRODUCT};

double fold(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::MIN: return std::min(a, b);
    case ReduceOp::MAX: return std::max(a, b);
    case ReduceOp::PRODUCT: return a * b;
    default: return a + b;
  }
}

// The float64 reduction of every rank's input (each rank regenerates the others' from the seed).
std::vector<double> reference(DType dt, int64_t n, int world, int salt, ReduceOp op) {
  std::vector<double> acc;
  for (int r = 0; r < world; ++r) {
    const auto v = make_input(dt, n, r, salt, op == ReduceOp::PRODUCT).to_vector();
    if (r == 0) acc = v;
    else for (size_t i = 0; i < v.size(); ++i) acc[i] = fold(op, acc[i], v[i]);
  }
  if (op == ReduceOp::AVG)
    for (auto& x : acc) x /= world;
  return acc;
}

void expect_matches(const Tensor& out, const std::vector<double>& ref, DType dt, const std::string& what) {
  const Tensor want = tensor(ref, kFloat64).view(out.sizes());
  if (is_floating_point(dt)) {
    const double err = kiln::testing::rel_error(out, want);
    EXPECT_LE(err, kiln::testing::tolerance(dt)) << what;
  } else {
    EXPECT_EQ(out.to_vector(), want.to_vector()) << what;
  }
}

std::string label(const char* op, DType dt, int64_t n, const char* extra = "") {
  return std::string(op) + " " + dtype_name(dt) + " n=" + std::to_string(n) + " " + extra;
}

}  // namespace

DIST_SCENARIO(every_op_matches_float64) {
  const int W = child.world, R = child.rank;
  auto comm = new_comm("gloo", kCPU, "main", child.options());
  ASSERT_EQ(comm->get_rank(), R);
  ASSERT_EQ(comm->get_size(), W);
  int salt = 0;
  for (DType dt : kDTypes)
    for (int64_t n : kSizes) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::AVG && !is_floating_point(dt)) continue;
        ++salt;
        Tensor t = make_input(dt, n, R, salt, op == ReduceOp::PRODUCT);
        comm->all_reduce(t, op);
        expect_matches(t, reference(dt, n, W, salt, op), dt, label("all_reduce", dt, n, reduce_op_name(op)));
      }
      // all_gather_single: rank r's input lands at [r * n, (r + 1) * n).
      ++salt;
      Tensor out = empty({W * n}, dt);
      comm->all_gather_single(out, make_input(dt, n, R, salt));
      std::vector<double> want;
      for (int r = 0; r < W; ++r) {
        const auto v = make_input(dt, n, r, salt).to_vector();
        want.insert(want.end(), v.begin(), v.end());
      }
      EXPECT_EQ(out.to_vector(), want) << label("all_gather_single", dt, n);
      // reduce_scatter_single: block R of the reduction.
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX, ReduceOp::AVG}) {
        if (op == ReduceOp::AVG && !is_floating_point(dt)) continue;
        ++salt;
        Tensor rs = empty({n}, dt);
        comm->reduce_scatter_single(rs, make_input(dt, W * n, R, salt), op);
        const auto full = reference(dt, W * n, W, salt, op);
        expect_matches(rs, std::vector<double>(full.begin() + R * n, full.begin() + (R + 1) * n), dt,
                       label("reduce_scatter_single", dt, n, reduce_op_name(op)));
      }
      // broadcast from every root.
      for (int root = 0; root < W; ++root) {
        ++salt;
        Tensor b = make_input(dt, n, R, salt);
        comm->broadcast(b, root);
        EXPECT_EQ(b.to_vector(), make_input(dt, n, root, salt).to_vector()) << label("broadcast", dt, n) << root;
      }
      // all_to_all_single: block j of rank i's input -> block i of rank j's output.
      ++salt;
      Tensor a2a = empty({W * n}, dt);
      comm->all_to_all_single(a2a, make_input(dt, W * n, R, salt));
      std::vector<double> got = a2a.to_vector(), expect;
      for (int i = 0; i < W; ++i) {
        const auto v = make_input(dt, W * n, i, salt).to_vector();
        expect.insert(expect.end(), v.begin() + R * n, v.begin() + (R + 1) * n);
      }
      EXPECT_EQ(got, expect) << label("all_to_all_single", dt, n);
    }
  // In place: all_gather from this rank's block of the output, reduce_scatter into the input's.
  for (int64_t n : {int64_t{3}, int64_t{20000}}) {
    Tensor buf = make_input(kFloat32, W * n, R, 800 + static_cast<int>(n));
    comm->all_gather_single(buf, buf.narrow(0, R * n, n));
    std::vector<double> want;
    for (int r = 0; r < W; ++r) {
      const auto v = make_input(kFloat32, W * n, r, 800 + static_cast<int>(n)).to_vector();
      want.insert(want.end(), v.begin() + r * n, v.begin() + (r + 1) * n);
    }
    EXPECT_EQ(buf.to_vector(), want) << "in-place all_gather_single n=" << n;
    Tensor in = make_input(kFloat32, W * n, R, 850 + static_cast<int>(n));
    comm->reduce_scatter_single(in.narrow(0, R * n, n), in);
    const auto full = reference(kFloat32, W * n, W, 850 + static_cast<int>(n), ReduceOp::SUM);
    expect_matches(in.narrow(0, R * n, n), std::vector<double>(full.begin() + R * n, full.begin() + (R + 1) * n),
                   kFloat32, "in-place reduce_scatter_single");
  }
  // send / recv around the ring (even ranks send first, so no pair waits on itself).
  for (DType dt : {kFloat32, kBFloat16, kInt64}) {
    const int64_t n = 1001;
    const int next = (R + 1) % W, prev = (R + W - 1) % W;
    Tensor mine = make_input(dt, n, R, 900), got = empty({n}, dt);
    if (R % 2 == 0) {
      comm->send(mine, next);
      comm->recv(got, prev);
    } else {
      comm->recv(got, prev);
      comm->send(mine, next);
    }
    EXPECT_EQ(got.to_vector(), make_input(dt, n, prev, 900).to_vector()) << "send/recv " << dtype_name(dt);
  }
  comm->barrier();
  // Shapes other than 1-D and empty tensors.
  Tensor m = make_input(kFloat32, 6, R, 950).view({2, 3});
  comm->all_reduce(m);
  expect_matches(m, reference(kFloat32, 6, W, 950, ReduceOp::SUM), kFloat32, "2-D all_reduce");
  Tensor none = empty({0}, kFloat32);
  comm->all_reduce(none);
  comm->barrier();
}

TEST(DistCollectives, EveryOpMatchesFloat64On2Ranks) {
  EXPECT_TRUE(ranks_ended(run_ranks({"every_op_matches_float64", 2})));
}
TEST(DistCollectives, EveryOpMatchesFloat64On3Ranks) {
  EXPECT_TRUE(ranks_ended(run_ranks({"every_op_matches_float64", 3, /*rank0_hosts=*/true})));
}
TEST(DistCollectives, EveryOpMatchesFloat64On4Ranks) {
  EXPECT_TRUE(ranks_ended(run_ranks({"every_op_matches_float64", 4})));
}

// Async works on two communicators at once, queued in a rank-dependent order: one communicator's
// ops never wait behind the other's (FSDP's all-gather / reduce-scatter overlap).
DIST_SCENARIO(async_two_comms) {
  const int W = child.world, R = child.rank;
  auto ag = new_comm("gloo", kCPU, "gather", child.options());
  auto rs = new_comm("gloo", kCPU, "scatter", child.options());
  const int64_t n = 3001;
  for (int step = 0; step < 4; ++step) {
    std::vector<Tensor> gathered, scattered;
    std::vector<std::shared_ptr<Work>> works;
    auto queue_gather = [&](int i) {
      gathered.push_back(empty({W * n}, kFloat32));
      works.push_back(ag->all_gather_single(gathered.back(), make_input(kFloat32, n, R, 100 * step + i), true));
    };
    auto queue_scatter = [&](int i) {
      scattered.push_back(empty({n}, kBFloat16));
      works.push_back(rs->reduce_scatter_single(scattered.back(), make_input(kBFloat16, W * n, R, 50 + 100 * step + i),
                                                ReduceOp::SUM, true));
    };
    // Even ranks queue gathers first, odd ranks scatters first.
    for (int i = 0; i < 3; ++i) {
      if (R % 2 == 0) queue_gather(i), queue_scatter(i);
      else queue_scatter(i), queue_gather(i);
    }
    // Odd ranks wait in reverse order.
    if (R % 2 == 1) std::reverse(works.begin(), works.end());
    for (auto& w : works) {
      EXPECT_NE(w->status(), WorkStatus::ERROR);
      w->wait();
      EXPECT_TRUE(w->is_completed());
      EXPECT_EQ(w->status(), WorkStatus::COMPLETED);
    }
    for (int i = 0; i < 3; ++i) {
      std::vector<double> want;
      for (int r = 0; r < W; ++r) {
        const auto v = make_input(kFloat32, n, r, 100 * step + i).to_vector();
        want.insert(want.end(), v.begin(), v.end());
      }
      EXPECT_EQ(gathered[i].to_vector(), want) << "step " << step << " gather " << i;
      const auto full = reference(kBFloat16, W * n, W, 50 + 100 * step + i, ReduceOp::SUM);
      expect_matches(scattered[i], std::vector<double>(full.begin() + R * n, full.begin() + (R + 1) * n), kBFloat16,
                     "async reduce_scatter");
    }
  }
  // Sequence numbers count each communicator's collectives on its own.
  auto w = ag->barrier(true);
  w->wait();
  EXPECT_EQ(w->seq(), 12u);
  EXPECT_EQ(w->op(), "barrier");
}

TEST(DistCollectives, AsyncWorksOnTwoCommunicatorsAtOnce) {
  EXPECT_TRUE(ranks_ended(run_ranks({"async_two_comms", 3})));
}

DIST_SCENARIO(split_groups) {
  const int R = child.rank;
  auto comm = new_comm("gloo", kCPU, "world", child.options());
  auto even = comm->split({0, 2}, "even");
  auto odd = comm->split({3, 1}, "odd");  // order of the list does not matter: ranks ascend
  auto mine = R % 2 == 0 ? even : odd;
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(R % 2 == 0 ? odd : even, nullptr);
  EXPECT_EQ(mine->get_size(), 2);
  EXPECT_EQ(mine->get_rank(), R / 2);
  Tensor t = full({9}, R + 1, kFloat64);
  mine->all_reduce(t);
  const double want = R % 2 == 0 ? 1 + 3 : 2 + 4;
  EXPECT_EQ(t.to_vector(), std::vector<double>(9, want));
  // The parent still works beside its children, and a child splits again.
  Tensor all = full({3}, 1, kInt32);
  comm->all_reduce(all);
  EXPECT_EQ(all.to_vector(), std::vector<double>(3, 4));
  auto solo = mine->split({mine->get_rank()}, "solo" + std::to_string(R));
  ASSERT_NE(solo, nullptr);
  EXPECT_EQ(solo->get_size(), 1);
  Tensor s = full({2}, 5, kFloat32);
  solo->all_reduce(s, ReduceOp::AVG);
  EXPECT_EQ(s.to_vector(), std::vector<double>(2, 5));
}

TEST(DistCollectives, SplitMakesIndependentGroups) {
  EXPECT_TRUE(ranks_ended(run_ranks({"split_groups", 4})));
}

// One process, one rank: every op is a local copy, through the same machinery.
TEST(DistCollectives, OneRankCommunicatorInProcess) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  o.trace_dir = ::testing::TempDir() + "/kiln_one_rank";
  auto comm = new_comm("gloo", kCPU, "solo", o);
  Tensor t = tensor({1, 2, 3}, kFloat32);
  comm->all_reduce(t, ReduceOp::AVG);
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, 2, 3}));
  Tensor out = empty({3}, kFloat32);
  comm->reduce_scatter_single(out, tensor({4, 5, 6}, kFloat32), ReduceOp::SUM);
  EXPECT_EQ(out.to_vector(), (std::vector<double>{4, 5, 6}));
  comm->all_gather_single(out, tensor({7, 8, 9}, kFloat32));
  EXPECT_EQ(out.to_vector(), (std::vector<double>{7, 8, 9}));
  comm->all_to_all_single(out, tensor({1, 1, 2}, kFloat32));
  EXPECT_EQ(out.to_vector(), (std::vector<double>{1, 1, 2}));
  comm->broadcast(out, 0);
  comm->barrier(true)->wait();
  EXPECT_EQ(comm->get_backend(), "gloo");
  EXPECT_EQ(comm->get_name(), "solo");
}

}  // namespace kiln::dist::testing
