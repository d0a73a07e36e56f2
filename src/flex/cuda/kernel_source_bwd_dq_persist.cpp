// The persistent dQ kernel (BWD_DQ_PERSIST; KILN_FLEX_BWD_DQ_PERSIST) as source text, pasted after
// the dQ kernel by kernel_template() (kernel_source.cpp). It is flex_bwd_dq when BWD_DQ_PERSIST is
// defined.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

// Pasted after kernel_backward_dq(), inside kernel_backward_common()'s #if KILN_BUILD_BWD.
const char* kernel_backward_dq_persist() {
  return R"kiln_src(#if BWD_DQ_PERSIST
// The persistent forward's structure (kernel_source_persist.cpp) for the dQ kernel, whose short rows
// spent their time waiting: on the window 1024 row (H200, session 18, KILN_FLEX_PROFILE) 30 % of
// its cycles waited for V, 12 % for K and 7 % were the prologue, with a CTA a q tile. gridDim.x CTAs
// (as many as fit at once) each walk the units u = blockIdx.x, + gridDim.x, ... (a unit: one 64-row
// q tile of one (b, h), in the one-unit-a-CTA kernel's order), one consumer warpgroup and one
// producer warpgroup a CTA. The producer thread issues each stage's K and V as the consumers release
// them (V once dP is done, K once dQ += dS K is), and a unit's Q and dO with its first K and V once
// the unit before has done its last S and dP. The consumers prefetch the next unit's lse2 / delta
// rows into registers during the unit before, and store dQ with plain stores (fire and forget).
// Every tile's arithmetic is flex_bwd_dq's (kernel_source_bwd_dq.cpp): the same bits.
#if !BWD_PAIRED
#error "the persistent dQ kernel issues its products in pairs (BWD_PAIRED)"
#endif
#define DQ_CTA_THREADS (NTHREADS + 128)
#define DQ_PERSIST_MIN_BLOCKS 2
#define DQ_CONSUMER_REGS PERSIST_CONSUMER_REGS(NTHREADS, DQ_PERSIST_MIN_BLOCKS)

// lse2 and delta of this thread's two rows (rows[r] of (b, h) row bh): +inf and 0 past L (p = 0).
__device__ __forceinline__ void dq_unit_rows(const FlexParams& P, i64 bh, const i64* rows, float* lse2, float* delta) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = rows[r] < P.L ? P.lse2[bh * P.L + rows[r]] : POS_INF;
    delta[r] = rows[r] < P.L ? P.delta[bh * P.L + rows[r]] : 0.f;
  }
}

// This thread's two rows of unit u (64-row q tiles).
__device__ __forceinline__ void dq_unit_of(i64 q_tiles, i64 u, int warp, int g, i64& bh, i64* rows) {
  i64 r0;
  persist_unit<TILE_M>(q_tiles, u, bh, r0);
  rows[0] = r0 + warp * 16 + g;
  rows[1] = rows[0] + 8;
}

// A unit without blocks: zero dQ rows (what flex_bwd_dq writes for it), by the consumer threads.
__device__ __forceinline__ void dq_store_empty(const FlexParams& P, i64 q_tiles, i64 u) {
  i64 bh, r0;
  persist_unit<TILE_M>(q_tiles, u, bh, r0);
  const i64 rows = P.L - r0 < TILE_M ? P.L - r0 : TILE_M;
  u32* dg = (u32*)((u16*)P.dq + (bh * P.L + r0) * HEAD_DIM);
  for (i64 i = threadIdx.x; i < rows * HEAD_DIM / 2; i += NTHREADS) dg[i] = 0u;
}

// A consumer warp's release of what it has read (its lane 0 arrives for the warp).
__device__ __forceinline__ void warp_release(u64* bar, int lane) {
  __syncwarp();  // the warp's products were waited for: its reads are over
  if (lane == 0) mbar_arrive(bar);
}

extern "C" __global__ void __launch_bounds__(DQ_CTA_THREADS, DQ_PERSIST_MIN_BLOCKS)
    flex_bwd_dq(const __grid_constant__ FlexParams P) {
  PROF_DECL
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = wg_smem_base(smem);
  u16* dOs = Qs + TILE_M * HEAD_DIM;
  u16* Ks = dOs + TILE_M * HEAD_DIM;  // stage x: K at Ks + 2 x TILE_N HEAD_DIM, V after it
  // full[x]: stage x's K (with a unit's Q) and its tile record; full[BWD_PSTAGES + x]: its V (with a
  // unit's dO); kempty / vempty: every consumer warp is done with its K / V; qempty: with the unit's Q and dO.
  __shared__ __align__(8) u64 full[2 * BWD_PSTAGES], kempty[BWD_PSTAGES], vempty[BWD_PSTAGES], qempty[1];
  __shared__ StageTile tiles[BWD_PSTAGES];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 q_tiles = P.q_tiles, units = P.B * P.Hq * q_tiles;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2 * BWD_PSTAGES; ++i) mbar_init_count(&full[i], 1);
    for (int i = 0; i < BWD_PSTAGES; ++i) {
      mbar_init_count(&kempty[i], NWARPS);
      mbar_init_count(&vempty[i], NWARPS);
    }
    mbar_init_count(qempty, NWARPS);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them; no block barrier after this
  if (warp >= NWARPS) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PERSIST_PRODUCER_REGS));
    if (threadIdx.x == NTHREADS)
      persist_produce<TILE_M, TILE_N, BWD_PSTAGES, true>(P, q_tiles, Qs, Ks, full, kempty, vempty, qempty, tiles);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(DQ_CONSUMER_REGS));
  PROF_MARK(0);

  // The unit being accumulated and what its tiles need; the next unit's rows, prefetched.
  i64 bh = 0, b = 0, h = 0, mrow = 0, rows[2] = {0, 0};
  bool rows_in = false;
  float lse2[2], delta[2], next_lse2[2] = {0.f, 0.f}, next_delta[2] = {0.f, 0.f};
  i64 next_unit = -1;
  i64 stored = blockIdx.x;  // this CTA's first unit not yet written (units without tiles are skipped)
  float dq[HEAD_DIM / 8][4];
  u32 phase = 0;
  for (int x = 0;; x = next_stage<BWD_PSTAGES>(x)) {
    mbar_wait(&full[x], (phase >> x) & 1);  // K (and a unit's Q) landed, and the tile record
    PROF_MARK(3);
    const StageTile tile = tiles[x];
    if (tile.flags & PTILE_END) break;
    if (tile.flags & PTILE_FIRST) {
      for (; stored < tile.unit; stored += gridDim.x) dq_store_empty(P, q_tiles, stored);
      stored = tile.unit + gridDim.x;
      dq_unit_of(q_tiles, tile.unit, warp, g, bh, rows);
      b = bh / P.Hq;
      h = bh % P.Hq;
      const i64 r0 = rows[0] - warp * 16 - g;
      rows_in = r0 + TILE_M <= P.L;
      mrow = persist_unit_mrow(P, bh, r0);
      if (next_unit == tile.unit) {
#pragma unroll
        for (int r = 0; r < 2; ++r) lse2[r] = next_lse2[r], delta[r] = next_delta[r];
      } else {
        dq_unit_rows(P, bh, rows, lse2, delta);
      }
      next_unit = tile.unit + gridDim.x;  // this CTA's next unit, unless it lists no block
      if (next_unit < units) {
        i64 nbh, nrows[2];
        dq_unit_of(q_tiles, next_unit, warp, g, nbh, nrows);
        dq_unit_rows(P, nbh, nrows, next_lse2, next_delta);
      }
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
    }
    const i64 c0 = tile.c0;
    const bool partial = tile.flags & PTILE_PARTIAL;
    const int slot0 = tile.slot;
    const bool interior = !partial && rows_in && c0 + TILE_N <= P.S;  // a full block's tile inside both lengths
    const u16* Kb = Ks + x * 2 * TILE_N * HEAD_DIM;
    const u16* Vb = Kb + TILE_N * HEAD_DIM;
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
#if MASK_RANGES
    Run runs[2];  // DQ_RUNS: the rows' runs of a tile that is not interior
#endif
#if BWD_SPLIT_P
    wg_abt_issue<64>(s, Qs, 64, 0, Kb);  // S first: its P while dP = dO V^T is in flight
    mbar_wait(&full[BWD_PSTAGES + x], (phase >> x) & 1);  // V (and a unit's dO) landed
    PROF_MARK(1);
    wg_abt_issue<64>(dp, dOs, 64, 0, Vb);
    DQ_RUNS();
    wg_wait<1>();
    reg_fence<TILE_N / 8>(s);
    dq_tile_p_of(P, s, b, h, rows, c0, t, partial, interior, lse2, mrow, slot0 DQ_RUNS_ARG);
    wg_wait<0>();
    reg_fence<TILE_N / 8>(dp);
#else
    mbar_wait(&full[BWD_PSTAGES + x], (phase >> x) & 1);  // V (and a unit's dO) landed
    PROF_MARK(1);
    wg_abt_issue<64>(dp, dOs, 64, 0, Vb);
    wg_abt_issue<64>(s, Qs, 64, 0, Kb);
    DQ_RUNS();
    wg_wait_all();
    reg_fence<TILE_N / 8>(dp);
    reg_fence<TILE_N / 8>(s);
#endif
    phase ^= 1u << x;
    PROF_MARK(4);
    warp_release(&vempty[x], lane);
    if (tile.flags & PTILE_LAST) warp_release(qempty, lane);
#if BWD_SPLIT_P
    dq_tile_ds_from_p(s, dp, delta);
#else
    dq_tile_ds_of(P, s, dp, b, h, rows, c0, t, partial, interior, lse2, delta, mrow, slot0 DQ_RUNS_ARG);
#endif
    PROF_MARK(5);
    BWD_PB(dq, s, Kb, LDSM_B_Q);  // dQ += dS K
    warp_release(&kempty[x], lane);
    PROF_MARK(6);
    if (tile.flags & PTILE_LAST) dq_store_rows(P, dq, bh, rows, t);
    PROF_MARK(7);
  }
  for (; stored < units; stored += gridDim.x) dq_store_empty(P, q_tiles, stored);
  PROF_FLUSH(8);
}
#endif  // BWD_DQ_PERSIST

)kiln_src";
}

}  // namespace kiln::flex::cuda
