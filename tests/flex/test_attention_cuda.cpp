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
#include "flex/cuda/kernel_config.h"
#include "flex/cuda/nvrtc.h"
#endif

namespace kiln::flex {
namespace {

using kiln::testing::rel_error;
using testing::all_partial;
using testing::MaskFn;
using testing::reference;
using testing::ScoreFn;

#ifdef KILN_WITH_CUDA

using kiln::testing::ScopedEnv;

// A fresh cache directory for one test (removed at the end).
struct TempCacheDir {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("kiln_flex_cache_" + std::to_string(getpid()) + "_" + std::to_string(std::rand())))
                         .string();
  ScopedEnv env{"KILN_CACHE_DIR", path.c_str()};
  ~TempCacheDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string source_for(const ScoreMod* score, const MaskMod* mask, bool bf16, int head_dim, int fwd_tile_m = 64,
                       int fwd_mt = 1, bool wgmma = false, int fwd_tile_n = 64, bool bwd_wgmma = false) {
  detail::Program sp, mp;
  if (score) sp = detail::compile(score->expr);
  if (mask) mp = detail::compile(mask->expr);
  cuda::KernelConfig cfg;
  cfg.bf16 = bf16;
  cfg.head_dim = head_dim;
  cfg.fwd_tile_m = fwd_tile_m;
  cfg.fwd_mt = fwd_mt;
  cfg.fwd_tile_n = fwd_tile_n;
  cfg.fwd_wgmma = wgmma;
  cfg.bwd_wgmma = bwd_wgmma;
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
  // The mod functions of every built-in mod and composition (fast: a one-line kernel calls them),
  // with 64-bit int locals and with the narrow ones.
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
  // Whole kernel sources: a captured-gradient score_mod with a tensor-reading composite mask in
  // bf16 / E = 128, fp16 / E = 64, and no mods for sm_80.
  EXPECT_NO_THROW(cuda::compile_cubin(source_for(&scores[3], &masks[5], true, 128), "sm_90a"));
  EXPECT_NO_THROW(cuda::compile_cubin(source_for(&scores[0], &masks[0], false, 64), "sm_90a"));
  // The forward's 128-row tile (4 warps of 32 rows), the default where the blocks allow it.
  EXPECT_NO_THROW(cuda::compile_cubin(
      "#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n" + source_for(&scores[3], &masks[5], true, 128, 128, 2),
      "sm_90a"));
  try {
    source_for(nullptr, nullptr, true, 64, 128, 3);
    ADD_FAILURE() << "a 128-row tile in warps of 48 rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] bad forward tile"), std::string::npos) << e.what();
  }
  // The wgmma forward (sm_90a): 64 x 128 tiles in bf16 / E = 128 with mods, 128 x 64 in fp16 / E = 64.
  const std::string fwd_only = "#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n";
  EXPECT_NO_THROW(
      cuda::compile_cubin(fwd_only + source_for(&scores[3], &masks[5], true, 128, 64, 1, true, 128), "sm_90a"));
  EXPECT_NO_THROW(cuda::compile_cubin(fwd_only + source_for(&scores[0], &masks[0], false, 64, 128, 1, true, 64), "sm_90a"));
  // The wgmma backward: captured-tensor gradients with a composite mask at E = 128, fp16 at E = 64.
  const std::string bwd_only = "#define KILN_BUILD_FWD 0\n#define KILN_BUILD_BWD 1\n";
  EXPECT_NO_THROW(cuda::compile_cubin(bwd_only + source_for(&scores[2], &masks[5], true, 128, 64, 1, false, 64, true),
                                      "sm_90a"));
  EXPECT_NO_THROW(
      cuda::compile_cubin(bwd_only + source_for(&scores[1], &masks[0], false, 64, 64, 1, false, 64, true), "sm_90a"));
  try {
    source_for(nullptr, nullptr, true, 64, 64, 1, true, 32);
    ADD_FAILURE() << "a wgmma tile of 32 columns was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] the wgmma forward takes"), std::string::npos) << e.what();
  }
  // The measurement switches: phase counters in every kernel, the forward's second K buffer; with
  // narrow int locals, as the host picks for lengths under 2^22.
  {
    detail::Program mp = detail::compile(masks[0].expr);
    cuda::KernelConfig cfg;
    cfg.fast_mods = true;
    cfg.profile = true;
    cfg.fwd_kbuf = cfg.bwd_kbuf = 2;
    cfg.fwd_wgmma = cfg.bwd_wgmma = true;
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(nullptr, &mp, cfg), "sm_90a"));
    cfg.fwd_overlap = true;  // the overlapped wgmma forward, with a tensor-reading score_mod (E = 128)
    const detail::Program sp = detail::compile(scores[2].expr);
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_overlap = false;
    cfg.fwd_tma = true;  // the TMA forward (bulk tensor copies, mbarriers), two K / V stages
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_kbuf = 1;  // and one
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_keepbits = true;  // keep bits while QK^T is in flight, the walks a step ahead
    cfg.walk_ahead = true;
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_keepbits = cfg.walk_ahead = false;
    cfg.mask_bits = true;  // partial blocks' keep bits from flex_mask_bits (a mask reading a tensor)
    const detail::Program dp = detail::compile(masks[2].expr);
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &dp, cfg), "sm_90a"));
    cfg.fwd_kbuf = 2;
    cfg.fwd_persist = true;  // the persistent forward: with the mask bits, then the keep bits
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &dp, cfg), "sm_90a"));
    cfg.mask_bits = false;
    cfg.fwd_keepbits = true;
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_persist = false;  // three stages, the last warp done with a stage issuing, the scale folded
    cfg.fwd_stages = 3;
    cfg.fwd_last_issues = cfg.fold_scale = true;
    EXPECT_NO_THROW(cuda::compile_cubin(fwd_only + cuda::generate_source(nullptr, &mp, cfg), "sm_90a"));
    cfg.fwd_tile_m = cfg.fwd_tile_n = 128;  // two warpgroups taking turns on the tensor cores
    cfg.fwd_pingpong = true;
    EXPECT_NE(cuda::generate_source(nullptr, &mp, cfg).find("#define FWD_PINGPONG 1"), std::string::npos);
    EXPECT_NO_THROW(cuda::compile_cubin(fwd_only + cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.fwd_tile_m = cfg.fwd_tile_n = 64;
    cfg.fwd_pingpong = false;
    cfg.fwd_stages = 2;
    cfg.fwd_last_issues = cfg.fold_scale = cfg.fwd_keepbits = false;
    cfg.merged_walk = true;  // one merged list a row, in every kernel (with the mask bits' slots)
    cfg.mask_bits = cfg.bwd_tma = true;
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &dp, cfg), "sm_90a"));
    cfg.merged_walk = cfg.mask_bits = false;
    cfg.mask_ranges = cfg.fwd_keepbits = true;  // a window's runs, with a score_mod of gradient 1 (split P)
    cfg.bwd_split_p = cfg.bwd_paired = true;
    const detail::Program wp = detail::compile(masks[1].expr), ap = detail::compile(scores[0].expr);
    EXPECT_NE(cuda::generate_source(&ap, &wp, cfg).find("#define MASK_RANGES 1"), std::string::npos);
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&ap, &wp, cfg), "sm_90a"));
    cfg.mask_ranges = cfg.fwd_keepbits = cfg.bwd_split_p = cfg.bwd_paired = cfg.bwd_tma = false;
    cfg.fwd_kbuf = 1;
    cfg.bwd_tma = true;  // the TMA backward, with captured-tensor gradients
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(&sp, &mp, cfg), "sm_90a"));
    cfg.bwd_tma = false;
    cfg.fwd_tma = false;
    cfg.fwd_wgmma = cfg.bwd_wgmma = false;
    EXPECT_NO_THROW(cuda::compile_cubin(cuda::generate_source(nullptr, &mp, cfg), "sm_80"));
  }
  // The forward and backward halves load_kernels compiles separately (here for sm_80).
  const std::string plain = source_for(nullptr, nullptr, true, 64);
  EXPECT_NO_THROW(cuda::compile_cubin("#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n" + plain, "sm_80"));
  EXPECT_NO_THROW(cuda::compile_cubin("#define KILN_BUILD_FWD 0\n#define KILN_BUILD_BWD 1\n" + plain, "sm_80"));
}

// Which masks keep one run a row and a column (MASK_RANGES): comparisons of +-kv and +-q with
// index-free ints joined by &, and | with a bool free of the run's index; not a document mask (a
// tensor read at kv), a chunk (kv / 64), nor the union of two runs (prefix-LM).
TEST(FlexCudaCodegen, MaskRangesOnlyForOneRunMasks) {
  auto runs = [](const MaskMod& m) {
    const detail::Program p = detail::compile(m.expr);
    return !cuda::mask_range_functions(p, true, true).empty();
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
  EXPECT_NE(std::string(cuda::params_struct_source()).find("tanh.approx.f32"), std::string::npos);
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
// its formula, taken from the generated prelude, evaluated with the host's IEEE float add.
TEST(FlexCudaCodegen, MagicIntToFloatIsExact) {
  const std::string formula = "__int_as_float(0x4B400000 + x) - 12582912.0f";
  ASSERT_NE(std::string(cuda::params_struct_source()).find(formula), std::string::npos);
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


// ---------------- GPU tests ----------------

const Device kGpu(DeviceType::CUDA, 0);

struct GpuCase {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 200, S = 333, E = 64, bs = 128;
};

struct FlexRun {
  Tensor out, lse;
  std::vector<Tensor> grads;  // q, k, v, then `extra` (on the CPU, float64)
};

// flex_attention on `dev` from CPU inputs (converted to dtype dt), with grads for q, k, v and `extra`.
FlexRun run_on(Device dev, DType dt, const Tensor& q, const Tensor& k, const Tensor& v, const FlexOptions& o,
           const Tensor& cot, const std::vector<Tensor>& extra = {}) {
  Tensor qd = q.to(dev, dt).detach().requires_grad_(), kd = k.to(dev, dt).detach().requires_grad_(),
         vd = v.to(dev, dt).detach().requires_grad_();
  const FlexOutput r = flex_attention(qd, kd, vd, o);
  std::vector<Tensor> wrt = {qd, kd, vd};
  for (const Tensor& e : extra) wrt.push_back(e);
  const std::vector<Tensor> g = autograd::grad({r.out}, wrt, {cot.to(dev, dt)});
  FlexRun res;
  res.out = r.out.to(kCPU, kFloat64);
  res.lse = r.lse.defined() ? r.lse.to(kCPU, kFloat64) : Tensor();
  for (const Tensor& x : g) res.grads.push_back(x.to(kCPU, kFloat64));
  return res;
}

// CUDA against the float64 reference (out, lse) and the float64 CPU kernels (gradients).
void check_cuda(const GpuCase& c, DType dt, const MaskMod* mask, const MaskFn& mfn, const ScoreMod& smod,
                const ScoreFn& sfn, const std::vector<Tensor>& extra = {}, bool device_mask = false) {
  const Tensor q = randn({c.B, c.Hq, c.L, c.E}, dt).to(kFloat64), k = randn({c.B, c.Hkv, c.S, c.E}, dt).to(kFloat64),
               v = randn({c.B, c.Hkv, c.S, c.E}, dt).to(kFloat64), cot = randn({c.B, c.Hq, c.L, c.E}, dt).to(kFloat64);
  FlexOptions o;
  o.score_mod = smod;
  o.enable_gqa = c.Hq != c.Hkv;
  o.return_lse = true;
  BlockMask bm, bm_dev;
  if (mask) {
    const int64_t mb = mask->expr.uses_b() ? c.B : 1, mh = mask->expr.uses_h() ? c.Hq : 1;
    bm = create_block_mask(*mask, mb, mh, c.L, c.S, c.bs);
    if (device_mask) {
      bm_dev = create_block_mask(*mask, mb, mh, c.L, c.S, c.bs, kGpu);
      ASSERT_TRUE(bm_dev.kv_indices.is_cuda());
    }
  }
  o.block_mask = mask ? (device_mask ? &bm_dev : &bm) : nullptr;
  const FlexRun gpu = run_on(kGpu, dt, q, k, v, o, cot, extra);
  const auto [ref_out, ref_lse] = reference(q, k, v, sfn, mfn);
  const double tol = dt == kBFloat16 ? 2e-2 : 5e-3, gtol = dt == kBFloat16 ? 4e-2 : 1e-2;
  EXPECT_CLOSE(gpu.out, ref_out, tol);
  EXPECT_CLOSE(gpu.lse, ref_lse, 1e-3);
  // Gradients against the CPU kernels in float64 (extra tensors' grads arrive on the CPU).
  std::vector<Tensor> extra64;
  for (const Tensor& e : extra) extra64.push_back(e);
  o.block_mask = mask ? &bm : nullptr;
  const FlexRun cpu = run_on(kCPU, kFloat64, q, k, v, o, cot, extra64);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  const char* names[] = {"dq", "dk", "dv", "dextra0", "dextra1"};
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    SCOPED_TRACE(names[std::min<size_t>(i, 4)]);
    EXPECT_CLOSE(gpu.grads[i], cpu.grads[i], gtol);
  }
}

const MaskFn kCausal = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
// The reference of softcap(5.0).
const ScoreFn kSoftcap5 = [](double s, int64_t, int64_t, int64_t, int64_t) { return 5.0 * std::tanh(s / 5.0); };

// Two batches, GQA (4 q heads over 2 kv heads), L = 333 and the given S at E = 128: lengths that
// are not multiples of any tile.
GpuCase gqa_ragged_e128(int64_t S) {
  GpuCase c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.L = 333;
  c.S = S;
  c.E = 128;
  return c;
}

// A causal window of W with softcap(5.0) in bf16, against the reference.
void check_window_softcap(const GpuCase& c, int64_t W) {
  const MaskMod window = sliding_window_mask(W);
  const MaskFn f = [W](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < W; };
  check_cuda(c, kBFloat16, &window, f, softcap(5.0), kSoftcap5);
}

// Causal attention with relative_position_bias(bias, c.S) in bf16 against the reference read from
// bias's current values; `extra` = {bias} also checks its gradient.
void check_relative_bias(const GpuCase& c, const Tensor& bias, const std::vector<Tensor>& extra = {},
                         const ScoreMod* mod = nullptr) {
  const std::vector<double> bv = bias.to_vector();
  const int64_t off = c.S;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, mod ? *mod : relative_position_bias(bias, off),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * (c.L + c.S) + q - kv + off]; },
             extra);
}

TEST(FlexAttentionCuda, MasksMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(11);
  GpuCase c;
  const MaskMod causal = causal_mask(), window = sliding_window_mask(100), prefix = prefix_lm_mask(150),
                chunk = chunked_mask(128);
  check_cuda(c, kBFloat16, nullptr, nullptr, ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr, {}, /*device_mask=*/true);
  check_cuda(c, kBFloat16, &window, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 100; },
             ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &prefix, [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 150 || q >= kv; },
             ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &chunk, [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 128 == kv / 128; },
             ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, DocumentMaskE128Fp16) {
  KILN_REQUIRE_CUDA();
  manual_seed(12);
  GpuCase c;
  c.L = c.S = 333;
  c.E = 128;
  std::vector<double> ids(333);
  for (int64_t i = 0; i < 333; ++i) ids[i] = static_cast<double>(i < 100 ? 0 : i < 103 ? 1 : i < 250 ? 2 : 3);
  const MaskMod doc = and_masks({document_mask(tensor(ids, kInt32)), causal_mask()});
  const MaskFn f = [&](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; };
  check_cuda(c, kFloat16, &doc, f, ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &doc, f, ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, ScoreModsAndLearnedBiasGradient) {
  KILN_REQUIRE_CUDA();
  manual_seed(13);
  GpuCase c;
  const Tensor slopes = rand({c.Hq}, kFloat64);
  const std::vector<double> sl = slopes.to_vector();
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, alibi(slopes),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
  check_cuda(c, kFloat16, nullptr, nullptr, softcap(2.0),
             [](double s, int64_t, int64_t, int64_t, int64_t) { return 2.0 * std::tanh(s / 2.0); });
  // A learned relative bias: its gradient (reduced in fixed order on the GPU) against the CPU's.
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  check_relative_bias(c, bias, {bias});
}

// The compiled-mod and kernel caches key on captured tensors' versions: an in-place update of a
// captured bias (an optimizer step) reaches the next call's device copy and kernels.
TEST(FlexAttentionCuda, InPlaceChangeOfCapturedTensorIsSeen) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  GpuCase c;
  Tensor bias = randn({c.Hq, c.L + c.S}, kFloat64) * 0.5;
  const ScoreMod mod = relative_position_bias(bias, c.S);  // one expression for both calls
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    check_relative_bias(c, bias, {}, &mod);
    NoGradGuard ng;
    add_(bias, randn(bias.sizes(), kFloat64));
  }
}

// On sm_90 the kernels default to wgmma; the mma.sync kernels (every other GPU) forced here, and
// the other way round elsewhere (wgmma is only taken on sm_90, so there the default runs twice).
TEST(FlexAttentionCuda, MmaSyncKernelsMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(18);
  const ScopedEnv fwd("KILN_FLEX_FWD_MMA", "mma"), bwd("KILN_FLEX_BWD_MMA", "mma");
  GpuCase c;
  const MaskMod causal = causal_mask();
  const Tensor slopes = rand({c.Hq}, kFloat64);
  const std::vector<double> sl = slopes.to_vector();
  check_cuda(c, kBFloat16, &causal, kCausal, alibi(slopes),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
  c.E = 128;
  c.L = c.S = 200;
  check_cuda(c, kFloat16, &causal, kCausal, ScoreMod(), nullptr);
}

// The forward's phase counters (a measurement tool) leave the results alone.
TEST(FlexAttentionCuda, ForwardProfileKeepsResults) {
  KILN_REQUIRE_CUDA();
  manual_seed(19);
  const ScopedEnv prof("KILN_FLEX_PROFILE", "1");
  GpuCase c;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
}

// KILN_FLEX_FWD_KBUF=2 and KILN_FLEX_BWD_KBUF=2 (the next K tile a step earlier, in a second
// buffer, in the forward and the dQ kernel), with both products.
// The second-buffer measurement switches (K in the forward and dQ kernels, Q / dO in dK/dV),
// learned-bias gradients included (the dK/dV walk differs with two Q / dO buffers).
TEST(FlexAttentionCuda, TwoKBuffersMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(20);
  const ScopedEnv kbuf("KILN_FLEX_FWD_KBUF", "2"), bkbuf("KILN_FLEX_BWD_KBUF", "2"), qbuf("KILN_FLEX_BWD_QBUF", "2"),
      btma("KILN_FLEX_BWD_TMA", "0");  // the cp.async backward's buffers (TMA has its own)
  GpuCase c;
  const MaskMod causal = causal_mask(), window = sliding_window_mask(100);
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
  check_cuda(c, kBFloat16, &window, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 100; },
             ScoreMod(), nullptr);
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  check_relative_bias(c, bias, {bias});
  const ScopedEnv mma("KILN_FLEX_FWD_MMA", "mma"), bmma("KILN_FLEX_BWD_MMA", "mma");
  check_cuda(c, kFloat16, &causal, kCausal, ScoreMod(), nullptr);
}

TEST(FlexAttentionCuda, MmaSelectionRejectsUnknownValues) {
  KILN_REQUIRE_CUDA();
  const ScopedEnv fwd("KILN_FLEX_FWD_MMA", "tensor");
  const Tensor q = randn({1, 2, 64, 64}, kBFloat16).to(kGpu);
  try {
    flex_attention(q, q, q, FlexOptions());
    ADD_FAILURE() << "KILN_FLEX_FWD_MMA=tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_FLEX_FWD_MMA must be wgmma or mma"), std::string::npos) << e.what();
  }
}

TEST(FlexAttentionCuda, GqaRaggedLengthsE128) {
  KILN_REQUIRE_CUDA();
  manual_seed(14);
  GpuCase c = gqa_ragged_e128(200);
  check_window_softcap(c, 70);
  // Per-head mask (BlockMask over heads) with a 64-block mask.
  c.bs = 64;
  const MaskMod per_head([](Expr bb, Expr hh, Expr q, Expr kv) { return q - kv <= hh * 40 + bb; });
  check_cuda(c, kFloat16, &per_head, [](int64_t bb, int64_t hh, int64_t q, int64_t kv) { return q - kv <= hh * 40 + bb; },
             ScoreMod(), nullptr);
}

// The forward's other tiles at E = 128 (KILN_FLEX_FWD_TILE; the default is 128 x 128 on sm_90),
// with the TMA forward's two stages and one: ragged lengths, GQA, a window and a score_mod, against
// the reference. (Short rows may take a smaller tile by default once measured.)
TEST(FlexAttentionCuda, ForwardTilesAtE128MatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(33);
  const GpuCase c = gqa_ragged_e128(400);
  for (const char* tile : {"64x64x1", "64x128x1", "128x64x1"})
    for (const char* kbuf : {"1", "2"}) {
      SCOPED_TRACE(std::string("tile ") + tile + ", K / V stages " + kbuf);
      const ScopedEnv t("KILN_FLEX_FWD_TILE", tile), k("KILN_FLEX_FWD_KBUF", kbuf);
      check_window_softcap(c, 150);
    }
}

TEST(FlexAttentionCuda, FullyMaskedRowsGiveZeroAndNoNan) {
  KILN_REQUIRE_CUDA();
  manual_seed(15);
  const int64_t L = 150, S = 150;
  // Rows q < 70 attend nothing.
  const MaskMod m([](Expr, Expr, Expr q, Expr kv) { return kv < q - 69; });
  const BlockMask bm = create_block_mask(m, 1, 1, L, S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  const Tensor q = randn({1, 2, L, 64}), k = randn({1, 2, S, 64}), v = randn({1, 2, S, 64}), cot = randn({1, 2, L, 64});
  const FlexRun r = run_on(kGpu, kBFloat16, q, k, v, o, cot);
  const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector(), dq = r.grads[0].to_vector();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 70; ++i) {
      EXPECT_EQ(lse[h * L + i], -INFINITY);
      for (int64_t e = 0; e < 64; ++e) {
        EXPECT_EQ(out[(h * L + i) * 64 + e], 0.0);
        EXPECT_EQ(dq[(h * L + i) * 64 + e], 0.0);
      }
    }
  for (const Tensor& g : r.grads)
    for (double x : g.to_vector()) ASSERT_TRUE(std::isfinite(x));
  const auto [ref, ref_lse] =
      reference(q.to(kBFloat16).to(kFloat64), k.to(kBFloat16).to(kFloat64), v.to(kBFloat16).to(kFloat64), nullptr,
                [](int64_t, int64_t, int64_t qi, int64_t kv) { return kv < qi - 69; });
  EXPECT_CLOSE(r.out, ref, 2e-2);
  EXPECT_CLOSE(r.lse, ref_lse, 1e-3);
}

bool same_bits(const FlexRun& a, const FlexRun& b) {
  auto eq = [](const Tensor& x, const Tensor& y) {
    const std::vector<double> u = x.to_vector(), w = y.to_vector();
    return u.size() == w.size() && std::memcmp(u.data(), w.data(), u.size() * sizeof(double)) == 0;
  };
  if (!eq(a.out, b.out) || a.grads.size() != b.grads.size()) return false;
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (!eq(a.grads[i], b.grads[i])) return false;
  return true;
}

TEST(FlexAttentionCuda, BackwardIsBitwiseDeterministic) {
  KILN_REQUIRE_CUDA();
  manual_seed(16);
  const int64_t L = 300, S = 420, H = 4;
  const Tensor q = randn({2, H, L, 64}), k = randn({2, 2, S, 64}), v = randn({2, 2, S, 64}), cot = randn({2, H, L, 64});
  const Tensor bias = randn({H, L + S}, kFloat32).requires_grad_();
  const BlockMask bm = create_block_mask(sliding_window_mask(200), 1, 1, L, S);
  FlexOptions o;
  o.block_mask = &bm;
  o.enable_gqa = true;
  o.score_mod = relative_position_bias(bias, S);
  const FlexRun a = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  const FlexRun b = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  EXPECT_TRUE(same_bits(a, b)) << "two CUDA runs differ";
  // The same mask with every listed block marked partial: the same bits (classification-free).
  const BlockMask partial = all_partial(bm, 128);
  o.block_mask = &partial;
  EXPECT_TRUE(same_bits(a, run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias})))
      << "full vs partial classification changes the CUDA result";
}

// The same call with `var`=`off` and with `var`=`on` gives the same bits (out, lse, gradients).
void expect_same_bits_across(const char* var, const char* on, const char* off, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& cot, const FlexOptions& o) {
  FlexRun base;
  {
    const ScopedEnv unset(var, off);
    base = run_on(kGpu, kBFloat16, q, k, v, o, cot);
  }
  const ScopedEnv set(var, on);
  const FlexRun other = run_on(kGpu, kBFloat16, q, k, v, o, cot);
  EXPECT_TRUE(same_bits(base, other)) << var << "=" << on << " changed the bits";
  const std::vector<double> a = base.lse.to_vector(), b = other.lse.to_vector();
  EXPECT_TRUE(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// expect_same_bits_across on fresh [1, c.Hq | c.Hkv, len, c.E] inputs (GQA, lse) under a BlockMask of
// `mask` over mh heads.
void expect_same_bits_on_mask(const char* var, const char* on, const char* off, const GpuCase& c, const MaskMod& mask,
                              int64_t mh) {
  const Tensor q = randn({1, c.Hq, c.L, c.E}), k = randn({1, c.Hkv, c.S, c.E}), v = randn({1, c.Hkv, c.S, c.E}),
               cot = randn({1, c.Hq, c.L, c.E});
  const BlockMask bm = create_block_mask(mask, 1, mh, c.L, c.S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  o.enable_gqa = true;
  expect_same_bits_across(var, on, off, q, k, v, cot, o);
}

// A kernel variant switched on by `var`=`on`: against the reference, with rows that attend
// nothing and tiles of one block, and bit for bit (out, lse, gradients; GQA) the kernels with
// `var`=`off` (the same operations in the same order, only issued or loaded differently).
void check_kernel_variant(const char* var, const char* on = "1", const char* off = "0") {
  GpuCase c;
  const MaskMod causal = causal_mask(), late = MaskMod([](Expr, Expr, Expr q, Expr kv) { return kv < q - 69; });
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  {
    const ScopedEnv set(var, on);
    check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
    check_cuda(c, kFloat16, &late, [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < q - 69; }, ScoreMod(),
               nullptr);
    check_relative_bias(c, bias, {bias});
    c.E = 128;
    check_cuda(c, kBFloat16, &causal, kCausal, softcap(5.0), kSoftcap5);
  }
  for (const int64_t E : {64, 128}) {
    const int64_t L = 700, S = 900;
    const Tensor q = randn({2, 4, L, E}), k = randn({2, 2, S, E}), v = randn({2, 2, S, E}), cot = randn({2, 4, L, E});
    const BlockMask bm = create_block_mask(sliding_window_mask(300), 1, 1, L, S);
    FlexOptions o;
    o.block_mask = &bm;
    o.return_lse = true;
    o.enable_gqa = true;
    SCOPED_TRACE("E = " + std::to_string(E));
    expect_same_bits_across(var, on, off, q, k, v, cot, o);
  }
}

// KILN_FLEX_FWD_OVERLAP=1: the softmax of a tile beside the previous tile's P V.
TEST(FlexAttentionCuda, OverlappedForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(21);
  check_kernel_variant("KILN_FLEX_FWD_OVERLAP");
}

// KILN_FLEX_FWD_TMA (the default on sm_90): Q, K and V tiles by TMA with mbarrier completion,
// against KILN_FLEX_FWD_TMA=0's cp.async.
TEST(FlexAttentionCuda, TmaForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  check_kernel_variant("KILN_FLEX_FWD_TMA");
}

// KILN_FLEX_BWD_CONCURRENT (the default): the dK/dV kernel on a side stream beside the dQ kernel,
// against the reference (captured-tensor gradients included) and bit for bit the kernels in turn.
TEST(FlexAttentionCuda, ConcurrentBackwardMatchesReferenceAndSequentialBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(31);
  check_kernel_variant("KILN_FLEX_BWD_CONCURRENT");
}

// The captured-tensor gradient slots are zeroed before the side stream's dK/dV kernel starts: with
// a long dQ kernel ahead of it on the main stream (2048 causal rows), a zero fill queued after the
// dQ kernel would wipe dK/dV's sums (that race, fixed in session 12, showed as changed bits).
TEST(FlexAttentionCuda, ConcurrentBackwardCapturedGradsOnLongRows) {
  KILN_REQUIRE_CUDA();
  manual_seed(36);
  const int64_t L = 2048, H = 8;
  const Tensor q = randn({1, H, L, 64}), k = randn({1, H, L, 64}), v = randn({1, H, L, 64}), cot = randn({1, H, L, 64});
  const Tensor bias = randn({H, 2 * L}, kFloat32).requires_grad_();
  const BlockMask bm = create_block_mask(causal_mask(), 1, 1, L, L);
  FlexOptions o;
  o.block_mask = &bm;
  o.score_mod = relative_position_bias(bias, L);
  FlexRun sequential;
  {
    const ScopedEnv off("KILN_FLEX_BWD_CONCURRENT", "0");
    sequential = run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias});
  }
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(same_bits(sequential, run_on(kGpu, kBFloat16, q, k, v, o, cot, {bias}))) << "run " << run;
}

// KILN_FLEX_BWD_KBUF=2 with the TMA backward (the default on sm_90): the dQ kernel's two K / V
// stages (the next tile's loads a whole step ahead), against one stage.
TEST(FlexAttentionCuda, TwoStageTmaDqMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(34);
  check_kernel_variant("KILN_FLEX_BWD_KBUF", "2", "1");
}

// KILN_FLEX_BWD_PAIRED=1 (the default on sm_90): the TMA backward's products issued in pairs, one
// wait a pair, against one wait a product.
TEST(FlexAttentionCuda, PairedBackwardProductsMatchReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(35);
  check_kernel_variant("KILN_FLEX_BWD_PAIRED");
}

// A switch on a causal document mask at E = 128 (partial blocks take their keep bits from
// flex_mask_bits): against the reference with var=on, and bit for bit against var=off.
void check_document_variant(const char* var, const char* on = "1", const char* off = "0") {
  GpuCase c;
  c.Hq = 4;
  c.L = 700;
  c.S = 900;
  c.E = 128;
  std::vector<int64_t> ids(static_cast<size_t>(c.S));
  for (size_t i = 0, d = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(d += std::rand() % 97 == 0);
  const Tensor doc = tensor(std::vector<double>(ids.begin(), ids.end()), kInt64);
  const MaskMod m = and_masks({document_mask(doc), causal_mask()});
  {
    const ScopedEnv set(var, on);
    check_cuda(c, kBFloat16, &m, [&](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; },
               ScoreMod(), nullptr);
  }
  expect_same_bits_on_mask(var, on, off, c, m, 1);
}

// KILN_FLEX_BWD_SPLIT_P=1 (the default on sm_90): without a score_mod each backward tile's P is
// computed while its dP product is in flight, then dS; against the reference, and bit for bit against
// KILN_FLEX_BWD_SPLIT_P=0's joint P / dS, on the variant suite and on a document mask (the dQ kernel's
// keep-bits path).
TEST(FlexAttentionCuda, SplitPBackwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(39);
  check_kernel_variant("KILN_FLEX_BWD_SPLIT_P");
  check_document_variant("KILN_FLEX_BWD_SPLIT_P");
}

// KILN_FLEX_MASK_RANGES (the default on sm_90): partial tiles of a mask that keeps one run a row and column test their
// elements against it instead of evaluating the mask; against the reference and bit for bit
// against the evaluated mask on the variant suite, and on compositions (a run joined with a
// head-only bool, equality, a row-only mask) and masks that fall back (prefix-LM, chunks).
TEST(FlexAttentionCuda, MaskRangesMatchReferenceAndEvaluatedBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(43);
  check_kernel_variant("KILN_FLEX_MASK_RANGES");
  using F = Expr;
  const std::vector<std::pair<MaskMod, MaskFn>> cases = {
      {MaskMod([](F, F h, F q, F kv) { return (q - kv < 100) & ((h == 1) | (kv >= q - 10)) & (kv <= q + 3); }),
       [](int64_t, int64_t h, int64_t q, int64_t kv) { return q - kv < 100 && (h == 1 || kv >= q - 10) && kv <= q + 3; }},
      {MaskMod([](F, F h, F q, F kv) { return (kv == q - 3) | (h == 0); }),
       [](int64_t, int64_t h, int64_t q, int64_t kv) { return kv == q - 3 || h == 0; }},
      {MaskMod([](F, F, F q, F) { return q < 300; }), [](int64_t, int64_t, int64_t q, int64_t) { return q < 300; }},
      {prefix_lm_mask(150), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < 150 || q >= kv; }},
      {chunked_mask(100), [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 100 == kv / 100; }}};
  GpuCase c;
  c.Hq = 4;
  c.L = 500;
  c.S = 600;
  for (const auto& [mask, fn] : cases) {
    SCOPED_TRACE(mask.to_string());
    for (const int64_t E : {64, 128}) {
      c.E = E;
      {
        const ScopedEnv set("KILN_FLEX_MASK_RANGES", "1");
        check_cuda(c, kBFloat16, &mask, fn, ScoreMod(), nullptr);
      }
      expect_same_bits_on_mask("KILN_FLEX_MASK_RANGES", "1", "0", c, mask, c.Hq);
    }
  }
}

// Score mods of gradient 1 take the split P too: ALiBi, and a relative bias that needs no
// gradient (a tensor load); against the reference at E = 128, and bit for bit against
// KILN_FLEX_BWD_SPLIT_P=0 on a window with GQA at both head dims.
TEST(FlexAttentionCuda, SplitPWithAdditiveScoreModsMatchesReferenceAndBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(42);
  GpuCase c;
  c.E = 128;
  const Tensor slopes = rand({4}, kFloat64), bias = randn({4, 1500}, kFloat64) * 0.5;
  const std::vector<double> sl = slopes.to_vector(), bv = bias.to_vector();
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, alibi(slopes),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + sl[h] * static_cast<double>(kv - q); });
  check_cuda(c, kFloat16, &causal, kCausal, relative_position_bias(bias, 700),
             [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * 1500 + (q - kv + 700)]; });
  for (const int64_t E : {64, 128}) {
    const int64_t L = 700, S = 800;
    const Tensor q = randn({1, 4, L, E}), k = randn({1, 2, S, E}), v = randn({1, 2, S, E}), cot = randn({1, 4, L, E});
    const BlockMask bm = create_block_mask(sliding_window_mask(300), 1, 1, L, S);
    for (const ScoreMod& mod : {alibi(slopes), relative_position_bias(bias, 700)}) {
      SCOPED_TRACE("E = " + std::to_string(E));
      FlexOptions o;
      o.block_mask = &bm;
      o.return_lse = true;
      o.enable_gqa = true;
      o.score_mod = mod;
      expect_same_bits_across("KILN_FLEX_BWD_SPLIT_P", "1", "0", q, k, v, cot, o);
    }
  }
}

// KILN_FLEX_HALVE_BLOCKS=1 (the default): 128-block masks on short rows run at 64-blocks, the
// empty halves of partial blocks dropped; against the reference, and bit for bit against the
// caller's 128-blocks (=0), on the variant suite and a document mask (data-dependent halving).
TEST(FlexAttentionCuda, HalvedBlocksMatchReferenceAndCallersBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(41);
  check_kernel_variant("KILN_FLEX_HALVE_BLOCKS");
  check_document_variant("KILN_FLEX_HALVE_BLOCKS");
}

// KILN_FLEX_FAST_MODS=0: the exact mods (64-bit int locals, IEEE divisions, tanhf) still match the
// reference, now that the suite's other tests run the cheaper ones.
TEST(FlexAttentionCuda, ExactModsMatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(32);
  const ScopedEnv exact("KILN_FLEX_FAST_MODS", "0");
  GpuCase c;
  c.E = 128;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, softcap(5.0), kSoftcap5);
  const Tensor bias = (randn({c.Hq, c.L + c.S}, kFloat64) * 0.5).detach().requires_grad_();
  check_relative_bias(c, bias, {bias});
}

// Captured-tensor gradients with several kv units per CTA: a bias table of 2^18 entries a head
// makes the slot budget (256 MiB of doubles) give 8 slots for 44 units, so each CTA walks units
// in turn (the TMA backward's barrier phases carry across them; kv tiles past L have no q tile),
// with the cp.async and the TMA backward.
TEST(FlexAttentionCuda, CapturedGradsWithSeveralUnitsPerCta) {
  KILN_REQUIRE_CUDA();
  manual_seed(28);
  GpuCase c;
  c.B = 2;
  c.Hq = 4;
  c.L = 300;
  c.S = 700;
  const int64_t W = int64_t{1} << 18, off = W / 2;
  const Tensor bias = (randn({c.Hq, W}, kFloat64) * 0.5).detach().requires_grad_();
  const std::vector<double> bv = bias.to_vector();
  const MaskMod causal = causal_mask();
  for (const char* tma : {"0", "1"}) {
    SCOPED_TRACE(std::string("KILN_FLEX_BWD_TMA=") + tma);
    const ScopedEnv env("KILN_FLEX_BWD_TMA", tma);
    check_cuda(c, kBFloat16, &causal, kCausal, relative_position_bias(bias, off),
               [&](double s, int64_t, int64_t h, int64_t q, int64_t kv) { return s + bv[h * W + q - kv + off]; },
               {bias});
  }
}

// KILN_FLEX_FWD_KBUF=2 with TMA (the default): two K / V stages, the tile after next loading
// while one is used; against one stage.
TEST(FlexAttentionCuda, TwoStageTmaForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(24);
  check_kernel_variant("KILN_FLEX_FWD_KBUF", "2", "1");
}

// KILN_FLEX_FWD_LAST_ISSUES=1 (the default at 128-row tiles): the last warp done with a stage issues
// its next loads instead of a block barrier; at 128 x 128 tiles (two warpgroups) and at 64 x 64.
TEST(FlexAttentionCuda, LastWarpIssuesMatchesReferenceAndBarrierBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(27);
  for (const char* tile : {"128x128x1", "64x64x1"}) {
    SCOPED_TRACE(std::string("tile ") + tile);
    const ScopedEnv t("KILN_FLEX_FWD_TILE", tile);
    check_kernel_variant("KILN_FLEX_FWD_LAST_ISSUES");
  }
}

// KILN_FLEX_FWD_STAGES=3: three K / V stages in the TMA forward, with the barrier and with the
// last warp issuing, at 128 x 128 and 64 x 64 tiles.
TEST(FlexAttentionCuda, ThreeStageForwardMatchesReferenceAndTwoStageBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(29);
  for (const char* tile : {"128x128x1", "64x64x1"})
    for (const char* last : {"0", "1"}) {
      SCOPED_TRACE(std::string("tile ") + tile + ", last-warp issues " + last);
      const ScopedEnv t("KILN_FLEX_FWD_TILE", tile), l("KILN_FLEX_FWD_LAST_ISSUES", last);
      check_kernel_variant("KILN_FLEX_FWD_STAGES", "3", "2");
    }
}

// KILN_FLEX_FWD_PINGPONG=1: at 128 x 128 tiles the two warpgroups take turns issuing their products
// (named barriers); the same arithmetic, so the same bits, with the last warp issuing and without.
TEST(FlexAttentionCuda, PingpongForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(44);
  const ScopedEnv t("KILN_FLEX_FWD_TILE", "128x128x1");
  for (const char* last : {"1", "0"}) {
    SCOPED_TRACE(std::string("last-warp issues ") + last);
    const ScopedEnv l("KILN_FLEX_FWD_LAST_ISSUES", last);
    check_kernel_variant("KILN_FLEX_FWD_PINGPONG");
  }
}

// KILN_FLEX_MERGED_WALK (the default): every kernel walks one merged list a row (the same blocks in the same
// order, so the same bits), with the keep bits and with the mask bits of a tensor-reading mask.
TEST(FlexAttentionCuda, MergedWalkMatchesReferenceAndTwoListBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(30);
  check_kernel_variant("KILN_FLEX_MERGED_WALK");
  GpuCase c;
  c.L = c.S = 333;
  std::vector<double> ids(333);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(i / 70);
  const Tensor doc = tensor(ids, kInt64);
  const MaskMod docs = and_masks({document_mask(doc), causal_mask()});
  const ScopedEnv set("KILN_FLEX_MERGED_WALK", "1");
  check_cuda(c, kBFloat16, &docs, [](int64_t, int64_t, int64_t q, int64_t kv) { return q / 70 == kv / 70 && q >= kv; },
             ScoreMod(), nullptr);
}

// Scales other than 1 / sqrt(E), folded into the exponent (scale > 0, no score_mod) or not (a
// negative scale; a score_mod): CUDA against the float64 CPU kernels, out, lse and gradients, and
// the folded forward against the unfolded one.
TEST(FlexAttentionCuda, ScalesMatchCpuFoldedOrNot) {
  KILN_REQUIRE_CUDA();
  manual_seed(28);
  const int64_t L = 300, S = 450;
  const BlockMask bm = create_block_mask(sliding_window_mask(200), 1, 1, L, S);
  for (const int64_t E : {64, 128})
    for (const double scale : {0.3, -0.2})
      for (const bool scored : {false, true}) {
        SCOPED_TRACE("E " + std::to_string(E) + ", scale " + std::to_string(scale) + (scored ? ", softcap" : ""));
        const Tensor q = randn({1, 2, L, E}, kFloat64), k = randn({1, 2, S, E}, kFloat64),
                     v = randn({1, 2, S, E}, kFloat64), cot = randn({1, 2, L, E}, kFloat64);
        FlexOptions o;
        o.block_mask = &bm;
        o.return_lse = true;
        o.scale = scale;
        if (scored) o.score_mod = softcap(5.0);
        const FlexRun gpu = run_on(kGpu, kBFloat16, q, k, v, o, cot), cpu = run_on(kCPU, kFloat64, q, k, v, o, cot);
        EXPECT_CLOSE(gpu.out, cpu.out, 2e-2);
        EXPECT_CLOSE(gpu.lse, cpu.lse, 1e-3);
        for (size_t i = 0; i < 3; ++i) {
          SCOPED_TRACE("grad " + std::to_string(i));
          EXPECT_CLOSE(gpu.grads[i], cpu.grads[i], 4e-2);
        }
        const ScopedEnv off("KILN_FLEX_FOLD_SCALE", "0");
        const FlexRun unfolded = run_on(kGpu, kBFloat16, q, k, v, o, cot);
        EXPECT_CLOSE(gpu.out, unfolded.out, 1e-2);
        EXPECT_CLOSE(gpu.lse, unfolded.lse, 1e-5);
      }
}

// KILN_FLEX_FWD_KEEPBITS=1: the keep bits of a tile while QK^T is in flight.
TEST(FlexAttentionCuda, KeepBitsForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(26);
  check_kernel_variant("KILN_FLEX_FWD_KEEPBITS");
}

// KILN_FLEX_MASK_BITS=1: a document mask's partial blocks take their keep bits from
// flex_mask_bits instead of evaluating the mask: against the reference (with and without a
// score_mod, GQA, ragged lengths) and bit for bit the forward that evaluates it.
TEST(FlexAttentionCuda, MaskBitsForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(29);
  for (const int64_t E : {64, 128}) {
    SCOPED_TRACE("E = " + std::to_string(E));
    GpuCase c;
    c.Hq = 4;
    c.L = 700;
    c.S = 900;
    c.E = E;
    std::vector<int64_t> ids(static_cast<size_t>(c.S));
    for (size_t i = 0, d = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(d += std::rand() % 97 == 0);
    const Tensor doc = tensor(std::vector<double>(ids.begin(), ids.end()), kInt64);
    const MaskMod m = and_masks({document_mask(doc), causal_mask()});
    const MaskFn f = [&](int64_t, int64_t, int64_t q, int64_t kv) { return ids[q] == ids[kv] && q >= kv; };
    {
      const ScopedEnv on("KILN_FLEX_MASK_BITS", "1");
      check_cuda(c, kBFloat16, &m, f, ScoreMod(), nullptr);
      check_cuda(c, kBFloat16, &m, f, softcap(5.0), kSoftcap5);
    }
    expect_same_bits_on_mask("KILN_FLEX_MASK_BITS", "1", "0", c, m, 1);
  }
}

// KILN_FLEX_WALK_AHEAD=1: the BlockMask lists' next entries loaded a step ahead.
TEST(FlexAttentionCuda, WalkAheadMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(27);
  check_kernel_variant("KILN_FLEX_WALK_AHEAD");
}

// KILN_FLEX_BWD_TMA=1 (the default on sm_90): the backward's Q, dO, K and V tiles by TMA; against
// cp.async.
TEST(FlexAttentionCuda, TmaBackwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(25);
  check_kernel_variant("KILN_FLEX_BWD_TMA");
}

// KILN_FLEX_FWD_PERSIST=1: the persistent forward (a producer warpgroup, bulk tensor stores). Beside
// the variant checks, more q tiles than CTAs fit at once (several units a CTA, with units that list
// no block between them; GQA), bit for bit against the one-unit-a-CTA forward on the same tiles:
// 128 x 128 (two consumer warpgroups) and 64 x 64, on the caller's 128-blocks.
TEST(FlexAttentionCuda, PersistentForwardMatchesReferenceAndDefaultBits) {
  KILN_REQUIRE_CUDA();
  manual_seed(29);
  const ScopedEnv keep("KILN_FLEX_HALVE_BLOCKS", "0");
  for (const char* tile : {"128x128x1", "64x64x1"}) {
    SCOPED_TRACE(std::string("tile ") + tile);
    const ScopedEnv pin("KILN_FLEX_FWD_TILE", tile);
    check_kernel_variant("KILN_FLEX_FWD_PERSIST");
    const MaskMod late([](Expr, Expr, Expr q, Expr kv) { return (kv < q - 1500) & (kv > q - 2600); });
    for (const int64_t E : {64, 128}) {
      const int64_t L = 4000, S = 3000;
      const Tensor q = randn({2, 8, L, E}), k = randn({2, 4, S, E}), v = randn({2, 4, S, E}), cot = randn({2, 8, L, E});
      const BlockMask bm = create_block_mask(late, 1, 1, L, S);
      FlexOptions o;
      o.block_mask = &bm;
      o.return_lse = true;
      o.enable_gqa = true;
      SCOPED_TRACE("E = " + std::to_string(E));
      expect_same_bits_across("KILN_FLEX_FWD_PERSIST", "1", "0", q, k, v, cot, o);
    }
  }
}

// Short rows at E = 128 (a window): by default the persistent forward runs on the caller's 128-blocks
// with 128 x 128 tiles while the backward walks the halved 64-blocks. Against the reference, and the
// forward bit for bit the one with the blocks kept for both (KILN_FLEX_HALVE_BLOCKS=0), which runs
// the same forward on the same blocks.
TEST(FlexAttentionCuda, ShortRowsForwardOnCallersBlocksBackwardHalved) {
  KILN_REQUIRE_CUDA();
  manual_seed(41);
  GpuCase c;
  c.E = 128;
  c.L = 1000;
  c.S = 1100;
  const int64_t w = 200 + std::rand() % 200;
  const MaskMod window = sliding_window_mask(w);
  const MaskFn f = [w](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < w; };
  check_cuda(c, kBFloat16, &window, f, ScoreMod(), nullptr);
  const Tensor q = randn({2, 4, c.L, c.E}), k = randn({2, 2, c.S, c.E}), v = randn({2, 2, c.S, c.E});
  const BlockMask bm = create_block_mask(window, 1, 1, c.L, c.S);
  FlexOptions o;
  o.block_mask = &bm;
  o.return_lse = true;
  o.enable_gqa = true;
  const Tensor qg = q.to(kGpu).to(kBFloat16), kg = k.to(kGpu).to(kBFloat16), vg = v.to(kGpu).to(kBFloat16);
  const FlexOutput split = flex_attention(qg, kg, vg, o);
  FlexOutput kept;
  {
    const ScopedEnv keep("KILN_FLEX_HALVE_BLOCKS", "0");
    kept = flex_attention(qg, kg, vg, o);
  }
  const std::vector<double> a = split.out.to(kCPU).to(kFloat64).to_vector(), b = kept.out.to(kCPU).to(kFloat64).to_vector();
  const std::vector<double> la = split.lse.to(kCPU).to_vector(), lb = kept.lse.to(kCPU).to_vector();
  EXPECT_TRUE(a == b) << "the forward's output changed with the backward's blocks";
  EXPECT_TRUE(la == lb) << "the forward's lse changed with the backward's blocks";
}

// E = 64 rows listing 6 or more blocks take the 64 x 128 forward tile by default (8 blocks here).
TEST(FlexAttentionCuda, LongRowsAtE64MatchReference) {
  KILN_REQUIRE_CUDA();
  manual_seed(22);
  GpuCase c;
  c.L = 900;
  c.S = 1000;
  const MaskMod causal = causal_mask();
  check_cuda(c, kBFloat16, &causal, kCausal, ScoreMod(), nullptr);
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

// Configurations outside the kernels (fp32, head dim 32, 16-blocks) run the CPU kernels on
// copies: same values as the CPU, gradients back on the device.
TEST(FlexAttentionCuda, UncoveredConfigurationsFallBackToCpu) {
  KILN_REQUIRE_CUDA();
  auto check = [](const Tensor& q_cpu, const FlexOptions& o, const char* what) {
    const Tensor qc = q_cpu.detach().requires_grad_(true);
    const Tensor qg = q_cpu.detach().to(kGpu).requires_grad_(true);
    const Tensor ref = flex_attention(qc, qc, qc, o).out;
    const Tensor got = flex_attention(qg, qg, qg, o).out;
    EXPECT_TRUE(got.is_cuda()) << what;
    EXPECT_EQ(rel_error(got.cpu(), ref), 0.0) << what;
    const auto gr = autograd::grad({sum(ref)}, {qc});
    const auto gg = autograd::grad({sum(got)}, {qg});
    EXPECT_TRUE(gg[0].is_cuda()) << what;
    EXPECT_EQ(rel_error(gg[0].cpu(), gr[0]), 0.0) << what;
  };
  check(randn({1, 2, 16, 64}, kFloat32), FlexOptions(), "fp32");
  check(randn({1, 2, 16, 32}, kBFloat16), FlexOptions(), "head dim 32");
  const BlockMask small = create_block_mask(causal_mask(), 1, 1, 16, 16, 16);
  FlexOptions o;
  o.block_mask = &small;
  check(randn({1, 2, 16, 64}, kBFloat16), o, "16-blocks");
}

TEST(FlexAttentionCuda, BadIndexRaises) {
  KILN_REQUIRE_CUDA();
  const Tensor qb = randn({1, 2, 16, 64}, TensorOptions().dtype(kBFloat16).device(kGpu));
  // A mod reading past its captured tensor raises after the kernel, as on the CPU.
  FlexOptions bad;
  bad.score_mod = relative_position_bias(randn({2, 3}), 0);
  EXPECT_THROW(flex_attention(qb, qb, qb, bad), Error);
}

// Inputs and dout that are views at a 2-byte offset into larger buffers (not 16-byte aligned, as
// TMA and the vector loads need): the same bits as their aligned copies, not an error.
TEST(FlexAttentionCuda, OffsetViewsMatchAlignedCopies) {
  KILN_REQUIRE_CUDA();
  manual_seed(23);
  const Shape shape = {1, 2, 200, 64};
  const int64_t n = 2 * 200 * 64;
  auto offset_view = [&](const Tensor& dense) {  // dense's values, one element into a buffer
    Tensor buf = zeros({n + 1}, TensorOptions().dtype(kBFloat16).device(kGpu));
    buf.narrow(0, 1, n).copy_(dense.reshape({n}));
    return buf.narrow(0, 1, n).view(shape);
  };
  const Tensor q = randn(shape, kBFloat16).to(kGpu), k = randn(shape, kBFloat16).to(kGpu),
               v = randn(shape, kBFloat16).to(kGpu), cot = randn(shape, kBFloat16).to(kGpu);
  const BlockMask bm = create_block_mask(sliding_window_mask(70), 1, 1, 200, 200);
  FlexOptions o;
  o.block_mask = &bm;
  auto run = [&](const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& d) {
    Tensor qg = qi.detach().requires_grad_(), kg = ki.detach().requires_grad_(), vg = vi.detach().requires_grad_();
    const FlexOutput r = flex_attention(qg, kg, vg, o);
    std::vector<Tensor> got = autograd::grad({r.out}, {qg, kg, vg}, {d});
    got.insert(got.begin(), r.out);
    return got;
  };
  const Tensor qo = offset_view(q);
  ASSERT_NE(reinterpret_cast<uintptr_t>(qo.data_ptr()) % 16, 0u);
  const std::vector<Tensor> a = run(qo, offset_view(k), offset_view(v), offset_view(cot));
  const std::vector<Tensor> b = run(q, k, v, cot);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(rel_error(a[i].to(kCPU, kFloat64), b[i].to(kCPU, kFloat64)), 0.0) << "output " << i;
}

// The configuration kernel_config.cpp chooses (no GPU needed): the measured defaults' rules by head
// dim, row length (blocks a row), architecture and captured-tensor gradients, and the switches.
TEST(FlexCudaConfig, DefaultsFollowTheMeasuredRules) {
  // A window-like mask at E = 64: 64-blocks, 5 listed a row (short rows).
  cpu::Problem p;
  p.B = 1;
  p.Hq = p.Hkv = 8;
  p.L = p.S = 32768;
  p.E = p.Ev = 64;
  p.QB = p.KB = 64;
  p.nQ = p.nKV = 512;
  p.kv_m = 2;
  p.fkv_m = 3;
  int64_t words = -1;
  auto config = [&](int major, int64_t grad_numel = 0) {
    return cuda::kernel_config_for(p, kBFloat16, major, false, true, grad_numel, &words);
  };
  cuda::KernelConfig c = config(9);
  EXPECT_TRUE(c.fwd_wgmma && c.bwd_wgmma && c.fwd_tma && c.bwd_tma && c.bwd_paired && c.bwd_split_p && c.fast_mods);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 64);
  EXPECT_EQ(c.fwd_kbuf, 2);
  EXPECT_EQ(c.bwd_kbuf, 2);
  EXPECT_EQ(c.fwd_min_blocks, 5);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 3);
  EXPECT_EQ(c.bwd_dq_min_blocks, 1);
  EXPECT_EQ(words, 0);
  EXPECT_TRUE(c.fold_scale) << "no score_mod and scale > 0";
  EXPECT_FALSE(c.fwd_last_issues) << "one warpgroup a CTA keeps the barrier";
  EXPECT_EQ(config(9, 100).bwd_dkdv_min_blocks, 1) << "captured-tensor gradients spill at 168 registers";
  p.scale = -0.125;
  EXPECT_FALSE(config(9).fold_scale) << "the max of raw scores is not the raw score of the max";
  p.scale = 1;
  {
    const ScopedEnv off("KILN_FLEX_FOLD_SCALE", "0"), on("KILN_FLEX_FWD_LAST_ISSUES", "1");
    c = config(9);
    EXPECT_FALSE(c.fold_scale);
    EXPECT_TRUE(c.fwd_last_issues);
  }
  {
    const ScopedEnv off("KILN_FLEX_FWD_MIN_BLOCKS", "1"), both("KILN_FLEX_BWD_MIN_BLOCKS", "2,4");
    c = config(9);
    EXPECT_EQ(c.fwd_min_blocks, 1);
    EXPECT_EQ(c.bwd_dkdv_min_blocks, 2);
    EXPECT_EQ(c.bwd_dq_min_blocks, 4);
  }
  {
    const ScopedEnv bad("KILN_FLEX_BWD_MIN_BLOCKS", "9");
    try {
      config(9);
      ADD_FAILURE() << "KILN_FLEX_BWD_MIN_BLOCKS=9 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[flex_attention] KILN_FLEX_BWD_MIN_BLOCKS"), std::string::npos) << e.what();
    }
  }
  // Not sm_90: mma.sync, cp.async, no caps.
  c = config(8);
  EXPECT_FALSE(c.fwd_wgmma || c.bwd_wgmma || c.fwd_tma || c.bwd_tma || c.bwd_split_p);
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  // Longer E = 64 rows (8 blocks of 128): 64 x 128 forward tiles, no caps.
  p.QB = p.KB = 128;
  p.nQ = p.nKV = 256;
  p.kv_m = 3;
  p.fkv_m = 5;
  c = config(9);
  EXPECT_EQ(c.fwd_tile_n, 128);
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  // E = 128: 64 x 64 tiles up to 9 blocks a row, 128 x 128 beyond; never capped.
  p.E = p.Ev = 128;
  c = config(9);
  EXPECT_EQ(c.fwd_tile_m, 64);
  EXPECT_EQ(c.fwd_tile_n, 64);
  EXPECT_EQ(c.fwd_min_blocks, 1);
  EXPECT_EQ(c.bwd_dkdv_min_blocks, 1);
  EXPECT_FALSE(c.fwd_persist);
  // With a mask that reads no tensors and no score_mod, those rows on 128-blocks take the persistent
  // forward with 128 x 128 tiles (KILN_FLEX_FWD_PERSIST=0: the staged one at 64 x 64); on 64-blocks
  // (the halved mask, the backward's) not.
  const detail::Program win = detail::compile(sliding_window_mask(256).expr);
  p.mask = &win;
  c = config(9);
  EXPECT_TRUE(c.fwd_persist);
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_EQ(c.fwd_tile_n, 128);
  {
    const ScopedEnv off("KILN_FLEX_FWD_PERSIST", "0");
    c = config(9);
    EXPECT_FALSE(c.fwd_persist);
    EXPECT_EQ(c.fwd_tile_m, 64);
  }
  {
    const ScopedEnv tall("KILN_FLEX_FWD_TILE", "128x64x1");
    EXPECT_FALSE(config(9).fwd_persist) << "the output is staged in a V tile";
  }
  p.QB = p.KB = 64;
  EXPECT_FALSE(config(9).fwd_persist);
  p.QB = p.KB = 128;
  p.mask = nullptr;
  p.kv_m = 8;
  c = config(9);
  EXPECT_EQ(c.fwd_tile_m, 128);
  EXPECT_EQ(c.fwd_tile_n, 128);
  EXPECT_TRUE(c.fwd_last_issues) << "two warpgroups a CTA: the last warp done with a stage issues";
  // A score_mod: no split P, no folded scale.
  const detail::Program soft = detail::compile(softcap(30.0).expr);
  p.score = &soft;
  EXPECT_FALSE(config(9).bwd_split_p);
  EXPECT_FALSE(config(9).fold_scale);
}

#else

TEST(FlexCudaCodegen, GeneratedSourcesCompileWithNvrtc) { GTEST_SKIP() << "kiln was built without CUDA (no NVRTC)"; }
TEST(FlexCudaConfig, DefaultsFollowTheMeasuredRules) { GTEST_SKIP() << "kiln was built without CUDA"; }

#endif

}  // namespace
}  // namespace kiln::flex
