// What the persistent kernels share, as source text: their unit order and tile stream, the tile
// records in shared memory, the mbarrier arrivals and the producer thread. Pasted after the walks by
// kernel_template() (kernel_source.cpp); used by the persistent forward (kernel_source_persist.cpp,
// FWD_PERSIST) and the persistent dQ kernel (kernel_source_bwd_dq_persist.cpp, BWD_DQ_PERSIST).
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* kernel_persist_common() {
  return R"kiln_src(#if FWD_PERSIST || BWD_DQ_PERSIST
// The producer is a whole warpgroup, so that setmaxnreg can move its registers to the consumers (it
// takes the warpgroup): ptxas holds the kernel to the launch's share of the register file for
// `blocks` resident CTAs, the producer drops to 40 (at 24 the forward's walk spilled) and the
// `consumers` threads take the rest (FlashAttention-3's split).
#define PERSIST_PRODUCER_REGS 40
#define PERSIST_LAUNCH_REGS(consumers, blocks) (65536 / ((blocks) * ((consumers) + 128)) / 8 * 8)
#define PERSIST_CONSUMER_REGS(consumers, blocks) \
  ((PERSIST_LAUNCH_REGS(consumers, blocks) * ((consumers) + 128) - PERSIST_PRODUCER_REGS * 128) / (consumers) / 8 * 8)

// Unit u's (b, h) row of q and first query row, for q tiles of kTileM rows: (b, h) by (b, h), each
// one's heaviest (last) q tiles first, as the one-unit-a-CTA kernels' blockIdx.x.
template <int kTileM>
__device__ __forceinline__ void persist_unit(i64 q_tiles, i64 u, i64& bh, i64& r0) {
  bh = u / q_tiles;
  r0 = (q_tiles - 1 - u % q_tiles) * kTileM;
}
__device__ __forceinline__ i64 persist_unit_mrow(const FlexParams& P, i64 bh, i64 r0) {
  return P.all_full ? 0 : mask_row(P, bh / P.Hq, bh % P.Hq) * P.nQB + r0 / P.QB;
}

// The kTileN-wide kv tiles of this CTA's units u = blockIdx.x, + gridDim.x, ... in order
// (blockIdx.x < the unit count: the host's grid).
template <int kTileM, int kTileN>
struct UnitStream {
  const FlexParams& P;
  i64 q_tiles, units, u;
  TileWalk tw;
  __device__ __forceinline__ static TileWalk walk_of(const FlexParams& P, i64 q_tiles, i64 u) {
    i64 bh, r0;
    persist_unit<kTileM>(q_tiles, u, bh, r0);
    return TileWalk(BlockWalk(P, KV_LISTS(P), persist_unit_mrow(P, bh, r0), P.nKVB), P.KB, P.S, kTileN);
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

// What the producer tells the consumers about the tile in a stage (written before it arms the
// stage's K barrier, whose arrival releases it to the waiting consumers).
struct StageTile {
  i64 unit, c0;
  int slot, flags;  // PTILE_*: FIRST: the unit's first tile (its Q came with K); LAST; END: no tile
};
#define PTILE_FIRST 1
#define PTILE_LAST 2
#define PTILE_END 4
#define PTILE_PARTIAL 8

// One arrival on a barrier (a consumer warp's release, or the producer's end marker); n arrivals.
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_n(u64* bar, u32 n) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_init_count(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// The stage after x of kStages.
template <int kStages>
__device__ __forceinline__ int next_stage(int x) {
  return x + 1 == kStages ? 0 : x + 1;
}

// The producer (one thread of the CTA's last warpgroup): every tile of this CTA's units into the
// stages in turn (stage x: K at Ks + 2 x kTileN HEAD_DIM, its V right after), its K once the
// consumers are done with the stage's last K (and tile record), its V once they are done with the
// last V; a unit's Q with its first K (kWithDo: and its dO, at Qs + kTileM HEAD_DIM, with that V),
// once the unit before has done its last products with them. Then the end marker.
// full[x]: stage x's K (and Q); full[kStages + x]: its V (and dO); kempty / vempty / qempty: the
// consumers' releases.
template <int kTileM, int kTileN, int kStages, bool kWithDo>
__device__ __forceinline__ void persist_produce(const FlexParams& P, i64 q_tiles, u16* Qs, u16* Ks, u64* full,
                                                u64* kempty, u64* vempty, u64* qempty, StageTile* tiles) {
  UnitStream<kTileM, kTileN> stream(P, q_tiles);
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
    StageTile& st = tiles[x];
    st.unit = u0;
    st.c0 = c0;
    st.slot = s0;
    st.flags = (first ? PTILE_FIRST : 0) | (last ? PTILE_LAST : 0) | (p0 ? PTILE_PARTIAL : 0);
    i64 bh, r0;
    persist_unit<kTileM>(q_tiles, u0, bh, r0);
    const i64 bhk = bh / P.Hq * P.Hkv + bh % P.Hq / P.G;
    if (first) {
      mbar_wait(qempty, qphase & 1);
      qphase ^= 1u;
      tma_tile(Qs, P.qmap, &full[x], r0, bh, kTileM, false);  // Q's bytes join K's phase
      if constexpr (kWithDo) tma_tile(Qs + kTileM * HEAD_DIM, P.domap, &full[kStages + x], r0, bh, kTileM, false);
    }
    tma_tile(Ks + x * 2 * kTileN * HEAD_DIM, P.kmap, &full[x], c0, bhk, kTileN);
    mbar_wait(&vempty[x], (vphase >> x) & 1);
    vphase ^= 1u << x;
    tma_tile(Ks + (x * 2 + 1) * kTileN * HEAD_DIM, P.vmap, &full[kStages + x], c0, bhk, kTileN);
    first = last;
    u0 = u1, c0 = c1, p0 = p1, s0 = s1, more = more1;
    more1 = more && stream.next(u1, c1, p1, s1);
    x = next_stage<kStages>(x);
  }
  mbar_wait(&kempty[x], (kphase >> x) & 1);
  tiles[x].flags = PTILE_END;
  mbar_arrive(&full[x]);
}
#endif  // FWD_PERSIST || BWD_DQ_PERSIST

)kiln_src";
}

}  // namespace kiln::flex::cuda
