// The `kiln` command: one subcommand per job (train, generate, info, inspect, convert, run, trace; benchmarks are bench/). Errors from the library are printed, never aborted on.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "kiln/cpu.h"
#include "kiln/kiln.h"
#include "command_line.h"
#include "dist_commands.h"
#include "io_commands.h"
#include "train_mlp.h"
#include "train/checkpoint.h"
#include "train/train.h"

namespace {

int run_info() {
  std::cout << "kiln 0.1.0\n";
#ifdef KILN_WITH_CUDA
  std::cout << "built with CUDA: yes\n";
#else
  std::cout << "built with CUDA: no\n";
#endif
  const int n = kiln::cuda_device_count();
  std::cout << "CUDA devices: " << n << "\n";
  for (int i = 0; i < n; ++i) {
    const kiln::Device d(kiln::DeviceType::CUDA, i);
    std::cout << "  " << d << ": allocated " << kiln::memory_allocated(d) << " B, reserved "
              << kiln::memory_reserved(d) << " B\n";
  }
  // The CPU kernels' Highway dispatch (logs of Arm runs show SVE / SVE2 / NEON by this).
  const kiln::CpuSimdInfo simd = kiln::cpu_simd_info();
  const auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (const auto& name : names) s += " " + name;
    return s;
  };
  std::cout << "CPU SIMD (Highway): dispatched " << simd.target << ", " << simd.vector_bits << "-bit vectors\n"
            << "  compiled:" << list(simd.compiled) << "\n  runnable here:" << list(simd.runnable) << "\n";
  for (const auto& family : simd.families) std::cout << "  " << family << ": " << simd.target << "\n";
  std::cout << "  FlexAttention tiles: plain C++ for the build's baseline (not dispatched)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: a deep-learning engine for training language models"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default (subcommands inherit it)
  app.footer("Run 'kiln COMMAND --help' for a command's flags and their defaults; docs/using.md describes runs/.");
  auto* info = app.add_subcommand("info", "version, backends and devices");

  // `kiln train`: the GPT job (default: the tiny CPU run on the Python stdlib); `--demo mlp`
  // keeps the MLP demo reachable (its step count is --steps too).
  auto* train = app.add_subcommand("train", "train a GPT (default: tiny, on the CPU, on the Python stdlib)");
  std::string demo;
  kiln::apps::MlpDemoConfig mlp;
  kiln::train::TrainConfig train_cfg;
  train->add_option("--demo", demo, "run a demo job instead")->check(CLI::IsMember({"mlp"}));
  kiln::train::add_train_options(train, train_cfg);

  auto* generate = app.add_subcommand("generate", "sample text from a training checkpoint");
  kiln::train::GenerateConfig gen_cfg;
  kiln::train::add_generate_options(generate, gen_cfg);

  auto* inspect = app.add_subcommand("inspect", "format, metadata and tensors of a checkpoint");
  std::string inspect_path;
  inspect->add_option("PATH", inspect_path,
                      "safetensors or PyTorch .pt file, or a run / checkpoint folder (its model.safetensors)")
      ->required();

  auto* convert = app.add_subcommand("convert", "convert a checkpoint (format from OUT's extension), keeping its metadata");
  std::string convert_in, convert_out;
  convert->add_option("IN", convert_in, "safetensors or PyTorch file, or a run / checkpoint folder")->required();
  convert->add_option("OUT", convert_out, "the file to write: .safetensors, or .pt/.pth/.bin/.ckpt")->required();

  kiln::apps::DistCommands dist;
  kiln::apps::add_dist_commands(app, dist);

  if (const int rc = kiln::apps::check_command_words(app, argc, argv, std::cerr); rc >= 0) return rc;
  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) return run_info();
    if (*train && demo == "mlp") {
      if (train->count("--steps") > 0) mlp.steps = train_cfg.steps;
      return kiln::apps::run_mlp_demo(mlp);
    }
    if (*train) return kiln::train::run_train(train_cfg, std::cout);
    if (*generate) return kiln::train::run_generate(gen_cfg, std::cout);
    if (*inspect) return kiln::apps::run_inspect(kiln::train::model_file(inspect_path), std::cout);
    if (*convert) return kiln::apps::run_convert(kiln::train::model_file(convert_in), convert_out, std::cout);
    if (const int rc = kiln::apps::run_dist_commands(dist); rc >= 0) return rc;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
