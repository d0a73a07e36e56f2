// The NCCL backend: one NCCL communicator (non-blocking config, so no call can hang the worker) and
// one stream per kiln communicator. Each op waits for the caller's stream at the time it was
// queued, runs on the communicator's stream, and the worker polls its completion event against
// the deadline; abort() is ncclCommAbort. The input check all-gathers its header through NCCL too.
#ifdef KILN_WITH_NCCL
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "core/cuda/check.h"
#include "dist/backend.h"
#include "dist/cuda/nccl_api.h"
#include "kiln/cuda.h"

#define KILN_NCCL_CHECK(comm, call)                                                                        \
  do {                                                                                                     \
    ncclResult_t kiln_nccl_ = (call);                                                                      \
    if (kiln_nccl_ != ncclSuccess && kiln_nccl_ != ncclInProgress)                                         \
      throw ::kiln::dist::CommError(::kiln::detail::str_cat("[nccl] ", #call, " failed: ",                 \
                                                            nccl().GetErrorString(kiln_nccl_), " (",          \
                                                            (comm) ? nccl().GetLastError(comm) : "", ") (", \
                                                            __FILE__, ":", __LINE__, ")"));                \
  } while (0)

namespace kiln::dist::detail {

namespace {

using ::kiln::detail::str_cat;

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kFloat16: return ncclFloat16;
    case kBFloat16: return ncclBfloat16;
    case kInt32: return ncclInt32;
    case kInt64: return ncclInt64;
    case kInt8: return ncclInt8;
    case kUInt32: return ncclUint32;
    case kUInt16: return ncclFloat16;  // moved as 16-bit words (never reduced: reduce_problem refuses it)
    default: return ncclUint8;  // uint8, bool: moved as bytes
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::AVG: return ncclAvg;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::PRODUCT: return ncclProd;
    default: return ncclSum;
  }
}

// Polls a non-blocking communicator until its last call finished (or the deadline).
void wait_ready(ncclComm_t comm, Clock::time_point deadline, const char* what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    KILN_NCCL_CHECK(comm, nccl().CommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      throw CommError(str_cat("[nccl] ", what, " failed: ", nccl().GetErrorString(state), " (", nccl().GetLastError(comm), ")"));
    if (Clock::now() >= deadline) throw TimeoutError(str_cat("[nccl] ", what, " timed out"));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclBackend final : public Backend {
 public:
  // Adopts comm (from a split or shrink) or, when comm is null, makes one through init.store.
  NcclBackend(const BackendInit& init, ncclComm_t comm) : rank_(init.rank), size_(init.size), device_(init.device.index) {
    cuda::DeviceGuard guard(device_);
    if (!comm) {
      ncclUniqueId id;
      if (rank_ == 0) {
        KILN_NCCL_CHECK(nullptr, nccl().GetUniqueId(&id));
        init.store->set("nccl_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
      } else {
        const std::string v = init.store->get("nccl_id");
        KILN_CHECK(v.size() == sizeof(id), "new_comm", "malformed NCCL unique id in the store");
        std::memcpy(&id, v.data(), sizeof(id));
      }
      ncclConfig_t config = nonblocking_config();
      KILN_NCCL_CHECK(nullptr, nccl().CommInitRankConfig(&comm, size_, id, rank_, &config));
      try {
        wait_ready(comm, Clock::now() + init.timeout, "ncclCommInitRankConfig");
      } catch (...) {
        nccl().CommAbort(comm);
        throw;
      }
    }
    comm_ = comm;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    scratch_tensor_ = empty({static_cast<int64_t>(kScratchBytes)}, TensorOptions(kUInt8).device(init.device));
    scratch_ = scratch_tensor_.data_ptr();
  }

  ~NcclBackend() override {
    cuda::DeviceGuard guard(device_);
    {
      // A non-blocking communicator is finalized (polled, bounded) before it is destroyed; one
      // that does not finish in time is aborted instead.
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_) {
        const ncclResult_t fin = nccl().CommFinalize(comm_);
        bool clean = fin == ncclSuccess || fin == ncclInProgress;
        const auto until = Clock::now() + std::chrono::seconds(10);
        ncclResult_t state = ncclInProgress;
        while (clean && state == ncclInProgress && Clock::now() < until) {
          if (nccl().CommGetAsyncError(comm_, &state) != ncclSuccess) clean = false;
          if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if (clean && state == ncclSuccess) nccl().CommDestroy(comm_);
        else nccl().CommAbort(comm_);
      }
      comm_ = nullptr;
    }
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  std::shared_ptr<void> on_submit() override {
    // The caller's stream at queue time: the op runs after the kernels that wrote its inputs.
    cuda::DeviceGuard guard(device_);
    cudaEvent_t ev;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(cuda::current_stream(device_).handle())));
    return std::shared_ptr<void>(ev, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  }

  void all_reduce(const Tensor& t, ReduceOp op, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) {
      return nccl().AllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm, stream_);
    });
  }
  void all_gather(const Tensor& out, const Tensor& in, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) {
      return nccl().AllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.dtype()), comm, stream_);
    });
  }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) {
      return nccl().ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.dtype()), nccl_op(op), comm,
                               stream_);
    });
  }
  void all_to_all(const Tensor& out, const Tensor& in, const OpContext& c) override {
    const size_t chunk = in.nbytes() / static_cast<size_t>(size_);
    run(c, [&](ncclComm_t comm) {
      ncclResult_t r = nccl().GroupStart();
      for (int p = 0; p < size_ && (r == ncclSuccess || r == ncclInProgress); ++p) {
        r = nccl().Send(static_cast<char*>(in.data_ptr()) + p * chunk, chunk, ncclUint8, p, comm, stream_);
        if (r == ncclSuccess || r == ncclInProgress)
          r = nccl().Recv(static_cast<char*>(out.data_ptr()) + p * chunk, chunk, ncclUint8, p, comm, stream_);
      }
      const ncclResult_t e = nccl().GroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? e : r;
    });
  }
  void broadcast(const Tensor& t, int root, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) {
      return nccl().Broadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), root, comm, stream_);
    });
  }
  void send(const Tensor& t, int dst, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) { return nccl().Send(t.data_ptr(), t.nbytes(), ncclUint8, dst, comm, stream_); });
  }
  void recv(const Tensor& t, int src, const OpContext& c) override {
    run(c, [&](ncclComm_t comm) { return nccl().Recv(t.data_ptr(), t.nbytes(), ncclUint8, src, comm, stream_); });
  }
  void barrier(const OpContext& c) override {
    run(c, [&](ncclComm_t comm) { return nccl().AllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm, stream_); });
  }

  void exchange_header(const std::vector<int64_t>& mine, std::vector<int64_t>& all, const OpContext& c) override {
    const size_t words = mine.size();
    all.assign(words * static_cast<size_t>(size_), 0);
    KILN_CHECK(all.size() * 8 <= kScratchBytes, "nccl", "input-check header too large");
    auto* dev = static_cast<int64_t*>(scratch_);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dev + words * rank_, mine.data(), words * 8, cudaMemcpyHostToDevice, stream_));
    run(c, [&](ncclComm_t comm) {
      return nccl().AllGather(dev + words * rank_, dev, words, ncclInt64, comm, stream_);
    });
    KILN_CUDA_CHECK(cudaMemcpy(all.data(), dev, all.size() * 8, cudaMemcpyDeviceToHost));
  }

  void swap_header(const std::vector<int64_t>& mine, std::vector<int64_t>& theirs, int peer,
                   const OpContext& c) override {
    const size_t words = mine.size();
    theirs.assign(words, 0);
    auto* dev = static_cast<int64_t*>(scratch_);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dev, mine.data(), words * 8, cudaMemcpyHostToDevice, stream_));
    run(c, [&](ncclComm_t comm) {
      ncclResult_t r = nccl().GroupStart();
      if (r == ncclSuccess) r = nccl().Send(dev, words, ncclInt64, peer, comm, stream_);
      if (r == ncclSuccess || r == ncclInProgress) r = nccl().Recv(dev + words, words, ncclInt64, peer, comm, stream_);
      const ncclResult_t e = nccl().GroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? e : r;
    });
    KILN_CUDA_CHECK(cudaMemcpy(theirs.data(), dev + words, words * 8, cudaMemcpyDeviceToHost));
  }

  void abort() noexcept override {
    aborted_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_) nccl().CommAbort(comm_);
    comm_ = nullptr;
  }

  bool splits_through_parent() const override { return true; }

  std::unique_ptr<Backend> split(const std::vector<int>& members, const BackendInit& init) override {
    const bool member = init.rank >= 0;
    ncclComm_t child = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      KILN_CHECK(comm_ != nullptr, "split", "the NCCL communicator was aborted");
      cuda::DeviceGuard guard(device_);
      ncclConfig_t config = nonblocking_config();
      KILN_NCCL_CHECK(comm_, nccl().CommSplit(comm_, member ? 0 : NCCL_SPLIT_NOCOLOR, rank_, &child, &config));
      wait_ready(comm_, Clock::now() + init.timeout, "ncclCommSplit");
    }
    (void)members;
    if (!member || !child) return nullptr;
    wait_ready(child, Clock::now() + init.timeout, "ncclCommSplit");
    return std::make_unique<NcclBackend>(init, child);
  }

  // ncclCommShrink when every survivor's parent is healthy (agreed through the store); otherwise
  // nullptr, and the survivors make a fresh communicator over the store.
  std::unique_ptr<Backend> shrink(const std::vector<int>& excluded, const BackendInit& init) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    const bool healthy = !aborted_;
    init.store->set("healthy/" + std::to_string(init.rank), healthy ? "1" : "0");
    std::vector<std::string> keys;
    for (int r = 0; r < init.size; ++r) keys.push_back("healthy/" + std::to_string(r));
    init.store->wait(keys, init.timeout);
    for (const auto& v : init.store->multi_get(keys))
      if (v.second != "1") return nullptr;
    ncclComm_t child = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!comm_) return nullptr;
      cuda::DeviceGuard guard(device_);
      std::vector<int> excl = excluded;
      ncclConfig_t config = nonblocking_config();
      if (excl.empty())  // nothing to leave out: a copy of the parent
        KILN_NCCL_CHECK(comm_, nccl().CommSplit(comm_, 0, rank_, &child, &config));
      else
        KILN_NCCL_CHECK(comm_, nccl().CommShrink(comm_, excl.data(), static_cast<int>(excl.size()), &child, &config,
                                              NCCL_SHRINK_DEFAULT));
      // On a non-blocking parent the child handle is set once the parent's call has finished.
      wait_ready(comm_, Clock::now() + init.timeout, "ncclCommShrink");
    }
    KILN_CHECK(child != nullptr, "shrink", "NCCL returned no communicator");
    wait_ready(child, Clock::now() + init.timeout, "ncclCommShrink");
    return std::make_unique<NcclBackend>(init, child);
#else
    (void)excluded, (void)init;
    return nullptr;
#endif
  }

 private:
  static constexpr size_t kScratchBytes = 1 << 16;

  // Enqueues one NCCL call (after the caller's stream) and polls its completion until the deadline.
  template <typename F>
  void run(const OpContext& c, F&& call) {
    cuda::DeviceGuard guard(device_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_ || !comm_) throw CommError("[nccl] the communicator was aborted");
      if (c.ready) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(c.ready), 0));
      KILN_NCCL_CHECK(comm_, call(comm_));
      wait_ready(comm_, c.deadline, "enqueue");
      KILN_CUDA_CHECK(cudaEventRecord(done_, stream_));
    }
    for (auto pause = std::chrono::microseconds(2);; pause = std::min(pause * 2, std::chrono::microseconds(500))) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) KILN_CUDA_CHECK(q);
      if (aborted_) throw CommError("[nccl] the communicator was aborted");
      {
        std::lock_guard<std::mutex> lock(mu_);
        ncclResult_t state = ncclSuccess;
        if (comm_ && nccl().CommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
          throw CommError(str_cat("[nccl] ", nccl().GetErrorString(state), " (", nccl().GetLastError(comm_), ")"));
      }
      if (Clock::now() >= c.deadline) throw TimeoutError("[nccl] Timed out waiting for the operation");
      std::this_thread::sleep_for(pause);
    }
  }

  int rank_, size_, device_;
  std::mutex mu_;
  std::atomic<bool> aborted_{false};
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  Tensor scratch_tensor_;  // the barrier's word and the input-check headers
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const BackendInit& init) {
  return std::make_unique<NcclBackend>(init, nullptr);
}

}  // namespace kiln::dist::detail

#else  // CUDA without NCCL headers / library

#include "dist/backend.h"

namespace kiln::dist::detail {
std::unique_ptr<Backend> make_nccl_backend(const BackendInit&) {
  KILN_FAIL("new_comm", "kiln was built without NCCL (nccl.h / libnccl not found at configure time)");
}
}  // namespace kiln::dist::detail

namespace kiln::dist {
std::string nccl_version() {
  KILN_FAIL("nccl_version", "kiln was built without NCCL (nccl.h / libnccl not found at configure time)");
}
}  // namespace kiln::dist

#endif
