// The NCCL backend on one GPU (one rank): every op against a float64 reference, async works,
// split and shrink, the input check. Skipped where no CUDA device is present.
#include <chrono>
#include <fstream>
#include <regex>
#include <string>

#include "dist/harness.h"
#include "support/testing.h"

namespace kiln::dist::testing {

namespace {

std::shared_ptr<Communicator> one_gpu_comm(const std::string& name) {
  CommOptions o;
  o.store = std::make_shared<HashStore>();
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(60);
  o.trace_dir = ::testing::TempDir() + "/kiln_nccl";
  return new_comm("nccl", Device("cuda:0"), name, o);
}

}  // namespace

TEST(DistNccl, OneRankOpsMatchFloat64) {
  KILN_REQUIRE_CUDA();
  auto comm = one_gpu_comm("nccl1");
  const Device gpu("cuda:0");
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kUInt8}) {
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::PRODUCT}) {
      if (op == ReduceOp::AVG && !is_floating_point(dt)) continue;
      const Tensor in = make_input(dt, 1001, 0, 1, op == ReduceOp::PRODUCT);
      Tensor t = in.to(gpu);
      comm->all_reduce(t, op);
      EXPECT_EQ(t.cpu().to_vector(), in.to_vector()) << dtype_name(dt) << " " << reduce_op_name(op);
    }
    const Tensor in = make_input(dt, 333, 0, 2);
    Tensor out = empty({333}, TensorOptions(dt).device(gpu));
    comm->all_gather_single(out, in.to(gpu));
    EXPECT_EQ(out.cpu().to_vector(), in.to_vector()) << dtype_name(dt);
    comm->reduce_scatter_single(out, in.to(gpu), ReduceOp::MAX);
    EXPECT_EQ(out.cpu().to_vector(), in.to_vector()) << dtype_name(dt);
    comm->all_to_all_single(out, in.to(gpu));
    EXPECT_EQ(out.cpu().to_vector(), in.to_vector()) << dtype_name(dt);
    Tensor b = in.to(gpu);
    comm->broadcast(b, 0);
    EXPECT_EQ(b.cpu().to_vector(), in.to_vector()) << dtype_name(dt);
  }
  comm->barrier();
}

TEST(DistNccl, AsyncSplitShrinkAndChecks) {
  KILN_REQUIRE_CUDA();
  auto comm = one_gpu_comm("nccl2");
  const Device gpu("cuda:0");
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<Work>> ws;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(full({1 << 16}, i + 1, TensorOptions(kFloat32).device(gpu)));
    ws.push_back(comm->all_reduce(ts.back(), ReduceOp::SUM, true));
  }
  for (int i = 0; i < 4; ++i) {
    ws[i]->wait();
    EXPECT_EQ(ws[i]->status(), WorkStatus::COMPLETED);
    EXPECT_EQ(ts[i].cpu().to_vector()[0], i + 1);
  }
  auto sub = comm->split({0}, "nccl2.sub");
  ASSERT_NE(sub, nullptr);
  Tensor s = full({7}, 2, TensorOptions(kBFloat16).device(gpu));
  sub->all_reduce(s, ReduceOp::PRODUCT);
  EXPECT_EQ(s.cpu().to_vector()[0], 2);
  auto small = comm->shrink({});
  Tensor t = full({5}, 3, TensorOptions(kFloat64).device(gpu));
  small->all_reduce(t);
  EXPECT_EQ(t.cpu().to_vector()[0], 3);
  // A CPU tensor on an NCCL communicator is refused.
  EXPECT_THROW(comm->all_reduce(full({2}, 1, kFloat32)), Error);
  const std::string dump = comm->dump_flight_recorder();
  EXPECT_FALSE(dump.empty());
}

}  // namespace kiln::dist::testing

namespace kiln::dist::testing {

namespace {
bool nccl_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libnccl") != std::string::npos) return true;
  return false;
}
}  // namespace

// NCCL is opened at first use, not linked: importing kiln must not bring a second NCCL into a
// process that later loads torch's. Needs no GPU: only the library is loaded.
TEST(DistNcclLibrary, LoadedOnFirstUseAndReportsItsVersion) {
  EXPECT_FALSE(nccl_mapped()) << "libkiln brought NCCL in before any NCCL call";
  std::string version;
  try {
    version = nccl_version();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("built without") != std::string::npos) GTEST_SKIP() << "kiln built without NCCL: " << what;
    FAIL() << what;
  }
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(2\.\d+\.\d+)"))) << version;
  EXPECT_TRUE(nccl_mapped());
  EXPECT_EQ(nccl_version(), version);  // loaded once
}

}  // namespace kiln::dist::testing
