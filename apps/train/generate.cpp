// Autoregressive sampling with temperature and top-k, drawn from a seeded mt19937_64 (so a seed
// gives the same text every time).
#include "generate.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

#include <CLI/CLI.hpp>

#include "../command_line.h"
#include "checkpoint.h"
#include "kiln/autograd.h"
#include "train.h"

namespace kiln::train {

std::string generate(GPT& model, const Tokenizer& tok, const std::string& prompt, const SampleOptions& o) {
  NoGradGuard ng;
  // Sampling runs in eval mode (no dropout); the model's mode is restored on return.
  struct EvalMode {
    GPT& m;
    bool was;
    ~EvalMode() { m.train(was); }
  } eval_mode{model, model.is_training()};
  model.eval();
  const Device dev = model.tok_emb.device();
  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) ids.push_back(Tokenizer::kEot);
  const size_t n_prompt = ids.size();
  std::mt19937_64 rng(o.seed);
  const int64_t T = model.config().seq_len;
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const size_t start = ids.size() > static_cast<size_t>(T) ? ids.size() - static_cast<size_t>(T) : 0;
    Tensor idx = empty({1, static_cast<int64_t>(ids.size() - start)}, kInt64);
    for (size_t j = start; j < ids.size(); ++j) idx.data_ptr<int64_t>()[j - start] = ids[j];
    std::vector<double> logits = model.last_logits(idx.to(dev)).to_vector();
    // A --synthetic run's model has more ids than its byte tokenizer can spell: sample among those it can.
    logits.resize(std::min(logits.size(), static_cast<size_t>(tok.vocab_size())));
    std::vector<int32_t> order(logits.size());
    for (size_t v = 0; v < order.size(); ++v) order[v] = static_cast<int32_t>(v);
    int32_t next = 0;
    if (o.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      const size_t k = o.top_k > 0 ? std::min(static_cast<size_t>(o.top_k), order.size()) : order.size();
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      std::vector<double> p(k);
      double total = 0;
      for (size_t j = 0; j < k; ++j) total += p[j] = std::exp((logits[order[j]] - logits[order[0]]) / o.temperature);
      double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
      next = order[k - 1];
      for (size_t j = 0; j < k; ++j) {
        if (u < p[j]) {
          next = order[j];
          break;
        }
        u -= p[j];
      }
    }
    if (next == Tokenizer::kEot) break;
    ids.push_back(next);
  }
  return prompt + tok.decode(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(n_prompt), ids.end()));
}

namespace {
int generate_from(const GenerateConfig& cfg, std::ostream& out) {
  const std::string dir = find_checkpoint(cfg.checkpoint);
  KILN_CHECK(!dir.empty(), "generate", "no checkpoint in ", cfg.checkpoint,
             " (give a run folder with checkpoints/latest, a checkpoint folder, or a file in one)");
  const TrainState st = load_state(dir);
  const ModelConfig mc = model_from_json(st.config_json);
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  GPT model(mc);
  load_weights(dir, model, nullptr);
  SampleOptions so;
  so.max_tokens = cfg.max_tokens, so.temperature = cfg.temperature, so.top_k = cfg.top_k, so.seed = cfg.seed;
  out << generate(model, tok, cfg.prompt, so) << "\n";
  return 0;
}
}  // namespace

int run_generate(const GenerateConfig& cfg, std::ostream& out) {
  try {
    return generate_from(cfg, out);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a file system or JSON failure: reported, never an abort
    KILN_FAIL("generate", e.what());
  }
}

void add_train_options(CLI::App* sub, TrainConfig& c) {
  sub->add_option("--preset", c.preset, "model preset: tiny (CPU default), micro, small, gpt125m");
  sub->add_option("--data", c.data, "text file or folder (default: the Python standard library)");
  sub->add_option("--max-data-bytes", c.max_data_bytes, "read at most this many bytes of the corpus")->check(CLI::NonNegativeNumber);
  sub->add_option("--run-dir", c.run_dir, "folder for checkpoints, metrics.jsonl, loss.svg");
  sub->add_option("--device", c.device, "cpu or cuda (cuda:N); a CUDA device is checked before the corpus is read");
  sub->add_option("--autocast", c.autocast,
                  "mixed precision: bf16 (bfloat16) or none (fp32, float32); auto: bf16 on CUDA, none on the CPU")
      ->transform(apps::autocast_spelling());
  sub->add_option("--dropout", c.dropout, "dropout on the embedding and residual branches")->check(CLI::NonNegativeNumber);
  sub->add_flag("--synthetic", c.synthetic, "random tokens in documents of random lengths (no corpus, no BPE)");
  sub->add_option("--synthetic-doc-len", c.synthetic_doc_len, "mean document length of --synthetic data (0: seq/4)")->check(CLI::NonNegativeNumber);
  sub->add_option("--bench-steps", c.bench_steps,
                  "benchmark: N timed steps after --bench-warmup, then one JSON line (tokens/s, peak memory, phases)")->check(CLI::NonNegativeNumber);
  sub->add_option("--bench-warmup", c.bench_warmup, "benchmark warm-up steps (not timed)")->check(CLI::NonNegativeNumber);
  sub->add_option("--vocab-size", c.vocab_size, "vocabulary size (BPE merges up to it; with --synthetic, the token range)")->check(CLI::NonNegativeNumber);
  sub->add_option("--dim", c.dim, "model width")->check(CLI::NonNegativeNumber);
  sub->add_option("--layers", c.layers, "transformer blocks")->check(CLI::NonNegativeNumber);
  sub->add_option("--heads", c.heads, "attention heads")->check(CLI::NonNegativeNumber);
  sub->add_option("--seq-len", c.seq_len, "tokens per sequence")->check(CLI::NonNegativeNumber);
  sub->add_option("--sliding-window", c.sliding_window, "attention window in tokens (0: full causal)")->check(CLI::NonNegativeNumber);
  sub->add_option("--mask-block", c.mask_block,
                  "FlexAttention BlockMask block size in tokens (0: 128 from 512 tokens, else 64; CUDA kernels need multiples of 64)")->check(CLI::NonNegativeNumber);
  sub->add_option("--steps", c.steps, "optimizer steps")->check(CLI::PositiveNumber);
  sub->add_option("--batch-size", c.batch_size, "sequences per micro-batch")->check(CLI::PositiveNumber);
  sub->add_option("--grad-accum", c.grad_accum, "micro-batches per optimizer step")->check(CLI::PositiveNumber);
  sub->add_option("--lr", c.lr, "peak learning rate")->check(CLI::NonNegativeNumber);
  sub->add_option("--min-lr", c.min_lr, "final learning rate of the cosine decay")->check(CLI::NonNegativeNumber);
  sub->add_option("--warmup-steps", c.warmup_steps, "linear warm-up steps")->check(CLI::NonNegativeNumber);
  sub->add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices only)")->check(CLI::NonNegativeNumber);
  sub->add_option("--grad-clip", c.grad_clip, "max global gradient norm")->check(CLI::NonNegativeNumber);
  sub->add_option("--eval-every", c.eval_every, "held-out loss every N steps")->check(CLI::NonNegativeNumber);
  sub->add_option("--eval-batches", c.eval_batches, "held-out batches per evaluation")->check(CLI::PositiveNumber);
  sub->add_option("--checkpoint-every", c.checkpoint_every, "checkpoint every N steps (0: at the end only)")->check(CLI::NonNegativeNumber);
  sub->add_option("--log-every", c.log_every, "progress line every N steps (plain output)")->check(CLI::PositiveNumber);
  sub->add_option_function<std::string>(
         "--resume",
         [&c](const std::string& mode) {
           c.resume = true;
           c.resume_auto = mode == "auto";
         },
         "continue the run in --run-dir from its latest checkpoint, with its saved settings (a flag that "
         "contradicts them is an error; see --override). No checkpoint there, or a damaged one, is an error; "
         "--resume=auto starts a fresh run when the folder has no checkpoint yet")
      ->expected(0, 1)
      ->default_str("require")
      ->check(CLI::IsMember({"require", "auto"}));
  sub->add_flag("--override", c.override_saved,
                "with --resume: flags that differ from the run's saved settings replace them (the model cannot change)");
  sub->add_option("--stop-after", c.stop_after, "stop after this step (the schedule still spans --steps)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", c.seed, "initialisation and data-order seed");
  sub->add_option("--threads", c.threads, "OpenMP threads (0: OpenMP's default, one per core; 1 is fastest for the tiny model)")->check(CLI::NonNegativeNumber);
  sub->add_option("--nproc", c.nproc, "sharded data parallel over N processes on this machine (fully_shard per block)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--fsdp", c.fsdp, "the sharded code path on a single process");
  sub->add_option("--progress", c.progress, "auto, tty, plain or none")
      ->check(CLI::IsMember({"auto", "tty", "plain", "none"}));
  sub->add_option("--sample-tokens", c.sample_tokens, "tokens generated at the end (0: none)")->check(CLI::NonNegativeNumber);
  sub->add_option("--prompt", c.sample_prompt, "prompt of the final sample");
  sub->add_flag("--golden-dump", c.golden_dump, "save initial weights and the first 10 batches (scripts/golden_check.py)");
  // Which flags were given: a resumed run takes the saved value of every other setting.
  sub->callback([sub, &c] {
    c.given.emplace();
    for (const CLI::Option* o : sub->get_options())
      if (o->count() > 0) c.given->insert(o->get_name());
  });
}

void add_generate_options(CLI::App* sub, GenerateConfig& c) {
  sub->add_option("--checkpoint", c.checkpoint, "run folder, checkpoint folder, or a file in one (as kiln inspect)")
      ->required();
  sub->add_option("--prompt", c.prompt, "text to continue");
  sub->add_option("--max-tokens", c.max_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", c.temperature, "sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", c.top_k, "sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", c.seed, "sampling seed");
}

}  // namespace kiln::train
