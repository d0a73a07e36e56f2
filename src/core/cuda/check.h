#pragma once
// Every CUDA runtime call goes through KILN_CUDA_CHECK: a failure becomes a kiln::Error naming
// the call, the error and the place, never an abort.
#include <cuda_runtime.h>

#include "kiln/error.h"

#define KILN_CUDA_CHECK(call)                                                              \
  do {                                                                                     \
    cudaError_t kiln_err_ = (call);                                                        \
    if (kiln_err_ != cudaSuccess)                                                          \
      KILN_FAIL("cuda", #call, " failed: ", cudaGetErrorString(kiln_err_), " (", __FILE__, \
                ":", __LINE__, ")");                                                       \
  } while (0)

// After a kernel launch: reports bad launch configurations at the launching op.
#define KILN_CUDA_CHECK_LAUNCH(op)                                                         \
  do {                                                                                     \
    cudaError_t kiln_err_ = cudaGetLastError();                                            \
    if (kiln_err_ != cudaSuccess)                                                          \
      KILN_FAIL(op, "kernel launch failed: ", cudaGetErrorString(kiln_err_), " (", __FILE__, \
                ":", __LINE__, ")");                                                       \
  } while (0)

namespace kiln::cuda {

cudaStream_t current_raw_stream(int device);

// Switches the current device for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace kiln::cuda
