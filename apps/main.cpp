// The `kiln` command: one subcommand per job (train, info; bench, inspect and convert arrive
// with their issues). Errors from the library are printed, never aborted on.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "kiln/kiln.h"
#include "train_mlp.h"

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
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: a deep-learning engine for training language models"};
  app.require_subcommand(1);
  auto* info = app.add_subcommand("info", "version, backends and devices");

  // Until the GPT training job lands, `kiln train` runs the MLP demo on the CPU.
  auto* train = app.add_subcommand("train", "train a model (for now: --demo mlp)");
  std::string demo = "mlp";
  kiln::apps::MlpDemoConfig mlp;
  train->add_option("--demo", demo, "which demo job")->check(CLI::IsMember({"mlp"}));
  train->add_option("--steps", mlp.steps, "optimizer steps");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) return run_info();
    if (*train) return kiln::apps::run_mlp_demo(mlp);
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
