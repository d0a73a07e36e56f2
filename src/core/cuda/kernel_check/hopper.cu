// Build-time check of core/cuda/hopper.cuh (cmake/KilnEmbed.cmake's kiln_kernel_check): one kernel
// calls every helper, so ptxas assembles each instruction for sm_90a during the normal build. Never
// launched; what it computes does not matter.
#include "core/cuda/hopper.cuh"

using namespace kiln::hopper;

namespace {

struct alignas(64) TensorMap {
  unsigned char bytes[128];
};

template <int N, bool kBf16>
__device__ void products(float (*d)[4], unsigned long long a, unsigned long long b, const unsigned* pa) {
  wgmma_m64_ss<N, kBf16>(d, a, b, 0);
  wgmma_m64_ss<N, kBf16, 1, 1>(d, a, b, 1);
  wgmma_m64_rs<N, kBf16>(d, pa, b, 1);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128) kiln_hopper_check(const __grid_constant__ TensorMap map,
                                                                    const float* src, float* out) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ unsigned long long bars[2];
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 1);
    mbar_init_count(&bars[1], 2);
    fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(&bars[0], 16);
    bulk_load(smem + 16384, src, 16, &bars[0]);
    mbar_arrive_expect_tx(&bars[0], 16384);
    tma_load_3d(smem, &map, &bars[0], 0, static_cast<int>(blockIdx.x), 0);
  }
  mbar_wait(&bars[0], 0);

  float d[16][4] = {};
  unsigned pa[4] = {threadIdx.x, threadIdx.x + 1, threadIdx.x + 2, threadIdx.x + 3};
  unsigned pk[2][2] = {{pa[0], pa[1]}, {pa[2], pa[3]}};
  const unsigned base = smem_u32(smem);
  const unsigned long long a = sw128_desc(base, 16), b = sw128_desc(base + 8192, 1024);
  reg_fence<16>(d);
  wg_fence();
  products<64, true>(d, a, b, pa);
  products<64, false>(d, a, b, pa);
  products<128, true>(d, a, b, pa);
  products<128, false>(d, a, b, pa);
  wg_commit();
  wg_wait<1>();
  reg_fence_pk<2>(pk);
  wg_wait_all();
  reg_fence<16>(d);

  float sum = 0.f;
  for (int i = 0; i < 16; ++i) sum += d[i][0] + d[i][1] + d[i][2] + d[i][3];
  reinterpret_cast<float*>(smem)[threadIdx.x] = sum + static_cast<float>(pk[1][1]);
  if (threadIdx.x == 0) mbar_arrive(&bars[1]);
  if (threadIdx.x == 1) mbar_arrive_n(&bars[1], 1);
  mbar_wait(&bars[1], 0);
  fence_async_smem();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store_3d(&map, smem, 0, static_cast<int>(blockIdx.x), 0);
    bulk_commit();
    bulk_wait_read<0>();
    bulk_wait<0>();
    fence_async_global();
    out[blockIdx.x] = sum;
  }
}
