#pragma once
// The flight recorder: a bounded ring of a communicator's last operations with the fields of
// PyTorch's (record id, sequence ids, op, sizes, dtypes, created / started / completed times,
// timeout, state), dumped as JSON for `kiln trace analyze` / `kiln trace export`.
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kiln/tensor.h"

namespace kiln::dist::detail {

struct TraceEntry {
  uint64_t record_id = 0;
  int64_t seq = -1;      // collective sequence number (-1 for point-to-point)
  int64_t p2p_seq = -1;  // point-to-point sequence number (-1 for collectives)
  std::string op;        // "all_reduce", "send", ...
  std::vector<Shape> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  int peer = -1;  // broadcast's root, send's dst, recv's src
  std::string reduce_op;
  int64_t created_ns = 0, started_ns = 0, completed_ns = 0;  // system clock, 0: not yet
  int64_t timeout_ms = 0;
  std::string state = "scheduled";  // scheduled, started, completed, timed_out, error
  std::string error;
};

// Wall-clock nanoseconds since the epoch (comparable across the processes of one machine).
int64_t wall_ns();

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  uint64_t record(TraceEntry e);  // sets record_id and created_ns, returns the id
  // Applies f to the entry if the ring still holds it.
  void update(uint64_t record_id, const std::function<void(TraceEntry&)>& f);
  std::vector<TraceEntry> snapshot() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::deque<TraceEntry> ring_;
};

struct DumpInfo {
  std::string comm, backend;
  int rank = 0, world_size = 1;
  bool aborted = false;
  std::string abort_reason;
};

// Writes {"version", "comm", "rank", ..., "entries": [...]} to path (its folder is made; the file is
// replaced whole, never seen half-written).
void write_dump(const std::string& path, const DumpInfo& info, const std::vector<TraceEntry>& entries);

// One JSON line {"ts": <unix seconds>, "event": ..., fields...} to "stderr" or appended to a file
// (one write, so processes sharing the file do not interleave lines); sink "" logs nothing.
void log_event(const std::string& sink, const std::string& event, const nlohmann::json& fields);

}  // namespace kiln::dist::detail
