// Current stream per (thread, device), as in PyTorch; the default is the legacy default stream.
#include <array>

#include "core/cuda/check.h"
#include "kiln/cuda.h"

namespace kiln {

bool cuda_is_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace cuda {
namespace {
constexpr int kMaxDevices = 64;
thread_local std::array<Stream, kMaxDevices> tls_current_streams;

int resolve(int device) {
  if (device < 0) device = current_device();
  KILN_CHECK(device < kMaxDevices, "cuda", "device index ", device, " out of range");
  return device;
}
}  // namespace

cudaStream_t current_raw_stream(int device) {
  return static_cast<cudaStream_t>(tls_current_streams[resolve(device)].handle());
}

Stream Stream::create(int device) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Stream out;
  out.handle_ = std::shared_ptr<void>(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  out.device_ = device;
  return out;
}

void Stream::synchronize() const { KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle()))); }

Stream current_stream(int device) { return tls_current_streams[resolve(device)]; }
void set_current_stream(const Stream& stream) { tls_current_streams[resolve(stream.device())] = stream; }

namespace {
// After a failed runtime call: a missing GPU or driver raises check_available's plain message,
// else the caller repeats the call for the runtime's own error. Only on failure: current_device
// sits under every op's stream lookup.
void explain_failure(int device, const char* op) {
  cudaGetLastError();
  check_available(device, op);
}
}  // namespace

int current_device() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    explain_failure(0, "cuda.current_device");
    KILN_CUDA_CHECK(cudaGetDevice(&d));
  }
  return d;
}
void set_device(int device) {
  if (cudaSetDevice(device) != cudaSuccess) {
    explain_failure(device, "cuda.set_device");
    KILN_CUDA_CHECK(cudaSetDevice(device));
  }
}

void synchronize(int device) {
  check_available(device < 0 ? 0 : device, "cuda.synchronize");
  DeviceGuard guard(resolve(device));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}
StreamGuard::~StreamGuard() { tls_current_streams[previous_.device()] = previous_; }

Event::Event() {
  cudaEvent_t e = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&e));
  handle_ = std::shared_ptr<void>(e, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}
void Event::record(const Stream& stream) {
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_.get()),
                                  static_cast<cudaStream_t>(stream.handle())));
}
void Event::synchronize() const { KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_.get()))); }
float Event::elapsed_ms(const Event& later) const {
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_.get()),
                                       static_cast<cudaEvent_t>(later.handle_.get())));
  return ms;
}

}  // namespace cuda
}  // namespace kiln
