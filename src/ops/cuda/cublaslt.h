#pragma once
// cuBLASLt plumbing behind cuda::gemm (ops/cuda/gemm.h): the status check macro, the per-device
// handle, the per-stream workspace, and the bias fallback kernel. Internal to src/ops/cuda.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/error.h"

// Every cuBLASLt call goes through this: a failure becomes a kiln::Error with the call text, the
// status and the place.
#define KILN_CUBLAS_CHECK(call)                                                                \
  do {                                                                                         \
    cublasStatus_t kiln_status_ = (call);                                                      \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      KILN_FAIL("cublasLt", #call, " failed: ", cublasLtGetStatusName(kiln_status_), " (",    \
                cublasLtGetStatusString(kiln_status_), ") (", __FILE__, ":", __LINE__, ")");   \
  } while (0)

namespace kiln::cuda {

// Created on first use for `device`, kept for the process.
cublasLtHandle_t cublaslt_handle(int device);
// gemm_workspace_bytes() of device memory for work on `stream`, from kiln's allocator.
void* cublaslt_workspace(int device, cudaStream_t stream);

// C[p, i, j] = beta * C[p, i, j] + bias[j] for p < batch, i < m, j < n (C row stride ldc, batch
// stride stride_c); beta == 0 never reads C. Used when no cuBLASLt algorithm fuses the bias.
void add_bias_rows(DType c_type, void* c, int64_t ldc, int64_t stride_c, int64_t batch, int64_t m, int64_t n,
                   double beta, DType bias_type, const void* bias, cudaStream_t stream);

}  // namespace kiln::cuda
