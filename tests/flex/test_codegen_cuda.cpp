// FlexAttention's CUDA sources and plan, checked without a GPU: the generated mod functions of every
// built-in mod and of compositions compile with NVRTC for sm_90a; every kernel configuration the
// plan's rules produce (kernel_config_for over architectures, head dims, dtypes, masks, score mods,
// row lengths, block sizes and tuning tiles) compiles with NVRTC, forward and backward module, for its
// architecture; the codegen's int locals, divisions and tanh; the plan's rules; the on-disk cubin
// cache (and, with a GPU, its use by a second process).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "kiln/flex.h"
#include "kiln/tuning.h"
#include "support/testing.h"

#ifdef KILN_WITH_CUDA
#include "core/embedded.h"
#include "core/env.h"
#include "flex/cuda/codegen.h"
#include "flex/cuda/kernel_config.h"
#include "flex/cuda/nvrtc.h"
#endif

namespace kiln::flex {
namespace {

using kiln::testing::rel_error;

#ifdef KILN_WITH_CUDA

const Device kGpu(DeviceType::CUDA, 0);

// A fresh cache directory for one test (removed at the end), in place of the environment's
// (KILN_CACHE_DIR, as XDG_CACHE_HOME) for this process.
struct TempCacheDir {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("kiln_flex_cache_" + std::to_string(getpid()) + "_" + std::to_string(std::rand())))
                         .string();
  TempCacheDir() { kiln::detail::set_cache_dir_override(path); }
  ~TempCacheDir() {
    kiln::detail::set_cache_dir_override("");
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
};

const std::string kFwdOnly = "#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n";
const std::string kBwdOnly = "#define KILN_BUILD_FWD 0\n#define KILN_BUILD_BWD 1\n";

std::string source_for(const ScoreMod* score, const MaskMod* mask, bool bf16, int head_dim, bool wgmma = false,
                       int fwd_tile_m = 64, int fwd_tile_n = 64) {
  detail::Program sp, mp;
  if (score) sp = detail::compile(score->expr);
  if (mask) mp = detail::compile(mask->expr);
  cuda::KernelConfig cfg;
  cfg.bf16 = bf16;
  cfg.head_dim = head_dim;
  cfg.wgmma = wgmma;
  cfg.fwd_tile_m = fwd_tile_m;
  cfg.fwd_tile_n = fwd_tile_n;
  return cuda::generate_source(score ? &sp : nullptr, mask ? &mp : nullptr, cfg);
}

TEST(FlexCudaCodegen, ModFunctionsCompileWithNvrtc) {
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
  // The mod functions of every built-in mod and composition (a one-line kernel calls them), with
  // 64-bit int locals and with the narrow ones.
  for (bool narrow : {false, true}) {
    for (const MaskMod& m : masks) {
      SCOPED_TRACE(m.to_string());
      const detail::Program mp = detail::compile(m.expr);
      EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_mod_check_source(nullptr, &mp, narrow), "sm_90a"));
    }
    for (const ScoreMod& s : scores) {
      SCOPED_TRACE(s.to_string());
      const detail::Program sp = detail::compile(s.expr);
      EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_mod_check_source(&sp, nullptr, narrow), "sm_90a"));
    }
  }
  // Whole kernel sources with the most general mods: a captured-gradient score_mod with a
  // tensor-reading composite mask, wgmma in bf16 at E = 128 and mma.sync in fp16 at E = 64, with the
  // 64-bit int locals and clamped loads of a problem past the narrow bounds.
  const detail::Program sp = detail::compile(scores[3].expr), mp = detail::compile(masks[5].expr);
  for (const bool wgmma : {true, false}) {
    cuda::KernelConfig cfg;
    cfg.wgmma = wgmma;
    cfg.bf16 = wgmma;
    cfg.head_dim = wgmma ? 128 : 64;
    cfg.fwd_keepbits = cfg.mask_ranges = wgmma;
    const std::string src = cuda::generate_source(&sp, &mp, cfg);
    for (const std::string& part : {kFwdOnly, kBwdOnly})
      EXPECT_NO_THROW(cuda::compile_cubin(part + src, wgmma ? "sm_90a" : "sm_80"));
  }
}

// sign, sigmoid, floor, float -> int, clamp and float modulo (forward and score_grad), with 64-bit
// and narrow int locals.
TEST(FlexCudaCodegen, ModVocabularyCompilesWithNvrtc) {
  const Tensor bias = randn({4, 63}).requires_grad_();
  Captured t = capture(bias);
  const ScoreMod score([&](Expr s, Expr, Expr hh, Expr q, Expr kv) {
    const Expr b = t[hh][clamp(q - kv + 31, Expr(0), Expr(62))];
    return sigmoid(s) * b + sign(s) + floor(s * Expr(2.0)) + (s % Expr(0.75)) + to_float(to_int(s * b)) +
           to_float(sign(q - kv)) + clamp(b, Expr(-1.0), Expr(1.0));
  });
  const MaskMod mask([](Expr, Expr, Expr q, Expr kv) {
    return (abs(clamp(q % 8, Expr(1), Expr(6)) - kv % 8) <= 1) | (to_int(to_float(kv) * Expr(0.5)) < 3);
  });
  const detail::Program sp = detail::compile(score.expr), mp = detail::compile(mask.expr);
  for (bool narrow : {false, true}) {
    const std::string src = cuda::generate_mod_check_source(&sp, &mp, narrow);
    for (const char* piece : {"kiln_f2i(", "floorf(", "expf(-", "> 0.f ? 1.f"}) EXPECT_NE(src.find(piece), std::string::npos) << piece;
    EXPECT_NO_THROW(cuda::compile_cubin(src, "sm_90a"));
  }
}

TEST(FlexCudaCodegen, BadTilesAreRejected) {
  try {
    source_for(nullptr, nullptr, true, 64, false, 40, 64);
    ADD_FAILURE() << "a 40-row tile was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] bad forward tile"), std::string::npos) << e.what();
  }
  try {
    source_for(nullptr, nullptr, true, 64, true, 64, 32);
    ADD_FAILURE() << "a wgmma tile of 32 columns was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] the wgmma forward takes"), std::string::npos) << e.what();
  }
}

// The defines of a generated source that choose its kernels' code paths (the forward module's or the
// backward's): the tile, the switches' rules, which mods there are. Dtype, index checks and register
// caps change types, clamps and __launch_bounds__ only, and the mods' own code is compiled above.
std::string path_key(const std::string& src, bool fwd) {
  static const std::vector<std::string> fwd_keys = {"HEAD_DIM",        "FWD_WGMMA", "FWD_TILE_M",  "FWD_TILE_N",
                                                    "FWD_PERSIST",     "FWD_KEEPBITS", "FWD_LAST_ISSUES", "MASK_BITS",
                                                    "MASK_RANGES",     "MERGED_WALK", "FOLD_SCALE", "HAS_SCORE",
                                                    "HAS_MASK"};
  static const std::vector<std::string> bwd_keys = {"HEAD_DIM",   "BWD_WGMMA",   "BWD_SPLIT_P", "HAS_CAP_GRAD",
                                                    "SCORE_GRAD_ONE", "MASK_BITS", "MASK_RANGES", "MERGED_WALK",
                                                    "FOLD_SCALE", "HAS_SCORE",   "HAS_MASK"};
  const std::vector<std::string>& keys = fwd ? fwd_keys : bwd_keys;
  std::istringstream in(src);
  std::string line, key;
  while (std::getline(in, line)) {
    if (line.rfind("#define ", 0) != 0) continue;
    const std::string name = line.substr(8, line.find(' ', 8) - 8);
    if (std::find(keys.begin(), keys.end(), name) != keys.end()) key += line + "\n";
  }
  return key;
}

// Every forward and backward module the plan's rules produce compiles with NVRTC for its
// architecture: kernel_config_for over sm_90 and sm_80, E = 64 and 128, no BlockMask, a BlockMask
// without a mask_mod, a mask of one run a row (causal), one of two runs (prefix-LM) and one that reads
// a tensor (documents), no score_mod, ALiBi (gradient 1), softcap and a learned bias, short and long
// rows, the caller's 128-blocks and the halved 64-blocks, the rule's tile and four tuning tiles, bf16
// and fp16, index checks. One source per distinct set of code paths (path_key), compiled in parallel.
TEST(FlexCudaCodegen, EveryPlannedConfigurationCompilesWithNvrtc) {
  static const int32_t kList[1] = {0};  // stands in for the BlockMask lists' device pointers
  std::vector<double> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(i / 300);
  const detail::Program causal = detail::compile(causal_mask().expr), prefix = detail::compile(prefix_lm_mask(300).expr),
                        documents = detail::compile(and_masks({document_mask(tensor(ids, kInt64)), causal_mask()}).expr);
  const detail::Program slopes = detail::compile(alibi(tensor(std::vector<double>(16, 0.5), kFloat32)).expr),
                        soft = detail::compile(softcap(30.0).expr),
                        bias = detail::compile(relative_position_bias(zeros({16, 8192}).requires_grad_(), 4096).expr);
  const detail::Program* masks[] = {nullptr, nullptr, &causal, &prefix, &documents};  // dense, no mask_mod, ...
  const detail::Program* scores[] = {nullptr, &slopes, &soft, &bias};
  struct Job {
    std::string source, arch;
  };
  std::map<std::string, Job> jobs;  // by architecture, module and path_key
  int configs = 0;
  for (const int major : {9, 8})
    for (const int64_t E : {64, 128})
      for (int mk = 0; mk < 5; ++mk)
        for (const detail::Program* score : scores)
          for (const bool long_rows : {false, true})
            for (const int64_t block : {128, 64})
              for (const auto& [tm, tn] : std::vector<std::pair<int, int>>{{0, 0}, {64, 64}, {64, 128}, {128, 64}, {128, 128}})
                for (const bool check : {false, true}) {
                  if (mk == 0 && block == 64) continue;
                  cpu::Problem p;
                  p.B = 2;
                  p.Hq = 16;
                  p.Hkv = 8;
                  p.L = p.S = 4096;
                  p.E = p.Ev = E;
                  p.scale = 0.1;
                  p.QB = p.KB = block;
                  p.nQ = p.nKV = (long_rows ? 4096 : 512) / block;
                  p.all_full = mk == 0;
                  if (mk > 0) {
                    p.kv_m = long_rows ? 4 : 1;
                    p.fkv_m = long_rows ? 20 : 2;
                    p.kv_num = p.kv_idx = p.fkv_num = p.fkv_idx = kList;
                    p.mask = masks[mk];
                    if (p.mask) p.kv_all_num = p.kv_all_idx = p.q_all_num = p.q_all_idx = kList;  // as the plan merges
                  }
                  p.score = score;
                  FlexTuning tuning;
                  tuning.fwd_tile_m = tm;
                  tuning.fwd_tile_n = tn;
                  int64_t words = 0;
                  const DType dt = check && E == 64 ? kFloat16 : kBFloat16;
                  const cuda::KernelConfig cfg =
                      cuda::kernel_config_for(p, dt, major, check, !check, score == &bias ? 16 * 8192 : 0, tuning, &words);
                  const std::string src = cuda::generate_source(p.score, p.mask, cfg);
                  const std::string arch = major == 9 ? "sm_90a" : "sm_80";
                  jobs.emplace(arch + " fwd\n" + path_key(src, true), Job{kFwdOnly + src, arch});
                  jobs.emplace(arch + " bwd\n" + path_key(src, false), Job{kBwdOnly + src, arch});
                  ++configs;
                }
  std::vector<std::pair<std::string, Job>> list(jobs.begin(), jobs.end());
  std::vector<std::string> errors(list.size());
  std::atomic<size_t> next{0};
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::vector<std::future<void>> workers;
  for (unsigned w = 0; w < n_threads; ++w)
    workers.push_back(std::async(std::launch::async, [&] {
      for (size_t i; (i = next++) < list.size();) try {
          cuda::compile_cubin(list[i].second.source, list[i].second.arch);
        } catch (const Error& e) {
          errors[i] = e.what();
        }
    }));
  for (auto& w : workers) w.get();
  for (size_t i = 0; i < list.size(); ++i) EXPECT_TRUE(errors[i].empty()) << list[i].first << "\n" << errors[i];
  EXPECT_GT(configs, 1000);
  EXPECT_GT(list.size(), 100u) << "the grid reaches too few code paths";
}

// Which masks keep one run a row and a column (MASK_RANGES): comparisons of +-kv and +-q with
// index-free ints joined by &, and | with a bool free of the run's index; not a document mask (a
// tensor read at kv), a chunk (kv / 64), nor the union of two runs (prefix-LM).
TEST(FlexCudaCodegen, MaskRangesOnlyForOneRunMasks) {
  auto runs = [](const MaskMod& m) {
    const detail::Program p = detail::compile(m.expr);
    return !cuda::mask_range_functions(p, true).empty();
  };
  using F = Expr;
  EXPECT_TRUE(runs(causal_mask()));
  EXPECT_TRUE(runs(sliding_window_mask(256)));
  EXPECT_TRUE(runs(MaskMod([](F, F h, F q, F kv) { return (q - kv < 100) & ((h == 1) | (kv >= q - 10)); })));
  EXPECT_TRUE(runs(MaskMod([](F, F, F q, F kv) { return kv == q; })));
  EXPECT_TRUE(runs(MaskMod([](F, F, F q, F) { return q < 300; })));  // a whole row or none
  EXPECT_FALSE(runs(document_mask(tensor({0, 0, 1}, kInt64))));
  EXPECT_FALSE(runs(chunked_mask(64)));
  EXPECT_FALSE(runs(prefix_lm_mask(7)));
  EXPECT_FALSE(runs(MaskMod([](F, F, F q, F kv) { return kv != q; })));
  EXPECT_FALSE(runs(MaskMod([](F, F, F q, F kv) { return kv * 2 < q; })));
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

// With fast_mods, float divisions by constants become multiplications by the reciprocal (forward
// and adjoint), unless the reciprocal is not a normal float; other divisors stay divisions. tanh
// is the SFU's. Without, the IEEE division and tanhf.
TEST(FlexCudaCodegen, ConstantDivisorsMultiplyAndTanhIsApprox) {
  const detail::Program soft = detail::compile(softcap(30.0).expr);
  const std::string exact = cuda::generate_mod_functions(&soft, nullptr, false);
  EXPECT_NE(exact.find("v1 / v2"), std::string::npos) << exact;
  EXPECT_NE(exact.find("tanhf(v3)"), std::string::npos) << exact;
  EXPECT_EQ(exact.find("kiln_tanh"), std::string::npos) << exact;
  const std::string src = cuda::generate_mod_functions(&soft, nullptr, true);
  EXPECT_EQ(src.find(" / "), std::string::npos) << src;
  EXPECT_NE(src.find("v1 * __uint_as_float(0x3d088889u)"), std::string::npos) << src;  // score * (float)(1 / 30)
  EXPECT_NE(src.find("a3 * __uint_as_float(0x3d088889u)"), std::string::npos) << src;  // its adjoint
  EXPECT_NE(src.find("kiln_tanh(v3)"), std::string::npos) << src;
  EXPECT_EQ(src.find("tanhf"), std::string::npos) << src;
  // A divisor that depends on the indices, and constants whose reciprocal overflows (1e-39 is
  // subnormal) or is infinite (0): divisions still.
  const ScoreMod by_q([](Expr s, Expr, Expr, Expr q, Expr) { return s / (q + Expr(1.0)); });
  const ScoreMod tiny([](Expr s, Expr, Expr, Expr, Expr) { return s / Expr(1e-39) + s / Expr(0.0); });
  for (const ScoreMod* m : {&by_q, &tiny}) {
    const detail::Program p = detail::compile(m->expr);
    const std::string s = cuda::generate_mod_functions(&p, nullptr, true);
    EXPECT_NE(s.find(" / v"), std::string::npos) << s;
    EXPECT_EQ(s.find(" * __uint_as_float"), std::string::npos) << s;
  }
  const std::string common(kiln::detail::embedded_source("flex/cuda/device_common.cuh"));
  EXPECT_NE(common.find("tanh.approx.f32"), std::string::npos);
}

// Int locals are `int` where the interval analysis proves them within 32 bits (q, kv < 2^22;
// b, h < 2^16), else and without fast_mods `long long`; a 64-bit result widens its operands.
TEST(FlexCudaCodegen, IntLocalsNarrowUnderTheBounds) {
  const detail::Program causal = detail::compile(causal_mask().expr);
  const std::string narrow = cuda::generate_mod_functions(nullptr, &causal, true);
  EXPECT_NE(narrow.find("const int v0 = (int)q;"), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("const int v1 = (int)kv;"), std::string::npos) << narrow;
  EXPECT_EQ(narrow.find("const long long v"), std::string::npos) << narrow;
  const std::string wide = cuda::generate_mod_functions(nullptr, &causal, false);
  EXPECT_NE(wide.find("const long long v0 = q;"), std::string::npos) << wide;
  EXPECT_EQ(wide.find("const int v"), std::string::npos) << wide;

  const detail::Program al = detail::compile(alibi(rand({4})).expr);
  const std::string an = cuda::generate_mod_functions(&al, nullptr, true);
  EXPECT_NE(an.find("const int v5 = v3 - v4;"), std::string::npos) << an;  // kv - q
  EXPECT_NE(an.find("const float v6 = kiln_i2f(v5);"), std::string::npos) << an;  // |kv - q| < 2^22
  EXPECT_EQ(an.find("const long long v"), std::string::npos) << an;
  const std::string aw = cuda::generate_mod_functions(&al, nullptr, false);
  EXPECT_NE(aw.find("const long long v5 = v3 - v4;"), std::string::npos) << aw;
  EXPECT_NE(aw.find("const float v6 = (float)v5;"), std::string::npos) << aw;
  EXPECT_EQ(aw.find("const int v"), std::string::npos) << aw;

  // q * kv needs 64 bits (its int operands widened); its remainder by 7 is narrow again.
  const MaskMod mixed([](Expr, Expr, Expr q, Expr kv) { return q * kv % Expr(7) == Expr(0); });
  const detail::Program mp = detail::compile(mixed.expr);
  const std::string mn = cuda::generate_mod_functions(nullptr, &mp, true);
  EXPECT_NE(mn.find("const long long v2 = (long long)v0 * (long long)v1;"), std::string::npos) << mn;
  EXPECT_NE(mn.find("const int v4 = kiln_floormod(v2, (long long)v3);"), std::string::npos) << mn;

  // q * 8 is a 32-bit int but reaches 2^25: its conversion stays (float).
  const ScoreMod wide_conv([](Expr sc, Expr, Expr, Expr q, Expr) { return sc + q * Expr(8) * Expr(1e-9); });
  const detail::Program wp = detail::compile(wide_conv.expr);
  const std::string wc = cuda::generate_mod_functions(&wp, nullptr, true);
  EXPECT_EQ(wc.find("kiln_i2f"), std::string::npos) << wc;
  EXPECT_NE(wc.find("(float)v"), std::string::npos) << wc;

  // The kernel source follows KernelConfig::fast_mods (and so does the NVRTC cache key).
  cuda::KernelConfig cfg;
  const std::string off = cuda::generate_source(nullptr, &causal, cfg);
  cfg.fast_mods = true;
  EXPECT_NE(off, cuda::generate_source(nullptr, &causal, cfg));
}

// kiln_i2f (the conversion of ints within +-2^22 under fast_mods) is exact over its whole range:
// its formula, taken from device_common.cuh, evaluated with the host's IEEE float add.
TEST(FlexCudaCodegen, MagicIntToFloatIsExact) {
  const std::string formula = "__int_as_float(0x4B400000 + x) - 12582912.0f";
  ASSERT_NE(std::string(kiln::detail::embedded_source("flex/cuda/device_common.cuh")).find(formula), std::string::npos);
  int64_t wrong = 0;
  for (int32_t x = -(1 << 22); x <= (1 << 22); ++x) {
    const uint32_t bits = 0x4B400000u + static_cast<uint32_t>(x);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    const volatile float r = f - 12582912.0f;
    wrong += r != static_cast<float>(x);
  }
  EXPECT_EQ(wrong, 0);
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

TEST(FlexAttentionCuda, SecondCompileLoadsFromDisk) {
  KILN_REQUIRE_CUDA();
  TempCacheDir dir;
  manual_seed(17);
  const int64_t w = 300 + std::rand() % 5000;  // a mod no other test compiled
  const BlockMask bm = create_block_mask(sliding_window_mask(w), 1, 1, 128, 128);
  FlexOptions o;
  o.block_mask = &bm;
  const Tensor q = randn({1, 1, 128, 64}, TensorOptions().dtype(kBFloat16).device(kGpu)),
               k = randn({1, 1, 128, 64}, TensorOptions().dtype(kBFloat16).device(kGpu));
  const cuda::CacheStats s0 = cuda::cache_stats();
  const Tensor a = flex_attention(q, k, k, o).out.to(kCPU, kFloat64);
  const cuda::CacheStats s1 = cuda::cache_stats();
  EXPECT_EQ(s1.compiles, s0.compiles + 2);  // the forward and backward modules
  const Tensor again = flex_attention(q, k, k, o).out.to(kCPU, kFloat64);  // in memory now
  EXPECT_EQ(cuda::cache_stats().compiles, s1.compiles);
  EXPECT_GE(cuda::cache_stats().memory_hits, s1.memory_hits + 1);
  cuda::clear_kernel_cache();  // as a new process would start
  const Tensor b = flex_attention(q, k, k, o).out.to(kCPU, kFloat64);
  const cuda::CacheStats s2 = cuda::cache_stats();
  EXPECT_EQ(s2.compiles, s1.compiles) << "the second process compiled again";
  EXPECT_EQ(s2.disk_hits, s1.disk_hits + 2);
  EXPECT_EQ(rel_error(a, b), 0.0);
  EXPECT_EQ(rel_error(a, again), 0.0);
}

#else

TEST(FlexCudaCodegen, ModFunctionsCompileWithNvrtc) { GTEST_SKIP() << "kiln was built without CUDA (no NVRTC)"; }

#endif

}  // namespace
}  // namespace kiln::flex
