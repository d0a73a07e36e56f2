// The communicator's operations: local checks (raised here, and told to the peers through the
// input check so they fail at once instead of at the timeout), the input-check header, the
// flight-recorder entry, and the backend call queued for the worker.
#include <cstring>
#include <nlohmann/json.hpp>

#include "dist/comm_state.h"
#include "dist/op_header.h"
#include "dist/reduce.h"

namespace kiln::dist {

using detail::Backend;
using detail::OpCode;
using detail::OpContext;
using detail::PendingOp;
using detail::TraceEntry;

namespace {

using RunFn = std::function<void(Backend&, const OpContext&)>;
using Rows = std::vector<const uint8_t*>;

// How a small collective completes inside the input check (PendingOp::inline_bytes ...).
struct Inline {
  int64_t bytes = -1;
  std::function<void(uint8_t*)> pack;
  std::function<void(const Rows&)> finish;
};

Inline inline_of(const Tensor& t, std::function<void(const Rows&)> finish) {
  if (!t.defined()) return {};
  return {static_cast<int64_t>(t.nbytes()), [t](uint8_t* dst) { std::memcpy(dst, t.data_ptr(), t.nbytes()); },
          std::move(finish)};
}

// Block `block` (of `bytes`) of every rank's row, one after another.
std::vector<uint8_t> gather_blocks(const Rows& rows, size_t block, size_t bytes) {
  std::vector<uint8_t> out(rows.size() * bytes);
  for (size_t r = 0; r < rows.size(); ++r) std::memcpy(out.data() + r * bytes, rows[r] + block * bytes, bytes);
  return out;
}

std::string tensor_problem(const detail::CommState& s, const Tensor& t, const std::string& what) {
  if (!t.defined()) return what + " is undefined";
  if (t.device() != s.device)
    return what + " is on " + t.device().str() + " but the communicator works on " + s.device.str();
  if (!t.is_contiguous()) return what + " is not contiguous";
  return {};
}

std::string reduce_problem(DType dt, ReduceOp op) {
  switch (dt) {
    case kFloat32: case kFloat64: case kBFloat16: case kFloat16:
      return {};
    case kInt32: case kInt64: case kInt8: case kUInt8:
      return op == ReduceOp::AVG ? std::string("AVG needs a floating-point tensor, got ") + dtype_name(dt) : "";
    default:
      return std::string("cannot reduce a ") + dtype_name(dt) + " tensor";
  }
}

// Where output and input share memory: "" when they do not, or when input is exactly output's
// block `block` (the in-place form of all_gather / reduce_scatter, block -1: none allowed).
std::string overlap_problem(const Tensor& big, const Tensor& small, int64_t block) {
  const auto* b0 = static_cast<const char*>(big.data_ptr());
  const auto* s0 = static_cast<const char*>(small.data_ptr());
  const bool apart = s0 + small.nbytes() <= b0 || b0 + big.nbytes() <= s0 || small.nbytes() == 0;
  if (apart || (block >= 0 && s0 == b0 + block * static_cast<int64_t>(small.nbytes()))) return {};
  return block >= 0 ? "input and output overlap other than input being output's block of this rank"
                    : "input and output overlap";
}

int dtype_code(const Tensor& t) { return t.defined() ? static_cast<int>(t.dtype()) : -1; }
int64_t numel_of(const Tensor& t) { return t.defined() ? t.numel() : -1; }

void describe_io(TraceEntry& e, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  for (const auto& t : in)
    if (t.defined()) {
      e.input_sizes.push_back(t.sizes());
      e.input_dtypes.emplace_back(dtype_name(t.dtype()));
    }
  for (const auto& t : out)
    if (t.defined()) {
      e.output_sizes.push_back(t.sizes());
      e.output_dtypes.emplace_back(dtype_name(t.dtype()));
    }
}

std::string first_problem(std::initializer_list<std::string> problems) {
  for (const auto& p : problems)
    if (!p.empty()) return p;
  return {};
}

// Queues an op, or raises this rank's own input problem after queueing a rejected op whose input
// check tells the peers (so their op fails now, with the same sequence numbers kept).
std::shared_ptr<Work> queue_op(detail::CommState& s, const char* op, bool p2p, int peer, const std::string& problem,
                               std::vector<int64_t> header, TraceEntry entry, RunFn run, bool async_op,
                               Inline small = {}) {
  s.throw_if_aborted(op);
  auto p = std::make_shared<PendingOp>();
  p->op = op;
  p->p2p = p2p;
  p->peer = peer;
  if (s.options.check_inputs) p->header = std::move(header);
  p->run = std::move(run);
  if (problem.empty()) {
    p->inline_bytes = small.bytes;
    p->pack = std::move(small.pack);
    p->finish_inline = std::move(small.finish);
  }
  if (problem.empty()) return s.submit(p, std::move(entry), async_op);
  const std::string msg = std::string("[") + op + "] " + s.describe() + ": " + problem;
  if (!p2p && s.options.check_inputs) {
    p->header[detail::kRejected] = 1;
    p->rejected = msg;
    p->run = nullptr;
    s.submit(p, std::move(entry), true);
  }
  throw Error(msg);
}

}  // namespace

Communicator::Communicator(std::shared_ptr<detail::CommState> state) : state_(std::move(state)) {}

Communicator::~Communicator() {
  state_->shutdown();
  state_->log("destroy", nlohmann::json::object());
}

int Communicator::get_rank() const { return state_->rank; }
int Communicator::get_size() const { return state_->size; }
const std::string& Communicator::get_name() const { return state_->name; }
const std::string& Communicator::get_backend() const { return state_->backend_name; }
Device Communicator::get_device() const { return state_->device; }
bool Communicator::is_aborted() const { return state_->aborted; }

CommOptions Communicator::get_options() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->options;
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  KILN_CHECK(timeout.count() > 0, "set_timeout", "the timeout must be positive, got ", timeout.count(), " ms");
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->options.timeout = timeout;
}

void Communicator::set_abort_process_on_error(bool abort_process) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->options.abort_process_on_error = abort_process;
}

std::shared_ptr<Work> Communicator::all_reduce(const Tensor& t, ReduceOp op, bool async_op) {
  auto& s = *state_;
  std::string problem = tensor_problem(s, t, "the tensor");
  if (problem.empty()) problem = reduce_problem(t.dtype(), op);
  TraceEntry e;
  describe_io(e, {t}, {t});
  e.reduce_op = reduce_op_name(op);
  auto header = detail::make_header(OpCode::kAllReduce, dtype_code(t), numel_of(t), numel_of(t), -1, static_cast<int>(op));
  const int W = s.size;
  return queue_op(s, "all_reduce", false, -1, problem, std::move(header), std::move(e),
                  [t, op](Backend& b, const OpContext& c) { b.all_reduce(t, op, c); }, async_op,
                  inline_of(t, [t, op, W](const Rows& rows) {
                    const auto blocks = gather_blocks(rows, 0, t.nbytes());
                    detail::reduce_blocks(t.data_ptr(), blocks.data(), W, static_cast<size_t>(t.numel()), t.dtype(), op);
                  }));
}

std::shared_ptr<Work> Communicator::all_gather_single(const Tensor& output, const Tensor& input, bool async_op) {
  auto& s = *state_;
  std::string problem = first_problem({tensor_problem(s, input, "input"), tensor_problem(s, output, "output")});
  if (problem.empty() && input.dtype() != output.dtype())
    problem = std::string("input is ") + dtype_name(input.dtype()) + " but output is " + dtype_name(output.dtype());
  if (problem.empty() && output.numel() != input.numel() * s.size)
    problem = "output has " + std::to_string(output.numel()) + " elements, expected size * input = " +
              std::to_string(s.size) + " * " + std::to_string(input.numel());
  if (problem.empty()) problem = overlap_problem(output, input, s.rank);
  TraceEntry e;
  describe_io(e, {input}, {output});
  auto header = detail::make_header(OpCode::kAllGather, dtype_code(input), numel_of(input), numel_of(output), -1, 0);
  return queue_op(s, "all_gather_single", false, -1, problem, std::move(header), std::move(e),
                  [output, input](Backend& b, const OpContext& c) { b.all_gather(output, input, c); }, async_op,
                  inline_of(input, [output, input](const Rows& rows) {
                    const auto all = gather_blocks(rows, 0, input.nbytes());
                    std::memcpy(output.data_ptr(), all.data(), all.size());
                  }));
}

std::shared_ptr<Work> Communicator::reduce_scatter_single(const Tensor& output, const Tensor& input, ReduceOp op,
                                                          bool async_op) {
  auto& s = *state_;
  std::string problem = first_problem({tensor_problem(s, input, "input"), tensor_problem(s, output, "output")});
  if (problem.empty() && input.dtype() != output.dtype())
    problem = std::string("input is ") + dtype_name(input.dtype()) + " but output is " + dtype_name(output.dtype());
  if (problem.empty() && input.numel() != output.numel() * s.size)
    problem = "input has " + std::to_string(input.numel()) + " elements, expected size * output = " +
              std::to_string(s.size) + " * " + std::to_string(output.numel());
  if (problem.empty()) problem = overlap_problem(input, output, s.rank);
  if (problem.empty()) problem = reduce_problem(input.dtype(), op);
  TraceEntry e;
  describe_io(e, {input}, {output});
  e.reduce_op = reduce_op_name(op);
  auto header = detail::make_header(OpCode::kReduceScatter, dtype_code(input), numel_of(input), numel_of(output), -1,
                                    static_cast<int>(op));
  const int W = s.size, R = s.rank;
  return queue_op(s, "reduce_scatter_single", false, -1, problem, std::move(header), std::move(e),
                  [output, input, op](Backend& b, const OpContext& c) { b.reduce_scatter(output, input, op, c); },
                  async_op, inline_of(input, [output, op, W, R](const Rows& rows) {
                    const auto blocks = gather_blocks(rows, static_cast<size_t>(R), output.nbytes());
                    detail::reduce_blocks(output.data_ptr(), blocks.data(), W, static_cast<size_t>(output.numel()),
                                          output.dtype(), op);
                  }));
}

std::shared_ptr<Work> Communicator::broadcast(const Tensor& t, int root, bool async_op) {
  auto& s = *state_;
  std::string problem = tensor_problem(s, t, "the tensor");
  if (problem.empty() && (root < 0 || root >= s.size))
    problem = "root " + std::to_string(root) + " is outside the group [0, " + std::to_string(s.size) + ")";
  TraceEntry e;
  describe_io(e, {t}, {t});
  e.peer = root;
  auto header = detail::make_header(OpCode::kBroadcast, dtype_code(t), numel_of(t), numel_of(t), root, 0);
  return queue_op(s, "broadcast", false, -1, problem, std::move(header), std::move(e),
                  [t, root](Backend& b, const OpContext& c) { b.broadcast(t, root, c); }, async_op,
                  inline_of(t, [t, root](const Rows& rows) { std::memcpy(t.data_ptr(), rows[root], t.nbytes()); }));
}

std::shared_ptr<Work> Communicator::all_to_all_single(const Tensor& output, const Tensor& input, bool async_op) {
  auto& s = *state_;
  std::string problem = first_problem({tensor_problem(s, input, "input"), tensor_problem(s, output, "output")});
  if (problem.empty() && input.dtype() != output.dtype())
    problem = std::string("input is ") + dtype_name(input.dtype()) + " but output is " + dtype_name(output.dtype());
  if (problem.empty() && (input.numel() != output.numel() || input.numel() % s.size != 0))
    problem = "input and output need the same number of elements, a multiple of the size " + std::to_string(s.size) +
              "; got " + std::to_string(input.numel()) + " and " + std::to_string(output.numel());
  if (problem.empty()) problem = overlap_problem(output, input, -1);
  TraceEntry e;
  describe_io(e, {input}, {output});
  auto header = detail::make_header(OpCode::kAllToAll, dtype_code(input), numel_of(input), numel_of(output), -1, 0);
  const int R = s.rank;
  return queue_op(s, "all_to_all_single", false, -1, problem, std::move(header), std::move(e),
                  [output, input](Backend& b, const OpContext& c) { b.all_to_all(output, input, c); }, async_op,
                  inline_of(input, [output, R](const Rows& rows) {
                    const size_t chunk = output.nbytes() / rows.size();
                    const auto all = gather_blocks(rows, static_cast<size_t>(R), chunk);
                    std::memcpy(output.data_ptr(), all.data(), all.size());
                  }));
}

std::shared_ptr<Work> Communicator::barrier(bool async_op) {
  auto& s = *state_;
  auto header = detail::make_header(OpCode::kBarrier, -1, 0, 0, -1, 0);
  // The input check's exchange is itself a barrier.
  return queue_op(s, "barrier", false, -1, "", std::move(header), TraceEntry{},
                  [](Backend& b, const OpContext& c) { b.barrier(c); }, async_op, Inline{0, nullptr, [](const Rows&) {}});
}

namespace {

std::shared_ptr<Work> point_to_point(detail::CommState& s, bool is_send, const Tensor& t, int peer, bool async_op) {
  const char* op = is_send ? "send" : "recv";
  std::string problem = tensor_problem(s, t, "the tensor");
  if (peer < 0 || peer >= s.size || peer == s.rank)
    problem = std::string(is_send ? "dst " : "src ") + std::to_string(peer) + " is not another rank of the group [0, " +
              std::to_string(s.size) + ")";
  if (!problem.empty()) throw Error(std::string("[") + op + "] " + s.describe() + ": " + problem);
  TraceEntry e;
  describe_io(e, {t}, {});
  e.peer = peer;
  auto header = detail::make_header(is_send ? OpCode::kSend : OpCode::kRecv, dtype_code(t), t.numel(), t.numel(), peer, 0);
  RunFn run = is_send ? RunFn([t, peer](Backend& b, const OpContext& c) { b.send(t, peer, c); })
                      : RunFn([t, peer](Backend& b, const OpContext& c) { b.recv(t, peer, c); });
  return queue_op(s, op, true, peer, "", std::move(header), std::move(e), std::move(run), async_op);
}

}  // namespace

std::shared_ptr<Work> Communicator::send(const Tensor& t, int dst, bool async_op) {
  return point_to_point(*state_, true, t, dst, async_op);
}

std::shared_ptr<Work> Communicator::recv(const Tensor& t, int src, bool async_op) {
  return point_to_point(*state_, false, t, src, async_op);
}

void Communicator::abort() {
  auto& s = *state_;
  s.abort_with(detail::ErrorKind::Comm, "aborted by the user on rank " + std::to_string(s.rank), true);
}

std::string Communicator::dump_flight_recorder(const std::string& path) const {
  return state_->dump(path.empty() ? state_->dump_path() : path);
}

}  // namespace kiln::dist
