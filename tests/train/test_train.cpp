// The training job: tokenizer, packing, the document mask, bit-for-bit resume, kill -9 recovery.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "data.h"
#include "generate.h"
#include "kiln/autograd.h"
#include "kiln/kiln.h"
#include "micro_config.h"
#include "model.h"
#include "support/testing.h"
#include "tokenizer.h"
#include "train.h"

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::train;

namespace {

const char* kSample =
    "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Run the thing.\"\"\"\n    if argv is None:\n"
    "        argv = sys.argv[1:]\n    for name in argv:\n        path = os.path.join(os.getcwd(), name)\n"
    "        print(path, len(name) + 42)\n    return 0\n\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n\n    def __repr__(self):\n        return f\"Point({self.x}, {self.y})\"\n";

// A small corpus folder: variations of kSample, deterministic.
std::string make_corpus(const std::string& name, int files) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_train_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int f = 0; f < files; ++f) {
    std::ofstream o(dir / ("mod" + std::to_string(100 + f) + ".txt"));
    for (int r = 0; r < 6 + f % 3; ++r) {
      std::string s = kSample;
      o << "# file " << f << " part " << r << "\n" << s << "value_" << (f * 7 + r) % 13 << " = " << r * f << "\n";
    }
  }
  return dir.string();
}

TrainConfig micro_config(const std::string& data, const std::string& run) {
  return kiln::train::testing::micro_test_config(data, run);
}

}  // namespace

TEST(Tokenizer, PretokenizeCoversText) {
  const std::string text = std::string(kSample) + "x=1;  y  =  [3.14, 'é']\n\n\t\tz\n";
  std::string joined;
  for (auto p : pretokenize(text)) joined += p;
  EXPECT_EQ(joined, text);
  const auto pieces = pretokenize("    return x\n");
  ASSERT_GE(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], "   ");
  EXPECT_EQ(pieces[1], " return");
}

TEST(Tokenizer, RoundTripAndJson) {
  const std::string text = std::string(kSample) + kSample + "naïve ünïcödé 123456\n";
  const Tokenizer tok = Tokenizer::train(text, 400);
  EXPECT_GT(tok.vocab_size(), 300);
  EXPECT_LE(tok.vocab_size(), 400);
  const auto ids = tok.encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // merges compress
  EXPECT_EQ(tok.decode(ids), text);
  const std::string other = "def other(q):\n    return q * 2  # ???\n";
  EXPECT_EQ(tok.decode(tok.encode(other)), other);
  const Tokenizer back = Tokenizer::from_json(tok.to_json());
  EXPECT_EQ(back.merges(), tok.merges());
  EXPECT_EQ(back.encode(text), ids);
  // Deterministic training.
  EXPECT_EQ(Tokenizer::train(text, 400).merges(), tok.merges());
  EXPECT_THROW(Tokenizer::from_json("{\"type\":\"other\"}"), kiln::Error);
}

TEST(Data, PackingIgnoresTargetsAcrossDocuments) {
  const Tokenizer tok;  // bytes only
  const std::vector<Document> docs{{"a", "abc"}, {"b", "defgh"}};
  const TokenStream s = pack(docs, tok);
  ASSERT_EQ(s.tokens.size(), 10u);  // 3 + eot + 5 + eot
  Loader loader(s, 4, 0, false);
  EXPECT_EQ(loader.num_windows(), 2);
  const Batch b = loader.window_batch({0, 1});
  const std::vector<double> tg = b.target.to_vector(), dd = b.doc_ids.to_vector();
  // window 0: a b c EOT -> targets b c EOT (ignored: next is doc b)
  EXPECT_EQ(tg[0], 'b');
  EXPECT_EQ(tg[2], Tokenizer::kEot);
  EXPECT_EQ(tg[3], -100);
  EXPECT_EQ(dd[3], 0);
  // window 1: d e f g -> targets e f g h, one document
  EXPECT_EQ(tg[4], 'e');
  EXPECT_EQ(tg[7], 'h');
  EXPECT_EQ(b.tokens, 7);
}

TEST(Model, DocumentMaskIsolatesDocuments) {
  // Tokens of document 1 in a packed row must see nothing of document 0: their hidden states equal
  // those of document 1 run alone (rotary attention depends on relative positions only).
  manual_seed(3);
  ModelConfig c = model_preset("micro");
  c.vocab_size = 64;
  GPT model(c);
  NoGradGuard ng;
  const int64_t T = 32, split = 13;
  const Tensor idx = randint(0, 64, {1, T});
  Tensor docs = zeros({1, T}, kInt32);
  for (int64_t t = split; t < T; ++t) docs.data_ptr<int32_t>()[t] = 1;
  const Tensor packed = model.hidden(idx, model.block_mask(docs)).select(0, 0).narrow(0, split, T - split);
  const Tensor alone_idx = idx.narrow(1, split, T - split).contiguous();
  const Tensor alone = model.hidden(alone_idx, model.block_mask(zeros({1, T - split}, kInt32))).select(0, 0);
  const std::vector<double> a = packed.to_vector(), b = alone.to_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LT(worst, 1e-4);
}

TEST(Train, LossFallsAndCheckpointLoads) {
  const std::string data = make_corpus("fall", 6);
  const std::string run = data + "_run";
  TrainConfig c = micro_config(data, run);
  c.steps = 30;
  c.eval_every = 10;
  c.checkpoint_every = 10;
  std::ostringstream out;
  const TrainResult r = kiln::train::train(c, out);
  ASSERT_EQ(r.train_losses.size(), 30u);
  EXPECT_LT(r.train_losses.back(), 0.8 * r.train_losses.front());
  EXPECT_LT(r.eval_losses.back().second, r.first_eval_loss);
  EXPECT_TRUE(fs::exists(fs::path(run) / "loss.svg"));
  EXPECT_TRUE(fs::exists(fs::path(run) / "metrics.jsonl"));
  const std::string ck = find_checkpoint(run);
  ASSERT_FALSE(ck.empty());
  EXPECT_EQ(load_state(ck).step, 30);
  GenerateConfig g;
  g.checkpoint = run;
  g.max_tokens = 20;
  std::ostringstream gen;
  EXPECT_EQ(run_generate(g, gen), 0);
  EXPECT_EQ(gen.str().rfind("def ", 0), 0u);
  fs::remove_all(data);
  fs::remove_all(run);
}

TEST(Train, ResumeReproducesLossesBitForBit) {
  const std::string data = make_corpus("resume", 6);
  std::ostringstream sink;
  TrainConfig full = micro_config(data, data + "_full");
  const TrainResult a = kiln::train::train(full, sink);
  ASSERT_EQ(a.train_losses.size(), 6u);

  TrainConfig half = micro_config(data, data + "_half");
  half.stop_after = 3;
  const TrainResult b1 = kiln::train::train(half, sink);
  ASSERT_EQ(b1.train_losses.size(), 3u);
  half.stop_after = 0;
  half.resume = true;
  const TrainResult b2 = kiln::train::train(half, sink);
  ASSERT_EQ(b2.train_losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a.train_losses[i], b1.train_losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.train_losses[3 + i], b2.train_losses[i]) << "step " << i + 4;
  }
  ASSERT_FALSE(a.eval_losses.empty());
  ASSERT_FALSE(b2.eval_losses.empty());
  EXPECT_EQ(a.eval_losses.back(), b2.eval_losses.back());
  for (const char* s : {"_full", "_half"}) fs::remove_all(data + s);
  fs::remove_all(data);
}

// The BlockMask block size only splits the same attention differently: the losses agree to
// float rounding (the online softmax groups its sums per block), and a negative size is refused.
TEST(Train, MaskBlockSizeKeepsTheLosses) {
  const std::string data = make_corpus("mask_block", 4);
  std::ostringstream sink;
  TrainConfig base = micro_config(data, data + "_auto");
  const TrainResult a = kiln::train::train(base, sink);
  TrainConfig small = micro_config(data, data + "_16");
  small.mask_block = 16;
  const TrainResult b = kiln::train::train(small, sink);
  ASSERT_EQ(a.train_losses.size(), b.train_losses.size());
  for (size_t i = 0; i < a.train_losses.size(); ++i)
    EXPECT_NEAR(a.train_losses[i], b.train_losses[i], 1e-5 * std::abs(a.train_losses[i])) << "step " << i + 1;
  TrainConfig bad = micro_config(data, data + "_bad");
  bad.mask_block = -64;
  try {
    kiln::train::train(bad, sink);
    ADD_FAILURE() << "a negative mask block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mask-block must be positive"), std::string::npos) << e.what();
  }
  for (const char* s : {"_auto", "_16", "_bad"}) fs::remove_all(data + s);
  fs::remove_all(data);
}

// The child half of the kill test: trains when its binary is given RUN and DATA after the gtest
// flags (see below).
TEST(TrainChild, Run) {
  const std::vector<std::string>& args = kiln::testing::program_args();
  if (args.size() != 2) GTEST_SKIP() << "only runs as the kill test's child process";
  TrainConfig c = micro_config(args[1], args[0]);
  c.steps = 100000;  // runs until killed
  c.checkpoint_every = 2;
  c.eval_every = 0;
  std::ostringstream sink;
  kiln::train::train(c, sink);
}

TEST(Train, KillNineLosesOnlyStepsSinceCheckpoint) {
  const std::string data = make_corpus("kill", 6);
  const std::string run = data + "_run";
  std::vector<std::string> command = kiln::testing::self_command();
  for (std::string arg : {std::string("--gtest_filter=TrainChild.Run"), run, data}) command.push_back(std::move(arg));
  std::vector<char*> argv;
  for (auto& word : command) argv.push_back(word.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // exec a fresh copy of this binary (no OpenMP state inherited across fork).
    execvp(argv[0], argv.data());
    _exit(127);
  }
  // Wait for a few checkpoints, then kill -9 at an arbitrary moment.
  int64_t seen = 0;
  for (int i = 0; i < 1200 && seen < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string ck = find_checkpoint(run);
    if (!ck.empty()) {
      try {
        seen = load_state(ck).step;
      } catch (const kiln::Error&) {
      }
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(37));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_GE(seen, 6) << "the child never wrote checkpoints";
  // The latest checkpoint is complete and loads; resuming continues from it.
  const std::string ck = find_checkpoint(run);
  ASSERT_FALSE(ck.empty());
  const TrainState st = load_state(ck);
  EXPECT_GE(st.step, seen);
  TrainConfig c = micro_config(data, run);
  c.steps = 100000;
  c.stop_after = st.step + 2;
  c.checkpoint_every = 2;
  c.eval_every = 0;
  c.resume = true;
  std::ostringstream sink;
  const TrainResult r = kiln::train::train(c, sink);
  EXPECT_EQ(r.train_losses.size(), 2u);
  EXPECT_EQ(r.last_step, st.step + 2);
  fs::remove_all(data);
  fs::remove_all(run);
}
