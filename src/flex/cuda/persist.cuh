#pragma once
// The persistent forward (the wgmma forward on short rows at E = 128, kernel_config.cpp): flex_fwd when
// FWD_PERSIST is defined. A CTA per SM slot walks several q tiles, a producer thread loading the
// next tile's Q and first K / V during the last tiles of the one before; out leaves by bulk tensor
// stores (FlexParams::omap).

#if KILN_BUILD_FWD && FWD_PERSIST
// gridDim.x CTAs (the host takes as many as fit the device at once) each walk the units u =
// blockIdx.x, + gridDim.x, ... of one q tile of one (b, h), in the staged forward's order: (b, h)
// by (b, h), heaviest q tiles first within each, so the CTAs running at once share a few heads' K
// and V in L2 (heaviest first over all heads had them read every head's K / V at once: 15-47 %
// slower than the staged forward).
// Warp-specialised (FlashAttention-3's producer): one thread of the CTA's last warpgroup only walks
// the BlockMask lists and issues the loads, a stage as soon as the consumers release it, with a
// unit's Q once the unit before has done its last Q K^T; the consumer warps only wait for stages
// and compute. FWD_PSTAGES K / V stages (three with 128-row tiles: one Q buffer and three stages
// fill the 227 KB). So the walk's dependent list reads, the loads' issue and a unit's prologue leave
// the consumers' path (a version where the consumers issued each stage after a block barrier waited
// on K for half their cycles, H200). A stage's K is released once its scores are done and its V
// once P V is, so each load is issued as early as its buffer allows. A unit's output goes through
// its last tile's V buffer by one bulk tensor store, so the consumers do not wait for their global
// stores; that stage's V is released once the store has read it.
// Every unit's arithmetic is the staged forward's: the same bits.
// The producer is a whole warpgroup, so that setmaxnreg can move its registers to the consumers
// (it takes the warpgroup): ptxas holds the kernel to the launch's share of the register file, the
// producer drops to 40 (at 24 its walk spilled) and the consumers take the rest (232 with 128-row
// tiles: two consumer warpgroups, where the launch's 168 spilled; FlashAttention-3's split).
#define FWD_CTA_THREADS (FWD_THREADS + 128)
#if FWD_TILE_M > FWD_TILE_N
#error "the persistent forward stages a unit's output in a V tile: FWD_TILE_M <= FWD_TILE_N"
#endif
// Resident CTAs the registers are held for: one with 128-row tiles; three with 64 x 64 tiles at
// E = 64; else two (at three, 80 registers a thread before setmaxnreg, ptxas could not place the
// 64 x 128 tile's product).
#define FWD_PERSIST_MIN_BLOCKS (FWD_TILE_M == 128 ? 1 : HEAD_DIM == 64 && FWD_TILE_N == 64 ? 3 : 2)
#define FWD_LAUNCH_REGS (65536 / (FWD_PERSIST_MIN_BLOCKS * FWD_CTA_THREADS) / 8 * 8)
#define FWD_PRODUCER_REGS 40
#define FWD_CONSUMER_REGS ((FWD_LAUNCH_REGS * FWD_CTA_THREADS - FWD_PRODUCER_REGS * 128) / FWD_THREADS / 8 * 8)

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
    return TileWalk(BlockWalk(P, KV_LISTS(P), fwd_unit_mrow(P, bh, r0), P.nKVB), P.KB, P.S, FWD_TILE_N);
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

// A unit without blocks: zero rows and lse -inf (what the staged forward writes for it), by the
// consumer threads.
__device__ __forceinline__ void fwd_store_empty(const FlexParams& P, i64 q_tiles, i64 u) {
  i64 bh, r0;
  fwd_unit(P, q_tiles, u, bh, r0);
  const i64 rows = P.L - r0 < FWD_TILE_M ? P.L - r0 : FWD_TILE_M;
  u32* og = (u32*)((u16*)P.out + (bh * P.L + r0) * HEAD_DIM);
  for (i64 i = threadIdx.x; i < rows * HEAD_DIM / 2; i += FWD_THREADS) og[i] = 0u;
  for (i64 i = threadIdx.x; i < rows; i += FWD_THREADS) P.lse[bh * P.L + r0 + i] = NEG_INF;
}

// What the producer tells the consumers about the tile in a stage (written before it arms the
// stage's K barrier, whose arrival releases it to the waiting consumers).
struct FwdStageTile {
  i64 unit, c0;
  int slot, flags;  // FWD_TILE_*: FIRST: the unit's first tile (its Q came with K); LAST; END: no tile
};
#define FWD_TILE_FIRST 1
#define FWD_TILE_LAST 2
#define FWD_TILE_END 4
#define FWD_TILE_PARTIAL 8

// The unit's output rows (this thread's o, m, l; row_base as the staged forward's) normalised into
// buf (the unit's last V buffer, whose reads by P V every consumer warp has waited for), in the
// swizzled 64-column panels of FWD_TILE_M rows the tensor maps use (16-byte chunk c of local row r
// at chunk c ^ (r % 8)); then thread 0 writes them out with one bulk tensor store a panel (rows past
// L are not written), committed as one group. The lse by the threads of t == 0, as fwd_store.
__device__ __forceinline__ void fwd_store_tma(const FlexParams& P, u16* buf, const float (&o)[FWD_MT][HEAD_DIM / 8][4],
                                              const float (&m)[FWD_MT][2], const float (&l)[FWD_MT][2], i64 bh,
                                              i64 r0, i64 row_base, int t) {
  asm volatile("bar.sync 1, %0;" ::"n"(FWD_THREADS) : "memory");  // every warp's P V reads are over
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lr = fwd_row_sum(l[mt][r]);
      const i64 row = row_base + mt * 16 + 8 * r;
      const int local = (int)(row - r0);
      const float inv = fwd_row_inv(lr);
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n) {
        u16* dst = buf + (n >> 3) * FWD_TILE_M * 64 + local * 64 + (((n & 7) ^ (local & 7)) << 3) + 2 * t;
        *(u32*)dst = pack2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      }
      if (t == 0 && row < P.L) P.lse[bh * P.L + row] = fwd_row_lse(P, m[mt][r], lr);
    }
  fence_async_smem();  // the generic-proxy writes, before the bulk copy reads them
  asm volatile("bar.sync 1, %0;" ::"n"(FWD_THREADS) : "memory");
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < HEAD_DIM / 64; ++p)
      asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(P.omap),
                   "r"(p * 64), "r"((int)r0), "r"((int)bh), "r"(smem_addr(buf + p * FWD_TILE_M * 64))
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
}

// The next stage after x.
__device__ __forceinline__ int fwd_next_stage(int x) { return x + 1 == FWD_PSTAGES ? 0 : x + 1; }

// The producer (one thread of the last warpgroup): every tile of this CTA's units into the stages in
// turn, its K once the consumers are done with the stage's last K (and tile record), its V once they
// are done with the last V; a unit's Q with its first K, once the unit before has done its last
// Q K^T. Then the end marker.
__device__ __forceinline__ void fwd_produce(const FlexParams& P, i64 q_tiles, u16* Qs, u16* Ks, u64* full, u64* kempty,
                                            u64* vempty, u64* qempty, FwdStageTile* tiles) {
  UnitStream stream(P, q_tiles);
  i64 u0 = 0, c0 = 0, u1 = 0, c1 = 0;
  bool p0 = false, p1 = false;
  int s0 = 0, s1 = 0;
  bool more = stream.next(u0, c0, p0, s0);
  bool more1 = more && stream.next(u1, c1, p1, s1);
  u32 kphase = ~0u, vphase = ~0u, qphase = 1u;  // parities to wait for: a fresh barrier's "previous phase" is complete
  int x = 0;
  bool first = true;
  while (more) {
    mbar_wait(&kempty[x], (kphase >> x) & 1);
    kphase ^= 1u << x;
    const bool last = !more1 || u1 != u0;
    FwdStageTile& st = tiles[x];
    st.unit = u0;
    st.c0 = c0;
    st.slot = s0;
    st.flags = (first ? FWD_TILE_FIRST : 0) | (last ? FWD_TILE_LAST : 0) | (p0 ? FWD_TILE_PARTIAL : 0);
    i64 bh, r0;
    fwd_unit(P, q_tiles, u0, bh, r0);
    const i64 bhk = bh / P.Hq * P.Hkv + bh % P.Hq / P.G;
    if (first) {
      mbar_wait(qempty, qphase & 1);
      qphase ^= 1u;
      tma_tile(Qs, P.qmap, &full[x], r0, bh, FWD_TILE_M, false);  // Q's bytes join K's phase
    }
    tma_tile(Ks + x * 2 * FWD_TILE_N * HEAD_DIM, P.kmap, &full[x], c0, bhk, FWD_TILE_N);
    mbar_wait(&vempty[x], (vphase >> x) & 1);
    vphase ^= 1u << x;
    tma_tile(Ks + (x * 2 + 1) * FWD_TILE_N * HEAD_DIM, P.vmap, &full[FWD_PSTAGES + x], c0, bhk, FWD_TILE_N);
    first = last;
    u0 = u1, c0 = c1, p0 = p1, s0 = s1, more = more1;
    more1 = more && stream.next(u1, c1, p1, s1);
    x = fwd_next_stage(x);
  }
  mbar_wait(&kempty[x], (kphase >> x) & 1);
  tiles[x].flags = FWD_TILE_END;
  mbar_arrive(&full[x]);
}

extern "C" __global__ void __launch_bounds__(FWD_CTA_THREADS, FWD_PERSIST_MIN_BLOCKS)
    flex_fwd(const __grid_constant__ FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = wg_smem_base(smem);
  u16* Ks = Qs + FWD_TILE_M * HEAD_DIM;  // stage x: K at Ks + x * 2 * FWD_TILE_N * HEAD_DIM, V after it
  u16* Vs = Ks + FWD_TILE_N * HEAD_DIM;
  // full[x]: stage x's K (with a unit's Q) and its tile record; full[FWD_PSTAGES + x]: its V;
  // kempty[x] / vempty[x]: the consumer warps are done with its K / V (a V holding a unit's output:
  // its store has read it); qempty: every consumer warp has done the unit's last Q K^T.
  __shared__ __align__(8) u64 full[2 * FWD_PSTAGES], kempty[FWD_PSTAGES], vempty[FWD_PSTAGES], qempty[1];
  __shared__ FwdStageTile tiles[FWD_PSTAGES];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 q_tiles = (P.L + FWD_TILE_M - 1) / FWD_TILE_M, units = P.B * P.Hq * q_tiles;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2 * FWD_PSTAGES; ++i) mbar_init_count(&full[i], 1);
    for (int i = 0; i < FWD_PSTAGES; ++i) {
      mbar_init_count(&kempty[i], FWD_WARPS);
      mbar_init_count(&vempty[i], FWD_WARPS);
    }
    mbar_init_count(qempty, FWD_WARPS);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them; no block barrier after this
  if (warp >= FWD_WARPS) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(FWD_PRODUCER_REGS));
    if (threadIdx.x == FWD_THREADS) fwd_produce(P, q_tiles, Qs, Ks, full, kempty, vempty, qempty, tiles);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(FWD_CONSUMER_REGS));

  // The unit being accumulated and what its tiles need.
  i64 bh = 0, b = 0, h = 0, r0 = 0, row_base = 0;
  bool rows_in = false;
  int storing = -1;  // the stage whose V buffer holds an output store thread 0 has not yet seen read
  i64 stored = blockIdx.x;  // this CTA's first unit not yet written (units without tiles are skipped)
  float o[FWD_MT][HEAD_DIM / 8][4], m[FWD_MT][2], l[FWD_MT][2];
  u32 kphase = 0;
  for (int x = 0;; x = fwd_next_stage(x)) {
    mbar_wait(&full[x], (kphase >> x) & 1);  // K (and a first Q) landed, and the tile record
    const FwdStageTile tile = tiles[x];
    if (threadIdx.x == 0 && storing >= 0) {  // the last unit's store had this wait to read its buffer
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      mbar_arrive_n(&vempty[storing], FWD_WARPS);
      storing = -1;
    }
    if (tile.flags & FWD_TILE_END) break;
    const i64 c0 = tile.c0;
    const bool partial = tile.flags & FWD_TILE_PARTIAL;
    if (tile.flags & FWD_TILE_FIRST) {
      for (; stored < tile.unit; stored += gridDim.x) fwd_store_empty(P, q_tiles, stored);
      stored = tile.unit + gridDim.x;
      fwd_unit(P, q_tiles, tile.unit, bh, r0);
      b = bh / P.Hq;
      h = bh % P.Hq;
      row_base = r0 + warp * 16 * FWD_MT + g;
      rows_in = r0 + FWD_TILE_M <= P.L;
#pragma unroll
      for (int mt = 0; mt < FWD_MT; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
      }
    }
    u16* Kx = Ks + x * 2 * FWD_TILE_N * HEAD_DIM;
    u16* Vx = Vs + x * 2 * FWD_TILE_N * HEAD_DIM;
    float s[FWD_MT][FWD_TILE_N / 8][4];
    u32 pk[FWD_MT][FWD_TILE_N / 8][2];
    FWD_TMA_SOFTMAX(Qs, Kx, partial, tile.slot)
    __syncwarp();  // the warp's Q K^T was waited for: its reads of K (and Q) are over
    if (lane == 0) {
      mbar_arrive(&kempty[x]);
      if (tile.flags & FWD_TILE_LAST) mbar_arrive(qempty);
    }
    mbar_wait(&full[FWD_PSTAGES + x], (kphase >> x) & 1);  // V landed
    kphase ^= 1u << x;
    wg_pb<FWD_TILE_N>(o[0], pk[0], Vx);
    if (tile.flags & FWD_TILE_LAST) {
      fwd_store_tma(P, Vx, o, m, l, bh, r0, row_base, t);
      storing = x;
    } else {
      __syncwarp();  // likewise P V: its reads of V are over
      if (lane == 0) mbar_arrive(&vempty[x]);
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the stores are done
  for (; stored < units; stored += gridDim.x) fwd_store_empty(P, q_tiles, stored);
}
#endif  // KILN_BUILD_FWD && FWD_PERSIST
