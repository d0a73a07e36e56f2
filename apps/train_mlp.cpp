// The MLP demo behind `kiln train --demo mlp`: interleaved 2-D spirals (one arm per class), which
// a linear model cannot separate, learned by a two-layer MLP in a few hundred full-batch steps.
#include "train_mlp.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace kiln::apps {
namespace {

// Spiral arms: point i of class k sits at radius r = i / n and angle 4 (k + r) + noise.
void make_spirals(const MlpDemoConfig& c, Tensor& x, Tensor& y) {
  const int64_t n = c.points_per_class, total = n * c.classes;
  const std::vector<double> noise = randn({total}, kFloat64).to_vector();
  std::vector<double> xs(static_cast<size_t>(total * 2)), ys(static_cast<size_t>(total));
  for (int64_t k = 0; k < c.classes; ++k)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = k * n + i;
      const double r = static_cast<double>(i) / static_cast<double>(n);
      const double t = 4.0 * (static_cast<double>(k) + r) + 0.2 * noise[j];
      xs[2 * j] = r * std::sin(t);
      xs[2 * j + 1] = r * std::cos(t);
      ys[j] = static_cast<double>(k);
    }
  x = tensor(xs, kFloat32).view({total, 2});
  y = tensor(ys, kInt64);
}

double accuracy(const Tensor& logits, const Tensor& y) {
  const std::vector<double> l = logits.to_vector(), t = y.to_vector();
  const int64_t C = logits.size(1);
  int64_t right = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c)
      if (l[i * C + c] > l[i * C + best]) best = c;
    right += best == static_cast<int64_t>(t[i]);
  }
  return static_cast<double>(right) / static_cast<double>(t.size());
}

}  // namespace

int run_mlp_demo(const MlpDemoConfig& c, std::ostream& out) {
  struct ThreadsGuard {
    int saved = omp_get_max_threads();
    ~ThreadsGuard() { omp_set_num_threads(saved); }
  } threads_guard;
  if (c.threads > 0) omp_set_num_threads(c.threads);
  manual_seed(c.seed);
  Tensor x, y;
  make_spirals(c, x, y);
  nn::Sequential mlp{std::make_shared<nn::Linear>(2, c.hidden),
                     std::make_shared<nn::Functional>([](const Tensor& h) { return gelu(h); }, "GELU"),
                     std::make_shared<nn::Linear>(c.hidden, c.classes)};
  optim::AdamWOptions o;
  o.lr = c.lr;
  optim::AdamW opt(mlp.parameters(), o);
  out << "mlp demo: " << x.size(0) << " points on " << c.classes << " spiral arms, MLP 2 -> " << c.hidden
      << " -> " << c.classes << " (" << mlp.num_parameters() << " parameters), AdamW, " << c.steps
      << " full-batch steps on the CPU\n";
  const auto start = std::chrono::steady_clock::now();
  double first = 0, last = 0;
  char line[160];
  for (int64_t step = 0; step < c.steps; ++step) {
    opt.set_lr(optim::warmup_cosine_lr(step, c.warmup_steps, c.steps, c.lr, c.lr * 0.1));
    Tensor loss = nn::functional::cross_entropy(mlp(x), y);
    opt.zero_grad();
    loss.backward();
    const double gnorm = optim::clip_grad_norm_(mlp.parameters(), c.max_grad_norm).item();
    opt.step();
    last = loss.item();
    if (step == 0) first = last;
    if (step % c.log_every == 0 || step == c.steps - 1) {
      std::snprintf(line, sizeof(line), "step %5lld | loss %.4f | lr %.2e | grad norm %.3f\n",
                    static_cast<long long>(step), last, opt.lr(), gnorm);
      out << line;
    }
  }
  double acc;
  {
    NoGradGuard no_grad;
    acc = accuracy(mlp(x), y);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::snprintf(line, sizeof(line), "done: loss %.4f -> %.4f, training accuracy %.1f%%, %.2f s\n", first, last,
                100.0 * acc, secs);
  out << line;
  return last < 0.25 * first ? 0 : 1;
}

}  // namespace kiln::apps
