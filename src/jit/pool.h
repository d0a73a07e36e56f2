#pragma once
// The compile pool: runs encoded requests (protocol.h) in worker processes, at most `workers` at
// once, each killed after `timeout_s`. A worker that crashes, hangs, or answers garbage costs its
// own job an error; the others and the calling process go on.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/jit.h"

namespace kiln::jit::detail {

struct WorkerJob {
  std::string name;     // the kernel's, for messages
  std::string request;  // protocol::encode_request
  WorkerFault fault = WorkerFault::none;
};

struct WorkerOutcome {
  bool ok = false;
  std::string binary;
  std::string error;  // the compiler's log, or how the worker died
};

std::vector<WorkerOutcome> run_in_workers(const std::vector<WorkerJob>& jobs, int workers, double timeout_s);

// Worker processes started by this process.
int64_t workers_started();

}  // namespace kiln::jit::detail
