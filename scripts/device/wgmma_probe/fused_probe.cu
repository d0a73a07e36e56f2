// Checks the primitives a fused FlexAttention backward would need (dQ formed in the dK/dV kernel, as
// FlashAttention-3 does), in isolation on the generated source's helpers (generated.cu from gen.cpp
// at E = 128), against a host reference:
//   1. dS^T from accumulator fragments (two warpgroups' 64 kv rows each, q columns) written into a
//      128-byte-swizzled shared tile [128 kv x 64 q] as bf16;
//   2. dQ [64 q x 128] = dS [64 q x 128 kv] K [128 kv x 128] by wgmma with both operands from shared
//      memory, A M-major (the dS^T tile) and B N-major (K's rows are kv), warpgroup w taking columns
//      64 w.. (the kernels' wg_ab_tt);
//   3. the fp32 partials added into a global accumulator by one bulk reduction a CTA
//      (cp.reduce.async.bulk .add.f32), CTAs taking turns by a semaphore (a fixed order), so the sum
//      is bit for bit the host's fp32 sum of the partials in CTA order.
// Build: nvcc -arch=sm_90a -I DIR fused_probe.cu (DIR holding generated.cu for E = 128).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bf16_host.h"
#include "generated.cu"

#if HEAD_DIM != 128
#error "the probe splits E = 128 between two warpgroups"
#endif
constexpr int kKv = 128, kQ = 64, kE = HEAD_DIM, kCtas = 4;

// One CTA a contribution: dst [kKv x kQ] fp32 (dS^T, rounded to bf16 here), k [kKv x kE] bf16.
// Writes its partial dQ to part [kQ x kE] and adds it into acc in turn (sem: the turns taken).
extern "C" __global__ void __launch_bounds__(256) fused_probe(const float* dst, const u16* k, float* part, float* acc,
                                                              unsigned* sem) {
  extern __shared__ __align__(16) u16 smem[];
  u16* dSt = wg_smem_base(smem);                 // [128 kv rows x 64 q] swizzled, one panel
  u16* Ks = dSt + kKv * kQ;                      // [128 kv rows x 128] swizzled, two 64-column panels
  float* dQbuf = (float*)(Ks + kKv * kE);        // [64 q x 128] fp32, row-major (the accumulator's layout)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wg = warp >> 2;
  const float* mine = dst + (size_t)blockIdx.x * kKv * kQ;
  load_tile_async<true>(Ks, k, 0, kKv, kKv, 256);
  cp_async_commit();
  // 1. This thread's accumulator fragments of dS^T (rows kv, columns q), as bf16 into the swizzled tile.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wg * 64 + (warp & 3) * 16 + g + 8 * r;
#pragma unroll
    for (int n = 0; n < kQ / 8; ++n) {
      const float lo = mine[row * kQ + n * 8 + 2 * t], hi = mine[row * kQ + n * 8 + 2 * t + 1];
      *(u32*)((char*)dSt + row * 128 + ((n ^ (row & 7)) << 4) + 4 * t) = pack2(lo, hi);
    }
  }
  cp_async_wait<0>();
  fence_async_smem();  // the generic-proxy writes, before wgmma reads them
  __syncthreads();
  // 2. dQ[:, 64 wg ..] = dS K: k16 steps over kv; A at kv rows 16 kk.. of the dS^T panel, B at the
  //    same rows of K's panel wg.
  float d[8][4];
  wg_ab_tt<kKv>(d, smem_addr(dSt), smem_addr(Ks) + wg * kKv * 128);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = (warp & 3) * 16 + g + 8 * (e >> 1), col = wg * 64 + n * 8 + 2 * t + (e & 1);
      part[(size_t)blockIdx.x * kQ * kE + row * kE + col] = d[n][e];
      dQbuf[row * kE + col] = d[n][e];
    }
  fence_async_smem();  // the partial's generic-proxy writes, before the bulk reduction reads them
  __syncthreads();
  // 3. The partial into acc in CTA order: wait for this CTA's turn, one bulk reduction, wait for its
  //    writes, then pass the turn.
  if (threadIdx.x == 0) {
    unsigned turn;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(turn) : "l"(sem) : "memory");
    } while (turn != blockIdx.x);
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(acc),
                 "r"(smem_addr(dQbuf)), "r"(kQ * kE * 4)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");  // the async-proxy writes, before the release
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sem) : "memory");
  }
}


int main() {
  std::vector<float> dst((size_t)kCtas * kKv * kQ);
  std::vector<u16> k((size_t)kKv * kE);
  unsigned seed = 777;
  auto rnd = [&] {
    seed = seed * 1664525u + 1013904223u;
    return ((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  };
  for (auto& x : dst) x = rnd();
  for (auto& x : k) x = to_bf(rnd());
  float *d_dst, *d_part, *d_acc;
  u16* d_k;
  unsigned* d_sem;
  cudaMalloc(&d_dst, dst.size() * 4);
  cudaMalloc(&d_k, k.size() * 2);
  cudaMalloc(&d_part, (size_t)kCtas * kQ * kE * 4);
  cudaMalloc(&d_acc, (size_t)kQ * kE * 4);
  cudaMalloc(&d_sem, 4);
  cudaMemcpy(d_dst, dst.data(), dst.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_k, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
  const int smem = (kKv * kQ + kKv * kE) * 2 + kQ * kE * 4 + 1024;
  cudaFuncSetAttribute(fused_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  std::vector<float> acc_runs[2];
  std::vector<float> part((size_t)kCtas * kQ * kE);
  for (int run = 0; run < 2; ++run) {
    cudaMemset(d_acc, 0, (size_t)kQ * kE * 4);
    cudaMemset(d_sem, 0, 4);
    fused_probe<<<kCtas, 256, smem>>>(d_dst, d_k, d_part, d_acc, d_sem);
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("fused probe launch failed: %s\n", cudaGetErrorString(err));
      return 1;
    }
    acc_runs[run].resize((size_t)kQ * kE);
    cudaMemcpy(acc_runs[run].data(), d_acc, acc_runs[run].size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(part.data(), d_part, part.size() * 4, cudaMemcpyDeviceToHost);
  }
  // 2. Each partial against dS (rounded to bf16) K in double.
  double worst = 0;
  for (int c = 0; c < kCtas; ++c)
    for (int q = 0; q < kQ; ++q)
      for (int e = 0; e < kE; ++e) {
        double ref = 0;
        for (int kv = 0; kv < kKv; ++kv)
          ref += double(bf(to_bf(dst[((size_t)c * kKv + kv) * kQ + q]))) * bf(k[(size_t)kv * kE + e]);
        const double got = part[((size_t)c * kQ + q) * kE + e];
        worst = std::max(worst, std::fabs(got - ref) / (1.0 + std::fabs(ref)));
      }
  const bool prod_ok = worst < 1e-4;
  std::printf("probe dQ = dS K (A M-major, B N-major, %d CTAs): max rel err %.3g -> %s\n", kCtas, worst,
              prod_ok ? "OK" : "WRONG");
  // 3. The accumulator: bit for bit the fp32 sum of the partials in CTA order, both runs.
  int mismatches = 0;
  for (int i = 0; i < kQ * kE; ++i) {
    float s = 0.f;
    for (int c = 0; c < kCtas; ++c) s += part[(size_t)c * kQ * kE + i];
    uint32_t a, b, h;
    std::memcpy(&a, &acc_runs[0][i], 4);
    std::memcpy(&b, &acc_runs[1][i], 4);
    std::memcpy(&h, &s, 4);
    mismatches += (a != h) + (b != h);
  }
  std::printf("probe ordered bulk reductions: %d of %d sums differ from the host's in-order fp32 sum -> %s\n",
              mismatches, 2 * kQ * kE, mismatches == 0 ? "OK" : "WRONG");
  return prod_ok && mismatches == 0 ? 0 : 1;
}
