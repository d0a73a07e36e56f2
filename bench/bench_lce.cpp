// bench_lce: for one shape, in one run, each variant's peak extra memory (max_memory_allocated
// minus what was allocated before, after reset_peak_memory_stats; gradients included) and its
// forward+backward time (best of --iters after one warm-up):
//   memory, speed: kiln::nn::functional::linear_cross_entropy with that strategy;
//   unfused:       CPU: kiln's own ops through autograd, cross_entropy(linear(x, W), y) and its
//                  backward ([N, V] logits and their gradient materialised); CUDA: the fused kernels
//                  over ONE [N, V] chunk (materialised logits and dz), what an unfused op holds;
//   gemm3:         the three GEMMs alone (logits, dx, dW; no loss; logits in the input dtype, dz a
//                  random normal [N, V] drawn once, as torch's gemm3 baseline);
//   phases:        (CUDA) one speed chunk's and one memory tile's GEMMs and kernels timed one by one
//                  (cuda_phases);
//   algos:         (CUDA) cuBLASLt's ranked algorithms for the op's GEMMs (lce_algos.cpp).

#include "lce_algos.h"
#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "kiln/kiln.h"
#include "kiln/lce.h"
#include "ops/cpu/gemm.h"
#ifdef KILN_WITH_CUDA
#include "lce/cuda/lce_kernels.h"
#include "lce/lce_internal.h"
#include "ops/cuda/gemm.h"
#endif

namespace kiln::bench {
namespace {

using nn::functional::LceStrategy;
#ifdef KILN_WITH_CUDA
namespace lce_k = cuda::lce_k;
#endif
using nn::functional::LinearCrossEntropyOptions;

struct Args {
  std::string device = "cpu", dtype = "f32";
  int64_t n = 2048, h = 1024, v = 32000;
  int iters = 3;
  bool json = false;
  int64_t chunk_tokens = 0, chunk_vocab = 0;  // 0: the op's own choice (memory/speed variants)
  std::string variants = "memory,speed,unfused,gemm3";
  bool wants(const char* name) const { return ("," + variants + ",").find(std::string(",") + name + ",") != std::string::npos; }
};

void sync(const Device& d) {
  if (d.is_cuda()) cuda::synchronize(d.index);
}

struct Result {
  int64_t peak = 0;
  double ms = 0, loss = NAN;
};

// f returns the loss (NaN for gemm3); memory from the first (cold) call, time: best of iters.
Result measure(const Device& dev, int iters, const std::function<double()>& f) {
  Result r;
  sync(dev);
  const int64_t base = memory_allocated(dev);
  reset_peak_memory_stats(dev);
  r.loss = f();
  sync(dev);
  r.peak = max_memory_allocated(dev) - base;
  r.ms = INFINITY;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sync(dev);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.ms = std::min(r.ms, ms);
  }
  return r;
}

// grad_bytes: the dx and dW the peak includes (every variant must hold them); the working memory
// is peak_extra_bytes - grad_bytes.
void print(const Args& a, const char* variant, const Result& r, int64_t grad_bytes) {
  if (a.json) {
    if (std::isnan(r.loss) && std::strcmp(variant, "gemm3") == 0)
      std::printf("{\"variant\": \"%s\", \"peak_extra_bytes\": %lld, \"fwd_bwd_ms\": %.3f, \"grad_bytes\": %lld}\n",
                  variant, static_cast<long long>(r.peak), r.ms, static_cast<long long>(grad_bytes));
    else
      std::printf("{\"variant\": \"%s\", \"peak_extra_bytes\": %lld, \"fwd_bwd_ms\": %.3f, \"loss\": %.6f, "
                  "\"grad_bytes\": %lld}\n",
                  variant, static_cast<long long>(r.peak), r.ms, r.loss, static_cast<long long>(grad_bytes));
  } else {
    std::printf("%-8s peak extra %10.1f MiB (%8.1f MiB beyond dx, dW)   fwd+bwd %9.2f ms   loss %.6f\n", variant,
                static_cast<double>(r.peak) / (1 << 20), static_cast<double>(r.peak - grad_bytes) / (1 << 20), r.ms,
                r.loss);
  }
  std::fflush(stdout);
}

#ifdef KILN_WITH_CUDA
// Each phase alone with CUDA events: one warm-up, the median of 5.
void time_phases(const Device& dev, const std::vector<std::pair<const char*, std::function<void()>>>& phases,
                 const char* strategy, int64_t tokens, int64_t classes, DType tile) {
  for (const auto& [name, fn] : phases) {
    fn();
    const double ms = median_ms(dev, fn, 5);
    std::printf("{\"variant\": \"phase\", \"strategy\": \"%s\", \"phase\": \"%s\", \"tokens\": %lld, "
                "\"classes\": %lld, \"tile\": \"%s\", \"ms\": %.4f}\n",
                strategy, name, static_cast<long long>(tokens), static_cast<long long>(classes), dtype_name(tile), ms);
  }
  std::fflush(stdout);
}

// Where a fused step's time goes: the phases of one speed-strategy chunk over the whole
// vocabulary (--chunk-tokens, default the op's own chunk for this shape), each timed alone with
// CUDA events (median of 5). Tiles of the input's type, as the op's, dz written over them in place
// as the op does.
void cuda_phases(const Args& a, const Tensor& x, const Tensor& w, const Tensor& y) {
  int64_t N = a.chunk_tokens;
  if (N <= 0) {
    LinearCrossEntropyOptions o;
    o.strategy = LceStrategy::Speed;
    N = nn::functional::linear_cross_entropy_with_stats(x, w, y, o).chunk_tokens;
  }
  N = std::min(N, a.n);
  NoGradGuard ng;
  const int64_t H = a.h, V = a.v;
  const DType t = x.dtype();
  const int64_t ld = lce::tile_stride(V, t);
  const int dev = x.device().index;
  void* stream = cuda::current_stream(dev).handle();
  const TensorOptions f32 = TensorOptions().dtype(kFloat32).device(x.device());
  Tensor z = empty({N, ld}, x.options()), dx = empty({N, H}, x.options());
  Tensor dw = empty({V, H}, x.options()), dwa = empty({V, H}, f32);
  Tensor state = empty({4, N}, f32), lse = empty({N}, f32), terms = empty({2, N}, f32), tot = empty({4}, f32);
  lce::Consts k;
  k.n = N, k.h = H, k.v = V;
  auto mm = [&](bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void* A, int64_t lda, const void* B,
                int64_t ldb, DType ab, void* C, DType ct, int64_t ldc, double beta) {
    cuda::GemmParams p;
    p.trans_a = ta, p.trans_b = tb, p.m = m, p.n = n, p.k = kk;
    p.a = A, p.lda = lda, p.b = B, p.ldb = ldb, p.c = C, p.ldc = ldc;
    p.ab_type = ab, p.c_type = ct, p.device = dev, p.stream = stream, p.beta = beta;
    cuda::gemm(p);
  };
  const int64_t* yp = y.data_ptr<int64_t>();
  void* zp = z.data_ptr();
  lce_k::prepare(t, yp, nullptr, k, tot.data_ptr(), stream);
  const std::vector<std::pair<const char*, std::function<void()>>> phases = {
      {"logits_gemm", [&] { mm(false, true, N, V, H, x.data_ptr(), H, w.data_ptr(), H, t, zp, t, ld, 0.0); }},
      {"stats", [&] { lce_k::stats(t, zp, N, V, ld, 0, nullptr, nullptr, yp, k, true, state.data_ptr(), N, nullptr, stream); }},
      {"finalize", [&] { lce_k::finalize(t, N, 0, state.data_ptr(), N, yp, nullptr, tot.data_ptr(), k,
                                         lse.data_ptr(), terms.data_ptr(), N, nullptr, nullptr, nullptr, stream); }},
      {"grad", [&] { lce_k::grad(t, zp, N, V, ld, 0, 0, nullptr, nullptr, yp, lse.data_ptr(), nullptr, false,
                                 nullptr, tot.data_ptr(), k, zp, ld, stream); }},
      {"dx_gemm", [&] { mm(false, false, N, H, V, zp, ld, w.data_ptr(), H, t, dx.data_ptr(), t, H, 0.0); }},
      {"dw_gemm_store", [&] { mm(true, false, V, H, N, zp, ld, x.data_ptr(), H, t, dw.data_ptr(), t, H, 0.0); }},
      {"dw_gemm_acc_bf16", [&] { mm(true, false, V, H, N, zp, ld, x.data_ptr(), H, t, dw.data_ptr(), t, H, 1.0); }},
      {"dw_gemm_acc_f32", [&] { mm(true, false, V, H, N, zp, ld, x.data_ptr(), H, t, dwa.data_ptr(), kFloat32, H,
                                   1.0); }},
  };
  time_phases(x.device(), phases, "speed", N, V, t);
  // One memory-strategy tile [Nm, Vc] (the op's own sizes): its GEMMs and passes, and how many
  // such tiles the op runs (its forward: logits + stats; its backward: logits + grad + dx + dW).
  LinearCrossEntropyOptions mo;
  mo.strategy = LceStrategy::Memory;
  mo.chunk_vocab = a.chunk_vocab;  // 0: the op's own width
  const auto ms = nn::functional::linear_cross_entropy_with_stats(x, w, y, mo);
  const int64_t Nm = std::min(ms.chunk_tokens, a.n), Vc = ms.chunk_vocab, ldm = lce::tile_stride(Vc, t);
  const bool one_chunk = Nm >= a.n;  // dW slices stored in T, else summed in a fp32 slice
  Tensor zm = empty({Nm, ldm}, x.options()), dxa = empty({Nm, H}, f32).zero_();
  Tensor mstate = empty({4, Nm}, f32), mlse = full({Nm}, 12.0, f32);  // any finite lse: the grad pass's cost
  lce::Consts km = k;
  km.n = Nm;
  void* zmp = zm.data_ptr();
  const std::vector<std::pair<const char*, std::function<void()>>> mphases = {
      {"logits_gemm", [&] { mm(false, true, Nm, Vc, H, x.data_ptr(), H, w.data_ptr(), H, t, zmp, t, ldm, 0.0); }},
      {"stats", [&] { lce_k::stats(t, zmp, Nm, Vc, ldm, 0, nullptr, nullptr, yp, km, true, mstate.data_ptr(), Nm,
                                   nullptr, stream); }},
      {"grad", [&] { lce_k::grad(t, zmp, Nm, Vc, ldm, 0, 0, nullptr, nullptr, yp, mlse.data_ptr(), nullptr, false,
                                 nullptr, tot.data_ptr(), km, zmp, ldm, stream); }},
      {"dx_gemm_acc_f32", [&] { mm(false, false, Nm, H, Vc, zmp, ldm, w.data_ptr(), H, t, dxa.data_ptr(), kFloat32,
                                   H, 1.0); }},
      {"dw_gemm", [&] { mm(true, false, Vc, H, Nm, zmp, ldm, x.data_ptr(), H, t,
                           one_chunk ? dw.data_ptr() : dwa.data_ptr(), one_chunk ? t : kFloat32, H,
                           one_chunk ? 0.0 : 1.0); }},
  };
  time_phases(x.device(), mphases, "memory", Nm, Vc, t);
  std::printf("{\"variant\": \"memory_tiles\", \"tokens\": %lld, \"classes\": %lld, \"tiles\": %lld}\n",
              static_cast<long long>(Nm), static_cast<long long>(Vc),
              static_cast<long long>(((a.n + Nm - 1) / Nm) * ((V + Vc - 1) / Vc)));
  std::fflush(stdout);
}
#endif

int parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("bench lce: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--device") a.device = next();
    else if (k == "--tokens") a.n = std::stoll(next());
    else if (k == "--hidden") a.h = std::stoll(next());
    else if (k == "--vocab") a.v = std::stoll(next());
    else if (k == "--dtype") a.dtype = next();
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--json") a.json = true;
    else if (k == "--chunk-tokens") a.chunk_tokens = std::stoll(next());
    else if (k == "--chunk-vocab") a.chunk_vocab = std::stoll(next());
    else if (k == "--variants") a.variants = next();
    else throw Error("bench lce: unknown argument " + k);
  }
  if (a.dtype != "bf16" && a.dtype != "f32") throw Error("bench lce: --dtype must be bf16 or f32");
  return 0;
}

}  // namespace

}  // namespace kiln::bench

int main(int argc, char** argv) {
  using namespace kiln;
  using namespace kiln::bench;
  try {
    Args a;
    parse(argc, argv, a);
    const Device dev(a.device);
    const DType dt = a.dtype == "bf16" ? kBFloat16 : kFloat32;
    const TensorOptions opt = TensorOptions().dtype(dt).device(dev);
    // Separate seeds: the CPU and CUDA generators both start at offset 0 of the same seed, so x
    // (CUDA) and W (CPU) from one seed would share their leading elements and make logit (i, i)
    // ~ sqrt(H) (the "loss 64" of the first H200 runs).
    manual_seed(0);
    Tensor x = randn({a.n, a.h}, opt).requires_grad_(true);
    Tensor w;
    manual_seed(1);
    {
      NoGradGuard ng;
      w = (randn({a.v, a.h}, TensorOptions().dtype(kFloat32)) * (1.0 / std::sqrt(static_cast<double>(a.h))))
              .to(dev, dt)
              .detach()
              .requires_grad_(true);
    }
    manual_seed(2);
    Tensor y = randint(0, a.v, {a.n}, TensorOptions().dtype(kInt64).device(dev));
    if (!a.json)
      std::printf("bench lce: device %s, N=%lld H=%lld V=%lld, %s\n", dev.str().c_str(), static_cast<long long>(a.n),
                  static_cast<long long>(a.h), static_cast<long long>(a.v), dtype_name(dt));

    const int64_t gb = (a.n + a.v) * a.h * static_cast<int64_t>(element_size(dt));
    auto fused = [&](LceStrategy s, int64_t chunk) {
      return [&, s, chunk]() {
        LinearCrossEntropyOptions o;
        o.strategy = s;
        o.chunk_tokens = chunk > 0 ? chunk : a.chunk_tokens;
        o.chunk_vocab = a.chunk_vocab;
        Tensor loss = nn::functional::linear_cross_entropy(x, w, y, o);
        auto g = autograd::grad({loss}, {x, w});
        return loss.item();
      };
    };
    if (a.wants("memory")) print(a, "memory", measure(dev, a.iters, fused(LceStrategy::Memory, 0)), gb);
    if (a.wants("speed")) print(a, "speed", measure(dev, a.iters, fused(LceStrategy::Speed, 0)), gb);
    if (!a.wants("unfused")) {
    } else if (dev.is_cuda()) {
      print(a, "unfused", measure(dev, a.iters, fused(LceStrategy::Speed, a.n)), gb);
    } else {
      print(a, "unfused", measure(dev, a.iters, [&]() {
              Tensor loss = nn::functional::cross_entropy(linear(x, w), y);
              auto g = autograd::grad({loss}, {x, w});
              return loss.item();
            }),
            gb);
    }
#ifdef KILN_WITH_CUDA
    if (dev.is_cuda() && a.wants("phases")) cuda_phases(a, x, w, y);
    if (dev.is_cuda() && a.wants("algos")) cuda_gemm_algos(x, w, y, a.json);
#endif
    // The three GEMMs of a fused forward+backward, alone, on random operands as torch's baseline
    // (a dz of zeros, from a fresh allocation, runs the tensor cores cooler and ~10 % faster).
    Tensor dz_random;
    if (a.wants("gemm3") && dev.is_cuda()) {
      NoGradGuard ng;
      manual_seed(3);
      dz_random = randn({a.n, a.v}, opt);
    }
    if (a.wants("gemm3")) print(a, "gemm3", measure(dev, a.iters, [&]() -> double {
            NoGradGuard ng;
            const int64_t N = a.n, H = a.h, V = a.v;
            if (dev.is_cuda()) {
#ifdef KILN_WITH_CUDA
              Tensor z = empty({N, V}, opt);  // logits in the input dtype, as torch's `x @ W.t()`
              const Tensor& dz = dz_random;
              Tensor dx = empty({N, H}, opt), dw = empty({V, H}, opt);
              auto mm = [&](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& A, int64_t lda,
                            const Tensor& B, int64_t ldb, const Tensor& C, int64_t ldc) {
                cuda::GemmParams p;
                p.trans_a = ta, p.trans_b = tb, p.m = m, p.n = n, p.k = k;
                p.a = A.data_ptr(), p.lda = lda, p.b = B.data_ptr(), p.ldb = ldb, p.c = C.data_ptr(), p.ldc = ldc;
                p.ab_type = dt, p.c_type = C.dtype(), p.device = dev.index;
                p.stream = cuda::current_stream(dev.index).handle();
                cuda::gemm(p);
              };
              mm(false, true, N, V, H, x, H, w, H, z, V);
              mm(false, false, N, H, V, dz, V, w, H, dx, H);
              mm(true, false, V, H, N, dz, V, x, H, dw, H);
#endif
              return NAN;
            }
            Tensor xf = x.detach().to(kFloat32), wf = w.detach().to(kFloat32);
            Tensor z = empty({N, V}), dx = empty({N, H}), dw = empty({V, H});
            const float* xp = xf.data_ptr<float>();
            const float* wp = wf.data_ptr<float>();
            cpu::gemm(false, true, N, V, H, 1.0f, xp, H, wp, H, 0.0f, z.data_ptr<float>(), V);
            cpu::gemm(false, false, N, H, V, 1.0f, z.data_ptr<float>(), V, wp, H, 0.0f, dx.data_ptr<float>(), H);
            cpu::gemm(true, false, V, H, N, 1.0f, z.data_ptr<float>(), V, xp, H, 0.0f, dw.data_ptr<float>(), H);
            return NAN;
          }),
          gb);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_lce: %s\n", e.what());
    return 1;
  }
}
