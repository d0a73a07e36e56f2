// C = beta * C + bias (row-broadcast) over a strided batch of row-major matrices, for gemm calls
// whose bias cuBLASLt cannot fuse (and k == 0). One thread per element in a grid-stride loop:
// the pass is memory-bound and rare, so simplicity wins over vector widths.
#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "ops/cuda/cublaslt.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename C, typename B>
__global__ void add_bias_rows_kernel(C* c, int64_t ldc, int64_t stride_c, int64_t m, int64_t n, int64_t total,
                                     dacc_t<C> beta, const B* bias) {
  using A = dacc_t<C>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % n, row = (i / n) % m, p = i / (n * m);
    C* dst = c + p * stride_c + row * ldc + j;
    A v = beta == A(0) ? A(0) : beta * convert<A>(*dst);  // beta == 0 never reads C (may be garbage)
    if (bias != nullptr) v += convert<A>(bias[j]);
    *dst = convert<C>(v);
  }
}

}  // namespace

void add_bias_rows(DType c_type, void* c, int64_t ldc, int64_t stride_c, int64_t batch, int64_t m, int64_t n,
                   double beta, DType bias_type, const void* bias, cudaStream_t stream) {
  const int64_t total = batch * m * n;
  if (total == 0) return;
  dispatch_floating(c_type, "gemm", [&](auto ctag) {
    using C = device_t<typename decltype(ctag)::type>;
    using A = dacc_t<C>;
    auto launch = [&](auto btag) {
      using B = device_t<typename decltype(btag)::type>;
      add_bias_rows_kernel<C, B><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<C*>(c), ldc, stride_c, m, n, total, static_cast<A>(beta), static_cast<const B*>(bias));
      KILN_CUDA_CHECK_LAUNCH("gemm");
    };
    if (bias != nullptr && bias_type != c_type) {
      launch(TypeTag<float>{});  // the only mixed case gemm accepts: fp32 bias on a 16-bit output
    } else {
      launch(ctag);
    }
  });
}

}  // namespace kiln::cuda
