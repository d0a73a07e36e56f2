// kiln::jit's compile service without a GPU (NVRTC only): kernels generated from the IR compile in
// parallel worker processes to the same bytes as an in-process compile; a worker that crashes or
// hangs costs its kernel a clear error while this process and the other kernels go on; a second
// call is served by the disk cache without starting a worker; a damaged cache entry is recompiled.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "jit/ir.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "support/testing.h"

#ifdef KILN_WITH_CUDA
#include "core/env.h"
#endif

namespace kiln::jit {
namespace {

#ifdef KILN_WITH_CUDA

// Each test compiles into a fresh cache folder of its own (removed afterwards).
class JitCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("kiln_jit_" + std::to_string(getpid()) + "_" +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    kiln::detail::set_cache_dir_override(dir_);
  }
  void TearDown() override {
    kiln::detail::set_cache_dir_override("");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

// A distinct small kernel per tag (a different constant: a source no other test compiled).
Kernel pointwise_kernel(const std::string& name, double c) {
  const Expr g = arg(0), u = arg(1);
  Pointwise p{name, 2, {silu(g) * u + Expr(c), max(g, u) * Expr(c)}};
  Kernel k;
  k.name = name;
  k.source = cuda_source(p, "float");
  return k;
}

bool is_elf(const std::string& s) { return s.size() > 4 && s.compare(0, 4, "\x7f" "ELF") == 0; }

TEST_F(JitCompile, ParallelWorkersGiveTheInProcessBytes) {
  std::vector<Kernel> ks;
  for (int i = 0; i < 4; ++i) ks.push_back(pointwise_kernel("pw" + std::to_string(i), 0.25 + i));
  RowSum rs{"row_sumsq", 1, arg(0) * arg(0)};
  Kernel r;
  r.name = "row_sumsq";
  r.source = cuda_source(rs, "float");
  ks.push_back(r);
  CompileOptions o;
  o.workers = 3;
  o.use_cache = false;
  const CompileStats s0 = compile_stats();
  const std::vector<CompileResult> got = compile_all(ks, o);
  EXPECT_EQ(compile_stats().workers_started, s0.workers_started + 5);
  o.isolate = false;
  const std::vector<CompileResult> local = compile_all(ks, o);
  ASSERT_EQ(got.size(), ks.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].error;
    EXPECT_TRUE(is_elf(got[i].binary)) << ks[i].name;
    EXPECT_EQ(got[i].binary, local[i].binary) << ks[i].name << ": the worker's cubin differs from NVRTC in process";
  }
  EXPECT_NE(got[0].binary, got[1].binary);
}

TEST_F(JitCompile, PtxOutput) {
  Kernel k = pointwise_kernel("pw_ptx", 3.0);
  k.output = Output::ptx;
  k.arch = "compute_90";
  const std::string ptx = compile(k);
  EXPECT_NE(ptx.find(".entry pw_ptx"), std::string::npos) << ptx.substr(0, 400);
}

TEST_F(JitCompile, CompilerErrorNamesTheKernelWithTheLog) {
  Kernel k;
  k.name = "broken_kernel";
  k.source = "extern \"C\" __global__ void broken_kernel(float* x) { x[0] = undeclared_thing; }\n";
  try {
    compile(k);
    ADD_FAILURE() << "a kernel with an undeclared name compiled";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[jit]"), std::string::npos) << m;
    EXPECT_NE(m.find("broken_kernel"), std::string::npos) << m;
    EXPECT_NE(m.find("undeclared_thing"), std::string::npos) << m;  // NVRTC's log
  }
}

TEST_F(JitCompile, CrashingWorkerCostsOnlyItsKernel) {
  std::vector<Kernel> ks = {pointwise_kernel("fine_a", 1.5), pointwise_kernel("crashes", 2.5),
                            pointwise_kernel("fine_b", 3.5)};
  ks[1].fault_for_tests = WorkerFault::crash;
  const CompileStats s0 = compile_stats();
  const std::vector<CompileResult> r = compile_all(ks);
  EXPECT_TRUE(r[0].ok()) << r[0].error;
  EXPECT_TRUE(r[2].ok()) << r[2].error;
  ASSERT_FALSE(r[1].ok());
  EXPECT_TRUE(r[1].binary.empty());
  EXPECT_NE(r[1].error.find("'crashes'"), std::string::npos) << r[1].error;
  EXPECT_NE(r[1].error.find("killed by signal 11"), std::string::npos) << r[1].error;
  EXPECT_EQ(compile_stats().failures, s0.failures + 1);
  // Nothing was cached for it: a compile without the fault succeeds.
  ks[1].fault_for_tests = WorkerFault::none;
  EXPECT_TRUE(is_elf(compile(ks[1])));
  ks[1].fault_for_tests = WorkerFault::crash;
  std::filesystem::remove(cache_path(ks[1]));
  EXPECT_THROW(compile(ks[1]), Error);
}

TEST_F(JitCompile, HangingWorkerIsKilledAtTheTimeout) {
  std::vector<Kernel> ks = {pointwise_kernel("hangs", 4.5), pointwise_kernel("fine_c", 5.5)};
  ks[0].fault_for_tests = WorkerFault::hang;
  CompileOptions o;
  o.timeout_s = 1.0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CompileResult> r = compile_all(ks, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r[0].ok());
  EXPECT_NE(r[0].error.find("'hangs'"), std::string::npos) << r[0].error;
  EXPECT_NE(r[0].error.find("did not finish within 1 s"), std::string::npos) << r[0].error;
  EXPECT_TRUE(r[1].ok()) << r[1].error;
  EXPECT_LT(seconds, 30.0);
}

TEST_F(JitCompile, SecondCallIsServedFromDiskWithoutAWorker) {
  const Kernel k = pointwise_kernel("cached", 6.5);
  const std::string path = cache_path(k);
  EXPECT_EQ(path.rfind(dir_, 0), 0u) << path;
  const CompileStats s0 = compile_stats();
  const std::vector<CompileResult> first = compile_all({k});
  ASSERT_TRUE(first[0].ok()) << first[0].error;
  EXPECT_FALSE(first[0].from_cache);
  EXPECT_TRUE(std::filesystem::exists(path));
  const CompileStats s1 = compile_stats();
  EXPECT_EQ(s1.workers_started, s0.workers_started + 1);
  EXPECT_GT(s1.compile_seconds, s0.compile_seconds);  // the miss's wall time is counted
  const std::vector<CompileResult> second = compile_all({k});
  const CompileStats s2 = compile_stats();
  EXPECT_TRUE(second[0].from_cache);
  EXPECT_EQ(second[0].binary, first[0].binary);
  EXPECT_EQ(s2.workers_started, s1.workers_started) << "a cache hit started a worker";
  EXPECT_EQ(s2.compiles, s1.compiles);
  EXPECT_EQ(s2.disk_hits, s1.disk_hits + 1);
  EXPECT_EQ(s2.compile_seconds, s1.compile_seconds) << "a cache hit counted compile time";
  // Whatever decides the bytes is in the key.
  Kernel other = k;
  other.arch = "sm_80";
  EXPECT_NE(cache_path(other), path);
  other = k;
  other.options = {"-DX=1"};
  EXPECT_NE(cache_path(other), path);
  other = k;
  other.headers = {{"extra.cuh", "#define Y 2\n"}};
  EXPECT_NE(cache_path(other), path);
}

TEST_F(JitCompile, DamagedCacheEntryIsRecompiled) {
  const Kernel k = pointwise_kernel("damaged", 7.5);
  const std::string good = compile(k);
  const std::string path = cache_path(k);
  std::string file;
  {
    std::ifstream f(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(file.size(), good.size());
  file[file.size() - good.size() / 2] ^= 0x40;  // one flipped bit inside the cubin, sizes intact
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << file; }
  const CompileStats s0 = compile_stats();
  const std::vector<CompileResult> r = compile_all({k});
  const CompileStats s1 = compile_stats();
  EXPECT_FALSE(r[0].from_cache);
  EXPECT_EQ(r[0].binary, good);
  EXPECT_EQ(s1.corrupt_entries, s0.corrupt_entries + 1);
  EXPECT_EQ(s1.compiles, s0.compiles + 1);
  // The entry was rewritten whole: the next call hits it.
  EXPECT_TRUE(compile_all({k})[0].from_cache);
  // A truncated file is damaged too.
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << file.substr(0, file.size() / 2); }
  EXPECT_FALSE(compile_all({k})[0].from_cache);
  EXPECT_EQ(compile_stats().corrupt_entries, s1.corrupt_entries + 1);
}

TEST_F(JitCompile, FaultHooksNeedIsolation) {
  Kernel k = pointwise_kernel("no_isolation", 8.5);
  k.fault_for_tests = WorkerFault::crash;
  CompileOptions o;
  o.isolate = false;
  EXPECT_THROW(compile(k, o), Error);
}

#else

TEST(JitCompile, NeedsNvrtc) {
  Kernel k;
  k.name = "k";
  k.source = "extern \"C\" __global__ void k() {}\n";
  EXPECT_THROW(compile(k), Error);  // kiln was built without CUDA: no NVRTC
}

#endif

}  // namespace
}  // namespace kiln::jit
