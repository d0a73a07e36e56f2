#pragma once
// kiln::dist: communicators over Gloo (CPU tensors) and NCCL (CUDA tensors) with torchcomms' shape:
// a key-value store for rendezvous, collectives that return a Work, a watchdog that turns a stuck
// operation into a TimeoutError (never a hang, never an abort of the process), a flight recorder of
// the last operations per communicator, and shrink() to go on without failed ranks.
//
//   auto comm = kiln::dist::new_comm("gloo", kiln::kCPU, "main");  // rank / size from the launcher
//   comm->all_reduce(t, kiln::dist::ReduceOp::SUM);                // in place, every rank
//   auto w = comm->all_gather_single(out, in, /*async_op=*/true);   // ... w->wait();
//
// Every rank of a communicator calls its collectives in the same order with the same sizes and
// dtypes; the communicator checks this (a small header exchange, CommOptions::check_inputs) and
// raises the same kiln::Error on every rank when they disagree.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::dist {

// A communication failure: a peer closed its connection, the communicator was aborted, the store
// could not be reached. The communicator is unusable afterwards (shrink() or a new one goes on).
class CommError : public Error {
 public:
  using Error::Error;
};

// An operation did not complete within its timeout. The message names the communicator, the op,
// its sequence number and the ranks that did not arrive.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

enum class ReduceOp : uint8_t { SUM, AVG, MIN, MAX, PRODUCT };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", ...

// ---- key-value store (rendezvous) ----

// String keys to binary-safe string values. get() and wait() block until the keys exist or the
// store's timeout passes (TimeoutError); a store that cannot be reached raises CommError.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
  // Adds delta to the integer stored at key (absent: 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired when its value is `expected` (absent counts as ""), returns the value after.
  virtual std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;  // all exist, without waiting
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual bool delete_key(const std::string& key) = 0;
  // Values of the keys present now ("" and false for absent ones), in one round trip.
  virtual std::vector<std::pair<bool, std::string>> multi_get(const std::vector<std::string>& keys) = 0;
  // A second handle on the same keys (a TCPStore opens its own connection): for a thread that
  // must not queue behind another's blocking get.
  virtual std::shared_ptr<Store> clone() const = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::seconds(30)};
};

// A store over TCP. is_server: this process also runs the server (a thread; port 0 picks a free
// port, see port()); the others connect to host:port, retrying until the timeout while the server
// is not up yet.
class TCPStore final : public Store {
 public:
  TCPStore(std::string host, int port, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  std::vector<std::pair<bool, std::string>> multi_get(const std::vector<std::string>& keys) override;
  std::shared_ptr<Store> clone() const override;

 private:
  struct Server;
  struct Client;
  std::string host_;
  int port_ = 0;
  std::shared_ptr<Server> server_;  // shared with clones, so the server outlives them
  std::unique_ptr<Client> client_;
};

// An in-process store (one-rank communicators, tests).
class HashStore final : public Store {
 public:
  HashStore();
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  std::vector<std::pair<bool, std::string>> multi_get(const std::vector<std::string>& keys) override;
  std::shared_ptr<Store> clone() const override;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Every key prefixed with "prefix/" in the underlying store (whose timeout its gets and waits keep).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  std::vector<std::pair<bool, std::string>> multi_get(const std::vector<std::string>& keys) override;
  std::shared_ptr<Store> clone() const override;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

// ---- launch ----

// This process's place in the job, from torchrun's / `kiln run`'s variables or Slurm's.
struct LaunchInfo {
  std::string source;  // "env", "slurm" or "none" (a single process)
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int store_port = 0;  // kiln's store: MASTER_PORT + 1 on rank 0, or the launcher's (`kiln run`)
};
LaunchInfo launch_info();
// The process's store from launch_info(), made on first use (rank 0 hosts it unless the launcher
// does) and shared by every communicator new_comm makes without CommOptions::store.
std::shared_ptr<Store> default_store();

// `kiln run`: nproc copies of command on this machine, each with torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: a free port left for
// torch.distributed) and KILN_STORE_PORT (kiln's store, hosted by the launcher, so it outlives any
// rank). The children form one process group: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
// SIGUSR2 are forwarded to it; when a child fails the group gets SIGTERM, then SIGKILL after
// kill_grace. Returns 0 when every child exits 0, else the first failure's status (its exit code,
// or 128 + the signal that ended it).
struct LaunchOptions {
  int nproc = 1;
  std::vector<std::string> command;  // program (PATH is searched) and its arguments
  std::chrono::milliseconds kill_grace{std::chrono::seconds(5)};
};
int run_local(const LaunchOptions& options);

// ---- communicators ----

enum class WorkStatus : uint8_t { NOT_STARTED, IN_PROGRESS, COMPLETED, TIMED_OUT, ERROR };
const char* work_status_name(WorkStatus s);

// One operation. A communicator runs its operations in the order they were called, one at a time,
// on its own thread; two communicators run theirs concurrently.
class Work {
 public:
  struct State;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Blocks until the op ends; raises its error (TimeoutError, CommError, or kiln::Error for inputs
  // the ranks disagreed on).
  void wait();
  // As wait(), but an op still running after `timeout` times out here: TIMED_OUT, the
  // communicator is aborted, TimeoutError.
  void wait(std::chrono::milliseconds timeout);
  bool is_completed() const;  // ended, successfully or not
  WorkStatus status() const;
  uint64_t seq() const;       // the collective (or point-to-point) sequence number
  const std::string& op() const;

 private:
  std::shared_ptr<State> state_;
};

struct CommOptions {
  // Each operation must complete within this time from when it starts.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // On a timeout or communication error, end the process (exit status 75) after the flight
  // recorder is dumped, as torch's async error handling does, so a launcher can restart the job.
  bool abort_process_on_error = false;
  // Exchange a small header (op, dtype, sizes, root) before each collective so ranks that
  // disagree get a clear error instead of corrupt results or a hang. It costs one small all-gather
  // per collective; collectives of up to a few KiB complete inside it. Must agree on every rank.
  bool check_inputs = true;
  std::string trace_dir = "kiln_trace";  // flight recorder dumps: <trace_dir>/<name>.rank<r>.json
  size_t trace_capacity = 2048;          // operations the flight recorder keeps
  // Life-cycle events (create, split, shrink, abort, timeout) as JSON lines: "" off, "stderr", or
  // a file appended to (several processes may share it).
  std::string log_path;
  // Rendezvous; unset: default_store() and launch_info()'s rank and world size.
  std::shared_ptr<Store> store;
  int rank = -1, world_size = -1;
  std::string hostname;  // the address Gloo listens on ("": 127.0.0.1 for a local master, else the host name)
};

namespace detail {
struct CommState;
}

class Communicator {
 public:
  explicit Communicator(std::shared_ptr<detail::CommState> state);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int get_rank() const;
  int get_size() const;
  const std::string& get_name() const;
  const std::string& get_backend() const;  // "gloo" or "nccl"
  Device get_device() const;
  CommOptions get_options() const;
  // Reconfigurable while the communicator lives (the rest of CommOptions is fixed at creation).
  void set_timeout(std::chrono::milliseconds timeout);  // for ops called from now on
  void set_abort_process_on_error(bool abort_process);

  // Tensors are contiguous, on the communicator's device, of dtype float32, float64, bfloat16,
  // float16, int64, int32, int8 or uint8 (any dtype where nothing is reduced). bf16 / fp16 reduce in
  // fp32. AVG needs a floating-point dtype. With async_op false the call returns after the op
  // ended (the Work is completed); either way an error raises from the call or from wait().

  // t: any shape, reduced in place across ranks.
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::SUM, bool async_op = false);
  // input: n elements on every rank; output: size * n elements, rank r's input at [r * n, (r + 1) * n).
  std::shared_ptr<Work> all_gather_single(const Tensor& output, const Tensor& input, bool async_op = false);
  // input: size * n elements; output: n elements, block r of the reduction on rank r.
  std::shared_ptr<Work> reduce_scatter_single(const Tensor& output, const Tensor& input,
                                              ReduceOp op = ReduceOp::SUM, bool async_op = false);
  // t: any shape; root's values to every rank.
  std::shared_ptr<Work> broadcast(const Tensor& t, int root, bool async_op = false);
  // input, output: size * n elements; block j of rank i's input lands in block i of rank j's output.
  std::shared_ptr<Work> all_to_all_single(const Tensor& output, const Tensor& input, bool async_op = false);
  // Point to point: t's elements to / from one peer (same count and dtype on both sides).
  std::shared_ptr<Work> send(const Tensor& t, int dst, bool async_op = false);
  std::shared_ptr<Work> recv(const Tensor& t, int src, bool async_op = false);
  std::shared_ptr<Work> barrier(bool async_op = false);

  // A communicator over `ranks` (this communicator's numbering; new ranks in ascending order),
  // called by every rank of this one (NCCL splits collectively); nullptr on ranks not listed.
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks, const std::string& name);
  // The survivors without exclude_ranks, renumbered in order: called by every survivor, also on an
  // aborted communicator (the way on after a TimeoutError or CommError). name "": "<name>.shrink<k>".
  std::shared_ptr<Communicator> shrink(const std::vector<int>& exclude_ranks, const std::string& name = "");
  // Fails every pending op at once and closes the connections so peers' ops fail too; later calls
  // raise CommError. (A Gloo op already running on this rank's worker ends by Gloo's own timeout.)
  void abort();
  bool is_aborted() const;

  // Writes the flight recorder as JSON (path "": <trace_dir>/<name>.rank<r>.json); returns the path.
  std::string dump_flight_recorder(const std::string& path = "") const;

 private:
  std::shared_ptr<detail::CommState> state_;
};

// backend: "gloo" (device cpu) or "nccl" (a CUDA device). Blocks until every rank joined (within
// options.timeout, else TimeoutError naming the missing ranks).
std::shared_ptr<Communicator> new_comm(const std::string& backend, const Device& device, const std::string& name,
                                       const CommOptions& options = {});

// The NCCL library's version, "2.28.3" (torch.cuda.nccl.version()); loads the library, which kiln
// does not link but opens at the first NCCL communicator. Raises where kiln has no NCCL or the
// library cannot be loaded (the message lists the places tried).
std::string nccl_version();

// Dumps the flight recorder of every live communicator of this process.
void dump_flight_recorders();
// After this, `signum` (default SIGUSR1) makes every communicator's watchdog dump its flight
// recorder (the handler only counts; the watchdogs write the files).
void enable_dump_on_signal(int signum = SIGUSR1);

// ---- reading flight recorder dumps (`kiln trace`) ----

struct TraceFinding {
  std::string comm;
  std::string kind;  // "behind", "desync", "missing_dump", "error", "timed_out"
  std::vector<int> ranks;
  int64_t seq = -1;
  std::string op;
  std::string detail;  // one human sentence
};

struct TraceReport {
  std::vector<TraceFinding> findings;
  std::string text;  // what `kiln trace analyze` prints
};

// Reads every <name>.rank<r>.json under dir and says, per communicator, which ranks are behind
// (on which sequence number and op) and where ranks called a different op, size or dtype.
TraceReport analyze_traces(const std::string& dir);
// A Chrome / Perfetto trace (JSON) of all dumps under dir: one track per rank and communicator.
void export_chrome_trace(const std::string& dir, const std::string& out_path);

}  // namespace kiln::dist
