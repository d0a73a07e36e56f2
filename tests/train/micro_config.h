#pragma once
// The training tests' shared run: the micro preset, six quick steps with evaluation and a
// checkpoint every three, no progress output, two threads.
#include <string>

#include "train.h"

namespace kiln::train::testing {

inline TrainConfig micro_test_config(const std::string& data, const std::string& run_dir) {
  TrainConfig c;
  c.preset = "micro";
  c.data = data;
  c.run_dir = run_dir;
  c.steps = 6;
  c.batch_size = 4;
  c.warmup_steps = 2;
  c.eval_every = 3;
  c.eval_batches = 1;
  c.checkpoint_every = 3;
  c.log_every = 1;
  c.progress = "none";
  c.sample_tokens = 0;
  c.quiet_summary = true;
  c.threads = 2;
  return c;
}

}  // namespace kiln::train::testing
