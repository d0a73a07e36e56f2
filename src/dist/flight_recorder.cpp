#include "dist/flight_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::dist::detail {

namespace {
std::atomic<uint64_t> g_next_record{0};  // record ids are unique across the process's communicators
}

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t FlightRecorder::record(TraceEntry e) {
  e.record_id = g_next_record++;
  e.created_ns = wall_ns();
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() == capacity_) ring_.pop_front();
  ring_.push_back(std::move(e));
  return ring_.back().record_id;
}

void FlightRecorder::update(uint64_t record_id, const std::function<void(TraceEntry&)>& f) {
  std::lock_guard<std::mutex> lock(mu_);
  // Ids grow along the ring: search from the back, where the live ops are.
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it) {
    if (it->record_id == record_id) return f(*it);
    if (it->record_id < record_id) return;
  }
}

std::vector<TraceEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ring_.begin(), ring_.end()};
}

void write_dump(const std::string& path, const DumpInfo& info, const std::vector<TraceEntry>& entries) {
  nlohmann::json j;
  j["version"] = 1;
  j["comm"] = info.comm;
  j["backend"] = info.backend;
  j["rank"] = info.rank;
  j["world_size"] = info.world_size;
  j["pid"] = static_cast<int64_t>(::getpid());
  j["dump_time_ns"] = wall_ns();
  j["aborted"] = info.aborted;
  j["abort_reason"] = info.abort_reason;
  auto& list = j["entries"] = nlohmann::json::array();
  for (const auto& e : entries) {
    list.push_back({{"record_id", e.record_id},
                    {"seq_id", e.seq},
                    {"p2p_seq_id", e.p2p_seq},
                    {"profiling_name", e.op},
                    {"input_sizes", e.input_sizes},
                    {"output_sizes", e.output_sizes},
                    {"input_dtypes", e.input_dtypes},
                    {"output_dtypes", e.output_dtypes},
                    {"peer", e.peer},
                    {"reduce_op", e.reduce_op},
                    {"time_created_ns", e.created_ns},
                    {"time_started_ns", e.started_ns},
                    {"time_completed_ns", e.completed_ns},
                    {"timeout_ms", e.timeout_ms},
                    {"state", e.state},
                    {"error", e.error}});
  }
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), "dump_flight_recorder", "cannot write ", tmp);
    f << j.dump(1) << "\n";
    KILN_CHECK(f.good(), "dump_flight_recorder", "cannot write ", tmp);
  }
  fs::rename(tmp, p, ec);
  KILN_CHECK(!ec, "dump_flight_recorder", "cannot move ", tmp, " to ", path, ": ", ec.message());
}

void log_event(const std::string& sink, const std::string& event, const nlohmann::json& fields) {
  if (sink.empty()) return;
  nlohmann::json j;
  j["ts"] = static_cast<double>(wall_ns()) * 1e-9;
  j["event"] = event;
  j["pid"] = static_cast<int64_t>(::getpid());
  for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  const std::string line = j.dump() + "\n";
  if (sink == "stderr") {
    (void)!::write(STDERR_FILENO, line.data(), line.size());
    return;
  }
  const int fd = ::open(sink.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;  // logging never fails an operation
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace kiln::dist::detail
