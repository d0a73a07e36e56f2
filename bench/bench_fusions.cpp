// The CPU fusions of the GPT step, each beside the unfused composition it replaced, in one run:
// swiglu vs silu(gate) * up, add_rms_norm vs add + rms_norm (forward + backward through autograd),
// AdamW over the model's parameters in one multi-tensor pass vs one pass per parameter, and the
// whole training step of a GPT preset (fused model vs unfused_gpt.h, same weights; both step
// with the multi-tensor AdamW, timed apart above). Repetitions
// alternate the two variants (the machine may be shared); each line gives both medians and the
// median of the per-repetition ratios unfused / fused (> 1: the fusion pays), then the ratio of
// the medians.
//
//   bench_fusions [--reps N] [--preset tiny] [--threads N]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/optim.h"
#include "model.h"
#include "optim/cpu/kernels.h"
#include "timing.h"
#include "unfused_gpt.h"

namespace {

using namespace kiln;
namespace F = kiln::nn::functional;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times a and b alternately (which goes first alternates too), `reps` times each.
void side_by_side(const std::string& what, int reps, const std::function<void()>& unfused,
                  const std::function<void()>& fused) {
  unfused();
  fused();  // warm-up: allocator, page faults, code
  std::vector<double> tu, tf, ratio;
  for (int r = 0; r < reps; ++r) {
    double a = 0, b = 0;
    for (int k = 0; k < 2; ++k) {
      const bool unfused_now = (r + k) % 2 == 0;
      const double t0 = bench::now_ms();
      (unfused_now ? unfused : fused)();
      (unfused_now ? a : b) = bench::now_ms() - t0;
    }
    tu.push_back(a), tf.push_back(b), ratio.push_back(a / b);
  }
  std::printf("%-40s unfused %9.3f ms  fused %9.3f ms  ratio %.2fx (of medians %.2fx)\n", what.c_str(), median(tu),
              median(tf), median(ratio), median(tu) / median(tf));
  std::fflush(stdout);
}

void bench_swiglu(int64_t rows, int64_t cols, int reps) {
  manual_seed(1);
  const Tensor g = randn({rows, cols}).requires_grad_(true), u = randn({rows, cols}).requires_grad_(true);
  const Tensor dy = randn({rows, cols});
  side_by_side("swiglu fwd+bwd [" + std::to_string(rows) + ", " + std::to_string(cols) + "]", reps,
               [&] { (silu(g) * u).backward(dy); }, [&] { F::swiglu(g, u).backward(dy); });
}

void bench_add_rms_norm(int64_t rows, int64_t cols, int reps) {
  manual_seed(2);
  const Tensor x = randn({rows, cols}).requires_grad_(true), r = randn({rows, cols}).requires_grad_(true);
  const Tensor w = (rand({cols}) + 0.5).requires_grad_(true);
  const Tensor gh = randn({rows, cols}), gy = randn({rows, cols});
  side_by_side("add + rms_norm fwd+bwd [" + std::to_string(rows) + ", " + std::to_string(cols) + "]", reps,
               [&] {
                 const Tensor h = x + r;
                 autograd::backward({h, F::rms_norm(h, w, 1e-5)}, {gh, gy});
               },
               [&] {
                 auto [h, y] = F::add_rms_norm(x, r, w, 1e-5);
                 autograd::backward({h, y}, {gh, gy});
               });
}

void bench_adamw(const train::ModelConfig& c, const std::string& preset, int reps) {
  manual_seed(3);
  train::GPT model(c);
  std::vector<cpu::AdamWTensors> all;
  const cpu::AdamWScalars s{1e-3, 0.9, 0.95, 1e-8, 0.1, 1e-3 / 0.1, 0.05};
  for (const Tensor& p : model.parameters())
    all.push_back({p.detach(), randn(p.sizes()), zeros(p.sizes()), zeros(p.sizes()), s});
  side_by_side("AdamW step, " + preset + " (" + std::to_string(all.size()) + " tensors)", reps,
               [&] {
                 for (const cpu::AdamWTensors& t : all) cpu::adamw_step({t});
               },
               [&] { cpu::adamw_step(all); });
}

void bench_step(const train::ModelConfig& c, const std::string& preset, int reps) {
  manual_seed(4);
  train::GPT fused(c);
  manual_seed(4);
  train::GPT unfused(c);
  optim::AdamW opt_f(fused.parameters()), opt_u(unfused.parameters());
  const int64_t B = 16, T = c.seq_len;
  const Tensor idx = randint(0, c.vocab_size, {B, T}), target = randint(0, c.vocab_size, {B, T});
  const flex::BlockMask mask = fused.block_mask(zeros({B, T}, kInt32));
  std::vector<double> lf, lu;  // per step: both models take the same steps from the same weights
  side_by_side("train step, " + preset + " (batch 16)", reps,
               [&] {
                 const Tensor l = train::testing::unfused_gpt_loss(unfused, idx, target, mask);
                 l.backward();
                 opt_u.step();
                 opt_u.zero_grad();
                 lu.push_back(l.item());
               },
               [&] {
                 const Tensor l = fused.loss(idx, target, mask);
                 l.backward();
                 opt_f.step();
                 opt_f.zero_grad();
                 lf.push_back(l.item());
               });
  double worst = 0;
  for (size_t i = 0; i < lf.size(); ++i) worst = std::max(worst, std::abs(lf[i] - lu[i]) / std::abs(lu[i]));
  std::printf("%-40s %zu steps: last loss unfused %.7f fused %.7f; largest relative gap %.2e\n", "", lf.size(),
              lu.back(), lf.back(), worst);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 21, threads = 0;
  std::string preset = "tiny";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  if (threads > 0) omp_set_num_threads(threads);
  const train::ModelConfig c = train::model_preset(preset);
  std::printf("bench_fusions: %d repetitions, %d threads, preset %s\n", reps, omp_get_max_threads(), preset.c_str());
  bench_swiglu(2048, c.hidden(), reps);
  bench_swiglu(8192, 1024, reps);
  bench_add_rms_norm(2048, c.dim, reps);
  bench_add_rms_norm(8192, 768, reps);
  bench_adamw(c, preset, reps);
  bench_step(c, preset, std::max(3, reps / 3));
  return 0;
}
