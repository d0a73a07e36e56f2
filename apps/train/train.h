#pragma once
// `kiln train` and `kiln generate`: the GPT training job (data, tokenizer, model, AdamW loop,
// progress, metrics, checkpoints, resume) and sampling from a checkpoint.
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist.h"
#include "model.h"

namespace CLI {
class App;
}

namespace kiln::train {

struct TrainConfig {
  std::string preset = "tiny";
  // Model overrides (0: the preset's value).
  int64_t vocab_size = 0, dim = 0, layers = 0, heads = 0, seq_len = 0, sliding_window = 0;
  int64_t mask_block = 0;  // BlockMask block size (0: ModelConfig's automatic choice)
  std::string data;             // file or folder; empty: the Python standard library
  int64_t max_data_bytes = 0;   // 0: all
  int64_t tokenizer_sample_bytes = 1 << 20;  // BPE is trained on this many bytes of the train split
  std::string run_dir = "runs/tiny";
  std::string device = "cpu";   // cpu, cuda, cuda:N
  std::string autocast = "auto";  // bf16 | none | auto (bf16 on CUDA, none on the CPU)
  double dropout = 0.0;
  bool synthetic = false;         // random tokens (benchmarks): no corpus, no tokenizer training
  int64_t synthetic_doc_len = 0;  // mean document length (0: seq_len / 4)
  int64_t bench_steps = 0;        // > 0: benchmark mode (no eval/checkpoints), prints one JSON line
  int64_t bench_warmup = 2;
  int64_t steps = 800;  // the default run: held-out loss 0.48 of its first at 600 steps (94 s here), 0.45 at 800
  int64_t batch_size = 16;       // sequences per micro-batch
  int64_t grad_accum = 1;
  double lr = 5e-3;
  double min_lr = 5e-4;
  int64_t warmup_steps = 30;
  double weight_decay = 0.1;
  double beta2 = 0.95;
  double grad_clip = 1.0;
  int64_t eval_every = 100;      // held-out loss every N steps (and at step 0 and the end)
  int64_t eval_batches = 4;     // batches of batch_size windows, spread over the held-out stream
  int64_t checkpoint_every = 200;  // 0: only at the end
  int64_t log_every = 50;
  // Continue from the run folder's latest checkpoint with the run's saved settings (config.json's
  // "train" and "model"). A missing or damaged checkpoint is an error, never a fresh start, unless
  // resume_auto (--resume=auto) is set and the run folder has no checkpoints/latest yet.
  bool resume = false;
  bool resume_auto = false;
  // With resume: settings that differ from the saved ones replace them (without it, an error).
  // The model's shape can never change.
  bool override_saved = false;
  // The flags given on the command line ("--steps", ...); add_train_options fills it.
  // Resuming, a setting not given takes the saved value; unset (the C++ API), every setting counts
  // as given and must match.
  std::optional<std::set<std::string>> given;
  int64_t stop_after = 0;       // stop (with a checkpoint) after this step; 0: run to `steps`
  uint64_t seed = 1337;
  // OpenMP threads (0: the machine's default). 1 by default: the tiny model's ops are too small
  // to amortise OpenMP barriers; on a loaded 2-core machine 2 threads ran 2.5x slower than 1.
  int threads = 1;
  std::string progress = "auto";  // auto | tty | plain | none
  int64_t sample_tokens = 200;  // generated at the end (0: none)
  std::string sample_prompt = "def ";
  bool golden_dump = false;     // write golden/init.safetensors + golden/batches.safetensors (first 10 steps)
  bool quiet_summary = false;   // tests: no header/footer text
  // Sharded data parallel: > 1 starts this many ranks (unless a launcher already did: RANK /
  // WORLD_SIZE set), each training on batch_size / nproc sequences of every global batch.
  int nproc = 1;
  bool fsdp = false;  // the sharded code path even on one rank
  // C++ callers that formed the ranks themselves: the communicator to shard over (unset: the
  // launcher's ranks, as `kiln run` / torchrun set them).
  std::shared_ptr<dist::Communicator> comm;
};

struct GenerateConfig {
  std::string checkpoint;       // run dir or one checkpoint folder
  std::string prompt = "def ";
  int64_t max_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 0;
};

// Registers the flags on a subcommand (values land in `cfg`; the preset is applied before the
// other flags by apply_preset_overrides, called by run_train).
void add_train_options(CLI::App* sub, TrainConfig& cfg);
void add_generate_options(CLI::App* sub, GenerateConfig& cfg);

// The preset with the flags' overrides applied.
ModelConfig resolve_model(const TrainConfig& cfg);

struct TrainResult {
  std::vector<double> train_losses;                     // per optimizer step done in this call
  std::vector<std::pair<int64_t, double>> eval_losses;  // (step, held-out loss) in this call
  double first_eval_loss = 0;                           // the run's first held-out loss
  int64_t last_step = 0;                                // the last step done (and good)
  int64_t steps = 0;                                    // the run's length (the saved one when resumed)
  std::string bench_json;                               // benchmark mode: the JSON printed
  // Set when a step produced a non-finite loss, gradient norm or parameter: the run stopped there
  // (no checkpoint of it; metrics.jsonl, the last good checkpoint and loss.svg are kept) and this
  // says which step and which value.
  std::string nonfinite;
};
TrainResult train(const TrainConfig& cfg, std::ostream& out);

// Returns 0 on success; 1 when the run finished but the held-out loss did not fall to at most
// half of its first value (the default run's check); 3 when a non-finite value stopped it (the
// message goes to stderr).
int run_train(const TrainConfig& cfg, std::ostream& out = std::cout);
int run_generate(const GenerateConfig& cfg, std::ostream& out = std::cout);

}  // namespace kiln::train
