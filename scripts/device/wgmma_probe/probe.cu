// Checks the wgmma forward's two products in isolation against a host reference: S = Q K^T
// (wg_abt) and O = P V (wg_pb), on the generated source (generated.cu, from gen.cpp),
// printing where wrong elements landed. Build: nvcc -arch=sm_90a -I DIR probe.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_host.h"
#include "generated.cu"

// One CTA: Q [FWD_TILE_M x E], K and V [FWD_TILE_N x E]; writes S [FWD_TILE_M x FWD_TILE_N] and
// O = round(S) V [FWD_TILE_M x E] in fp32 through the accumulator layout the kernel assumes.
extern "C" __global__ void __launch_bounds__(FWD_THREADS) probe(const u16* q, const u16* k, const u16* v, float* s_out,
                                                                float* o_out) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = wg_smem_base(smem);
  u16* Ks = Qs + FWD_TILE_M * HEAD_DIM;
  u16* Vs = Ks + FWD_TILE_N * HEAD_DIM;
  load_tile_async<true>(Qs, q, 0, FWD_TILE_M, FWD_TILE_M, FWD_THREADS);
  load_tile_async<true>(Ks, k, 0, FWD_TILE_N, FWD_TILE_N, FWD_THREADS);
  load_tile_async<true>(Vs, v, 0, FWD_TILE_N, FWD_TILE_N, FWD_THREADS);
  cp_async_commit();
  cp_async_wait<0>();
  fence_async_smem();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float s[FWD_TILE_N / 8][4];
  wg_abt<FWD_TILE_N>(s, Qs, FWD_TILE_M, (warp >> 2) * 64, Ks);
  u32 pk[FWD_TILE_N / 8][2];
  for (int n = 0; n < FWD_TILE_N / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + g + 8 * (e >> 1), col = n * 8 + 2 * t + (e & 1);
      s_out[row * FWD_TILE_N + col] = s[n][e];
    }
  for (int n = 0; n < FWD_TILE_N / 8; ++n)
    for (int r = 0; r < 2; ++r) pk[n][r] = pack2(s[n][2 * r], s[n][2 * r + 1]);
  float o[HEAD_DIM / 8][4];
  for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  wg_pb<FWD_TILE_N>(o, pk, Vs);
  for (int n = 0; n < HEAD_DIM / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + g + 8 * (e >> 1), col = n * 8 + 2 * t + (e & 1);
      o_out[row * HEAD_DIM + col] = o[n][e];
    }
}


// Reports max error and, for the first wrong elements, where the expected value sits instead.
static bool compare(const char* what, const std::vector<float>& got, const std::vector<double>& ref, int rows, int cols) {
  double worst = 0;
  int shown = 0;
  for (int i = 0; i < rows * cols; ++i) {
    const double err = std::fabs(got[i] - ref[i]) / (1.0 + std::fabs(ref[i]));
    worst = std::max(worst, err);
    if (err > 2e-2 && shown < 6) {
      int found = -1;
      for (int j = 0; j < rows * cols && found < 0; ++j)
        if (std::fabs(got[j] - ref[i]) / (1.0 + std::fabs(ref[i])) < 1e-3) found = j;
      std::printf("  %s (%d,%d): got %.4f want %.4f; the wanted value is at %d,%d\n", what, i / cols, i % cols, got[i],
                  ref[i], found < 0 ? -1 : found / cols, found < 0 ? -1 : found % cols);
      ++shown;
    }
  }
  const bool ok = worst < 2e-2;
  std::printf("probe %s %dx%d (E=%d): max rel err %.3g -> %s\n", what, rows, cols, HEAD_DIM, worst, ok ? "OK" : "WRONG");
  return ok;
}

int main() {
  const int M = FWD_TILE_M, N = FWD_TILE_N, E = HEAD_DIM;
  std::vector<u16> q(M * E), k(N * E), v(N * E);
  unsigned seed = 12345;
  auto rnd = [&] {
    seed = seed * 1664525u + 1013904223u;
    return ((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  };
  for (auto& x : q) x = to_bf(rnd());
  for (auto& x : k) x = to_bf(rnd());
  for (auto& x : v) x = to_bf(rnd());
  std::vector<double> s_ref(M * N), o_ref(M * E, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = 0;
      for (int e = 0; e < E; ++e) acc += double(bf(q[i * E + e])) * bf(k[j * E + e]);
      s_ref[i * N + j] = acc;
    }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const double p = bf(to_bf(float(s_ref[i * N + j])));
      for (int e = 0; e < E; ++e) o_ref[i * E + e] += p * bf(v[j * E + e]);
    }
  u16 *dq, *dk, *dv;
  float *ds, *dout;
  cudaMalloc(&dq, q.size() * 2);
  cudaMalloc(&dk, k.size() * 2);
  cudaMalloc(&dv, v.size() * 2);
  cudaMalloc(&ds, M * N * 4);
  cudaMalloc(&dout, M * E * 4);
  cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  const int smem = (M + 2 * N) * E * 2 + 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<1, FWD_THREADS, smem>>>(dq, dk, dv, ds, dout);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("probe launch failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<float> s(M * N), o(M * E);
  cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
  const bool ok = compare("S=QK^T", s, s_ref, M, N) & compare("O=PV", o, o_ref, M, E);
  return ok ? 0 : 1;
}
