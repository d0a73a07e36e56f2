// Bad input gives a clear kiln::Error, on every rank where ranks disagree, never a hang: sizes or
// dtypes that differ between ranks, a tensor on the wrong device, a rank outside the group, a
// reduction a dtype cannot take, a rank that never joins, a backend that is not built.
#include <chrono>

#include "dist/harness.h"

namespace kiln::dist::testing {

namespace {

using std::chrono::milliseconds;

// Runs f, which must raise kiln::Error (not CommError: the communicator stays usable) whose
// message holds every part.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with '" << *parts.begin() << "'";
  } catch (const CommError& e) {
    ADD_FAILURE() << "a communication error for bad input: " << e.what();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

DIST_SCENARIO(bad_inputs) {
  const int R = child.rank;
  auto comm = new_comm("gloo", kCPU, "main", child.options(milliseconds(5000)));
  auto still_works = [&] {
    Tensor t = full({4}, 1, kFloat32);
    comm->all_reduce(t);
    ASSERT_EQ(t.to_vector()[0], child.world);
  };
  // Sizes differ on rank 2: every rank raises, naming both groups.
  expect_error([&] { comm->all_reduce(full({R == 2 ? 5 : 6}, 1, kFloat32)); },
               {"ranks called different collectives", "rank 2 all_reduce(sum) float32 numel 5", "numel 6"});
  still_works();
  // A dtype differs on rank 0.
  expect_error([&] { comm->all_gather_single(empty({3 * child.world}, R == 0 ? kFloat64 : kFloat32),
                                             full({3}, 1, R == 0 ? kFloat64 : kFloat32)); },
               {"rank 0 all_gather_single float64"});
  still_works();
  // Rank 1 passes a tensor on another device: it raises at once, the others hear of it.
  static float fake[4];
  const Tensor on_gpu = from_blob(fake, {4}, TensorOptions(kFloat32).device(Device("cuda:0")));
  if (R == 1) expect_error([&] { comm->all_reduce(on_gpu); }, {"is on cuda:0", "works on cpu"});
  else expect_error([&] { comm->all_reduce(full({4}, 1, kFloat32)); }, {"rank 1 rejected its input"});
  still_works();
  // Non-contiguous, a root outside the group, a wrong output size, AVG of integers: every rank.
  expect_error([&] { comm->all_reduce(full({4, 4}, 1, kFloat32).t()); }, {"not contiguous"});
  expect_error([&] { comm->broadcast(full({2}, 1, kFloat32), child.world); }, {"root 3 is outside the group"});
  expect_error([&] { comm->all_gather_single(empty({5}, kFloat32), full({2}, 1, kFloat32)); },
               {"output has 5 elements"});
  expect_error([&] { comm->all_reduce(full({2}, 1, kInt32), ReduceOp::AVG); }, {"AVG needs a floating-point tensor"});
  const Tensor shared = full({3 * child.world}, 1, kFloat32);
  expect_error([&] { comm->all_to_all_single(shared, shared); }, {"input and output overlap"});
  expect_error([&] { comm->all_gather_single(shared, shared.narrow(0, 1, 3)); }, {"overlap other than"});
  still_works();
  // Point to point with an impossible peer: a local error; send / recv sizes that disagree: both.
  expect_error([&] { comm->send(full({2}, 1, kFloat32), R); }, {"dst", "is not another rank"});
  expect_error([&] { comm->recv(full({2}, 1, kFloat32), 9); }, {"src 9"});
  if (R == 0) expect_error([&] { comm->send(full({7}, 1, kFloat32), 1); }, {"the peers disagree"});
  if (R == 1) expect_error([&] { comm->recv(empty({8}, kFloat32), 0); }, {"the peers disagree"});
  still_works();
  // split with ranks outside the group or listed twice.
  expect_error([&] { comm->split({0, 9}, "bad"); }, {"rank 9 is outside the group"});
  expect_error([&] { comm->split({1, 1}, "bad"); }, {"listed twice"});
  expect_error([&] { comm->shrink({R}); }, {"this rank is in exclude_ranks"});
  still_works();
}

TEST(DistBadInput, ClearErrorsOnEveryRankAndTheCommunicatorGoesOn) {
  EXPECT_TRUE(ranks_ended(run_ranks({"bad_inputs", 3})));
}

// Two processes run, but the communicator asks for three: the rendezvous times out naming rank 2.
DIST_SCENARIO(missing_rank) {
  CommOptions o = child.options(milliseconds(1000));
  o.world_size = 3;
  const auto start = std::chrono::steady_clock::now();
  try {
    new_comm("gloo", kCPU, "main", o);
    ADD_FAILURE() << "a communicator without rank 2 was made";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks [2] did not join"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(DistBadInput, RankThatNeverJoinsTimesOut) { EXPECT_TRUE(ranks_ended(run_ranks({"missing_rank", 2}))); }

TEST(DistBadInput, BackendsAndDevicesAreChecked) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  EXPECT_THROW(new_comm("mpi", kCPU, "x", o), Error);
  EXPECT_THROW(new_comm("gloo", Device("cuda:0"), "x", o), Error);
  EXPECT_THROW(new_comm("nccl", kCPU, "x", o), Error);
  EXPECT_THROW(new_comm("gloo", kCPU, "", o), Error);
  o.rank = 1;
  EXPECT_THROW(new_comm("gloo", kCPU, "x", o), Error);
#ifndef KILN_WITH_CUDA
  o.rank = 0;
  try {
    new_comm("nccl", Device("cuda:0"), "x", o);
    ADD_FAILURE() << "an nccl communicator without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln was built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace kiln::dist::testing
