// The training job's RNG checkpointing (dropout resume), bf16 autocast, synthetic data, the
// benchmark mode, the gpt125m preset, and the CUDA path (skipped without a GPU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint.h"
#include "data.h"
#include "kiln/autograd.h"
#include "kiln/kiln.h"
#include "micro_config.h"
#include "model.h"
#include "support/testing.h"
#include "train.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::train;

namespace {

TrainConfig synthetic_config(const std::string& name) {
  TrainConfig c = kiln::train::testing::micro_test_config(
      "", (fs::temp_directory_path() / ("kiln_trainx_" + name + "_" + std::to_string(getpid()))).string());
  c.synthetic = true;
  c.vocab_size = 128;
  return c;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
  return worst;
}

}  // namespace

TEST(Synthetic, StreamIsDeterministicWithRandomDocuments) {
  const TokenStream a = synthetic_stream(5000, 77, 20, 9), b = synthetic_stream(5000, 77, 20, 9);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.doc, b.doc);
  EXPECT_NE(synthetic_stream(5000, 77, 20, 10).tokens, a.tokens);
  for (int32_t t : a.tokens) ASSERT_TRUE(t >= 0 && t < 77);
  // Documents: consecutive ids, lengths in [1, 39], mean near 20.
  int64_t docs = 1, run = 1, longest = 1;
  for (size_t i = 1; i < a.doc.size(); ++i) {
    ASSERT_TRUE(a.doc[i] == a.doc[i - 1] || a.doc[i] == a.doc[i - 1] + 1);
    if (a.doc[i] != a.doc[i - 1]) ++docs, run = 0;
    longest = std::max(longest, ++run);
  }
  EXPECT_LE(longest, 39);
  EXPECT_NEAR(5000.0 / static_cast<double>(docs), 20.0, 4.0);
  EXPECT_THROW(synthetic_stream(10, 1, 5, 0), kiln::Error);
}

TEST(Presets, Gpt125m) {
  const ModelConfig c = model_preset("gpt125m");
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.dim, 768);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.vocab_size, 131072);
  EXPECT_EQ(c.seq_len, 4096);
  EXPECT_EQ(c.hidden(), 2048);
  TrainConfig t;
  t.preset = "gpt125m";
  t.vocab_size = 50000;
  EXPECT_EQ(resolve_model(t).vocab_size, 50000);
}

// Dropout draws from the generator every step; a resumed run replays the same masks only because
// the checkpoint restores the generator state (rng.safetensors).
TEST(TrainRng, ResumeWithDropoutIsBitExact) {
  TrainConfig full = synthetic_config("rng_full");
  full.dropout = 0.2;
  std::ostringstream sink;
  const TrainResult a = kiln::train::train(full, sink);
  ASSERT_EQ(a.train_losses.size(), 6u);

  TrainConfig half = synthetic_config("rng_half");
  half.dropout = 0.2;
  half.stop_after = 3;
  kiln::train::train(half, sink);
  const std::string ck = find_checkpoint(half.run_dir);
  ASSERT_TRUE(fs::exists(fs::path(ck) / "rng.safetensors"));
  const TrainState st = load_state(ck);
  ASSERT_EQ(st.rng.size(), 1u);
  EXPECT_EQ(st.rng[0].first, "cpu");
  EXPECT_GT(st.rng[0].second.to_vector()[1], 0);  // the generator advanced past init
  half.stop_after = 0;
  half.resume = true;
  const TrainResult b2 = kiln::train::train(half, sink);
  ASSERT_EQ(b2.train_losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a.train_losses[3 + i], b2.train_losses[i]) << "step " << i + 4;
  // Dropout is on: the same run without it gives other losses.
  TrainConfig nodrop = synthetic_config("rng_nodrop");
  const TrainResult c = kiln::train::train(nodrop, sink);
  EXPECT_NE(c.train_losses[1], a.train_losses[1]);
  for (const auto* d : {&full, &half, &nodrop}) fs::remove_all(d->run_dir);
}

// The GPT under CPU bf16 autocast: projections, attention and the fused head in bf16, norms and
// the residual stream in fp32; the loss is fp32 and close to the fp32 model's, and every
// parameter gets an fp32 gradient close to the fp32 one.
TEST(TrainAutocast, GptLossAndGradsCloseToFp32) {
  manual_seed(21);
  ModelConfig c = model_preset("micro");
  c.vocab_size = 96;
  GPT model(c);
  const Tensor idx = randint(0, 96, {2, 32}), tgt = randint(0, 96, {2, 32});
  Tensor docs = zeros({2, 32}, kInt32);
  for (int64_t t = 20; t < 32; ++t) docs.data_ptr<int32_t>()[t] = 1;
  const Tensor ref = model.loss(idx, tgt, docs);
  ref.backward();
  std::vector<Tensor> ref_grads;
  for (const Tensor& p : model.parameters()) ref_grads.push_back(p.grad().clone());
  model.zero_grad();
  Tensor bf;
  {
    AutocastGuard ac(DeviceType::CPU, kBFloat16);
    bf = model.loss(idx, tgt, docs);
  }
  EXPECT_EQ(bf.dtype(), kFloat32);
  EXPECT_NEAR(bf.item(), ref.item(), 2e-2 * ref.item());
  EXPECT_NE(bf.item(), ref.item());  // it really ran in bf16
  // The value is fp32 (from the fp32 logsumexp), not the bf16-rounded loss of the fused head.
  EXPECT_NE(bf.item(), static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(bf.item())))));
  bf.backward();
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << i;
    EXPECT_EQ(params[i].grad().dtype(), kFloat32) << i;
    EXPECT_LT(kiln::testing::rel_error(params[i].grad(), ref_grads[i]), 0.1) << i;
  }
}

TEST(TrainAutocast, Bf16RunOnCpuLearns) {
  TrainConfig c = synthetic_config("ac");
  c.autocast = "bf16";
  c.steps = 20;
  c.eval_every = 0;
  c.checkpoint_every = 0;
  c.synthetic_doc_len = 4;
  c.lr = 1e-2;
  std::ostringstream sink;
  const TrainResult r = kiln::train::train(c, sink);
  ASSERT_EQ(r.train_losses.size(), 20u);
  // Random tokens: the model can only learn the unigram distribution (ln 128 = 4.85 is the floor
  // for uniform tokens); the loss must stay finite and near it, and not diverge.
  for (double l : r.train_losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(r.train_losses.back(), r.train_losses.front() + 0.05);
  EXPECT_NEAR(r.train_losses.back(), std::log(128.0), 0.3);
  EXPECT_THROW(
      [&] {
        TrainConfig bad = c;
        bad.autocast = "fp8";
        kiln::train::train(bad, sink);
      }(),
      kiln::Error);
  fs::remove_all(c.run_dir);
}

TEST(TrainBench, PrintsJsonWithPhases) {
  TrainConfig c = synthetic_config("bench");
  c.bench_steps = 2;
  c.bench_warmup = 1;
  std::ostringstream out;
  const TrainResult r = kiln::train::train(c, out);
  ASSERT_FALSE(r.bench_json.empty());
  EXPECT_NE(out.str().find(r.bench_json), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(r.bench_json);
  EXPECT_EQ(j.at("kind"), "kiln_train_bench");
  EXPECT_EQ(j.at("steps"), 2);
  EXPECT_EQ(j.at("tokens_per_step"), 4 * 32);
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0);
  EXPECT_GT(j.at("peak_allocated_bytes").get<int64_t>(), 0);
  const auto& ph = j.at("phases_ms_per_step");
  for (const char* k : {"embedding", "attention", "mlp", "norms", "lce", "block_mask", "backward", "optimizer", "other"})
    EXPECT_TRUE(ph.contains(k)) << k;
  double sum = 0;
  for (const auto& [k, v] : ph.items()) sum += v.get<double>();
  EXPECT_NEAR(sum, j.at("step_s_mean").get<double>() * 1e3, 0.05 * sum + 0.5);
  EXPECT_FALSE(fs::exists(fs::path(c.run_dir) / "checkpoints"));  // no checkpoints in bench mode
  fs::remove_all(c.run_dir);
}

// CUDA: the same run on the GPU (fp32, no autocast) follows the CPU run's losses; bf16 autocast
// stays close; checkpoints hold CPU tensors and resume on CUDA.
TEST(TrainCuda, MatchesCpuAndResumes) {
  KILN_REQUIRE_CUDA();
  std::ostringstream sink;
  TrainConfig cpu = synthetic_config("cuda_ref");
  const TrainResult a = kiln::train::train(cpu, sink);
  TrainConfig gpu = synthetic_config("cuda_fp32");
  gpu.device = "cuda";
  gpu.autocast = "none";
  const TrainResult b = kiln::train::train(gpu, sink);
  ASSERT_EQ(b.train_losses.size(), a.train_losses.size());
  EXPECT_LT(max_rel(b.train_losses, a.train_losses), 1e-3);
  const io::Checkpoint ck = io::load((fs::path(find_checkpoint(gpu.run_dir)) / "model.safetensors").string());
  EXPECT_FALSE(ck.tensors.empty());
  const TrainState st = load_state(find_checkpoint(gpu.run_dir));
  ASSERT_EQ(st.rng.size(), 2u);
  EXPECT_EQ(st.rng[1].first, "cuda:0");

  TrainConfig bf = synthetic_config("cuda_bf16");
  bf.device = "cuda";  // autocast auto: bf16 on CUDA
  const TrainResult c = kiln::train::train(bf, sink);
  EXPECT_LT(max_rel(c.train_losses, a.train_losses), 3e-2);

  TrainConfig half = synthetic_config("cuda_half");
  half.device = "cuda";
  half.autocast = "none";
  half.stop_after = 3;
  kiln::train::train(half, sink);
  half.stop_after = 0;
  half.resume = true;
  const TrainResult h = kiln::train::train(half, sink);
  ASSERT_EQ(h.train_losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(h.train_losses[i], b.train_losses[3 + i], 1e-5 * b.train_losses[3 + i]);

  TrainConfig bench = synthetic_config("cuda_bench");
  bench.device = "cuda";
  bench.bench_steps = 2;
  const nlohmann::json j = nlohmann::json::parse(kiln::train::train(bench, sink).bench_json);
  EXPECT_EQ(j.at("device"), "cuda:0");
  EXPECT_EQ(j.at("autocast"), "bf16");
  EXPECT_GT(j.at("phases_ms_per_step").at("attention").get<double>(), 0);
  for (const auto* d : {&cpu, &gpu, &bf, &half, &bench}) fs::remove_all(d->run_dir);
}
