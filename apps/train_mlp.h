#pragma once
// `kiln train --demo mlp`: a two-layer MLP trained with AdamW on a synthetic classification
// task on the CPU (the `make train` job until the GPT trainer lands).
#include <cstdint>
#include <iostream>
#include <ostream>

namespace kiln::apps {

struct MlpDemoConfig {
  int64_t steps = 400;
  int64_t log_every = 25;
  int64_t classes = 3;
  int64_t points_per_class = 300;  // on a 2-D spiral arm per class
  int64_t hidden = 128;
  double lr = 1e-2;
  int64_t warmup_steps = 20;
  double max_grad_norm = 1.0;
  uint64_t seed = 0;
  // OpenMP threads for the run (0: leave the default). The batch is tiny, so thread barriers
  // cost more than they give: on a loaded 2-core machine 2 threads took 30 s, 1 thread 1 s.
  int threads = 1;
};

// Trains Linear(2, hidden) -> gelu -> Linear(hidden, classes) with cross_entropy, AdamW, a warmup +
// cosine learning rate and gradient clipping, full batch; prints the loss every log_every steps
// and the final training accuracy to `out`. Returns 0 when the loss fell below a quarter of its
// first value (the run did learn), 1 otherwise.
int run_mlp_demo(const MlpDemoConfig& config = {}, std::ostream& out = std::cout);

}  // namespace kiln::apps
