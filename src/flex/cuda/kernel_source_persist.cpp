// The persistent forward (KILN_FLEX_FWD_PERSIST=1; TMA with two K / V stages) as source text,
// pasted after the forward by kernel_template() (kernel_source.cpp). It is flex_fwd when
// FWD_PERSIST is defined.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* kernel_forward_persist() {
  return R"kiln_src(#if KILN_BUILD_FWD && FWD_PERSIST
// gridDim.x CTAs (the host takes as many as fit the device at once) each walk the units u =
// blockIdx.x, + gridDim.x, ... of one q tile of one (b, h), in the default forward's order: (b, h)
// by (b, h), heaviest q tiles first within each, so the CTAs running at once share a few heads' K
// and V in L2 (heaviest first over all heads had them read every head's K / V at once: session 9
// measured that order 15-47 % slower than the default forward).
// The tiles of a CTA's units form one stream: the stage loads run two tiles ahead across unit
// boundaries, and a unit's Q loads into the other of two Q buffers with its first K. So a unit's
// block-list reads and first loads hide behind the previous unit's last tiles; at E = 128 one CTA
// fills an SM, and the one-unit-a-CTA kernel left each unit's prologue and epilogue exposed.
// Every unit's arithmetic is the default forward's: the same bits.

// Unit u's (b, h) row of q / out and first query row.
__device__ __forceinline__ void fwd_unit(const FlexParams&, i64 q_tiles, i64 u, i64& bh, i64& r0) {
  bh = u / q_tiles;
  r0 = (q_tiles - 1 - u % q_tiles) * FWD_TILE_M;
}
__device__ __forceinline__ i64 fwd_unit_mrow(const FlexParams& P, i64 bh, i64 r0) {
  return P.all_full ? 0 : mask_row(P, bh / P.Hq, bh % P.Hq) * P.nQB + r0 / P.QB;
}

// The tiles of this CTA's units in order (blockIdx.x < the unit count: the host's grid).
struct UnitStream {
  const FlexParams& P;
  i64 q_tiles, units, u;
  TileWalk tw;
  __device__ __forceinline__ static TileWalk walk_of(const FlexParams& P, i64 q_tiles, i64 u) {
    i64 bh, r0;
    fwd_unit(P, q_tiles, u, bh, r0);
    const i64 mrow = fwd_unit_mrow(P, bh, r0);
    TileWalk t(BlockWalk(P, KV_LISTS(P), mrow, P.nKVB), P.KB, P.S, FWD_TILE_N);
    return t;
  }
  __device__ __forceinline__ UnitStream(const FlexParams& p, i64 qt)
      : P(p), q_tiles(qt), units(p.B * p.Hq * qt), u(blockIdx.x), tw(walk_of(p, qt, blockIdx.x)) {}
  __device__ __forceinline__ bool next(i64& unit, i64& c, bool& partial, int& slot) {
    for (;;) {
      if (tw.next(c, partial, &slot)) {
        unit = u;
        return true;
      }
      u += gridDim.x;
      if (u >= units) return false;
      tw = walk_of(P, q_tiles, u);
    }
  }
};

// A unit without blocks: zero rows and lse -inf (what the default forward writes for it).
__device__ __forceinline__ void fwd_store_empty(const FlexParams& P, i64 q_tiles, i64 u) {
  i64 bh, r0;
  fwd_unit(P, q_tiles, u, bh, r0);
  const i64 rows = P.L - r0 < FWD_TILE_M ? P.L - r0 : FWD_TILE_M;
  u32* og = (u32*)((u16*)P.out + (bh * P.L + r0) * HEAD_DIM);
  for (i64 i = threadIdx.x; i < rows * HEAD_DIM / 2; i += FWD_THREADS) og[i] = 0u;
  for (i64 i = threadIdx.x; i < rows; i += FWD_THREADS) P.lse[bh * P.L + r0 + i] = NEG_INF;
}

extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_MIN_BLOCKS) flex_fwd(const __grid_constant__ FlexParams P) {
  PROF_DECL
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = wg_smem_base(smem);
  u16* Ks = Qs + FWD_TILE_M * HEAD_DIM;  // stage x: K at Ks + x * 2 * FWD_TILE_N * HEAD_DIM, V after it
  u16* Vs = Ks + FWD_TILE_N * HEAD_DIM;
  u16* Qs2 = Ks + 4 * FWD_TILE_N * HEAD_DIM;  // the other Q buffer, after both stages
  // Stage x's K (with a new unit's Q) on bars[x], its V on bars[2 + x]; kphase bit x: its parity.
  __shared__ __align__(8) u64 bars[4];
  u32 kphase = 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 q_tiles = (P.L + FWD_TILE_M - 1) / FWD_TILE_M, units = P.B * P.Hq * q_tiles;
  UnitStream stream(P, q_tiles);
  // Step 0 (in use) and step 1 (loading): unit, columns, partial, slot, Q buffer (flips per unit).
  i64 u0 = 0, c0 = 0, u1 = 0, c1 = 0;
  bool p0 = false, p1 = false;
  int s0 = 0, s1 = 0;
  bool more = stream.next(u0, c0, p0, s0);
  bool more1 = more && stream.next(u1, c1, p1, s1);
  u32 qb0 = 0, qb1 = more1 && u1 != u0 ? 1u : 0u;
  // Thread 0: a step's K and V into stage x, with its unit's Q when the step starts the unit.
  const auto issue = [&](int x, i64 u, i64 c, bool first, u32 qb) {
    i64 bh, r0;
    fwd_unit(P, q_tiles, u, bh, r0);
    const i64 bhk = bh / P.Hq * P.Hkv + bh % P.Hq / P.G;
    if (first) tma_tile(qb ? Qs2 : Qs, P.qmap, &bars[x], r0, bh, FWD_TILE_M, false);
    tma_tile(Ks + x * 2 * FWD_TILE_N * HEAD_DIM, P.kmap, &bars[x], c, bhk, FWD_TILE_N);
    tma_tile(Vs + x * 2 * FWD_TILE_N * HEAD_DIM, P.vmap, &bars[2 + x], c, bhk, FWD_TILE_N);
  };
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 4);
    if (more) issue(0, u0, c0, true, qb0);
    if (more1) issue(1, u1, c1, u1 != u0, qb1);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  PROF_MARK(0);

  // The unit being accumulated and what its tiles need.
  i64 bh = 0, b = 0, h = 0, row_base = 0, mrow = 0;
  bool rows_in = false;
  const u16* Qx = Qs;
  i64 stored = blockIdx.x;  // this CTA's first unit not yet written (units without tiles are skipped)
  float o[FWD_MT][HEAD_DIM / 8][4], m[FWD_MT][2], l[FWD_MT][2];
  int x = 0;
  while (more) {
    if (u0 >= stored) {  // the first tile of unit u0
      for (; stored < u0; stored += gridDim.x) fwd_store_empty(P, q_tiles, stored);
      stored = u0 + gridDim.x;
      i64 r0;
      fwd_unit(P, q_tiles, u0, bh, r0);
      b = bh / P.Hq;
      h = bh % P.Hq;
      row_base = r0 + warp * 16 * FWD_MT + g;
      mrow = fwd_unit_mrow(P, bh, r0);
      rows_in = r0 + FWD_TILE_M <= P.L;
      Qx = qb0 ? Qs2 : Qs;
#pragma unroll
      for (int mt = 0; mt < FWD_MT; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
      }
    }
    FWD_TMA_STAGE_STEP(Qx, p0, s0)
    i64 u2 = 0, c2 = 0;
    bool p2 = false;
    int s2 = 0;
    const bool more2 = more1 && stream.next(u2, c2, p2, s2);
    const u32 qb2 = more2 && u2 != u1 ? qb1 ^ 1u : qb1;
    // Every warp is done with stage x, and with Q buffer qb2 when step 2 starts a unit: that
    // buffer's previous unit ended at or before this step (step 1 is another unit's).
    __syncthreads();
    if (more2 && threadIdx.x == 0) issue(x, u2, c2, u2 != u1, qb2);
    if (!more1 || u1 != u0) fwd_store(P, o, m, l, bh, row_base, t);  // u0's last tile
    u0 = u1, c0 = c1, p0 = p1, s0 = s1, qb0 = qb1, more = more1;
    u1 = u2, c1 = c2, p1 = p2, s1 = s2, qb1 = qb2, more1 = more2;
    x ^= 1;
  }
  for (; stored < units; stored += gridDim.x) fwd_store_empty(P, q_tiles, stored);
  PROF_MARK(6);
  PROF_FLUSH(0);
}
#endif  // KILN_BUILD_FWD && FWD_PERSIST

)kiln_src";
}

}  // namespace kiln::flex::cuda
