#pragma once
// FlexAttention's wgmma (sm_90a) tiles, a part of the kernel source that NVRTC compiles: included
// after the prelude (its types, smem_addr, pack2, HEAD_DIM) and before the kernels, which use these
// and the Hopper helpers (core/cuda/hopper.cuh) by their plain names. The swizzled tile layout is
// hopper.cuh's: 64-column panels of 128-byte rows, 1024-byte aligned. As the first operand a tile
// is K-major (rows along the reduction); as the second of P V-like products it is read N-major
// (transposed). A warpgroup (4 warps) owns 64 rows, warp w rows 16 (w % 4)..., its accumulators in
// the mma.sync m16n8 C-fragment layout per 8 columns. (sw_offset and load_tile_async<true> for this
// layout are in the prelude.)
#if FWD_WGMMA || BWD_WGMMA
#include "core/cuda/hopper.cuh"

using namespace kiln::hopper;

#define WG_SMEM_ALIGN 1024
// The first WG_SMEM_ALIGN-aligned element of the dynamic shared memory (the host adds the slack).
__device__ __forceinline__ u16* wg_smem_base(u16* smem) {
  return smem + ((WG_SMEM_ALIGN - (smem_addr(smem) & (WG_SMEM_ALIGN - 1))) & (WG_SMEM_ALIGN - 1)) / 2;
}

// Issues d[64 x NB] = A B^T over HEAD_DIM as one wgmma group (wg_wait, then reg_fence(d), before
// reading d): A is the warpgroup's 64 rows of a swizzled tile of a_rows rows (a_row0 its first),
// B a swizzled tile of NB rows.
template <int NB>
__device__ __forceinline__ void wg_abt_issue(float (*d)[4], const u16* A, int a_rows, int a_row0, const u16* Bm) {
  const u32 aa = smem_addr(A) + a_row0 * 128, ba = smem_addr(Bm);
  reg_fence<NB / 8>(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    const u32 col = (kk & 3) * 32;  // bytes into the 128-byte rows of panel kk / 4
    wgmma_m64_ss<NB, KILN_BF16 != 0>(d, sw128_desc(aa + (kk >> 2) * a_rows * 128 + col, 16),
                                     sw128_desc(ba + (kk >> 2) * NB * 128 + col, 16), kk > 0);
  }
  wg_commit();
}
template <int NB>
__device__ __forceinline__ void wg_abt(float (*d)[4], const u16* A, int a_rows, int a_row0, const u16* Bm) {
  wg_abt_issue<NB>(d, A, a_rows, a_row0, Bm);
  wg_wait_all();
  reg_fence<NB / 8>(d);
}

// Issues d[64 x HEAD_DIM] += P B as one wgmma group, where P [64 x KB] is in registers (pk[n][r]:
// rows g / g + 8 of column block n, rounded to T; untouched until waited for) and B a swizzled
// tile of KB rows (its panels KB * 128 bytes apart).
template <int KB>
__device__ __forceinline__ void wg_pb_issue(float (*d)[4], const u32 (*pk)[2], const u16* Bm) {
  const u32 ba = smem_addr(Bm);
  reg_fence<HEAD_DIM / 8>(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) {
    const u32 a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
    wgmma_m64_rs<HEAD_DIM, KILN_BF16 != 0>(d, a, sw128_desc(ba + kk * 16 * 128, KB * 128), 1);
  }
  wg_commit();
}
template <int KB>
__device__ __forceinline__ void wg_pb(float (*d)[4], const u32 (*pk)[2], const u16* Bm) {
  wg_pb_issue<KB>(d, pk, Bm);
  wg_wait_all();
  reg_fence<HEAD_DIM / 8>(d);
}

// pk = p rounded to T, in wg_pb's A layout.
template <int NB>
__device__ __forceinline__ void pack_rows(u32 (*pk)[2], const float (*p)[4]) {
#pragma unroll
  for (int n = 0; n < NB / 8; ++n) {
    pk[n][0] = pack2(p[n][0], p[n][1]);
    pk[n][1] = pack2(p[n][2], p[n][3]);
  }
}
#if FWD_TMA || BWD_TMA
// TMA tiles with mbarrier completion: one thread issues a tile as one bulk copy per 64-column panel
// (box {64, rows, 1} of a [B*H, len, E] tensor map, the 128-byte swizzle); rows past the length
// arrive as zeros and still count as bytes. `arrive`: this tile's bytes complete the barrier's phase
// with the issuing thread's one arrival; false adds them to the phase without arriving (a tile
// sharing a phase with a later one).
__device__ __forceinline__ void tma_tile(u16* dst, const void* map, u64* bar, i64 row0, i64 bh, int rows,
                                         bool arrive = true) {
  if (arrive) mbar_arrive_expect_tx(bar, rows * HEAD_DIM * 2);
  else mbar_expect_tx(bar, rows * HEAD_DIM * 2);
#pragma unroll
  for (int p = 0; p < HEAD_DIM / 64; ++p) tma_load_3d(dst + p * rows * 64, map, bar, p * 64, (int)row0, (int)bh);
}
#endif
#define SMEM_PROXY_FENCE() fence_async_smem()
#else
#define SMEM_PROXY_FENCE()
#endif
