// The training job against damaged runs: a state.json of the wrong shape, a damaged or foreign
// `latest`, a weight changed on disk, divergence to NaN, and --resume that must continue the run as
// it was saved (or refuse), never restart it silently. Every failure is a kiln::Error naming the
// file and the problem, raised in a child process within 2 s (so an abort would fail the test).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "generate.h"
#include "io/hostile_files.h"
#include "kiln/kiln.h"
#include "micro_config.h"
#include "resume.h"
#include "train.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::train;
using kiln::io::hostile::expect_bounded_error;

namespace {

// A run folder for one test (synthetic data: no corpus, no BPE).
struct RunDir {
  explicit RunDir(const std::string& name)
      : dir((fs::temp_directory_path() / ("kiln_hardening_" + name + "_" + std::to_string(getpid()))).string()) {
    fs::remove_all(dir);
  }
  ~RunDir() { fs::remove_all(dir); }
  TrainConfig config() const {
    TrainConfig c = kiln::train::testing::micro_test_config("", dir);
    c.synthetic = true;
    return c;
  }
  std::string file(const std::string& rel) const { return (fs::path(dir) / rel).string(); }
  std::string dir;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// checkpoints/latest is a symbolic link to a folder: replaced by the file, not written through.
void spit(const std::string& path, const std::string& text) {
  if (fs::is_symlink(fs::symlink_status(path))) fs::remove(path);
  std::ofstream(path, std::ios::binary) << text;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TrainResult quiet_train(const TrainConfig& c) {
  std::ostringstream sink;
  return kiln::train::train(c, sink);
}

}  // namespace

TEST(TrainHardening, StateJsonOfTheWrongShapeIsAClearError) {
  RunDir run("state");
  TrainConfig c = run.config();
  c.stop_after = 3;
  quiet_train(c);
  const std::string ckpt = find_checkpoint(run.dir);
  ASSERT_EQ(fs::path(ckpt).filename(), "step-0000003");
  const std::string state_path = (fs::path(ckpt) / "state.json").string();
  const nlohmann::json good = nlohmann::json::parse(slurp(state_path));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string rule;
  };
  const std::vector<Case> cases = {
      {"no step", [](nlohmann::json& j) { j.erase("step"); }, "state.json: missing \"step\""},
      {"string step", [](nlohmann::json& j) { j["step"] = "3"; },
       "\"step\" must be a non-negative integer, found a string \"3\""},
      {"string adam_steps", [](nlohmann::json& j) { j["adam_steps"][0] = "3"; },
       "\"adam_steps[0]\" must be a non-negative integer, found a string \"3\""},
      {"adam_steps past step", [](nlohmann::json& j) { j["adam_steps"][1] = 4; }, "is out of range (at most 3)"},
      {"rng key cuda:x", [](nlohmann::json& j) { j["rng"]["cuda:x"] = {{"seed_bits", 1}, {"offset", 0}}; },
       "\"rng\" has a generator 'cuda:x': only cpu and cuda:N exist"},
      {"step 10**12", [](nlohmann::json& j) { j["step"] = 1000000000000; },
       "\"step\" = 1000000000000 but the folder is step-0000003"},
      {"negative epoch", [](nlohmann::json& j) { j["data"]["epoch"] = -1; }, "\"data.epoch\" must be a non-negative"},
      {"model not an object", [](nlohmann::json& j) { j["config"]["model"] = 7; },
       "\"config.model\" must be a JSON object, found the number 7"},
      {"not JSON", nullptr, "state.json is not valid JSON"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    if (k.edit) {
      nlohmann::json j = good;
      k.edit(j);
      spit(state_path, j.dump());
    } else {
      spit(state_path, "{\"step\": 3,");
    }
    expect_bounded_error([&] { load_state(ckpt); }, k.rule);
    TrainConfig r = run.config();
    r.resume = true;
    expect_bounded_error([&] { quiet_train(r); }, k.rule);
    GenerateConfig g;
    g.checkpoint = run.dir;
    g.max_tokens = 2;
    expect_bounded_error([&] { std::ostringstream o; run_generate(g, o); }, k.rule);
  }
  // A consistent step past the run's --steps (the folder agrees) trains nothing: an error.
  nlohmann::json j = good;
  j["step"] = 1000000000000;
  j["adam_steps"] = nlohmann::json::array();
  for (size_t i = 0; i < good["adam_steps"].size(); ++i) j["adam_steps"].push_back(1000000000000);
  const fs::path far = fs::path(run.dir) / "checkpoints" / "step-1000000000000";
  fs::copy(ckpt, far);
  spit((far / "state.json").string(), j.dump());
  spit(run.file("checkpoints/latest"), "step-1000000000000\n");
  TrainConfig r = run.config();
  r.resume = true;
  expect_bounded_error([&] { quiet_train(r); }, "step 1000000000000 is past the run's 6 steps");
}

TEST(TrainHardening, ResumeRefusesInsteadOfRestarting) {
  RunDir run("refuse");
  TrainConfig c = run.config();
  c.stop_after = 3;
  quiet_train(c);
  const std::string metrics = slurp(run.file("metrics.jsonl"));
  ASSERT_FALSE(metrics.empty());
  const std::string latest = run.file("checkpoints/latest");
  TrainConfig r = run.config();
  r.resume = true;
  struct Case {
    std::string latest_text, rule;
  };
  for (const Case& k : std::vector<Case>{
           {"", "checkpoints/latest is empty"},
           {"\x01\xff garbage", "names '\\x01\\xff garbage', not a step-NNNNNNN folder of this run"},
           {"../../other_run/checkpoints/step-0000003\n", "names '../../other_run/checkpoints/step-0000003', not a step"},
           {"/etc\n", "names '/etc', not a step"},
           {"step-0000042\n", "names step-0000042, but"}}) {
    SCOPED_TRACE(k.latest_text);
    spit(latest, k.latest_text);
    expect_bounded_error([&] { quiet_train(r); }, k.rule);
    TrainConfig a = r;
    a.resume_auto = true;  // auto starts fresh only where there is no checkpoint, never over a damaged one
    expect_bounded_error([&] { quiet_train(a); }, k.rule);
    EXPECT_EQ(slurp(run.file("metrics.jsonl")), metrics) << "the history changed";
  }
  spit(latest, "step-0000003\n");
  fs::remove(run.file("checkpoints/step-0000003/state.json"));
  expect_bounded_error([&] { quiet_train(r); }, "step-0000003/state.json is missing: the checkpoint is incomplete");
  EXPECT_EQ(slurp(run.file("metrics.jsonl")), metrics);
  // No checkpoint at all: --resume refuses; --resume=auto starts fresh.
  fs::remove_all(run.file("checkpoints"));
  expect_bounded_error([&] { quiet_train(r); }, "has no checkpoint to continue from");
  TrainConfig a = r;
  a.resume_auto = true;
  EXPECT_EQ(quiet_train(a).last_step, 6);
}

TEST(TrainHardening, AWeightChangedOnDiskIsDetected) {
  RunDir run("crc");
  TrainConfig c = run.config();
  c.stop_after = 3;
  quiet_train(c);
  const std::string model = run.file("checkpoints/step-0000003/model.safetensors");
  const io::CheckpointInfo info = io::inspect(model);
  ASSERT_TRUE(info.tensors[0].stored_crc32.has_value());
  std::string bytes = slurp(model);
  const float big = 1e30f;
  std::memcpy(&bytes[info.tensors[0].span_offset], &big, 4);
  spit(model, bytes);
  TrainConfig r = run.config();
  r.resume = true;
  expect_bounded_error([&] { quiet_train(r); }, "model.safetensors: [safetensors] tensor '" + info.tensors[0].name +
                                                    "' fails its checksum");
}

TEST(TrainHardening, NonFiniteValuesStopTheRunAndKeepTheLastGoodCheckpoint) {
  RunDir run("nan");
  TrainConfig c = run.config();
  c.steps = 30;
  c.checkpoint_every = 1;
  c.eval_every = 0;
  c.lr = 1e3;  // diverges within a few steps (1e6 as well, but at the second)
  c.grad_clip = 1e30;
  std::ostringstream out;
  const TrainResult r = kiln::train::train(c, out);
  ASSERT_FALSE(r.nonfinite.empty()) << "the run did not diverge";
  ASSERT_GE(r.last_step, 1) << r.nonfinite;
  const int64_t bad = r.last_step + 1;
  EXPECT_NE(r.nonfinite.find("stopped at step " + std::to_string(bad) + ": "), std::string::npos) << r.nonfinite;
  EXPECT_TRUE(r.nonfinite.find("the loss is") != std::string::npos ||
              r.nonfinite.find("the gradient norm is") != std::string::npos ||
              r.nonfinite.find("parameter ") != std::string::npos)
      << r.nonfinite;
  EXPECT_EQ(r.train_losses.size(), static_cast<size_t>(r.last_step));
  for (double l : r.train_losses) EXPECT_TRUE(std::isfinite(l));
  // The last good checkpoint: before the bad step, loads (checksums verified), finite weights.
  const std::string ckpt = find_checkpoint(run.dir);
  ASSERT_FALSE(ckpt.empty());
  const TrainState st = load_state(ckpt);
  EXPECT_LT(st.step, bad);
  EXPECT_NE(r.nonfinite.find(ckpt), std::string::npos) << r.nonfinite;
  GPT model(model_from_json(st.config_json));
  load_weights(ckpt, model, nullptr);
  EXPECT_EQ(first_nonfinite_parameter(model.named_parameters()), "");
  // The history: a line per good step, then the stopped step; the curve is drawn.
  std::ifstream m(run.file("metrics.jsonl"));
  std::string line;
  int64_t losses = 0;
  nlohmann::json last;
  while (std::getline(m, line)) {
    last = nlohmann::json::parse(line);
    losses += last.contains("loss") && last["loss"].is_number();
  }
  EXPECT_EQ(losses, r.last_step);
  EXPECT_EQ(last["step"], bad);
  EXPECT_NE(last["error"].get<std::string>().find("non-finite"), std::string::npos);
  EXPECT_TRUE(fs::exists(run.file("loss.svg")));
  // The command's exit code.
  RunDir again("nan_cli");
  TrainConfig c2 = c;
  c2.run_dir = again.dir;
  EXPECT_EQ(run_train(c2, out), 3);
}

TEST(TrainHardening, FirstNonFiniteParameterNamesIt) {
  Tensor a = ones({2, 3}), b = zeros({5});
  EXPECT_EQ(first_nonfinite_parameter({{"a", a}, {"b", b}}), "");
  b.data_ptr<float>()[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_nonfinite_parameter({{"a", a}, {"b", b}}), "parameter b holds inf (element 3)");
  a.data_ptr<float>()[4] = std::nanf("");
  EXPECT_NE(first_nonfinite_parameter({{"a", a}, {"b", b}}).find("parameter a holds"), std::string::npos);
}

// --resume continues the run as it was saved: settings not given come from config.json; a given
// one that differs is an error unless overridden; the model never changes.
TEST(TrainHardening, ResumeContinuesWithTheSavedSettings) {
  RunDir run("settings");
  TrainConfig c = run.config();
  c.steps = 8;
  c.stop_after = 4;
  c.lr = 2e-3;
  c.given = std::set<std::string>{"--steps", "--stop-after", "--lr"};  // as the command line reports them
  const TrainResult first = quiet_train(c);
  ASSERT_EQ(first.last_step, 4);

  TrainConfig r = run.config();  // defaults: steps 6, lr 5e-3 -- not given, so the saved ones apply
  r.resume = true;
  r.given = std::set<std::string>{"--resume"};
  const TrainResult resumed = quiet_train(r);
  EXPECT_EQ(resumed.steps, 8);
  EXPECT_EQ(resumed.last_step, 8);
  const nlohmann::json saved = nlohmann::json::parse(slurp(run.file("config.json")));
  EXPECT_EQ(saved["train"]["steps"], 8);
  EXPECT_EQ(saved["train"]["lr"], 2e-3);

  TrainConfig more = r;
  more.steps = 10;
  more.given = std::set<std::string>{"--resume", "--steps"};
  expect_bounded_error([&] { quiet_train(more); },
                       "--resume: --steps 10 contradicts the run's saved steps = 8 (config.json); drop the flag to "
                       "continue as saved, or add --override to change it");
  more.override_saved = true;
  std::ostringstream out;
  const TrainResult longer = kiln::train::train(more, out);
  EXPECT_EQ(longer.last_step, 10);
  EXPECT_NE(out.str().find("resume: --steps 10 replaces the saved 8"), std::string::npos) << out.str();

  TrainConfig model = r;
  model.dim = 64;
  model.given = std::set<std::string>{"--resume", "--dim"};
  model.override_saved = true;
  expect_bounded_error([&] { quiet_train(model); }, "--dim 64 contradicts the checkpoint's model (32)");
  // The C++ API (no command line): every setting counts as given.
  TrainConfig api = run.config();
  api.resume = true;
  api.steps = 10;
  api.lr = 1e-3;
  expect_bounded_error([&] { quiet_train(api); }, "--lr 0.001 contradicts the run's saved lr = 0.002");
}

TEST(TrainHardening, SettingsOutOfRangeAreNamed) {
  RunDir run("ranges");
  TrainConfig c = run.config();
  c.steps = -5;
  EXPECT_NE(error_of([&] { quiet_train(c); }).find("[train] --steps must be positive, got -5"), std::string::npos);
  c = run.config();
  c.log_every = 0;
  EXPECT_NE(error_of([&] { quiet_train(c); }).find("--log-every must be positive, got 0"), std::string::npos);
  c = run.config();
  c.lr = -1;
  EXPECT_NE(error_of([&] { quiet_train(c); }).find("--lr must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(error_of([] { optim::warmup_cosine_lr(-3, 2, 10, 1e-3, 1e-4); }).find("step must be >= 0, got -3"),
            std::string::npos);
  Tensor p = zeros({2});
  p.requires_grad_(true);
  optim::AdamW opt(std::vector<Tensor>{p});
  EXPECT_NE(error_of([&] { opt.set_lr(-0.5); }).find("[AdamW] learning rate must be >= 0, got -0.5"), std::string::npos);
}

TEST(TrainHardening, StaleTemporariesOfAKilledSaveAreRemoved) {
  RunDir run("stale");
  TrainConfig c = run.config();
  c.stop_after = 3;
  quiet_train(c);
  const std::string dir = run.file("checkpoints/step-0000006");
  fs::create_directories(dir);
  spit(dir + "/.model.safetensors.tmp.x1Y2z3", std::string(4096, 'x'));
  spit(run.file("checkpoints/.latest.tmp.a1B2c3"), "step-0000");
  fs::create_directory_symlink("step-0000003", run.file("checkpoints/.latest.link.step-0000009"));
  TrainConfig r = run.config();
  r.resume = true;
  EXPECT_EQ(quiet_train(r).last_step, 6);
  EXPECT_FALSE(fs::exists(dir + "/.model.safetensors.tmp.x1Y2z3"));
  EXPECT_FALSE(fs::exists(run.file("checkpoints/.latest.tmp.a1B2c3")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(run.file("checkpoints/.latest.link.step-0000009"))));
}
