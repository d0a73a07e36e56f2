#include "dist_commands.h"

#include <chrono>
#include <iostream>

#include "kiln/dist.h"

namespace kiln::apps {

void add_dist_commands(CLI::App& app, DistCommands& c) {
  c.run = app.add_subcommand("run", "run N processes of a command on this machine (torchrun's variables)");
  c.run->add_option("--nproc", c.nproc, "number of processes")->required()->check(CLI::Range(1, 4096));
  c.run->add_option("--kill-grace", c.kill_grace_s, "seconds between SIGTERM and SIGKILL for the others when one fails")
      ->check(CLI::NonNegativeNumber);
  c.run->add_option("command", c.command, "the command and its arguments, after --")->required();
  c.trace = app.add_subcommand("trace", "read flight-recorder dumps of kiln::dist communicators");
  c.trace->require_subcommand(1);
  c.trace_analyze = c.trace->add_subcommand("analyze", "which ranks are behind or desynchronised, per communicator");
  c.trace_analyze->add_option("DIR", c.trace_dir, "folder of <comm>.rank<r>.json dumps")->required();
  c.trace_export = c.trace->add_subcommand("export", "a Chrome / Perfetto trace of every rank");
  c.trace_export->add_option("DIR", c.trace_dir, "folder of <comm>.rank<r>.json dumps")->required();
  c.trace_export->add_option("OUT", c.trace_out, "the trace to write (.json)")->required();
}

int run_dist_commands(const DistCommands& c) {
  if (*c.run) {
    dist::LaunchOptions o;
    o.nproc = c.nproc;
    o.command = c.command;
    o.kill_grace = std::chrono::milliseconds(static_cast<int64_t>(c.kill_grace_s * 1000));
    return dist::run_local(o);
  }
  if (*c.trace_analyze) {
    std::cout << dist::analyze_traces(c.trace_dir).text;
    return 0;
  }
  if (*c.trace_export) {
    dist::export_chrome_trace(c.trace_dir, c.trace_out);
    std::cout << "wrote " << c.trace_out << "\n";
    return 0;
  }
  return -1;
}

}  // namespace kiln::apps
