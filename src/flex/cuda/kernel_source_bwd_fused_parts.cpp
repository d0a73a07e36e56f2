// The fused backward's pieces as source text, between kernel_backward_fused_config() and
// kernel_backward_fused() (kernel_source_bwd_fused.cpp): the q-tile walks of a kv unit, the unit
// itself, a part's turn on its q tile, the ordered add and the in-place convert.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* kernel_backward_fused_parts() {
  return R"kiln_src(
// Entry i of a kv block's merged q list at base: the q block, and whether it is partial (every q
// block, full, without a BlockMask).
__device__ __forceinline__ int q_list_block(const FlexParams& P, i64 base, i64 i, bool& part) {
  if (P.all_full) {
    part = false;
    return (int)i;
  }
  const int e = P.q_all_idx[base + i];
  part = e & 1;
  return e >> 1;
}

// The q tiles of kv block jblk, head by head of the group, each head's tiles in descending order
// (merged lists; every block, full, without a BlockMask).
struct GroupWalkDesc {
  const FlexParams& P;
  i64 b, hk, jblk, gi, base, i, r, rlo;
  bool part;
  __device__ __forceinline__ void head() {
    const i64 mcol = P.all_full ? 0 : mask_row(P, b, hk * P.G + gi) * P.nKVB + jblk;
    base = mcol * P.q_all_m;
    i = P.all_full ? P.nQB : P.q_all_num[mcol];
    r = rlo = 0;  // no block open
  }
  __device__ __forceinline__ GroupWalkDesc(const FlexParams& p, i64 b_, i64 hk_, i64 jblk_)
      : P(p), b(b_), hk(hk_), jblk(jblk_), gi(0), base(0), i(0), r(0), rlo(0), part(false) {
    head();
  }
  __device__ __forceinline__ bool next(i64& g, i64& r0, bool& partial) {
    for (;;) {
      if (r > rlo) {
        r -= TILE_M;
        g = gi;
        r0 = r;
        partial = part;
        return true;
      }
      if (i > 0) {
        --i;
        const int blk = q_list_block(P, base, i, part);
        rlo = (i64)blk * P.QB;
        const i64 end = rlo + P.QB < P.L ? rlo + P.QB : P.L;
        r = rlo + (end - rlo + TILE_M - 1) / TILE_M * TILE_M;  // one past the block's last tile start
        continue;
      }
      if (++gi >= P.G) return false;
      head();
    }
  }
};

// The q tiles of kv block jblk, head by head of the group, each head's tiles in ascending order.
struct GroupWalkAsc {
  const FlexParams& P;
  i64 b, hk, jblk, gi, base, i, n, r, rend;
  bool part;
  __device__ __forceinline__ void head() {
    const i64 mcol = P.all_full ? 0 : mask_row(P, b, hk * P.G + gi) * P.nKVB + jblk;
    base = mcol * P.q_all_m;
    n = P.all_full ? P.nQB : P.q_all_num[mcol];
    i = r = rend = 0;  // no block open
  }
  __device__ __forceinline__ GroupWalkAsc(const FlexParams& p, i64 b_, i64 hk_, i64 jblk_)
      : P(p), b(b_), hk(hk_), jblk(jblk_), gi(0), base(0), i(0), n(0), r(0), rend(0), part(false) {
    head();
  }
  __device__ __forceinline__ bool next(i64& g, i64& r0, bool& partial) {
    for (;;) {
      if (r < rend) {
        g = gi;
        r0 = r;
        partial = part;
        r += TILE_M;
        return true;
      }
      if (i < n) {
        const int blk = q_list_block(P, base, i, part);
        ++i;
        r = (i64)blk * P.QB;
        rend = r + P.QB < P.L ? r + P.QB : P.L;
        continue;
      }
      if (++gi >= P.G) return false;
      head();
    }
  }
};

#if FUSED_ASCENDING
typedef GroupWalkAsc FusedWalk;
#else
typedef GroupWalkDesc FusedWalk;
#endif

// Unit u: 128 kv rows c0.. (kv block jblk) of kv head hk of batch b, row bhk of K / V; units are
// launched (or, persistent, taken) head by head, in a head from kv block 0 up (FUSED_ASCENDING: down).
struct FusedUnit {
  i64 bhk, b, hk, c0, jblk;
  __device__ __forceinline__ FusedUnit(const FlexParams& P, i64 u) {
    bhk = u / P.kv_tiles;
    b = bhk / P.Hkv;
    hk = bhk % P.Hkv;
    const i64 tile = FUSED_ASCENDING ? P.kv_tiles - 1 - u % P.kv_tiles : u % P.kv_tiles;
    c0 = tile * FUSED_KV;
    jblk = c0 / P.KB;
  }
};

// How many kv blocks below jblk q block ib of (b, h) lists: the parts added to its tiles before jblk's.
__device__ __forceinline__ unsigned kv_rank(const FlexParams& P, i64 b, i64 h, i64 ib, i64 jblk) {
  if (P.all_full) return (unsigned)jblk;
  const i64 row = mask_row(P, b, h) * P.nQB + ib;
  const int* idx = P.kv_all_idx + row * P.kv_all_m;
  int lo = 0, hi = P.kv_all_num[row];
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if ((idx[mid] >> 1) < jblk) lo = mid + 1;
    else hi = mid;
  }
  return (unsigned)lo;
}

// How many kv blocks q block ib of (b, h) lists: the parts its tiles' sums take.
__device__ __forceinline__ unsigned kv_count(const FlexParams& P, i64 b, i64 h, i64 ib) {
  return P.all_full ? (unsigned)P.nKVB : (unsigned)P.kv_all_num[mask_row(P, b, h) * P.nQB + ib];
}

// Kv block jblk's turn on q block ib's tiles of (b, h): its place among the blocks the q block lists,
// counted from the lowest (or, FUSED_ASCENDING, from the highest).
__device__ __forceinline__ unsigned part_turn(const FlexParams& P, i64 b, i64 h, i64 ib, i64 jblk) {
#if FUSED_ASCENDING
  return kv_count(P, b, h, ib) - 1u - kv_rank(P, b, h, ib, jblk);
#else
  return kv_rank(P, b, h, ib, jblk);
#endif
}

// The rows of q tile r0 (TILE_M, fewer at the end of L).
__device__ __forceinline__ i64 q_tile_rows(const FlexParams& P, i64 r0) { return P.L - r0 < TILE_M ? P.L - r0 : TILE_M; }

// One part (this block's, in buf) into q tile r0 of (b, h) row bh: wait for the block's turn on the
// tile, one bulk reduction of its valid rows (FUSED_INPLACE: a store for the first), wait for its
// writes, pass the turn (by one thread). Returns whether it was the tile's last (FUSED_INPLACE).
__device__ __forceinline__ bool fused_add_part(const FlexParams& P, i64 b, i64 h, i64 r0, i64 jblk, const float* buf) {
  const i64 bh = b * P.Hq + h;
  unsigned* sem = P.dqsem + bh * P.q_tiles + r0 / TILE_M;
#if !FUSED_UNORDERED
  const unsigned rank = part_turn(P, b, h, r0 / P.QB, jblk);
  unsigned seen;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
  } while (seen != rank);
  asm volatile("fence.proxy.async.global;" ::: "memory");  // the acquire, before the async proxy's adds
#endif
#if FUSED_TMA_SUMS
#pragma unroll
  for (int p = 0; p < HEAD_DIM / 32; ++p) {  // panel p: columns 32 p.. of the tile's rows
    const u32 src = smem_addr(buf + p * TILE_M * 32);
#if FUSED_INPLACE
    if (rank == 0)
      asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(P.dqmap),
                   "r"(p * 32), "r"((int)r0), "r"((int)bh), "r"(src)
                   : "memory");
    else
#endif
      asm volatile(
          "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
              P.dqmap),
          "r"(p * 32), "r"((int)r0), "r"((int)bh), "r"(src)
          : "memory");
  }
#else
  float* dst = P.dqacc + (bh * P.L + r0) * HEAD_DIM;
  const int bytes = (int)(q_tile_rows(P, r0) * HEAD_DIM * 4);
#if FUSED_INPLACE
  if (rank == 0)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(buf)),
                 "r"(bytes)
                 : "memory");
  else
#endif
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
                 "r"(smem_addr(buf)), "r"(bytes)
                 : "memory");
#endif
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#if !FUSED_UNORDERED
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the sums are written
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sem) : "memory");
#else
  (void)sem;
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // buf may be rewritten (the adds go on)
#endif
#if FUSED_INPLACE
  return rank + 1 == kv_count(P, b, h, r0 / P.QB);
#else
  return false;
#endif
}

#if FUSED_INPLACE
// dQ = scale sums of q tile r0 of (b, h) row bh in T, by the 32 lanes of a warp (the sums complete and
// visible to lane 0's async proxy): lane 0 copies them into `scratch` (the part buffer just added) by
// one bulk copy completing on `bar` (its phase `parity`), then the lanes convert from shared memory.
// The loads straight from L2, one 16-byte vector a lane at a time, left ~64 L2 round trips a tile
// on the reducer's path.
__device__ __forceinline__ void fused_convert_tile(const FlexParams& P, i64 bh, i64 r0, int lane, float* scratch,
                                                   u64* bar, u32 parity) {
  const i64 nrows = q_tile_rows(P, r0), base = (bh * P.L + r0) * HEAD_DIM;
  const int bytes = (int)(nrows * HEAD_DIM * 4);
  if (lane == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(scratch)),
                 "l"(P.dqacc + base), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
  }
  mbar_wait(bar, parity);
  const float sc = P.scale_f;
  for (i64 i = lane * 4; i < nrows * HEAD_DIM; i += 32 * 4) {
    const float4 v = *(const float4*)(scratch + i);
    *(uint2*)((u16*)P.dq + base + i) = make_uint2(pack2(v.x * sc, v.y * sc), pack2(v.z * sc, v.w * sc));
  }
}
#endif
)kiln_src";
}

}  // namespace kiln::flex::cuda
