// `bench_lce --variants algos` (CUDA): does cuBLASLt's first-ranked algorithm serve the fused
// op's GEMMs well? For each GEMM the op issues at this shape (one speed chunk, one memory tile)
// and for gemm3's three, every candidate the heuristic ranks (up to 24) is timed alone (CUDA
// events, median of 5 after one warm-up) on random operands. Prints one line per candidate, one
// per GEMM with the fastest, and last the KILN_GEMM_PICK value that pins the fastest where it
// beats the first choice by more than 2 % (rerun the other variants with it to see the whole op).
#include "lce_algos.h"

#include "timing.h"

#ifdef KILN_WITH_CUDA
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/lce.h"
#include "lce/lce_internal.h"
#include "ops/cuda/gemm.h"

namespace kiln::bench {
namespace {

constexpr int kMaxCandidates = 24;
constexpr double kWorthPinning = 0.98;  // a candidate is pinned when it takes < 98 % of rank 0's time

struct NamedGemm {
  std::string name;
  cuda::GemmParams p;
};

// Candidate `rank` of p alone: one warm-up (and the plan's first launch), the median of 5.
double candidate_ms(const cuda::GemmParams& p, int rank) {
  const auto run = [&] { cuda::gemm_with_candidate(p, rank); };
  run();
  return median_ms(Device(DeviceType::CUDA, p.device), run, 5);
}

cuda::GemmParams params(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda,
                        const Tensor& b, int64_t ldb, const Tensor& c, int64_t ldc, double beta) {
  cuda::GemmParams p;
  p.trans_a = ta, p.trans_b = tb, p.m = m, p.n = n, p.k = k;
  p.a = a.data_ptr(), p.lda = lda, p.b = b.data_ptr(), p.ldb = ldb, p.c = c.data_ptr(), p.ldc = ldc;
  p.ab_type = a.dtype(), p.c_type = c.dtype(), p.beta = beta;
  p.device = a.device().index;
  p.stream = cuda::current_stream(p.device).handle();
  return p;
}

}  // namespace

void cuda_gemm_algos(const Tensor& x, const Tensor& w, const Tensor& y, bool json) {
  const int64_t N = x.size(0), H = x.size(1), V = w.size(0);
  const DType t = x.dtype();
  // The op's own chunks, from a run with gradients (x and w require them: without, no speed chunks).
  using nn::functional::LceStrategy;
  nn::functional::LinearCrossEntropyOptions o;
  o.strategy = LceStrategy::Speed;
  const int64_t Ns = nn::functional::linear_cross_entropy_with_stats(x, w, y, o).chunk_tokens;
  o.strategy = LceStrategy::Memory;
  const auto mem = nn::functional::linear_cross_entropy_with_stats(x, w, y, o);
  const int64_t Nm = mem.chunk_tokens, Vc = mem.chunk_vocab;
  NoGradGuard ng;
  const bool one_chunk = Nm >= N;  // the memory strategy stores dW slices in T, else sums them in fp32
  const int64_t lds = lce::tile_stride(V, t), ldm = lce::tile_stride(Vc, t);
  const TensorOptions ot = x.options(), f32 = x.options().dtype(kFloat32);
  manual_seed(4);
  const Tensor zs = randn({Ns, lds}, ot), zm = randn({Nm, ldm}, ot), zg = randn({N, V}, ot);  // dz stand-ins
  const Tensor dx = empty({N, H}, ot), dx_acc = empty({N, H}, f32).zero_(), dw = empty({V, H}, ot).zero_();
  const Tensor dwt = one_chunk ? Tensor() : empty({Vc, H}, f32).zero_();
  const std::vector<NamedGemm> gemms = {
      {"speed_logits", params(false, true, Ns, V, H, x, H, w, H, zs, lds, 0.0)},
      {"speed_dw_acc", params(true, false, V, H, Ns, zs, lds, x, H, dw, H, 1.0)},
      {"speed_dx", params(false, false, Ns, H, V, zs, lds, w, H, dx, H, 0.0)},
      {"memory_logits", params(false, true, Nm, Vc, H, x, H, w, H, zm, ldm, 0.0)},
      {"memory_dx_acc", params(false, false, Nm, H, Vc, zm, ldm, w, H, dx_acc, H, 1.0)},
      {"memory_dw", one_chunk ? params(true, false, Vc, H, Nm, zm, ldm, x, H, dw, H, 0.0)
                              : params(true, false, Vc, H, Nm, zm, ldm, x, H, dwt, H, 1.0)},
      {"gemm3_logits", params(false, true, N, V, H, x, H, w, H, zg, V, 0.0)},
      {"gemm3_dx", params(false, false, N, H, V, zg, V, w, H, dx, H, 0.0)},
      {"gemm3_dw", params(true, false, V, H, N, zg, V, x, H, dw, H, 0.0)},
  };
  // KILN_GEMM_PICK keys on the shape only: two GEMMs of one shape (different leading dims or
  // output types) share the first one's pin.
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, std::string> pinned;
  std::string pick;
  for (const NamedGemm& g : gemms) {
    const cuda::GemmParams& p = g.p;
    const double flop = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
    int best = 0;
    double best_ms = 0, first_ms = 0;
    for (const cuda::GemmCandidate& c : cuda::gemm_candidates(p, kMaxCandidates)) {
      double ms = 0;
      try {
        ms = candidate_ms(p, c.rank);
      } catch (const Error& e) {  // a candidate cuBLASLt ranks but will not run: say so, time the rest
        std::printf("{\"variant\": \"algo_error\", \"gemm\": \"%s\", \"rank\": %d, \"config\": \"%s\"}\n",
                    g.name.c_str(), c.rank, c.config.c_str());
        std::fprintf(stderr, "bench lce algos: %s\n", e.what());
        if (c.rank == 0) throw;  // the default's own algorithm failing is a real error
        continue;
      }
      if (c.rank == 0) first_ms = best_ms = ms;
      if (ms < best_ms) best = c.rank, best_ms = ms;
      if (json)
        std::printf("{\"variant\": \"algo\", \"gemm\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"rank\": %d, "
                    "\"ms\": %.4f, \"tflops\": %.1f, \"waves\": %.2f, \"workspace\": %zu, \"config\": \"%s\"}\n",
                    g.name.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.n),
                    static_cast<long long>(p.k), c.rank, ms, flop / ms * 1e-9, c.waves, c.workspace, c.config.c_str());
      else
        std::printf("%-14s rank %2d  %8.4f ms  %6.1f TFLOP/s  waves %5.2f  %s\n", g.name.c_str(), c.rank, ms,
                    flop / ms * 1e-9, c.waves, c.config.c_str());
    }
    const auto key = std::make_tuple(p.m, p.n, p.k, p.trans_a ? 1 : 0, p.trans_b ? 1 : 0);
    const bool pin = best != 0 && best_ms < kWorthPinning * first_ms && !pinned.count(key);
    if (pin) {
      pinned[key] = g.name;
      pick += std::to_string(p.m) + "," + std::to_string(p.n) + "," + std::to_string(p.k) + "," +
              std::to_string(p.trans_a ? 1 : 0) + "," + std::to_string(p.trans_b ? 1 : 0) + "=" + std::to_string(best) +
              ";";
    }
    if (json)
      std::printf("{\"variant\": \"algo_best\", \"gemm\": \"%s\", \"rank0_ms\": %.4f, \"best_rank\": %d, \"best_ms\": "
                  "%.4f, \"pinned\": %s}\n",
                  g.name.c_str(), first_ms, best, best_ms, pin ? "true" : "false");
    else
      std::printf("%-14s first %.4f ms, fastest rank %d %.4f ms (%.3fx)%s\n", g.name.c_str(), first_ms, best, best_ms,
                  best_ms / first_ms, pin ? ", pinned" : "");
    std::fflush(stdout);
  }
  if (json)
    std::printf("{\"variant\": \"algo_pick\", \"env\": \"%s\"}\n", pick.c_str());
  else
    std::printf("KILN_GEMM_PICK='%s'\n", pick.c_str());
  std::fflush(stdout);
}

}  // namespace kiln::bench
#endif
