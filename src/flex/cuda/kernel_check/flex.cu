// Build-time check of FlexAttention's kernel source (cmake/KilnEmbed.cmake's kiln_kernel_check): its
// embedded parts included as the NVRTC source includes them, compiled by nvcc for sm_90a during the
// normal build. Never launched.
#include "flex/cuda/flex_params.cuh"

// The block arrives by value in parameter memory, as the generated kernels take it.
extern "C" __global__ void flex_params_check(const FlexParams P) {
  if (threadIdx.x == 0 && P.err)
    *P.err = static_cast<int>(P.B * P.Hq + P.msize[kiln::flex::cuda::kMaxBuffers - 1][2] + P.qmap[127] +
                              P.dqmap[0]) + P.kv_num[0];
}
