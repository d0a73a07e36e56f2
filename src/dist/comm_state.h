#pragma once
// A communicator's insides. Calls queue operations; one worker thread runs them in order through
// the backend; a watchdog thread times out the running one, publishes this rank's progress to the
// store (who arrived where) and watches for peers' aborts.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/backend.h"
#include "dist/flight_recorder.h"
#include "kiln/dist.h"

namespace kiln::dist::detail {

enum class ErrorKind : uint8_t { None, Invalid, Comm, Timeout };
[[noreturn]] void throw_error_of(ErrorKind kind, const std::string& message);

// The input check found that ranks disagree (the communicator stays usable).
class InputMismatch : public Error {
 public:
  using Error::Error;
};

struct PendingOp {
  std::string op;
  bool p2p = false;
  int64_t seq = -1;  // collective or point-to-point sequence number
  uint32_t tag = 0, header_tag = 0;
  int peer = -1;
  std::vector<int64_t> header;  // this rank's input-check words (empty: no check)
  std::string rejected;         // this rank's own input error: the check tells the peers
  std::function<void(Backend&, const OpContext&)> run;
  // A small collective completes within the input check (Backend::inline_capacity): inline_bytes
  // (-1: never) that pack writes beside this rank's header; finish_inline gets every rank's.
  int64_t inline_bytes = -1;
  std::function<void(uint8_t*)> pack;
  std::function<void(const std::vector<const uint8_t*>&)> finish_inline;
  std::shared_ptr<void> ready;  // Backend::on_submit's token
  std::shared_ptr<Work::State> work;
  uint64_t record_id = 0;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;  // set when it starts
};

struct CommState : std::enable_shared_from_this<CommState> {
  CommState(std::string name, std::string backend_name, std::string prefix, int rank, int size, Device device,
            CommOptions options);

  // ---- identity (fixed) ----
  const std::string name, backend_name, prefix;
  const int rank, size;
  const Device device;
  CommOptions options;  // timeout changes under mu
  std::shared_ptr<Store> root_store;  // the unprefixed store (splits and shrinks make prefixes in it)
  std::shared_ptr<Store> store;       // prefixed: this communicator's keys
  std::shared_ptr<Store> wd_store;    // the watchdog's own connection, short timeouts
  std::shared_ptr<Backend> backend;
  FlightRecorder recorder;
  std::map<std::string, int> split_counts;
  int shrink_count = 0;

  // ---- queue and state (under mu) ----
  std::mutex mu;
  std::condition_variable worker_cv, watchdog_cv, idle_cv;
  std::deque<std::shared_ptr<PendingOp>> queue;
  std::shared_ptr<PendingOp> current;
  std::shared_ptr<PendingOp> last_submitted;
  bool stop = false, worker_done = false;
  std::atomic<bool> aborted{false};
  ErrorKind abort_kind = ErrorKind::None;
  std::string abort_message;
  int64_t next_seq = 0, next_p2p_seq = 0;
  std::vector<uint32_t> send_count, recv_count;  // per peer: the pair's message numbers
  std::string entered;                            // "<seq> <op>" of the last collective started
  std::string published;                          // what the store holds for this rank
  std::thread worker, watchdog;
  uint64_t dumps_seen = 0;

  void start_threads();
  void shutdown();  // the communicator handle is gone: fail what is queued, end the threads

  // Queues op (sequence number, tags and record assigned here); waits for it unless async_op.
  std::shared_ptr<Work> submit(const std::shared_ptr<PendingOp>& op, TraceEntry entry, bool async_op);
  void throw_if_aborted(const char* op);
  void drain();  // waits until every op queued so far has ended

  void worker_loop();
  void run_op(PendingOp& op);
  std::vector<int64_t> check_header(PendingOp& op, const std::vector<int64_t>& mine, const OpContext& c);
  void watchdog_loop();
  void heartbeat(const std::shared_ptr<PendingOp>& cur);

  // The op passed its deadline (or a wait(timeout) gave up): TIMED_OUT, abort, TimeoutError.
  void on_timeout(const std::shared_ptr<PendingOp>& op, const std::string& why);
  void on_backend_error(const std::shared_ptr<PendingOp>& op, const std::string& what);
  void timeout_work(const Work::State* work, std::chrono::milliseconds waited);
  // Marks the communicator aborted once: fails the running and queued ops, closes the backend's
  // connections, tells peers through the store (publish), dumps the flight recorder, logs.
  // `failed` (the op that caused it) ends with failed_status; the running op and the queued ones
  // with ERROR. The communicator is marked aborted before any of them ends, so a caller that sees
  // the error also finds the communicator aborted.
  void abort_with(ErrorKind kind, const std::string& message, bool publish,
                  const std::shared_ptr<PendingOp>& failed = nullptr, WorkStatus failed_status = WorkStatus::ERROR);
  // Ends op's Work (first end wins) with its flight-recorder entry updated before any waiter wakes.
  bool finish(PendingOp& op, WorkStatus status, ErrorKind kind, const std::string& message);

  // "[2] (rank 2 last started seq 4 all_reduce)": ranks whose published progress is below seq.
  std::string arrival_report(int64_t seq);
  std::string peer_abort_reason();
  std::string describe() const;  // "communicator 'main' (rank 1 of 4)"
  std::string dump_path() const;
  std::string dump(const std::string& path);
  void log(const std::string& event, const nlohmann::json& fields);
};

// Every live communicator of the process (dump_flight_recorders, the signal request).
void register_comm(const std::shared_ptr<CommState>& s);
uint64_t dump_requests();  // how many signal requests arrived so far

// Makes a communicator over store prefix `prefix`: rendezvous, backend, threads.
std::shared_ptr<Communicator> create_comm(const std::string& backend, const Device& device, const std::string& name,
                                          const std::string& prefix, int rank, int size,
                                          const std::shared_ptr<Store>& root_store, const CommOptions& options,
                                          std::unique_ptr<Backend> made = nullptr);

}  // namespace kiln::dist::detail

struct kiln::dist::Work::State {
  std::mutex mu;
  std::condition_variable cv;
  WorkStatus status = WorkStatus::NOT_STARTED;
  detail::ErrorKind kind = detail::ErrorKind::None;
  std::string message;
  int64_t seq = -1;
  std::string op;
  std::weak_ptr<detail::CommState> comm;

  bool is_final() {
    std::lock_guard<std::mutex> lock(mu);
    return final_locked();
  }
  bool final_locked() const {
    return status == WorkStatus::COMPLETED || status == WorkStatus::TIMED_OUT || status == WorkStatus::ERROR;
  }
  void start() {
    std::lock_guard<std::mutex> lock(mu);
    if (status == WorkStatus::NOT_STARTED) status = WorkStatus::IN_PROGRESS;
  }
  // The first final state wins; false when the work had already ended. `also` runs under the
  // lock, before any waiter can see the new state.
  bool finish(WorkStatus s, detail::ErrorKind k, const std::string& msg, const std::function<void()>& also = {}) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (final_locked()) return false;
      status = s;
      kind = k;
      message = msg;
      if (also) also();
    }
    cv.notify_all();
    return true;
  }
};
