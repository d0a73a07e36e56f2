#pragma once
// The engines under a communicator (Gloo, NCCL): each call runs one operation to completion on the
// communicator's worker thread, or raises. The communicator above validates inputs, numbers the
// operations, records them and times them out; a backend only moves bytes and reduces.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dist.h"

namespace kiln::dist::detail {

using Clock = std::chrono::steady_clock;

struct OpContext {
  uint32_t tag = 0;  // unique among the communicator's ops in flight (p2p: the pair's message number)
  Clock::time_point deadline;
  void* ready = nullptr;  // what on_submit returned for this op
};

struct BackendInit {
  std::string name;  // the communicator's, for messages
  int rank = 0, size = 1;
  Device device;
  std::shared_ptr<Store> store;  // private to this communicator (prefixed)
  std::chrono::milliseconds timeout{30000};
  std::string hostname, iface;  // where Gloo listens
};

class Backend {
 public:
  virtual ~Backend() = default;
  // On the calling thread as an op is queued (NCCL: an event on the caller's current stream, so
  // the op runs after the kernels that wrote its inputs); handed to the op as OpContext::ready.
  virtual std::shared_ptr<void> on_submit() { return nullptr; }
  virtual void all_reduce(const Tensor& t, ReduceOp op, const OpContext& c) = 0;
  virtual void all_gather(const Tensor& out, const Tensor& in, const OpContext& c) = 0;
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const OpContext& c) = 0;
  virtual void all_to_all(const Tensor& out, const Tensor& in, const OpContext& c) = 0;
  virtual void broadcast(const Tensor& t, int root, const OpContext& c) = 0;
  virtual void send(const Tensor& t, int dst, const OpContext& c) = 0;
  virtual void recv(const Tensor& t, int src, const OpContext& c) = 0;
  virtual void barrier(const OpContext& c) = 0;
  // Bytes a small collective may carry beside each rank's input-check header, so it completes in
  // that one exchange (0: never; the same on every rank of a communicator).
  virtual size_t inline_capacity() const { return 0; }
  // The input check: all-gathers each rank's header (host int64 words) into all (size * words).
  virtual void exchange_header(const std::vector<int64_t>& mine, std::vector<int64_t>& all, const OpContext& c) = 0;
  // The point-to-point check: sends mine to peer and receives peer's into theirs.
  virtual void swap_header(const std::vector<int64_t>& mine, std::vector<int64_t>& theirs, int peer,
                           const OpContext& c) = 0;
  // Any thread, any number of times: this rank's blocked and later ops fail, and peers blocked on
  // this rank see their connections close.
  virtual void abort() noexcept = 0;

  // NCCL makes sub-communicators from the parent (collectively over all its ranks; nullptr on
  // ranks not in members); Gloo makes fresh ones over the store (these return nullptr).
  virtual bool splits_through_parent() const { return false; }
  virtual std::unique_ptr<Backend> split(const std::vector<int>& members, const BackendInit& init) {
    (void)members, (void)init;
    return nullptr;
  }
  virtual std::unique_ptr<Backend> shrink(const std::vector<int>& excluded, const BackendInit& init) {
    (void)excluded, (void)init;
    return nullptr;
  }
};

// Blocks until every rank of init joined (init.timeout); raises kiln::Error when the backend was
// not built.
std::unique_ptr<Backend> make_gloo_backend(const BackendInit& init);
std::unique_ptr<Backend> make_nccl_backend(const BackendInit& init);

}  // namespace kiln::dist::detail
