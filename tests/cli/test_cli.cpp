// The built `kiln` command run as a user runs it: unknown commands named with a suggestion,
// defaults in --help, numbers and precisions checked at parse time, CUDA refused before any work
// on a machine without a GPU, and inspect / generate / convert taking the same paths.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/io.h"
#include "support/testing.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {

struct Ran {
  int rc = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the built kiln (under the cross build's emulator where there is one) with `args`.
Ran kiln(const std::vector<std::string>& args) {
  std::vector<std::string> command = testing::self_command();
  command.pop_back();  // this test binary; what stays is the emulator's prefix, if any
  command.push_back(KILN_CLI_PATH);
  command.insert(command.end(), args.begin(), args.end());
  std::string line;
  for (const std::string& a : command) line += quoted(a) + " ";
  line += "2>&1";
  Ran r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("kiln_cli_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

TEST(Cli, UnknownCommandIsNamedWithASuggestion) {
  Ran r = kiln({"trian"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r.out, "unknown command \"trian\"; did you mean \"train\"?")) << r.out;
  EXPECT_TRUE(has(r.out, "generate")) << "the commands are listed: " << r.out;
  r = kiln({"trace", "analzye"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r.out, "did you mean \"trace analyze\"?")) << r.out;
  r = kiln({"frobnicate"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r.out, "unknown command \"frobnicate\" (commands:")) << "no far-fetched guess: " << r.out;
}

TEST(Cli, HelpListsEveryCommandsFlagsWithDefaults) {
  const Ran top = kiln({"--help"});
  EXPECT_EQ(top.rc, 0) << top.out;
  for (const char* sub : {"info", "train", "generate", "inspect", "convert", "run", "trace"}) {
    EXPECT_TRUE(has(top.out, std::string("  ") + sub)) << sub << " missing from kiln --help";
    const Ran h = kiln({sub, "--help"});
    EXPECT_EQ(h.rc, 0) << sub << ": " << h.out;
    EXPECT_TRUE(has(h.out, "-h,--help")) << sub << ": " << h.out;
  }
  const Ran train = kiln({"train", "--help"});
  EXPECT_TRUE(has(train.out, "--steps INT:POSITIVE=800")) << train.out;
  EXPECT_TRUE(has(train.out, "--threads INT:NONNEGATIVE=1")) << "the default thread count is 1: " << train.out;
  EXPECT_TRUE(has(train.out, "--lr FLOAT:NONNEGATIVE=0.005")) << train.out;
  EXPECT_TRUE(has(train.out, "--run-dir TEXT=runs/tiny")) << train.out;
  const Ran gen = kiln({"generate", "--help"});
  EXPECT_TRUE(has(gen.out, "=0.8") && has(gen.out, "=40") && has(gen.out, "=200")) << gen.out;
}

TEST(Cli, InvalidNumbersAreRefusedBeforeAnythingIsWritten) {
  const fs::path run = scratch("numbers");
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--steps", "-5"}, {"--steps", "0"}, {"--lr", "-1"}, {"--batch-size", "-2"}, {"--threads", "-1"}}) {
    std::vector<std::string> args = {"train", "--run-dir", run.string()};
    args.insert(args.end(), bad.begin(), bad.end());
    const Ran r = kiln(args);
    EXPECT_NE(r.rc, 0) << bad[0] << " " << bad[1];
    EXPECT_TRUE(has(r.out, bad[0])) << "the flag is named: " << r.out;
    EXPECT_FALSE(fs::exists(run)) << bad[0] << " " << bad[1] << " wrote " << run;
  }
  const Ran g = kiln({"generate", "--checkpoint", run.string(), "--max-tokens", "-3"});
  EXPECT_NE(g.rc, 0);
  EXPECT_TRUE(has(g.out, "--max-tokens")) << g.out;
}

TEST(Cli, CudaWithoutAGpuFailsBeforeTheCorpusIsRead) {
  if (cuda_is_available()) GTEST_SKIP() << "a GPU is present";
  const fs::path run = scratch("nocuda");
  // fp32 / float32 / bfloat16 are accepted spellings: parsing passes and the device check fails.
  for (const char* autocast : {"fp32", "float32", "bfloat16", "BF16", "none"}) {
    const Ran r = kiln({"train", "--device", "cuda", "--autocast", autocast, "--run-dir", run.string()});
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_TRUE(has(r.out, "[train] no CUDA device: this machine has no NVIDIA driver / GPU")) << r.out;
    EXPECT_FALSE(has(r.out, "BPE")) << "the corpus was tokenized first: " << r.out;
    EXPECT_LT(r.seconds, 20.0) << "expensive work ran before the device check";
    EXPECT_FALSE(fs::exists(run));
  }
  const Ran bad = kiln({"train", "--autocast", "fp64", "--run-dir", run.string()});
  EXPECT_NE(bad.rc, 0);
  EXPECT_TRUE(has(bad.out, "--autocast")) << bad.out;
}

TEST(Cli, InspectGenerateAndConvertTakeTheSamePaths) {
  const fs::path run = scratch("paths");
  const fs::path corpus = scratch("corpus.txt");
  {
    std::ofstream text(corpus);
    for (int i = 0; i < 400; ++i) text << "def f" << i % 17 << "(x):\n    return x * " << i % 7 << " + abc\n";
  }
  // --stop-after: a short run that ends before its schedule (exit 0 without the loss-halving check).
  const Ran t = kiln({"train", "--preset", "micro", "--data", corpus.string(), "--vocab-size", "300", "--steps", "4",
                      "--stop-after", "2", "--eval-batches", "1", "--progress", "none", "--sample-tokens", "0",
                      "--run-dir", run.string()});
  ASSERT_EQ(t.rc, 0) << t.out;
  const fs::path latest = run / "checkpoints" / "latest";
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(latest))) << "checkpoints/latest is a link to the folder";
  EXPECT_TRUE(fs::exists(latest / "model.safetensors"));
  for (const fs::path& p : {run, run / "checkpoints", latest, latest / "model.safetensors"}) {
    SCOPED_TRACE(p.string());
    const Ran i = kiln({"inspect", p.string()});
    EXPECT_EQ(i.rc, 0) << i.out;
    EXPECT_TRUE(has(i.out, "format:   safetensors")) << i.out;
    const Ran g = kiln({"generate", "--checkpoint", p.string(), "--max-tokens", "3", "--prompt", "ab"});
    EXPECT_EQ(g.rc, 0) << g.out;
    EXPECT_TRUE(g.out.rfind("ab", 0) == 0) << g.out;
  }
  // A --synthetic run (a byte tokenizer under a larger model vocabulary) samples text too.
  const fs::path synth = scratch("synthetic");
  ASSERT_EQ(kiln({"train", "--preset", "micro", "--synthetic", "--steps", "4", "--stop-after", "1", "--eval-batches", "1",
                  "--progress", "none", "--run-dir", synth.string()}).rc, 0);
  const Ran sg = kiln({"generate", "--checkpoint", synth.string(), "--max-tokens", "5", "--prompt", "ab"});
  EXPECT_EQ(sg.rc, 0) << sg.out;
  fs::remove_all(synth);
  const Ran none = kiln({"inspect", fs::temp_directory_path().string()});
  EXPECT_EQ(none.rc, 1);
  EXPECT_TRUE(has(none.out, "is a folder with no checkpoint")) << none.out;
  // Resuming reads the link.
  const Ran r = kiln({"train", "--resume", "--stop-after", "3", "--progress", "none", "--run-dir", run.string()});
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "resumed from")) << r.out;
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-0000003" / "state.json"));
  EXPECT_EQ(fs::read_symlink(latest).string(), "step-0000003");
  fs::remove_all(run);
  fs::remove(corpus);
}

TEST(Cli, ConvertKeepsMetadataOrSaysWhyNot) {
  const fs::path dir = scratch("convert");
  fs::create_directories(dir);
  io::TensorDict tensors;
  tensors.insert("w", randn({3, 4}));
  io::save((dir / "in.safetensors").string(), tensors, {{"author", "kiln test"}, {"step", "7"}});
  Ran c = kiln({"convert", (dir / "in.safetensors").string(), (dir / "out.safetensors").string()});
  EXPECT_EQ(c.rc, 0) << c.out;
  EXPECT_TRUE(has(c.out, "2 metadata entries kept")) << c.out;
  EXPECT_EQ(io::load((dir / "out.safetensors").string()).metadata.at("author"), "kiln test");
  c = kiln({"convert", (dir / "in.safetensors").string(), (dir / "out.pt").string()});
  EXPECT_EQ(c.rc, 0) << c.out;
  EXPECT_TRUE(has(c.out, "note: 2 metadata entries (author, step) are not in")) << c.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
