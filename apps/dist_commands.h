#pragma once
// `kiln run` (processes of one machine with torchrun's variables) and `kiln trace` (flight-recorder
// dumps: analyze, export).
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace kiln::apps {

struct DistCommands {
  CLI::App* run = nullptr;
  CLI::App* trace = nullptr;
  CLI::App* trace_analyze = nullptr;
  CLI::App* trace_export = nullptr;
  int nproc = 1;
  double kill_grace_s = 5.0;
  std::vector<std::string> command;
  std::string trace_dir, trace_out;
};

void add_dist_commands(CLI::App& app, DistCommands& c);
// The exit status when one of the commands was chosen, else -1.
int run_dist_commands(const DistCommands& c);

}  // namespace kiln::apps
