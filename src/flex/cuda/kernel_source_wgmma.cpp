// The wgmma (sm_90a) helpers of the FlexAttention kernels as source text, pasted between the
// prelude and the forward kernel by kernel_template() (kernel_source.cpp): the swizzled tile
// layout and its loads, shared-memory matrix descriptors, fences, and the two products
// (wg_abt: A B^T from descriptors; wg_pb: P B with P in registers and B transposed).
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* wgmma_helpers_source() {
  return R"kiln_src(#if FWD_WGMMA || BWD_WGMMA
// wgmma (sm_90a). Tiles in shared memory are 64-column panels of 128-byte rows whose 16-byte
// chunk c of row r sits at chunk c ^ (r % 8): the 128-byte swizzle wgmma reads without bank
// conflicts. Each panel starts on a 1024-byte boundary (the swizzle's period). As the first
// operand a tile is K-major (rows along the reduction); as the second of P V-like products it is
// read N-major (transposed). A warpgroup (4 warps) owns 64 rows, warp w rows 16 (w % 4)...,
// and its accumulators have the mma.sync m16n8 C-fragment layout per 8 columns.
// (sw_offset and load_tile_async<true> for this layout are in the prelude.)
#define WG_SMEM_ALIGN 1024
// The first WG_SMEM_ALIGN-aligned element of the dynamic shared memory (the host adds the slack).
__device__ __forceinline__ u16* wg_smem_base(u16* smem) {
  return smem + ((WG_SMEM_ALIGN - (smem_addr(smem) & (WG_SMEM_ALIGN - 1))) & (WG_SMEM_ALIGN - 1)) / 2;
}
// Shared-memory matrix descriptor: start address, leading / stride byte offsets (8-row groups are
// 1024 bytes apart in every tile here), 128-byte swizzle.
__device__ __forceinline__ u64 sw_desc(u32 addr, u32 leading_bytes) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(leading_bytes >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void reg_fence(float (*d)[4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
template <int N>
__device__ __forceinline__ void wgmma_ss(float (*d)[4], u64 a, u64 b, int accumulate) {
  if constexpr (N == 64) wgmma_ss_n64(d, a, b, accumulate);
  else wgmma_ss_n128(d, a, b, accumulate);
}

template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Keeps P's registers live (and unmoved) until a wgmma that reads them has been waited for.
template <int N>
__device__ __forceinline__ void reg_fence_pk(u32 (*pk)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(pk[i][0]), "+r"(pk[i][1])::"memory");
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
    wgmma_ss<NB>(d, sw_desc(aa + (kk >> 2) * a_rows * 128 + col, 16), sw_desc(ba + (kk >> 2) * NB * 128 + col, 16),
                 kk > 0);
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
    wgmma_rs(d, a, sw_desc(ba + kk * 16 * 128, KB * 128));
  }
  wg_commit();
}
template <int KB>
__device__ __forceinline__ void wg_pb(float (*d)[4], const u32 (*pk)[2], const u16* Bm) {
  wg_pb_issue<KB>(d, pk, Bm);
  wg_wait_all();
  reg_fence<HEAD_DIM / 8>(d);
}

// d[64 x 64] = A B over K rows (k): A an M-major swizzled panel of K rows (64 m a row) at shared address
// a, B an N-major panel of K rows (64 n a row) at b; both panels' rows 128 bytes apart (wgmma_ss_tt_n64,
// the fused backward's dQ part: its dS^T tile times a panel of K). Waited for.
template <int K>
__device__ __forceinline__ void wg_ab_tt(float (*d)[4], u32 a, u32 b) {
#pragma unroll
  for (int n = 0; n < 8; ++n) d[n][0] = d[n][1] = d[n][2] = d[n][3] = 0.f;
  reg_fence<8>(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_ss_tt_n64(d, sw_desc(a + kk * 16 * 128, K * 128), sw_desc(b + kk * 16 * 128, K * 128), kk > 0);
  wg_commit();
  wg_wait_all();
  reg_fence<8>(d);
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
// TMA (cp.async.bulk.tensor) tiles with mbarrier completion: one thread issues a tile as one
// bulk copy per 64-column panel (box {64, rows, 1} of a [B*H, len, E] tensor map, the 128-byte
// swizzle of the layout above); rows past the length arrive as zeros and still count as bytes.
__device__ __forceinline__ void mbar_init(u64* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 phase) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}" ::"r"(
          smem_addr(bar)),
      "r"(phase)
      : "memory");
}
// Thread 0 initialises a CTA's n barriers (before a block barrier, after which anyone may wait).
__device__ __forceinline__ void mbar_init_all(u64* bars, int n) {
  for (int i = 0; i < n; ++i) mbar_init(&bars[i]);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // the inits, before the async proxy uses them
}
// One arrival on a barrier (a consumer warp's release, a producer's end marker); n arrivals; a barrier
// expecting `count` arrivals a phase.
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_n(u64* bar, u32 n) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_init_count(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// `arrive`: this tile's bytes complete the barrier's phase with the issuing thread's one arrival;
// false adds them to the phase without arriving (a tile sharing a phase with a later one).
__device__ __forceinline__ void tma_tile(u16* dst, const void* map, u64* bar, i64 row0, i64 bh, int rows,
                                         bool arrive = true) {
  if (arrive)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(rows * HEAD_DIM * 2)
                 : "memory");
  else
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(rows * HEAD_DIM * 2)
                 : "memory");
#pragma unroll
  for (int p = 0; p < HEAD_DIM / 64; ++p)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
            smem_addr(dst + p * rows * 64)),
        "l"(map), "r"(p * 64), "r"((int)row0), "r"((int)bh), "r"(smem_addr(bar))
        : "memory");
}
#endif
#define SMEM_PROXY_FENCE() fence_async_smem()
#else
#define SMEM_PROXY_FENCE()
#endif
)kiln_src";
}

}  // namespace kiln::flex::cuda
