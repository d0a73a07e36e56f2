// The Gloo backend: a full mesh of TCP pairs made through kiln's store, and Gloo's own algorithms
// (ring all-reduce, ring all-gather, pairwise all-to-all, tree broadcast). Reductions Gloo lacks
// come from dist/reduce.h: bf16 / fp16 reduce through an fp32 copy; reduce-scatter is an
// all-to-all of the blocks followed by a local reduction in rank order, which moves the same
// bytes as a ring reduce-scatter and gives every rank the same bits.
#ifdef KILN_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "dist/backend.h"
#include "dist/reduce.h"
#include "dist/socket.h"

namespace kiln::dist::detail {

namespace {

using std::chrono::milliseconds;

// Gloo's rendezvous reads and writes through kiln's store.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<dist::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = s_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys, s_->timeout()); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override { s_->wait(keys, timeout); }

 private:
  std::shared_ptr<dist::Store> s_;
};

// One TCP device (and its event-loop thread) per listen address, kept for the process.
std::shared_ptr<gloo::transport::Device> device_for(const std::string& hostname, const std::string& iface) {
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::shared_ptr<gloo::transport::Device>>;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = hostname + "|" + iface;
  auto it = devices->find(key);
  if (it != devices->end()) return it->second;
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) attr.iface = iface;
  else attr.hostname = hostname;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  devices->emplace(key, dev);
  return dev;
}

// Gloo's own timeout trails the communicator's deadline a little, so the watchdog reports first
// and Gloo's wait still ends by itself soon after.
milliseconds gloo_timeout(const OpContext& c) {
  const auto left = std::chrono::duration_cast<milliseconds>(c.deadline - Clock::now()) + milliseconds(250);
  return std::max(left, milliseconds(1));
}

constexpr size_t kAllreduceSegmentBytes = size_t{2} << 20;

// Slots of point-to-point messages: a prefix byte Gloo's collectives do not use, then the pair's
// message number.
uint64_t p2p_slot(uint32_t tag, bool header) { return (uint64_t{header ? 0xA1u : 0xA0u} << 56) | tag; }

template <typename T>
void allreduce_typed(gloo::AllreduceOptions& opts, void* p, size_t n) {
  opts.setOutput<T>(static_cast<T*>(p), n);
}

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const BackendInit& init) : rank_(init.rank), size_(init.size) {
    auto dev = device_for(init.hostname, init.iface);
    ctx_ = std::make_shared<gloo::rendezvous::Context>(init.rank, init.size);
    ctx_->setTimeout(init.timeout);
    GlooStore store(init.store);
    ctx_->connectFullMesh(store, dev);
  }

  // Up to 4 KiB a rank, less past 4 ranks so the check's all-gather stays within 16 KiB.
  size_t inline_capacity() const override {
    return std::min<size_t>(4096, (16384 / static_cast<size_t>(size_)) & ~size_t{7});
  }

  void all_reduce(const Tensor& t, ReduceOp op, const OpContext& c) override {
    const size_t n = static_cast<size_t>(t.numel());
    if (n == 0) return;
    const DType dt = t.dtype();
    if (reduces_in_float32(dt)) {
      std::vector<float> buf(n);
      to_float32(t.data_ptr(), buf.data(), n, dt);
      run_allreduce(buf.data(), n, kFloat32, op, c);
      from_float32(buf.data(), t.data_ptr(), n, dt);
    } else {
      run_allreduce(t.data_ptr(), n, dt, op, c);
    }
  }

  void all_gather(const Tensor& out, const Tensor& in, const OpContext& c) override {
    if (out.nbytes() == 0) return;
    gloo::AllgatherOptions opts(ctx_);
    auto* o = static_cast<uint8_t*>(out.data_ptr());
    if (in.data_ptr() != o + static_cast<size_t>(rank_) * in.nbytes())  // else in place: no input
      opts.setInput<uint8_t>(static_cast<uint8_t*>(in.data_ptr()), in.nbytes());
    opts.setOutput<uint8_t>(o, out.nbytes());
    opts.setTag(c.tag);
    opts.setTimeout(gloo_timeout(c));
    gloo::allgather(opts);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const OpContext& c) override {
    const size_t n = static_cast<size_t>(out.numel());
    if (n == 0) return;
    std::vector<uint8_t> blocks(in.nbytes());
    if (size_ == 1) std::memcpy(blocks.data(), in.data_ptr(), in.nbytes());
    else alltoall_bytes(in.data_ptr(), blocks.data(), in.nbytes(), c);
    reduce_blocks(out.data_ptr(), blocks.data(), static_cast<size_t>(size_), n, out.dtype(), op);
  }

  void all_to_all(const Tensor& out, const Tensor& in, const OpContext& c) override {
    if (in.nbytes() == 0) return;
    if (size_ == 1) {
      std::memcpy(out.data_ptr(), in.data_ptr(), in.nbytes());
      return;
    }
    alltoall_bytes(in.data_ptr(), out.data_ptr(), in.nbytes(), c);
  }

  void broadcast(const Tensor& t, int root, const OpContext& c) override {
    if (t.nbytes() == 0 || size_ == 1) return;
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
    opts.setRoot(root);
    opts.setTag(c.tag);
    opts.setTimeout(gloo_timeout(c));
    gloo::broadcast(opts);
  }

  void send(const Tensor& t, int dst, const OpContext& c) override {
    if (t.nbytes() == 0) return;
    auto buf = ctx_->createUnboundBuffer(t.data_ptr(), t.nbytes());
    buf->send(dst, p2p_slot(c.tag, false));
    if (!buf->waitSend(gloo_timeout(c))) throw CommError("send was aborted");
  }

  void recv(const Tensor& t, int src, const OpContext& c) override {
    if (t.nbytes() == 0) return;
    auto buf = ctx_->createUnboundBuffer(t.data_ptr(), t.nbytes());
    buf->recv(src, p2p_slot(c.tag, false));
    if (!buf->waitRecv(gloo_timeout(c))) throw CommError("recv was aborted");
  }

  void barrier(const OpContext& c) override {
    if (size_ == 1) return;
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(c.tag);
    opts.setTimeout(gloo_timeout(c));
    gloo::barrier(opts);
  }

  void exchange_header(const std::vector<int64_t>& mine, std::vector<int64_t>& all, const OpContext& c) override {
    all.assign(mine.size() * static_cast<size_t>(size_), 0);
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(mine.size() * rank_));
    if (size_ == 1) return;
    gloo::AllgatherOptions opts(ctx_);
    opts.setInput<int64_t>(const_cast<int64_t*>(mine.data()), mine.size());
    opts.setOutput<int64_t>(all.data(), all.size());
    opts.setTag(c.tag);
    opts.setTimeout(gloo_timeout(c));
    gloo::allgather(opts);
  }

  void swap_header(const std::vector<int64_t>& mine, std::vector<int64_t>& theirs, int peer,
                   const OpContext& c) override {
    theirs.assign(mine.size(), 0);
    auto out = ctx_->createUnboundBuffer(const_cast<int64_t*>(mine.data()), mine.size() * 8);
    auto in = ctx_->createUnboundBuffer(theirs.data(), theirs.size() * 8);
    out->send(peer, p2p_slot(c.tag, true));
    in->recv(peer, p2p_slot(c.tag, true));
    if (!in->waitRecv(gloo_timeout(c)) || !out->waitSend(gloo_timeout(c)))
      throw CommError("header exchange was aborted");
  }

  void abort() noexcept override {
    try {
      ctx_->closeConnections();
    } catch (...) {  // a pair that never connected: nothing to close
    }
  }

 private:
  void run_allreduce(void* p, size_t n, DType dt, ReduceOp op, const OpContext& c) {
    if (size_ > 1) {
      gloo::AllreduceOptions opts(ctx_);
      switch (dt) {
        case kFloat32: allreduce_typed<float>(opts, p, n); break;
        case kFloat64: allreduce_typed<double>(opts, p, n); break;
        case kInt32: allreduce_typed<int32_t>(opts, p, n); break;
        case kInt64: allreduce_typed<int64_t>(opts, p, n); break;
        case kInt8: allreduce_typed<int8_t>(opts, p, n); break;
        case kUInt8: allreduce_typed<uint8_t>(opts, p, n); break;
        default: KILN_FAIL("all_reduce", "cannot reduce ", dtype_name(dt));
      }
      opts.setReduceFunction(reduce_fn(dt, op));
      // Gloo's ring sends segments of at most 1 MiB by default, each with its own ready / data
      // handshake; 2 MiB halves those round trips. 64 MiB float32, kiln / torch's gloo in the same
      // processes on a 2-core host: 0.94-1.18x (2 ranks), 0.90-1.04x (4) at 1 MiB; 1.06-1.17x, 0.99-1.15x at 2 MiB.
      opts.setMaxSegmentSize(kAllreduceSegmentBytes);
      opts.setTag(c.tag);
      opts.setTimeout(gloo_timeout(c));
      gloo::allreduce(opts);
    }
    if (op == ReduceOp::AVG) divide(p, n, dt, size_);
  }

  void alltoall_bytes(void* in, void* out, size_t nbytes, const OpContext& c) {
    gloo::AlltoallOptions opts(ctx_);
    opts.setInput<uint8_t>(static_cast<uint8_t*>(in), nbytes);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), nbytes);
    opts.setTag(c.tag);
    opts.setTimeout(gloo_timeout(c));
    gloo::alltoall(opts);
  }

  int rank_, size_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendInit& init) {
  net::ignore_sigpipe_once();
  return std::make_unique<GlooBackend>(init);
}

}  // namespace kiln::dist::detail

#else  // built without Gloo

#include "dist/backend.h"

namespace kiln::dist::detail {
std::unique_ptr<Backend> make_gloo_backend(const BackendInit&) {
  KILN_FAIL("new_comm", "kiln was built without Gloo (install libgloo-dev, scripts/setup.sh, and reconfigure)");
}
}  // namespace kiln::dist::detail

#endif
