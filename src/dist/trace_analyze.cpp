// `kiln trace`: reads every rank's flight-recorder dump and tells, per communicator, who is behind
// (the last collective each rank started), where ranks disagreed (the first sequence number whose
// op, sizes, dtypes or root differ between ranks), which ops failed, and whose dump is missing;
// or writes the dumps as one Chrome / Perfetto trace.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kiln/dist.h"

namespace kiln::dist {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr const char* kOp = "kiln trace";

struct Dump {
  std::string file;
  json j;
};

std::vector<Dump> read_dumps(const std::string& dir) {
  KILN_CHECK(fs::is_directory(dir), kOp, "no such folder: ", dir);
  std::vector<Dump> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("entries") || !j.contains("comm")) continue;
    out.push_back({e.path().string(), std::move(j)});
  }
  KILN_CHECK(!out.empty(), kOp, "no flight-recorder dumps (<name>.rank<r>.json) in ", dir);
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

// What a rank called at one sequence number: the fields every rank must agree on.
std::string signature(const json& e) {
  std::ostringstream os;
  os << e.value("profiling_name", "?");
  const std::string red = e.value("reduce_op", "");
  if (!red.empty()) os << "(" << red << ")";
  const auto& dts = e["input_dtypes"];
  if (!dts.empty()) os << " " << dts[0].get<std::string>();
  os << " " << e["input_sizes"].dump();
  if (e["output_sizes"] != e["input_sizes"]) os << " -> " << e["output_sizes"].dump();
  if (e.value("peer", -1) >= 0) os << " root " << e.value("peer", -1);
  return os.str();
}

bool started(const json& e) { return e.value("time_started_ns", int64_t{0}) > 0; }

void analyze_comm(const std::string& comm, const std::vector<const Dump*>& dumps, TraceReport& report) {
  std::ostringstream text;
  int world = 0;
  std::map<int, const json*> by_rank;
  for (const Dump* d : dumps) {
    world = std::max(world, d->j.value("world_size", 1));
    by_rank[d->j.value("rank", 0)] = &d->j;
  }
  std::vector<int> have;
  for (auto& [r, j] : by_rank) have.push_back(r);
  text << "communicator '" << comm << "': " << world << " ranks, dumps from " << ranks_text(have) << "\n";
  auto add = [&](TraceFinding f) {
    text << "  " << f.detail << "\n";
    report.findings.push_back(std::move(f));
  };

  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!by_rank.count(r)) missing.push_back(r);
  if (!missing.empty())
    add({comm, "missing_dump", missing, -1, "", "no dump from " + ranks_text(missing) + " (dead, or never dumped)"});

  // Per rank: collective entries by sequence number, and the last one started.
  std::map<int, std::map<int64_t, const json*>> seqs;
  std::map<int, int64_t> last;
  for (auto& [r, j] : by_rank) {
    last[r] = -1;
    for (const auto& e : (*j)["entries"]) {
      const int64_t s = e.value("seq_id", int64_t{-1});
      if (s < 0) continue;
      seqs[r][s] = &e;
      if (started(e)) last[r] = std::max(last[r], s);
    }
  }

  // Desync: the first sequence number where the ranks that recorded it called different things.
  std::set<int64_t> all_seqs;
  for (auto& [r, m] : seqs)
    for (auto& [s, e] : m) all_seqs.insert(s);
  for (int64_t s : all_seqs) {
    std::map<std::string, std::vector<int>> groups;
    for (auto& [r, m] : seqs)
      if (auto it = m.find(s); it != m.end()) groups[signature(*it->second)].push_back(r);
    if (groups.size() < 2) continue;
    // The largest group is the reference (ties: the group with the lowest rank); the rest deviate.
    auto ref = std::max_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      return a.second.size() != b.second.size() ? a.second.size() < b.second.size() : a.second[0] > b.second[0];
    });
    std::vector<int> odd;
    std::string detail;
    for (auto& [sig, ranks] : groups) {
      if (&sig == &ref->first) continue;
      odd.insert(odd.end(), ranks.begin(), ranks.end());
      detail += ranks_text(ranks) + " called " + sig + "; ";
    }
    std::sort(odd.begin(), odd.end());
    detail += ranks_text(ref->second) + " called " + ref->first;
    add({comm, "desync", odd, s, seqs[ref->second[0]][s]->value("profiling_name", "?"),
         "desync at seq " + std::to_string(s) + ": " + detail});
    break;
  }

  // Behind: ranks whose last started collective is below the furthest rank's, and ranks that
  // started a collective only after other ranks had timed out on it.
  int64_t front = -1;
  for (auto& [r, s] : last) front = std::max(front, s);
  std::map<int64_t, std::map<int, std::string>> behind;  // seq -> rank -> why
  for (auto& [r, s] : last)
    if (s < front)
      behind[s + 1][r] = "rank " + std::to_string(r) + " last started " +
                         (s < 0 ? std::string("nothing") : "seq " + std::to_string(s) + " " + seqs[r][s]->value("profiling_name", "?"));
  for (int64_t s : all_seqs) {
    int64_t timed_out_at = 0;
    std::vector<int> timed;
    for (auto& [r, m] : seqs)
      if (auto it = m.find(s); it != m.end() && it->second->value("state", "") == "timed_out") {
        const int64_t t = it->second->value("time_completed_ns", int64_t{0});
        timed_out_at = timed.empty() ? t : std::min(timed_out_at, t);
        timed.push_back(r);
      }
    if (timed.empty()) continue;
    for (auto& [r, m] : seqs) {
      auto it = m.find(s);
      if (it == m.end() || !started(*it->second)) continue;
      const int64_t late = it->second->value("time_started_ns", int64_t{0}) - timed_out_at;
      if (late > 0)
        behind[s][r] = "rank " + std::to_string(r) + " started it " + std::to_string(late / 1000000) + " ms after " +
                       ranks_text(timed) + " timed out";
    }
  }
  for (auto& [s, why] : behind) {
    std::vector<int> ranks, others;
    std::string reasons;
    for (auto& [r, w] : why) {
      ranks.push_back(r);
      reasons += (reasons.empty() ? "" : "; ") + w;
    }
    std::string op = "?";
    for (auto& [r, m] : seqs)
      if (!why.count(r))
        if (auto it = m.find(s); it != m.end()) {
          op = it->second->value("profiling_name", "?");
          others.push_back(r);
        }
    add({comm, "behind", ranks, s, op,
         ranks_text(ranks) + " behind at seq " + std::to_string(s) + " (" + op +
             (others.empty() ? "" : ", which " + ranks_text(others) + " started") + "): " + reasons});
  }

  // Failed ops, grouped by sequence number and state.
  std::map<std::pair<int64_t, std::string>, std::pair<std::vector<int>, std::string>> failed;
  for (auto& [r, m] : seqs)
    for (auto& [s, e] : m) {
      const std::string st = e->value("state", "");
      if (st != "timed_out" && st != "error") continue;
      auto& slot = failed[{s, st}];
      slot.first.push_back(r);
      if (slot.second.empty()) slot.second = e->value("profiling_name", "?") + ": " + e->value("error", "");
    }
  for (auto& [key, v] : failed) {
    std::string first_line = v.second.substr(0, v.second.find('\n'));
    add({comm, key.second == "timed_out" ? "timed_out" : "error", v.first, key.first,
         v.second.substr(0, v.second.find(':')),
         key.second + " at seq " + std::to_string(key.first) + " on " + ranks_text(v.first) + ": " + first_line});
  }
  if (report.findings.empty() || report.findings.back().comm != comm)
    text << "  all ranks reached seq " << front << "; no desync\n";
  report.text += text.str();
}

}  // namespace

TraceReport analyze_traces(const std::string& dir) {
  const auto dumps = read_dumps(dir);
  std::map<std::string, std::vector<const Dump*>> by_comm;
  for (const auto& d : dumps) by_comm[d.j["comm"].get<std::string>()].push_back(&d);
  TraceReport report;
  for (auto& [comm, list] : by_comm) analyze_comm(comm, list, report);
  return report;
}

void export_chrome_trace(const std::string& dir, const std::string& out_path) {
  const auto dumps = read_dumps(dir);
  // One process track per OS process (named by its rank in the largest communicator it dumped),
  // one thread track per communicator.
  std::map<int64_t, std::pair<int, int>> proc_rank;  // pid -> (world size, rank)
  std::map<std::string, int> comm_tid;
  for (const auto& d : dumps) {
    const int64_t pid = d.j.value("pid", int64_t{0});
    const int world = d.j.value("world_size", 1);
    auto& pr = proc_rank[pid];
    if (world > pr.first) pr = {world, d.j.value("rank", 0)};
    comm_tid.emplace(d.j["comm"].get<std::string>(), static_cast<int>(comm_tid.size()) + 1);
  }
  json events = json::array();
  for (auto& [pid, pr] : proc_rank)
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
                      {"args", {{"name", "rank " + std::to_string(pr.second) + " (pid " + std::to_string(pid) + ")"}}}});
  for (const auto& d : dumps) {
    const int64_t pid = d.j.value("pid", int64_t{0});
    const std::string comm = d.j["comm"].get<std::string>();
    const int tid = comm_tid[comm];
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid},
                      {"args", {{"name", comm + " (rank " + std::to_string(d.j.value("rank", 0)) + ")"}}}});
    const int64_t dump_ns = d.j.value("dump_time_ns", int64_t{0});
    for (const auto& e : d.j["entries"]) {
      const int64_t start = e.value("time_started_ns", int64_t{0});
      if (start == 0) continue;
      int64_t end = e.value("time_completed_ns", int64_t{0});
      if (end == 0) end = std::max(dump_ns, start);
      events.push_back({{"ph", "X"}, {"name", e.value("profiling_name", "?")}, {"cat", comm}, {"pid", pid},
                        {"tid", tid}, {"ts", static_cast<double>(start) / 1e3},
                        {"dur", static_cast<double>(end - start) / 1e3},
                        {"args",
                         {{"seq_id", e["seq_id"]}, {"p2p_seq_id", e["p2p_seq_id"]}, {"state", e["state"]},
                          {"input_sizes", e["input_sizes"]}, {"input_dtypes", e["input_dtypes"]}}}});
    }
  }
  std::ofstream f(out_path, std::ios::trunc);
  KILN_CHECK(f.good(), kOp, "cannot write ", out_path);
  f << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  KILN_CHECK(f.good(), kOp, "cannot write ", out_path);
}

}  // namespace kiln::dist
