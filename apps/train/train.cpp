// The training job: corpus -> tokenizer -> packed windows -> GPT -> AdamW loop with warm-up +
// cosine, clipping and accumulation; progress, JSON-lines metrics, held-out loss, checkpoints
// every N steps (resumable bit for bit on the CPU), the loss-curve SVG, and a generated sample.
#include "train.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "data.h"
#include "generate.h"
#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/cuda.h"
#include "kiln/io.h"
#include "kiln/jit.h"
#include "kiln/memory.h"
#include "kiln/optim.h"
#include "kiln/telemetry.h"
#include "profile.h"
#include "report.h"
#include "resume.h"
#include "sharding.h"

namespace fs = std::filesystem;

namespace kiln::train {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct ThreadsGuard {
  int saved = omp_get_max_threads();
  ~ThreadsGuard() { omp_set_num_threads(saved); }
};

// BPE sample: an equal share of every training document (cut at a line end), so the merges see
// the whole corpus rather than its alphabetically first files.
std::string tokenizer_sample(const std::vector<Document>& docs, int64_t budget) {
  std::string s;
  const size_t share = static_cast<size_t>(std::max<int64_t>(budget / static_cast<int64_t>(docs.size()), 256));
  for (const Document& d : docs) {
    size_t n = std::min(share, d.text.size());
    const size_t nl = d.text.rfind('\n', n);
    if (n < d.text.size() && nl != std::string::npos && nl > 0) n = nl + 1;
    s.append(d.text, 0, n);
  }
  return s;
}

// Where the model runs and in which precision.
struct Placement {
  Device device;
  bool autocast = false;  // bf16 autocast around the forward
};

// A micro-batch with its block mask (built on the host from the doc ids) and the loader position
// before it (what a checkpoint saves while it waits).
struct PreparedBatch {
  Batch batch;
  flex::BlockMask mask;
  int64_t epoch = 0, cursor = 0;
};

PreparedBatch prepare_batch(Loader& loader, const GPT& model, int64_t batch_size) {
  PreparedBatch p;
  p.epoch = loader.epoch();
  p.cursor = loader.cursor();
  p.batch = loader.next(batch_size);
  p.mask = model.block_mask(p.batch.doc_ids);
  return p;
}

// The loss of one batch on the model's device (doc ids stay on the host: the block mask is built there).
Tensor batch_loss(GPT& model, const Batch& b, const flex::BlockMask& mask, const Placement& pl) {
  Tensor input = b.input, target = b.target;
  if (pl.device.is_cuda()) {
    Phase ph("data");
    input = input.to(pl.device);
    target = target.to(pl.device);
  }
  std::optional<AutocastGuard> ac;
  if (pl.autocast) ac.emplace(pl.device.type, kBFloat16);
  return model.loss(input, target, mask);
}

double evaluate(GPT& model, const Loader& loader, const std::vector<int64_t>& windows, int64_t batch,
                const Placement& pl) {
  NoGradGuard ng;
  model.eval();
  double sum = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < windows.size(); i += static_cast<size_t>(batch)) {
    const std::vector<int64_t> w(windows.begin() + static_cast<std::ptrdiff_t>(i),
                                 windows.begin() + static_cast<std::ptrdiff_t>(std::min(windows.size(), i + static_cast<size_t>(batch))));
    const Batch b = loader.window_batch(w);
    if (b.tokens == 0) continue;
    sum += batch_loss(model, b, model.block_mask(b.doc_ids), pl).item() * static_cast<double>(b.tokens);
    tokens += b.tokens;
  }
  model.train();
  return tokens > 0 ? sum / static_cast<double>(tokens) : std::nan("");
}

nlohmann::json model_json(const ModelConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"dim", c.dim},         {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},       {"mlp_hidden", c.hidden()}, {"seq_len", c.seq_len},
          {"sliding_window", c.sliding_window}, {"rope_theta", c.rope_theta}, {"norm_eps", c.norm_eps},
          {"dropout", c.dropout}};
}

// The benchmark's JSON line: throughput over the timed steps, peak memory, and the mean time per
// step of each phase (device time on CUDA); "other" is the step time no phase covers (host work,
// syncs, launch gaps).
// startup_s: from the command's start (settings checked) to the end of the first step, run-time
// compiles included; jit: what kiln::jit did in the process (a warm cache compiles nothing).
std::string bench_report(const TrainConfig& cfg, const ModelConfig& mc, int64_t params, const Placement& pl,
                         const std::vector<double>& step_s, const std::map<std::string, double>& phase_ms,
                         const std::vector<double>& losses, const MemoryStats& mem, const telemetry::Reading& tel,
                         double startup_s) {
  const jit::CompileStats js = jit::compile_stats();
  const double n = static_cast<double>(std::max<size_t>(step_s.size(), 1));
  double total = 0;
  for (double s : step_s) total += s;
  const double mean_s = total / n;
  const int64_t tokens = cfg.batch_size * cfg.grad_accum * mc.seq_len;
  nlohmann::json phases = nlohmann::json::object();
  double covered = 0;
  for (const auto& [name, ms] : phase_ms) {
    phases[name] = ms / n;
    covered += ms / n;
  }
  phases["other"] = std::max(0.0, mean_s * 1e3 - covered);
  return nlohmann::json{{"kind", "kiln_train_bench"},
                        {"framework", "kiln"},
                        {"device", pl.device.str()},
                        {"autocast", pl.autocast ? "bf16" : "none"},
                        {"preset", cfg.preset},
                        {"model", model_json(mc)},
                        {"params", params},
                        {"batch_size", cfg.batch_size},
                        {"grad_accum", cfg.grad_accum},
                        {"seq_len", mc.seq_len},
                        {"tokens_per_step", tokens},
                        {"warmup_steps", cfg.bench_warmup},
                        {"steps", step_s.size()},
                        {"step_s", step_s},
                        {"step_s_mean", mean_s},
                        {"tokens_per_s", static_cast<double>(tokens) / mean_s},
                        {"peak_allocated_bytes", mem.peak_allocated},
                        {"peak_reserved_bytes", mem.peak_reserved},
                        {"phases_ms_per_step", phases},
                        {"startup_s", startup_s},
                        {"jit", {{"compiles", js.compiles}, {"disk_hits", js.disk_hits},
                                 {"workers_started", js.workers_started}, {"failures", js.failures},
                                 {"compile_s", js.compile_seconds}}},
                        {"losses", losses},
                        {"telemetry", nlohmann::json::parse(telemetry::to_json(tel))}}
      .dump();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

}  // namespace

ModelConfig model_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  const nlohmann::json& m = j.contains("model") ? j.at("model") : j;
  ModelConfig c;
  c.vocab_size = m.at("vocab_size").get<int64_t>();
  c.dim = m.at("dim").get<int64_t>();
  c.n_layers = m.at("n_layers").get<int64_t>();
  c.n_heads = m.at("n_heads").get<int64_t>();
  c.mlp_hidden = m.at("mlp_hidden").get<int64_t>();
  c.seq_len = m.at("seq_len").get<int64_t>();
  c.sliding_window = m.at("sliding_window").get<int64_t>();
  c.rope_theta = m.at("rope_theta").get<double>();
  c.norm_eps = m.at("norm_eps").get<double>();
  c.dropout = m.value("dropout", 0.0);
  return c;
}

ModelConfig resolve_model(const TrainConfig& cfg) {
  ModelConfig c = model_preset(cfg.preset);
  if (cfg.vocab_size > 0) c.vocab_size = cfg.vocab_size;
  if (cfg.dim > 0) c.dim = cfg.dim;
  if (cfg.layers > 0) c.n_layers = cfg.layers;
  if (cfg.heads > 0) c.n_heads = cfg.heads;
  if (cfg.seq_len > 0) c.seq_len = cfg.seq_len;
  if (cfg.sliding_window > 0) c.sliding_window = cfg.sliding_window;
  KILN_CHECK(cfg.mask_block >= 0, "train", "--mask-block must be positive (or 0 for automatic), got ", cfg.mask_block);
  c.mask_block = cfg.mask_block;
  c.dropout = cfg.dropout;
  return c;
}

namespace {
// Ranges of the settings, checked before anything runs (a zero --log-every would divide by zero,
// a negative --steps reach AdamW as a negative learning rate).
void check_settings(const TrainConfig& c) {
  auto positive = [](int64_t v, const char* flag) {
    KILN_CHECK(v > 0, "train", flag, " must be positive, got ", v);
  };
  auto non_negative = [](double v, const char* flag) {
    KILN_CHECK(v >= 0, "train", flag, " must be >= 0, got ", v);  // NaN fails too
  };
  positive(c.steps, "--steps");
  positive(c.batch_size, "--batch-size");
  positive(c.grad_accum, "--grad-accum");
  positive(c.log_every, "--log-every");
  positive(c.eval_batches, "--eval-batches");
  positive(c.tokenizer_sample_bytes, "tokenizer_sample_bytes");
  for (const auto& [v, flag] : {std::pair<double, const char*>{static_cast<double>(c.warmup_steps), "--warmup-steps"},
                                {static_cast<double>(c.eval_every), "--eval-every"},
                                {static_cast<double>(c.checkpoint_every), "--checkpoint-every"},
                                {static_cast<double>(c.stop_after), "--stop-after"},
                                {static_cast<double>(c.max_data_bytes), "--max-data-bytes"},
                                {static_cast<double>(c.bench_steps), "--bench-steps"},
                                {static_cast<double>(c.bench_warmup), "--bench-warmup"},
                                {static_cast<double>(c.synthetic_doc_len), "--synthetic-doc-len"},
                                {c.lr, "--lr"},
                                {c.min_lr, "--min-lr"},
                                {c.weight_decay, "--weight-decay"},
                                {c.grad_clip, "--grad-clip"},
                                {c.dropout, "--dropout"}})
    non_negative(v, flag);
  KILN_CHECK(c.beta2 >= 0 && c.beta2 < 1, "train", "beta2 must be in [0, 1), got ", c.beta2);
  KILN_CHECK(c.dropout < 1, "train", "--dropout must be below 1, got ", c.dropout);
}
}  // namespace

TrainResult train(const TrainConfig& requested, std::ostream& rank0_out) {
  TrainConfig cfg = requested;  // a resumed run takes its saved settings into this copy
  check_settings(cfg);
  // Sharded runs: rank 0 speaks and owns the run folder; the other ranks keep their metrics in
  // <run>/rank<r> and print nothing.
  const int launch_rank = cfg.comm ? cfg.comm->get_rank() : dist::launch_info().rank;
  std::ofstream silent;  // never opened: what rank > 0 would print is dropped
  std::ostream& out = launch_rank == 0 ? rank0_out : silent;
  ThreadsGuard threads_guard;
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  Placement pl{Device(cfg.device)};
  if (pl.device.is_cuda()) cuda::check_available(pl.device.index, "train");  // before the corpus is read
  KILN_CHECK(cfg.autocast == "auto" || cfg.autocast == "bf16" || cfg.autocast == "none", "train",
             "--autocast must be bf16, none or auto, got '", cfg.autocast, "'");
  pl.autocast = cfg.autocast == "bf16" || (cfg.autocast == "auto" && pl.device.is_cuda());
  const bool bench = cfg.bench_steps > 0;
  KILN_CHECK(!(bench && cfg.resume), "train", "--bench-steps and --resume do not combine");
  const double t_start = now_s();

  // Resume: the checkpoint's settings, tokenizer and data position; the model shape must match.
  const std::string ckpt = resume_checkpoint(cfg);
  const std::string shared_run_dir = cfg.run_dir;  // where every rank's checkpoint shards go
  if (launch_rank != 0) cfg.run_dir = (fs::path(cfg.run_dir) / ("rank" + std::to_string(launch_rank))).string();
  TrainState state;
  state.seed = cfg.seed;
  std::vector<std::string> resume_notes;
  std::optional<ModelConfig> saved_model;
  if (!ckpt.empty()) {
    state = load_state(ckpt);
    saved_model = apply_saved_settings(state.config_json, cfg, resume_notes);
    check_settings(cfg);
    KILN_CHECK(state.step <= cfg.steps, "train", (fs::path(ckpt) / "state.json").string(), ": step ", state.step,
               " is past the run's ", cfg.steps, " steps; add --steps N with --override to train further");
  }
  fs::create_directories(cfg.run_dir);
  ModelConfig mc = resolve_model(cfg);
  if (saved_model && cfg.given) mc = *saved_model;
  std::string progress_mode = cfg.progress;
  if (progress_mode == "auto") progress_mode = (&out == &std::cout && isatty(STDOUT_FILENO)) ? "tty" : "plain";
  Progress progress(out, progress_mode);
  const bool chatty = !cfg.quiet_summary;

  const std::string data_path = resolved_data_path(cfg);
  std::vector<Document> docs, train_docs, held_docs;
  if (!cfg.synthetic) {
    docs = load_documents(data_path, cfg.max_data_bytes);
    split_documents(docs, 20, train_docs, held_docs);
  }
  int64_t train_bytes = 0;
  for (const auto& d : train_docs) train_bytes += static_cast<int64_t>(d.text.size());
  const double t_tok = now_s();
  // Synthetic data needs no merges: the byte tokenizer is saved (generation then shows bytes).
  const Tokenizer tok = cfg.synthetic ? Tokenizer()
                        : ckpt.empty() ? Tokenizer::train(tokenizer_sample(train_docs, cfg.tokenizer_sample_bytes), mc.vocab_size)
                                       : Tokenizer::load((fs::path(ckpt) / "tokenizer.json").string());
  TokenStream train_stream, held_stream;
  if (cfg.synthetic) {
    // Enough windows that a benchmark or short run rarely repeats one; the loader cycles epochs.
    const int64_t windows = std::max<int64_t>(64, 8 * cfg.batch_size * cfg.grad_accum);
    const int64_t doc_len = cfg.synthetic_doc_len > 0 ? cfg.synthetic_doc_len : std::max<int64_t>(1, mc.seq_len / 4);
    train_stream = synthetic_stream(windows * mc.seq_len + 1, mc.vocab_size, doc_len, cfg.seed);
    held_stream = synthetic_stream(std::max<int64_t>(cfg.eval_batches * cfg.batch_size, 1) * mc.seq_len + 1,
                                   mc.vocab_size, doc_len, cfg.seed + 1);
  } else {
    mc.vocab_size = tok.vocab_size();  // a small corpus may yield fewer merges than asked for
    train_stream = pack(train_docs, tok);
    held_stream = pack(held_docs, tok);
  }
  if (chatty && cfg.synthetic) {
    out << "kiln train: synthetic data: " << train_stream.tokens.size() << " random train tokens, vocab "
        << mc.vocab_size << "\n";
  } else if (chatty) {
    out << "kiln train: " << data_path << ": " << train_docs.size() << " train / " << held_docs.size()
        << " held-out files, " << format_bytes(static_cast<double>(train_bytes)) << "; BPE vocab " << tok.vocab_size()
        << (ckpt.empty() ? " trained" : " loaded") << " in " << fmt("%.1fs", now_s() - t_tok) << ": "
        << train_stream.tokens.size() << " train tokens ("
        << fmt("%.2f", static_cast<double>(train_bytes) / static_cast<double>(train_stream.tokens.size()))
        << " bytes/token), " << held_stream.tokens.size() << " held-out\n";
  }

  // Weights are drawn on the CPU (the same initial model on every device), then moved.
  manual_seed(cfg.seed);
  GPT model(mc);
  if (pl.device.is_cuda()) model.to(pl.device);
  // From here model.parameters() are this rank's shards (the optimizer steps on them).
  const Sharding sh = shard_model(model, pl.device, cfg.fsdp, cfg.comm);
  // Weight decay on matrices only (norm gains and the like are left alone).
  std::vector<Tensor> decay, no_decay;
  std::vector<std::string> decay_names, no_decay_names;
  for (const auto& [name, p] : model.named_parameters()) {
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
    (p.dim() >= 2 ? decay_names : no_decay_names).push_back(name);
  }
  std::vector<std::string> opt_names = decay_names;
  opt_names.insert(opt_names.end(), no_decay_names.begin(), no_decay_names.end());
  optim::AdamWOptions ao;
  ao.lr = cfg.lr, ao.beta2 = cfg.beta2, ao.weight_decay = cfg.weight_decay;
  optim::AdamWOptions ao_nd = ao;
  ao_nd.weight_decay = 0;
  optim::AdamW opt({optim::ParamGroup{decay, ao}, optim::ParamGroup{no_decay, ao_nd}});

  nlohmann::json config_json = {{"model", model_json(mc)},
                                {"train", {{"preset", cfg.preset}, {"steps", cfg.steps}, {"batch_size", cfg.batch_size},
                                           {"grad_accum", cfg.grad_accum}, {"lr", cfg.lr}, {"min_lr", cfg.min_lr},
                                           {"warmup_steps", cfg.warmup_steps}, {"weight_decay", cfg.weight_decay},
                                           {"beta2", cfg.beta2}, {"grad_clip", cfg.grad_clip}, {"seed", cfg.seed},
                                           {"data", data_path}, {"max_data_bytes", cfg.max_data_bytes},
                                           {"synthetic", cfg.synthetic}, {"synthetic_doc_len", cfg.synthetic_doc_len}}}};
  Loader loader(train_stream, mc.seq_len, cfg.seed, /*shuffle=*/true);
  const Loader held_loader(held_stream, mc.seq_len, cfg.seed, /*shuffle=*/false);
  std::vector<int64_t> eval_windows;
  const int64_t n_eval = std::min(cfg.eval_batches * cfg.batch_size, held_loader.num_windows());
  for (int64_t i = 0; i < n_eval; ++i) eval_windows.push_back(i * held_loader.num_windows() / n_eval);

  const std::string metrics_path = (fs::path(cfg.run_dir) / "metrics.jsonl").string();
  int64_t step = 0;
  if (!ckpt.empty()) {
    const nlohmann::json saved = nlohmann::json::parse(state.config_json);
    KILN_CHECK(saved.at("model") == model_json(mc), "train", "--resume: the checkpoint's model ",
               saved.at("model").dump(), " differs from the requested ", model_json(mc).dump());
    if (sh.active()) load_shards(ckpt, sh, opt, opt_names, state.adam_steps);
    else load_weights(ckpt, model, &opt, opt_names);
    const std::string bad = first_nonfinite_parameter(model.named_parameters());
    KILN_CHECK(bad.empty(), "train", "--resume: the checkpoint ", ckpt, " is not usable: its ", bad);
    restore_rng(state.rng);  // after model init, which drew from the generator
    loader.set_position(state.data_epoch, state.data_cursor);
    step = state.step;
    // Drop metrics logged after the checkpoint (a killed or diverged run's lost steps).
    std::ifstream in(metrics_path);
    std::string line, kept;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= step)
        kept += line + "\n";
    }
    write_file_atomic(metrics_path, kept);
    if (chatty) out << "resumed from " << ckpt << " at step " << step << "\n";
    for (const std::string& note : resume_notes) out << "resume: " << note << "\n";
  } else {
    std::ofstream(metrics_path, std::ios::trunc);
  }
  write_file_atomic((fs::path(cfg.run_dir) / "config.json").string(), config_json.dump(2) + "\n");
  state.config_json = config_json.dump();
  std::ofstream metrics(metrics_path, std::ios::app);

  if (chatty) {
    out << "model " << cfg.preset << ": " << model.num_parameters() << " parameters (dim " << mc.dim << ", "
        << mc.n_layers << " layers, " << mc.n_heads << " heads, seq " << mc.seq_len << ", vocab " << mc.vocab_size
        << "); " << cfg.batch_size * cfg.grad_accum * mc.seq_len << " tokens/step, "
        << (bench ? cfg.bench_warmup + cfg.bench_steps : cfg.steps) << " steps on " << pl.device.str()
        << (pl.autocast ? " (bf16 autocast)" : "") << ", " << omp_get_max_threads() << " threads\n";
  }

  TrainResult result;
  const int64_t end = bench ? cfg.bench_warmup + cfg.bench_steps
                            : cfg.stop_after > 0 ? std::min(cfg.stop_after, cfg.steps) : cfg.steps;
  const int64_t total_steps = bench ? end : cfg.steps;  // the LR schedule's length
  telemetry::CpuSampler cpu_sampler;
  auto sample_telemetry = [&] {
    return pl.device.is_cuda() ? telemetry::cuda(pl.device.index) : cpu_sampler.sample();
  };
  auto log_eval = [&](int64_t at) {
    const double t0 = now_s();
    const double l = evaluate(model, held_loader, eval_windows, cfg.batch_size, pl);
    if (at == 0 && state.first_eval_loss == 0) state.first_eval_loss = l;
    result.eval_losses.emplace_back(at, l);
    metrics << nlohmann::json{{"step", at}, {"heldout_loss", l}, {"eval_s", now_s() - t0}}.dump() << "\n" << std::flush;
    progress.print("step " + std::to_string(at) + ": held-out loss " + fmt("%.4f", l) +
                   (state.first_eval_loss > 0 ? " (" + fmt("%.2f", l / state.first_eval_loss) + " of the first)" : ""));
  };
  if (step == 0 && !bench) log_eval(0);

  // For scripts/golden_check.py: the initial weights and the first ten steps' batches.
  io::TensorDict golden_batches;
  if (cfg.golden_dump && step == 0) {
    fs::create_directories(fs::path(cfg.run_dir) / "golden");
    io::save((fs::path(cfg.run_dir) / "golden" / "init.safetensors").string(), io::TensorDict(model.named_parameters()));
  }
  const double t_loop = now_s();
  double step_time_ema = 0;
  const int64_t step0 = step;
  // Benchmark: peak memory over the whole run (weights, optimizer state, activations); phase
  // times and step times over the timed steps only.
  std::unique_ptr<PhaseTimer> timer;
  std::map<std::string, double> phase_ms;
  std::vector<double> bench_step_s;
  if (bench) {
    if (pl.device.is_cuda()) cuda::synchronize(pl.device.index);
    reset_peak_memory_stats(pl.device);
    timer = std::make_unique<PhaseTimer>(pl.device);
  }
  // On CUDA the next step's first micro-batch and its block mask are prepared while the device
  // still runs this step's optimizer (the host work would otherwise leave the GPU idle), and the
  // losses are read after the optimizer is queued: one wait per step.
  std::optional<PreparedBatch> ahead;
  double startup_s = 0;  // to the end of the first step this process runs
  while (step < end) {
    const bool timed = bench && step >= cfg.bench_warmup;
    if (timed) PhaseTimer::set_active(timer.get());
    const double t0 = now_s();
    const double lr = optim::warmup_cosine_lr(step, std::min(cfg.warmup_steps, total_steps), total_steps, cfg.lr, cfg.min_lr);
    opt.set_lr(lr);
    std::vector<Tensor> micro_losses;
    int64_t tokens = 0;
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      PreparedBatch pb = ahead ? std::move(*ahead) : prepare_batch(loader, model, cfg.batch_size);
      ahead.reset();
      // Sharded: this rank's rows; its mean loss is weighted by its share of the global batch's
      // targets, so the ranks' average is the global-batch mean the single process computes.
      double loss_weight = 1.0;
      if (sh.active()) {
        const int64_t global_tokens = pb.batch.tokens;
        pb.batch = local_part(pb.batch, sh.rank, sh.world);
        pb.mask = model.block_mask(pb.batch.doc_ids);
        loss_weight = static_cast<double>(pb.batch.tokens * sh.world) / static_cast<double>(global_tokens);
      }
      const Batch& b = pb.batch;
      if (cfg.golden_dump && step < 10) {
        const std::string k = "step" + std::to_string(step) + ".micro" + std::to_string(micro) + ".";
        golden_batches.insert(k + "input", b.input);
        golden_batches.insert(k + "target", b.target);
        golden_batches.insert(k + "doc_ids", b.doc_ids);
      }
      const Tensor loss = loss_weight == 1.0 ? batch_loss(model, b, pb.mask, pl) : batch_loss(model, b, pb.mask, pl) * loss_weight;
      {
        Phase ph("backward");  // outside autocast, as PyTorch recommends
        (cfg.grad_accum > 1 ? loss / static_cast<double>(cfg.grad_accum) : loss).backward();
      }
      micro_losses.push_back(loss.detach());
      tokens += b.input.numel() * sh.world;
    }
    Tensor grad_norm_t;
    {
      Phase ph("optimizer");
      if (sh.active()) sh.root->finish_grad_sync();  // the reduce-scatters into the shards' .grad
      grad_norm_t = sh.active() ? dist::clip_grad_norm_sharded_(model.parameters(), cfg.grad_clip, *sh.comm)
                                : optim::clip_grad_norm_(model.parameters(), cfg.grad_clip);
      opt.step();
      opt.zero_grad();
    }
    if (pl.device.is_cuda() && step + 1 < end) ahead = prepare_batch(loader, model, cfg.batch_size);
    double loss_sum = 0;
    for (const Tensor& l : micro_losses) loss_sum += l.item();  // waits for the step on CUDA
    const double grad_norm = grad_norm_t.item();
    ++step;
    if (startup_s == 0) startup_s = now_s() - t_start;
    if (timed) {
      PhaseTimer::set_active(nullptr);
      timer->collect(phase_ms);
      bench_step_s.push_back(now_s() - t0);
    }
    const double loss = mean_over_ranks(sh, loss_sum / static_cast<double>(cfg.grad_accum));
    // A non-finite loss, gradient norm or parameter stops the run at this step, before anything
    // of it is saved: the last checkpoint stays the last good one.
    std::string bad;
    if (!std::isfinite(loss)) bad = "the loss is " + fmt("%g", loss);
    else if (!std::isfinite(grad_norm)) bad = "the gradient norm is " + fmt("%g", grad_norm);
    else if (!bench) bad = first_nonfinite_parameter(model.named_parameters());
    if (!bad.empty()) {
      if (timed) PhaseTimer::set_active(nullptr);
      metrics << nlohmann::json{{"step", step}, {"error", "non-finite: " + bad}, {"loss", fmt("%g", loss)},
                                {"grad_norm", fmt("%g", grad_norm)}, {"lr", lr}}
                     .dump()
              << "\n";
      const std::string last = find_checkpoint(cfg.run_dir);
      result.nonfinite = "stopped at step " + std::to_string(step) + ": " + bad + " (after step " +
                         std::to_string(step - 1) + ", loss " + fmt("%.4f", result.train_losses.empty() ? std::nan("") : result.train_losses.back()) +
                         "); " + (last.empty() ? std::string("no checkpoint was written") : "the last good checkpoint is " + last) +
                         ", and metrics.jsonl keeps every step before; a lower --lr or --grad-clip may help";
      --step;
      break;
    }
    result.train_losses.push_back(loss);
    const double dt = now_s() - t0;
    step_time_ema = step == step0 + 1 ? dt : 0.9 * step_time_ema + 0.1 * dt;
    const double tok_s = static_cast<double>(tokens) / dt;
    const telemetry::Reading tel = sample_telemetry();
    const MemoryStats mem = memory_stats(pl.device);
    nlohmann::json m = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm}, {"tokens", tokens},
                        {"step_s", dt}, {"tokens_per_s", tok_s}, {"elapsed_s", now_s() - t_start},
                        {"kiln_allocated_bytes", mem.allocated}, {"kiln_peak_bytes", mem.peak_allocated},
                        {"peak_rss_bytes", peak_rss_bytes()}, {"rank", sh.rank}, {"world", sh.world},
                        {"telemetry", nlohmann::json::parse(telemetry::to_json(tel))}};
    metrics << m.dump() << "\n";
    if (step % cfg.log_every == 0 || step == end || progress_mode == "tty") {
      std::string line = "step " + std::to_string(step) + "/" + std::to_string(total_steps) + " loss " + fmt("%.4f", loss) +
                         " lr " + fmt("%.2e", lr) + " | " + fmt("%.0f", tok_s) + " tok/s | ETA " +
                         format_duration(step_time_ema * static_cast<double>(end - step)) + " | mem " +
                         (pl.device.is_cuda()
                              ? format_bytes(static_cast<double>(mem.allocated)) + " " + pl.device.str()
                              : format_bytes(static_cast<double>(tel.process_memory_bytes.value_or(mem.allocated)))) +
                         " (kiln peak " + format_bytes(static_cast<double>(mem.peak_allocated)) + ") | " +
                         telemetry::summary(tel);
      progress.update(line);
    }
    if (bench) continue;
    if ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == cfg.steps) log_eval(step);
    if ((cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || step == end) {
      state.step = step;
      state.data_epoch = ahead ? ahead->epoch : loader.epoch();  // a prepared batch is not consumed yet
      state.data_cursor = ahead ? ahead->cursor : loader.cursor();
      state.rng = capture_rng(pl.device);
      std::string dir;
      if (sh.active()) {
        char name[32];
        std::snprintf(name, sizeof(name), "step-%07lld", static_cast<long long>(step));
        save_shards((fs::path(shared_run_dir) / "checkpoints" / name).string(), sh, opt, opt_names);
        if (sh.rank == 0) dir = save_checkpoint(cfg.run_dir, model, opt, opt_names, tok, state, 2, /*tensor_files=*/false);
        sh.comm->barrier();  // `latest` names the new folder before any rank goes on
      } else {
        dir = save_checkpoint(cfg.run_dir, model, opt, opt_names, tok, state);
      }
      metrics << std::flush;
      progress.print("checkpoint " + dir);
    }
  }
  progress.finish();
  metrics.close();
  if (cfg.golden_dump && !golden_batches.empty())
    io::save((fs::path(cfg.run_dir) / "golden" / "batches.safetensors").string(), golden_batches);
  result.first_eval_loss = state.first_eval_loss;
  result.last_step = step;
  result.steps = cfg.steps;
  if (bench) {
    result.bench_json = bench_report(cfg, mc, model.num_parameters(), pl, bench_step_s, phase_ms, result.train_losses,
                                     memory_stats(pl.device), sample_telemetry(), startup_s);
    out << result.bench_json << "\n" << std::flush;
    return result;
  }

  // The loss curve from the whole metrics file (so a resumed run draws its full history); lines
  // without a numeric step or loss (a stopped step, a hand edit) are skipped.
  std::vector<std::pair<int64_t, double>> train_pts, held_pts;
  {
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      const int64_t at = j["step"].get<int64_t>();
      if (j.contains("loss") && j["loss"].is_number()) train_pts.emplace_back(at, j["loss"].get<double>());
      if (j.contains("heldout_loss") && j["heldout_loss"].is_number())
        held_pts.emplace_back(at, j["heldout_loss"].get<double>());
    }
  }
  const std::string svg = (fs::path(cfg.run_dir) / "loss.svg").string();
  write_loss_svg(svg, train_pts, held_pts, "kiln train: " + cfg.preset + " on " + fs::path(data_path).filename().string());
  if (chatty) {
    out << "trained " << (step - step0) << " steps in " << format_duration(now_s() - t_loop) << " (total "
        << format_duration(now_s() - t_start) << "); metrics " << metrics_path << ", loss curve " << svg << "\n";
  }
  if (!result.nonfinite.empty()) return result;
  if (cfg.sample_tokens > 0 && step == cfg.steps && !cfg.synthetic) {
    SampleOptions so;
    so.max_tokens = cfg.sample_tokens;
    so.seed = cfg.seed;
    const std::string text = generate(model, tok, cfg.sample_prompt, so);
    out << "---- sample (prompt \"" << cfg.sample_prompt << "\") ----\n" << text << "\n----\n";
  }
  return result;
}

int run_train(const TrainConfig& cfg, std::ostream& rank0_out) {
  if (cfg.nproc > 1 && dist::launch_info().source == "none") return spawn_ranks(cfg.nproc);
  std::ofstream silent;  // never opened: ranks other than 0 print nothing
  std::ostream& out = dist::launch_info().rank == 0 ? rank0_out : silent;
  TrainResult r;
  try {
    r = train(cfg, out);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a file system or JSON failure: reported, never an abort
    KILN_FAIL("train", e.what());
  }
  if (!r.nonfinite.empty()) {
    std::cerr << "kiln train: " << r.nonfinite << "\n";
    return 3;
  }
  if (r.last_step < r.steps || r.eval_losses.empty() || r.first_eval_loss <= 0) return 0;
  const double last = r.eval_losses.back().second, ratio = last / r.first_eval_loss;
  out << "held-out loss " << fmt("%.4f", r.first_eval_loss) << " -> " << fmt("%.4f", last) << " ("
      << fmt("%.2f", ratio) << " of the first)" << (ratio <= 0.5 ? ": OK, at most half\n" : ": did NOT halve\n");
  return ratio <= 0.5 ? 0 : 1;
}

}  // namespace kiln::train
