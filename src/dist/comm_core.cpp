// The communicator's machinery: the queue, the worker, the input check, the watchdog (timeouts,
// progress published to the store, peers' aborts), abort, and Work.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/comm_state.h"
#include "dist/op_header.h"

namespace kiln::dist {

namespace detail {

using std::chrono::milliseconds;

namespace {

constexpr milliseconds kTick{100};  // watchdog period: progress publishing, peers' aborts, dump requests
constexpr int kAbortExitCode = 75;  // abort_process_on_error (EX_TEMPFAIL: a launcher may restart)

std::string status_state(WorkStatus s) {
  switch (s) {
    case WorkStatus::COMPLETED: return "completed";
    case WorkStatus::TIMED_OUT: return "timed_out";
    case WorkStatus::ERROR: return "error";
    case WorkStatus::IN_PROGRESS: return "started";
    default: return "scheduled";
  }
}

const char* op_code_name(int64_t code) {
  switch (static_cast<OpCode>(code)) {
    case OpCode::kAllReduce: return "all_reduce";
    case OpCode::kAllGather: return "all_gather_single";
    case OpCode::kReduceScatter: return "reduce_scatter_single";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kAllToAll: return "all_to_all_single";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kSend: return "send";
    case OpCode::kRecv: return "recv";
  }
  return "unknown op";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

}  // namespace

std::string describe_header(const int64_t* h) {
  std::ostringstream os;
  const auto code = static_cast<OpCode>(h[kOpCode]);
  os << op_code_name(h[kOpCode]);
  if (code == OpCode::kAllReduce || code == OpCode::kReduceScatter)
    os << "(" << reduce_op_name(static_cast<ReduceOp>(h[kRedOp])) << ")";
  if (code != OpCode::kBarrier) os << " " << dtype_name(static_cast<DType>(h[kDType])) << " numel " << h[kInNumel];
  if (code == OpCode::kAllGather || code == OpCode::kReduceScatter || code == OpCode::kAllToAll)
    os << " -> " << h[kOutNumel];
  if (code == OpCode::kBroadcast) os << " root " << h[kRoot];
  os << " at seq " << h[kSeq];
  return os.str();
}

void throw_error_of(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::Timeout: throw TimeoutError(message);
    case ErrorKind::Comm: throw CommError(message);
    default: throw Error(message);
  }
}

CommState::CommState(std::string n, std::string b, std::string p, int r, int s, Device d, CommOptions o)
    : name(std::move(n)), backend_name(std::move(b)), prefix(std::move(p)), rank(r), size(s), device(d),
      options(std::move(o)), recorder(options.trace_capacity),
      send_count(static_cast<size_t>(s), 0), recv_count(static_cast<size_t>(s), 0) {}

std::string CommState::describe() const {
  return "communicator '" + name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
}

void CommState::log(const std::string& event, const nlohmann::json& fields) {
  nlohmann::json f = fields;
  f["comm"] = name;
  f["rank"] = rank;
  f["size"] = size;
  log_event(options.log_path, event, f);
}

void CommState::start_threads() {
  auto self = shared_from_this();
  worker = std::thread([self] { self->worker_loop(); });
  watchdog = std::thread([self] { self->watchdog_loop(); });
}

void CommState::shutdown() {
  std::deque<std::shared_ptr<PendingOp>> pending;
  Clock::time_point bound;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    pending.swap(queue);
    bound = Clock::now() + std::chrono::seconds(2);
    if (current && !aborted) bound = std::max(bound, current->deadline + std::chrono::seconds(1));
  }
  for (auto& op : pending)
    finish(*op, WorkStatus::ERROR, ErrorKind::Comm,
           "[" + op->op + "] " + describe() + ": the communicator was destroyed before the op ran");
  worker_cv.notify_all();
  watchdog_cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
  // Gloo's own timeout ends an op stuck after an abort; past that bound the worker is left to end
  // by itself (it owns this state), so destruction never hangs.
  std::unique_lock<std::mutex> lock(mu);
  const bool done = idle_cv.wait_until(lock, bound, [&] { return worker_done; });
  lock.unlock();
  if (worker.joinable()) {
    if (done) worker.join();
    else worker.detach();
  }
}

void CommState::throw_if_aborted(const char* op) {
  if (!aborted) return;
  std::lock_guard<std::mutex> lock(mu);
  throw_error_of(abort_kind, std::string("[") + op + "] " + describe() + " was aborted: " + abort_message);
}

std::shared_ptr<Work> CommState::submit(const std::shared_ptr<PendingOp>& op, TraceEntry entry, bool async_op) {
  op->work = std::make_shared<Work::State>();
  op->work->op = op->op;
  if (op->run) op->ready = backend->on_submit();
  op->work->comm = weak_from_this();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) throw_error_of(abort_kind, "[" + op->op + "] " + describe() + " was aborted: " + abort_message);
    KILN_CHECK(!stop, op->op.c_str(), describe(), " was destroyed");
    if (op->p2p) {
      op->seq = next_p2p_seq++;
      op->tag = op->header_tag = op->op == "send" ? send_count[op->peer]++ : recv_count[op->peer]++;
      entry.p2p_seq = op->seq;
    } else {
      op->seq = next_seq++;
      op->header_tag = static_cast<uint32_t>(op->seq * 2);
      op->tag = static_cast<uint32_t>(op->seq * 2 + 1);
      entry.seq = op->seq;
      if (!op->header.empty()) op->header[kSeq] = op->seq;
    }
    op->work->seq = op->seq;
    op->timeout = options.timeout;
    entry.op = op->op;
    entry.timeout_ms = op->timeout.count();
    op->record_id = recorder.record(std::move(entry));
    queue.push_back(op);
    last_submitted = op;
  }
  worker_cv.notify_one();
  auto w = std::make_shared<Work>(op->work);
  if (!async_op) w->wait();
  return w;
}

void CommState::drain() {
  std::shared_ptr<PendingOp> last;
  {
    std::lock_guard<std::mutex> lock(mu);
    last = last_submitted;
  }
  if (!last) return;
  std::unique_lock<std::mutex> lock(last->work->mu);
  last->work->cv.wait(lock, [&] { return last->work->final_locked(); });
}

bool CommState::finish(PendingOp& op, WorkStatus status, ErrorKind kind, const std::string& message) {
  const int64_t now = wall_ns();
  return op.work->finish(status, kind, message, [&] {
    recorder.update(op.record_id, [&](TraceEntry& e) {
      e.state = status_state(status);
      e.completed_ns = now;
      e.error = message;
    });
  });
}

// ---- worker ----

void CommState::worker_loop() {
  for (;;) {
    std::shared_ptr<PendingOp> op;
    {
      std::unique_lock<std::mutex> lock(mu);
      worker_cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) break;
      op = queue.front();
      queue.pop_front();
      if (aborted) {
        const std::string msg = "[" + op->op + "] " + describe() + " was aborted: " + abort_message;
        const ErrorKind kind = abort_kind;
        lock.unlock();
        finish(*op, WorkStatus::ERROR, kind, msg);
        continue;
      }
      op->deadline = Clock::now() + op->timeout;
      current = op;
      if (!op->p2p) entered = std::to_string(op->seq) + " " + op->op;
    }
    op->work->start();
    const int64_t now = wall_ns();
    recorder.update(op->record_id, [&](TraceEntry& e) {
      e.started_ns = now;
      e.state = "started";
    });
    watchdog_cv.notify_all();
    run_op(*op);
    {
      std::lock_guard<std::mutex> lock(mu);
      current.reset();
    }
    idle_cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu);
  worker_done = true;
  idle_cv.notify_all();
}

void CommState::run_op(PendingOp& op) {
  try {
    if (!op.header.empty()) {
      // A small collective rides on the input check: every rank's bytes arrive with the headers.
      const size_t room = op.p2p ? 0 : backend->inline_capacity();
      const bool fits = op.finish_inline && op.inline_bytes >= 0 && static_cast<size_t>(op.inline_bytes) <= room &&
                        op.rejected.empty();
      std::vector<int64_t> mine = op.header;
      mine.resize(kHeaderWords + room / 8, 0);
      if (fits && op.inline_bytes > 0) op.pack(reinterpret_cast<uint8_t*>(mine.data() + kHeaderWords));
      const std::vector<int64_t> all = check_header(op, mine, OpContext{op.header_tag, op.deadline, op.ready.get()});
      if (!op.rejected.empty()) {
        finish(op, WorkStatus::ERROR, ErrorKind::Invalid, op.rejected);
        return;
      }
      if (fits) {
        std::vector<const uint8_t*> rows;
        for (int r = 0; r < size; ++r)
          rows.push_back(reinterpret_cast<const uint8_t*>(all.data() + r * mine.size() + kHeaderWords));
        op.finish_inline(rows);
        finish(op, WorkStatus::COMPLETED, ErrorKind::None, "");
        return;
      }
    }
    op.run(*backend, OpContext{op.tag, op.deadline, op.ready.get()});
    finish(op, WorkStatus::COMPLETED, ErrorKind::None, "");
  } catch (const InputMismatch& e) {
    finish(op, WorkStatus::ERROR, ErrorKind::Invalid, e.what());
    try {
      dump(dump_path());  // every rank raises the same error: each leaves its dump for `kiln trace`
    } catch (const std::exception&) {
    }
  } catch (const std::exception& e) {
    std::shared_ptr<PendingOp> cur;
    {
      std::lock_guard<std::mutex> lock(mu);
      cur = current;
    }
    on_backend_error(cur, e.what());
  }
}

// Compares this rank's header with every peer's; on a difference raises the same message on
// every rank (the groups of ranks and what each group called). Returns every rank's row.
std::vector<int64_t> CommState::check_header(PendingOp& op, const std::vector<int64_t>& mine, const OpContext& c) {
  std::vector<std::vector<int64_t>> rows;
  std::vector<int> row_ranks;
  std::vector<int64_t> all;
  if (op.p2p) {
    std::vector<int64_t> theirs;
    backend->swap_header(mine, theirs, op.peer, c);
    rows = {std::vector<int64_t>(mine.begin(), mine.begin() + kHeaderWords),
            std::vector<int64_t>(theirs.begin(), theirs.begin() + kHeaderWords)};
    row_ranks = {rank, op.peer};
  } else {
    backend->exchange_header(mine, all, c);
    for (int r = 0; r < size; ++r) {
      const auto row = all.begin() + static_cast<std::ptrdiff_t>(r * mine.size());
      rows.emplace_back(row, row + kHeaderWords);
      row_ranks.push_back(r);
    }
  }
  const std::string where = "[" + op.op + "] " + describe() + " " + op.op + " seq " + std::to_string(op.seq) + ": ";
  std::vector<int> rejected;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i][kMagic] != kHeaderMagic) throw InputMismatch(where + "garbled input check from rank " +
                                                             std::to_string(row_ranks[i]));
    else if (rows[i][kRejected] != 0) rejected.push_back(row_ranks[i]);
  if (!rejected.empty()) {
    if (!op.rejected.empty()) return all;  // this rank's own error is the one to raise
    throw InputMismatch(where + rank_list(rejected) + " rejected its input (see the error there)");
  }
  if (op.p2p) {
    const auto& a = rows[0];
    const auto& b = rows[1];
    const bool pair_ok = a[kOpCode] != b[kOpCode] && a[kDType] == b[kDType] && a[kInNumel] == b[kInNumel];
    if (!pair_ok)
      throw InputMismatch(where + "the peers disagree: rank " + std::to_string(rank) + " " + describe_header(a.data()) +
                          ", rank " + std::to_string(op.peer) + " " + describe_header(b.data()));
    return all;
  }
  std::map<std::vector<int64_t>, std::vector<int>> groups;
  for (size_t i = 0; i < rows.size(); ++i) groups[rows[i]].push_back(row_ranks[i]);
  if (groups.size() == 1) return all;
  std::vector<std::pair<std::vector<int>, std::string>> parts;
  for (const auto& [row, ranks] : groups) parts.emplace_back(ranks, describe_header(row.data()));
  std::sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.first[0] < y.first[0]; });
  std::string msg = where + "ranks called different collectives: ";
  for (size_t i = 0; i < parts.size(); ++i) msg += (i ? "; " : "") + rank_list(parts[i].first) + " " + parts[i].second;
  throw InputMismatch(msg);
}

// ---- failures ----

std::string CommState::arrival_report(int64_t seq) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("arrive/" + std::to_string(r));
  std::vector<std::pair<bool, std::string>> got;
  try {
    got = wd_store->multi_get(keys);
  } catch (const std::exception& e) {
    return "unknown (the store did not answer: " + std::string(e.what()) + ")";
  }
  std::vector<int> missing;
  std::string last;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    int64_t at = -1;
    std::string op;
    if (got[r].first) {
      std::istringstream is(got[r].second);
      is >> at >> op;
    }
    if (at >= seq) continue;
    missing.push_back(r);
    last += "; rank " + std::to_string(r) +
            (at < 0 ? " started no collective" : " last started seq " + std::to_string(at) + " " + op);
  }
  if (missing.empty()) return "none (every rank started it)";
  std::string list;
  for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return "[" + list + "]" + last;
}

std::string CommState::peer_abort_reason() {
  try {
    auto got = wd_store->multi_get({"abort"});
    if (got[0].first) return got[0].second;
  } catch (const std::exception&) {
  }
  return {};
}

void CommState::on_timeout(const std::shared_ptr<PendingOp>& op, const std::string& why) {
  if (!op || op->work->is_final() || aborted) return;
  const std::string who = op->p2p ? "peer rank " + std::to_string(op->peer) : arrival_report(op->seq);
  const std::string msg = "[" + op->op + "] " + describe() + ": " + op->op + (op->p2p ? " p2p seq " : " seq ") +
                          std::to_string(op->seq) + " " + why + "; ranks that did not arrive: " + who;
  log("timeout", {{"op", op->op}, {"seq", op->seq}, {"p2p", op->p2p}, {"not_arrived", who}});
  abort_with(ErrorKind::Timeout, msg, true, op, WorkStatus::TIMED_OUT);
}

void CommState::on_backend_error(const std::shared_ptr<PendingOp>& op, const std::string& what) {
  if (!op || op->work->is_final()) return;
  // Gloo reports its own (slightly later) timeout as "Timed out ...": the same timeout.
  if (Clock::now() >= op->deadline || what.find("Timed out") != std::string::npos)
    return on_timeout(op, "timed out after " + std::to_string(op->timeout.count()) + " ms");
  const std::string peer = peer_abort_reason();
  const std::string msg = "[" + op->op + "] " + describe() + ": " + op->op + " seq " + std::to_string(op->seq) +
                          " failed: " + what + (peer.empty() ? "" : "; the communicator was aborted by " + peer);
  abort_with(ErrorKind::Comm, msg, true, op);
  finish(*op, WorkStatus::ERROR, ErrorKind::Comm, msg);  // when an earlier abort already took the lead
}

void CommState::timeout_work(const Work::State* work, milliseconds waited) {
  std::shared_ptr<PendingOp> op;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (current && current->work.get() == work) op = current;
    for (auto& q : queue)
      if (q->work.get() == work) op = q;
  }
  on_timeout(op, "was not complete when wait() gave up after " + std::to_string(waited.count()) + " ms");
}

void CommState::abort_with(ErrorKind kind, const std::string& message, bool publish,
                           const std::shared_ptr<PendingOp>& failed, WorkStatus failed_status) {
  std::deque<std::shared_ptr<PendingOp>> pending;
  std::shared_ptr<PendingOp> cur;
  bool end_process;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
    end_process = options.abort_process_on_error;
    abort_kind = kind;
    abort_message = message;
    aborted = true;
    pending.swap(queue);
    cur = current;
  }
  if (failed) finish(*failed, failed_status, kind, message);
  // Tell the peers why before closing the connections, so a peer woken by the close can say it.
  if (publish) {
    try {
      wd_store->compare_set("abort", "", "rank " + std::to_string(rank) + ": " + message);
    } catch (const std::exception&) {
    }
  }
  backend->abort();
  if (cur) finish(*cur, WorkStatus::ERROR, kind, message);
  for (auto& op : pending)
    finish(*op, WorkStatus::ERROR, kind,
           "[" + op->op + "] " + describe() + ": not run, the communicator was aborted: " + message);
  log("abort", {{"reason", message}});
  try {
    dump(dump_path());
  } catch (const std::exception& e) {
    log("dump_failed", {{"error", e.what()}});
  }
  idle_cv.notify_all();
  watchdog_cv.notify_all();
  if (end_process) {
    std::fprintf(stderr, "kiln: %s; ending the process (abort_process_on_error)\n", message.c_str());
    std::fflush(stderr);
    ::_exit(kAbortExitCode);  // opted in by the user: the launcher restarts the job
  }
}

// ---- watchdog ----

void CommState::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mu);
  auto next_tick = Clock::now() + kTick;
  while (!stop) {
    auto wake = next_tick;
    if (current && !aborted && !current->work->is_final()) wake = std::min(wake, current->deadline);
    watchdog_cv.wait_until(lock, wake);
    if (stop) break;
    auto cur = current;
    const auto now = Clock::now();
    if (cur && !aborted && now >= cur->deadline && !cur->work->is_final()) {
      lock.unlock();
      on_timeout(cur, "timed out after " + std::to_string(cur->timeout.count()) + " ms");
      lock.lock();
      continue;
    }
    if (now >= next_tick) {
      next_tick = now + kTick;
      lock.unlock();
      heartbeat(cur);
      lock.lock();
    }
  }
}

void CommState::heartbeat(const std::shared_ptr<PendingOp>& cur) {
  std::string progress;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (entered != published) progress = entered;
  }
  try {
    if (!progress.empty()) {
      wd_store->set("arrive/" + std::to_string(rank), progress);
      std::lock_guard<std::mutex> lock(mu);
      published = progress;
    }
    // A peer that aborted while this rank waits on it: fail now instead of at the deadline.
    if (cur && !aborted && !cur->work->is_final() && Clock::now() - (cur->deadline - cur->timeout) >= kTick) {
      const std::string peer = peer_abort_reason();
      if (!peer.empty()) {
        const std::string msg = "[" + cur->op + "] " + describe() + ": " + cur->op + " seq " +
                                std::to_string(cur->seq) + " failed: the communicator was aborted by " + peer;
        abort_with(ErrorKind::Comm, msg, false, cur);
      }
    }
  } catch (const std::exception&) {
    // The store may be gone with its host; the ops themselves still fail or time out.
  }
  const uint64_t req = dump_requests();
  if (req != dumps_seen) {
    dumps_seen = req;
    try {
      dump(dump_path());
    } catch (const std::exception&) {
    }
  }
}

std::string CommState::dump_path() const {
  std::string safe;
  for (char ch : name) safe += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_') ? ch : '_';
  return options.trace_dir + "/" + safe + ".rank" + std::to_string(rank) + ".json";
}

std::string CommState::dump(const std::string& path) {
  DumpInfo info{name, backend_name, rank, size, aborted.load(), {}};
  {
    std::lock_guard<std::mutex> lock(mu);
    info.abort_reason = abort_message;
  }
  write_dump(path, info, recorder.snapshot());
  return path;
}

}  // namespace detail

// ---- Work ----

void Work::wait() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->final_locked(); });
  if (state_->status != WorkStatus::COMPLETED) detail::throw_error_of(state_->kind, state_->message);
}

void Work::wait(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->final_locked(); })) {
      lock.unlock();
      if (auto comm = state_->comm.lock()) comm->timeout_work(state_.get(), timeout);
      state_->finish(WorkStatus::TIMED_OUT, detail::ErrorKind::Timeout,
                     "[" + state_->op + "] wait() gave up after " + std::to_string(timeout.count()) + " ms");
    }
  }
  wait();
}

bool Work::is_completed() const { return state_->is_final(); }

WorkStatus Work::status() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

uint64_t Work::seq() const { return static_cast<uint64_t>(state_->seq); }
const std::string& Work::op() const { return state_->op; }

const char* work_status_name(WorkStatus s) {
  switch (s) {
    case WorkStatus::NOT_STARTED: return "NOT_STARTED";
    case WorkStatus::IN_PROGRESS: return "IN_PROGRESS";
    case WorkStatus::COMPLETED: return "COMPLETED";
    case WorkStatus::TIMED_OUT: return "TIMED_OUT";
    case WorkStatus::ERROR: return "ERROR";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MIN: return "min";
    case ReduceOp::MAX: return "max";
    case ReduceOp::PRODUCT: return "product";
  }
  return "?";
}

}  // namespace kiln::dist
