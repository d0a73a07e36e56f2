// FlexAttention benchmark, CPU or CUDA: block-sparse flex against (a) the same flex kernels visiting
// every block with the mask evaluated everywhere ("flex_all_blocks") and (b) kiln's dense attention
// (matmul, additive mask, softmax, matmul: "dense"; omitted with a note where its L x S tensors would
// not fit), forward and forward+backward; then BlockMask creation for the mask.
// Usage:
//   bench_flex [--device cpu|cuda] [--batch B] [--heads H] [--seq S] [--head-dim D]
//              [--mask causal|sliding:W|document[:N]|prefix:N|chunked:N|none] [--score none|alibi|softcap:C]
//              [--dtype f32|bf16|f16] [--reps N] [--bm-seq N] [--json] [--flex-only]
//   bench_flex B H S D W      (the older positional form: CPU, f32, causal sliding window W)
// Defaults: cpu, f32 (bf16 on cuda), 1 x 4 x 4096 x 64, sliding:256. CUDA times come from CUDA
// events around each call (the first call, which compiles or loads the kernels, is a warm-up).
// With --json it prints one object per line:
//   {"variant": "flex" | "flex_all_blocks" | "dense", "fwd_ms": ..., "fwd_bwd_ms": ..., "peak_extra_bytes": ...,
//    "fwd_host_ms": ...} (fwd_host_ms: the forward call's host time, without waiting for the device)
//   {"variant": "dense", "omitted": "<why>"}
//   {"variant": "first_call", "of": "<variant>", "fwd_bwd_ms": ...}  (the warm-up: kernel compile or cache load)
//   {"variant": "block_mask", "create_ms": ..., "sparsity": (percent of blocks skipped), "bytes": ..., "seq": ...}
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "timing.h"
#include "flex/ir.h"
#include "kiln/kiln.h"

namespace kiln::bench::flex_bench {

using namespace kiln::flex;

namespace {

struct Args {
  std::string device = "cpu", mask = "sliding:256", score = "none", dtype;
  int64_t B = 1, H = 4, S = 4096, D = 64, bm_seq = 0, block = 128;  // block: the BlockMask's block size (--block-size)
  int reps = 0;
  bool json = false;
  bool flex_only = false;  // --flex-only: the flex variant alone (A/B rounds on a device budget)
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void usage(const char* why) { throw UsageError(why); }

Args parse(int argc, char** argv) {
  Args a;
  if (argc > 1 && argv[1][0] != '-') {  // positional: B H S D W
    a.B = std::atoll(argv[1]);
    if (argc > 2) a.H = std::atoll(argv[2]);
    if (argc > 3) a.S = std::atoll(argv[3]);
    if (argc > 4) a.D = std::atoll(argv[4]);
    if (argc > 5) a.mask = std::string("sliding:") + argv[5];
    a.bm_seq = int64_t{1} << 20;
    return a;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + f).c_str());
      return argv[++i];
    };
    if (f == "--device") a.device = value();
    else if (f == "--batch") a.B = std::atoll(value().c_str());
    else if (f == "--heads") a.H = std::atoll(value().c_str());
    else if (f == "--seq") a.S = std::atoll(value().c_str());
    else if (f == "--head-dim") a.D = std::atoll(value().c_str());
    else if (f == "--mask") a.mask = value();
    else if (f == "--score") a.score = value();
    else if (f == "--dtype") a.dtype = value();
    else if (f == "--reps") a.reps = std::atoi(value().c_str());
    else if (f == "--bm-seq") a.bm_seq = std::atoll(value().c_str());
    else if (f == "--block-size") a.block = std::atoll(value().c_str());
    else if (f == "--json") a.json = true;
    else if (f == "--flex-only") a.flex_only = true;
    else usage(("unknown flag " + f).c_str());
  }
  if (a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  if (a.B < 1 || a.H < 1 || a.S < 1 || a.D < 1 || a.block < 1) usage("sizes must be positive");
  return a;
}

DType parse_dtype(const Args& a) {
  const std::string d = a.dtype.empty() ? (a.device == "cuda" ? "bf16" : "f32") : a.dtype;
  if (d == "f32") return kFloat32;
  if (d == "bf16") return kBFloat16;
  if (d == "f16") return kFloat16;
  usage("--dtype must be f32, bf16 or f16");
}

// The mask named on the command line; doc_ids keeps the document ids alive.
MaskMod parse_mask(const std::string& m, int64_t S, Tensor& doc_ids) {
  auto arg = [&](int64_t dflt) {
    const size_t c = m.find(':');
    return c == std::string::npos ? dflt : std::atoll(m.c_str() + c + 1);
  };
  if (m == "none") return noop_mask();
  if (m == "causal") return causal_mask();
  if (m.rfind("sliding", 0) == 0) return sliding_window_mask(arg(256));
  if (m.rfind("prefix", 0) == 0) return prefix_lm_mask(arg(S / 4));
  if (m.rfind("chunked", 0) == 0) return chunked_mask(arg(1024));
  if (m.rfind("document", 0) == 0) {  // N packed documents of random lengths, causal within each
    const int64_t n = std::max<int64_t>(1, arg(16));
    std::vector<double> cuts = rand({n - 1}, kFloat64).to_vector();
    for (double& c : cuts) c *= static_cast<double>(S);
    std::sort(cuts.begin(), cuts.end());
    std::vector<double> ids(static_cast<size_t>(S));
    size_t d = 0;
    for (int64_t i = 0; i < S; ++i) {
      while (d < cuts.size() && static_cast<double>(i) >= cuts[d]) ++d;
      ids[i] = static_cast<double>(d);
    }
    doc_ids = tensor(ids, kInt64);
    return and_masks({document_mask(doc_ids), causal_mask()});
  }
  usage(("unknown mask " + m).c_str());
}

ScoreMod parse_score(const std::string& s, int64_t H, Tensor& slopes) {
  if (s == "none") return ScoreMod();
  if (s == "alibi") {
    std::vector<double> v(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) v[h] = std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(H));
    slopes = tensor(v, kFloat32);
    return alibi(slopes);
  }
  if (s.rfind("softcap", 0) == 0) {
    const size_t c = s.find(':');
    return softcap(c == std::string::npos ? 30.0 : std::atof(s.c_str() + c + 1));
  }
  usage(("unknown score mod " + s).c_str());
}


// Every block listed as partial: the kernels visit all of S and apply the mask everywhere.
BlockMask all_blocks(const MaskMod& m, int64_t L, int64_t S) {
  const int64_t nQ = (L + 127) / 128, nKV = (S + 127) / 128;
  Tensor num = full({1, 1, nQ}, static_cast<double>(nKV), kInt32);
  Tensor idx = empty({1, 1, nQ, nKV}, kInt32);
  for (int64_t i = 0; i < nQ; ++i)
    for (int64_t j = 0; j < nKV; ++j) idx.data_ptr<int32_t>()[i * nKV + j] = static_cast<int32_t>(j);
  return BlockMask::from_kv_blocks(num, idx, Tensor(), Tensor(), L, S, 128, m);
}

// [1, 1, L, S] additive mask (0 / -inf) in dtype, evaluated row by row on the CPU.
Tensor dense_bias(const MaskMod& m, int64_t L, int64_t S, DType dtype, const Device& dev) {
  const flex::detail::Program prog = flex::detail::compile(m.expr);
  flex::detail::RowEval<double> eval(prog, S);
  std::vector<float> bias(static_cast<size_t>(L * S));
  for (int64_t q = 0; q < L; ++q) {
    eval.run(0, 0, q, 0, S, nullptr);
    const uint8_t* keep = eval.bool_result();
    for (int64_t c = 0; c < S; ++c) bias[q * S + c] = keep[c] ? 0.f : -INFINITY;
  }
  return from_blob(bias.data(), {1, 1, L, S}, kFloat32).to(dev, dtype);
}

void line(bool json, const char* variant, double fwd, double fwd_bwd, int64_t peak, double host) {
  if (json)
    std::printf("{\"variant\": \"%s\", \"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f, \"peak_extra_bytes\": %lld, "
                "\"fwd_host_ms\": %.3f}\n",
                variant, fwd, fwd_bwd, static_cast<long long>(peak), host);
  else
    std::printf("%-16s fwd %10.3f ms   fwd+bwd %10.3f ms   peak extra %8.1f MiB   host part of fwd %.3f ms\n", variant,
                fwd, fwd_bwd, static_cast<double>(peak) / (1 << 20), host);
  std::fflush(stdout);
}

// Times forward (no grad) and forward+backward of `attn`, with the peak memory above the inputs.
void run(const Args& a, const char* variant, const Device& dev, const Tensor& q, const Tensor& k, const Tensor& v,
         const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& attn, int reps) {
  const Tensor g = randn(q.sizes(), q.options());
  if (dev.is_cuda()) cuda::synchronize(dev.index);
  const double t0 = now_ms();
  {
    Tensor out = attn(q, k, v);  // warm-up (CUDA: compiles or loads the kernels)
    autograd::grad({out}, {q, k, v}, {g});
  }
  if (dev.is_cuda()) cuda::synchronize(dev.index);
  const double first = now_ms() - t0;  // the first forward+backward: NVRTC compile or disk-cache load
  if (a.json)
    std::printf("{\"variant\": \"first_call\", \"of\": \"%s\", \"fwd_bwd_ms\": %.3f}\n", variant, first);
  else
    std::printf("%-16s first forward+backward (compile or cache load included) %.1f ms\n", variant, first);
  const int64_t base = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  const double fwd = median_ms(dev, [&] {
    NoGradGuard ng;
    attn(q, k, v);
  }, reps);
  const double fwd_bwd = median_ms(dev, [&] {
    Tensor out = attn(q, k, v);
    autograd::grad({out}, {q, k, v}, {g});
  }, reps);
  // The host's share of a forward: the call's wall time without waiting for the device (CUDA
  // launches return at once), which fwd_ms includes whenever the device outruns the host.
  std::vector<double> host = {fwd};  // the CPU: all of it
  for (int r = 0; dev.is_cuda() && r < reps; ++r) {
    NoGradGuard ng;
    const double h0 = now_ms();
    attn(q, k, v);
    host.push_back(now_ms() - h0);
    cuda::synchronize(dev.index);
  }
  std::sort(host.begin() + (dev.is_cuda() ? 1 : 0), host.end());
  const double host_ms = dev.is_cuda() ? host[1 + (host.size() - 1) / 2] : fwd;
  line(a.json, variant, fwd, fwd_bwd, max_memory_allocated(dev) - base, host_ms);
}

void block_mask_line(const Args& a, const MaskMod& m, int64_t seq, int reps) {
  BlockMask bm;
  const double ms = median_ms(kCPU, [&] { bm = create_block_mask(m, 1, 1, seq, seq); }, reps);
  if (a.json)
    std::printf("{\"variant\": \"block_mask\", \"create_ms\": %.3f, \"sparsity\": %.4f, \"bytes\": %lld, \"seq\": %lld}\n",
                ms, bm.sparsity(), static_cast<long long>(bm.nbytes()), static_cast<long long>(seq));
  else
    std::printf("block_mask       seq %lld: create %.3f ms, sparsity %.2f%%, %lld bytes\n",
                static_cast<long long>(seq), ms, bm.sparsity(), static_cast<long long>(bm.nbytes()));
  std::fflush(stdout);
}

}  // namespace

int run_main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const Device dev(a.device);
  const DType dt = parse_dtype(a);
  const int reps = a.reps > 0 ? a.reps : (dev.is_cuda() ? 20 : 5);
  manual_seed(0);
  Tensor doc_ids, slopes;
  const MaskMod m = parse_mask(a.mask, a.S, doc_ids);
  const ScoreMod sm = parse_score(a.score, a.H, slopes);
  const TensorOptions opt = TensorOptions().dtype(dt).device(dev);
  const Tensor q = randn({a.B, a.H, a.S, a.D}, opt).requires_grad_(), k = randn({a.B, a.H, a.S, a.D}, opt).requires_grad_(),
               v = randn({a.B, a.H, a.S, a.D}, opt).requires_grad_();
  if (!a.json)
    std::printf("flex_attention %s %s: B=%lld H=%lld S=%lld D=%lld mask=%s score=%s\n", a.device.c_str(),
                dtype_name(dt), static_cast<long long>(a.B), static_cast<long long>(a.H), static_cast<long long>(a.S),
                static_cast<long long>(a.D), a.mask.c_str(), a.score.c_str());

  const bool uses_mask = a.mask != "none";
  const BlockMask sparse = create_block_mask(m, 1, 1, a.S, a.S, a.block, dev);
  auto flex_with = [&](const BlockMask* bm) {
    return [bm, &sm](const Tensor& x, const Tensor& y, const Tensor& z) {
      FlexOptions o;
      o.block_mask = bm;
      o.score_mod = sm;
      return flex_attention(x, y, z, o).out;
    };
  };
  run(a, "flex", dev, q, k, v, flex_with(uses_mask ? &sparse : nullptr), reps);
  if (a.flex_only) return 0;
  if (uses_mask) {
    const BlockMask every = all_blocks(m, a.S, a.S).to(dev);
    run(a, "flex_all_blocks", dev, q, k, v, flex_with(&every), std::max(1, reps / 4));
  }

  // Dense: scores, probabilities and their gradients are B*H*S*S each; keep them under a budget.
  const double dense_bytes = 4.0 * static_cast<double>(a.B * a.H) * static_cast<double>(a.S) *
                             static_cast<double>(a.S) * static_cast<double>(element_size(dt));
  const double budget = dev.is_cuda() ? 80e9 : 8e9;
  if (dense_bytes > budget || !sm.is_identity()) {
    const std::string why = !sm.is_identity() ? "score_mod not expressible as a dense mask here"
                                              : "its B*H*S*S tensors need about " +
                                                    std::to_string(static_cast<int64_t>(dense_bytes / 1e9)) + " GB";
    if (a.json) std::printf("{\"variant\": \"dense\", \"omitted\": \"%s\"}\n", why.c_str());
    else std::printf("dense            omitted: %s\n", why.c_str());
  } else {
    const Tensor bias = uses_mask ? dense_bias(m, a.S, a.S, dt, dev) : Tensor();
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.D));
    run(a, "dense", dev, q, k, v,
        [&](const Tensor& x, const Tensor& y, const Tensor& z) {
          Tensor s = matmul(x, y.transpose(-2, -1)) * scale;
          if (bias.defined()) s = s + bias;
          return matmul(softmax(s, -1), z);
        },
        std::max(1, reps / 4));
  }
  if (uses_mask) {
    block_mask_line(a, m, a.S, 5);
    if (a.bm_seq > 0 && a.mask.rfind("document", 0) != 0) block_mask_line(a, m, a.bm_seq, 5);
  }
  return 0;
}

}  // namespace kiln::bench::flex_bench

int main(int argc, char** argv) {
  using namespace kiln::bench;
  try {
    return flex_bench::run_main(argc, argv);
  } catch (const flex_bench::UsageError& e) {
    std::fprintf(stderr,
                 "bench_flex: %s\nusage: bench_flex [--device cpu|cuda] [--batch B] [--heads H] [--seq S] "
                 "[--head-dim D] [--mask causal|sliding:W|document[:N]|prefix:N|chunked:N|none] "
                 "[--score none|alibi|softcap:C] [--dtype f32|bf16|f16] [--reps N] [--bm-seq N] [--block-size N (128)] [--json] [--flex-only]\n",
                 e.what());
    return 2;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "bench_flex: %s\n", e.what());
    return 1;
  }
}
