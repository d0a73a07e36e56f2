#pragma once
// CUDA streams and events. Kernels launch on the current stream of their device (per thread,
// as in PyTorch). Built without CUDA, these throw kiln::Error when used.
#include <memory>

#include "kiln/device.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// A CUDA stream (opaque: cudaStream_t). The default-constructed handle is the legacy default stream.
class Stream {
 public:
  Stream() = default;
  static Stream create(int device = 0);  // a new non-blocking stream, destroyed with its last copy
  // Wraps a stream someone else owns (e.g. torch's current stream; nullptr: the legacy default
  // stream) without taking ownership: the owner must keep it alive while kiln uses it.
  static Stream external(void* handle, int device) {
    Stream s;
    s.handle_ = std::shared_ptr<void>(handle, [](void*) {});
    s.device_ = device;
    return s;
  }
  void* handle() const { return handle_ ? handle_.get() : nullptr; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  std::shared_ptr<void> handle_;
  int device_ = 0;
};

// Throws kiln::Error("[op] no CUDA device: ...") unless cuda:<device> can hold tensors here: kiln
// built with CUDA, an NVIDIA driver loaded, the index present. The message says which is missing
// ("this machine has no NVIDIA driver / GPU"). Jobs call it before any expensive work; the
// allocator, current_device, set_device and synchronize call it too.
void check_available(int device, const char* op);

Stream current_stream(int device = -1);  // -1: the current device
void set_current_stream(const Stream& stream);
int current_device();
void set_device(int device);
void synchronize(int device = -1);  // waits for all work on the device

// Makes `stream` current for the scope, restoring the previous one on exit.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Timing events (cudaEvent_t with timing enabled).
class Event {
 public:
  Event();
  void record(const Stream& stream = current_stream());
  void synchronize() const;
  float elapsed_ms(const Event& later) const;  // from this event to `later`

 private:
  std::shared_ptr<void> handle_;
};

// The Philox state of one CUDA device as an int64 [2] CPU tensor {seed (bits), counter offset}
// (torch.cuda.get_rng_state). It is generator bookkeeping only, so it works without a GPU.
// device -1: the current device.
Tensor get_rng_state(int device = -1);
void set_rng_state(const Tensor& state, int device = -1);

}  // namespace kiln::cuda
