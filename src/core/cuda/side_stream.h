// A second stream of a device beside the op's stream (created once per device, kept for the
// process), joined to the op's stream through one event: follow() orders the side after the work
// queued so far on the main stream, join() the main stream after the side's. The destructor joins
// too, so buffers freed on the main stream (stream-ordered) outlive the side's reads even when an
// error unwinds the caller. Users: the fused loss's dW GEMMs, FlexAttention's dK/dV kernel.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "core/cuda/check.h"
#include "kiln/cuda.h"

namespace kiln::cuda {

class SideStream {
 public:
  SideStream(int device, void* main) : main_(static_cast<cudaStream_t>(main)), side_(stream_of(device)) {
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
  }
  ~SideStream() {
    if (cudaEventRecord(ev_, side_) != cudaSuccess || cudaStreamWaitEvent(main_, ev_, 0) != cudaSuccess)
      cudaGetLastError();
    cudaEventDestroy(ev_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void* stream() const { return side_; }
  void follow() { order(main_, side_); }
  void join() { order(side_, main_); }

 private:
  void order(cudaStream_t before, cudaStream_t after) {
    KILN_CUDA_CHECK(cudaEventRecord(ev_, before));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(after, ev_, 0));
  }
  static cudaStream_t stream_of(int device) {
    static std::mutex mu;
    static auto* streams = new std::unordered_map<int, Stream>;  // process lifetime
    std::lock_guard<std::mutex> lock(mu);
    auto it = streams->find(device);
    if (it == streams->end()) it = streams->emplace(device, Stream::create(device)).first;
    return static_cast<cudaStream_t>(it->second.handle());
  }
  cudaStream_t main_, side_;
  cudaEvent_t ev_ = nullptr;
};

}  // namespace kiln::cuda
