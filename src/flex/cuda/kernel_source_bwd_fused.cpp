// The fused backward (BWD_FUSED; KILN_FLEX_BWD_FUSED=1) as source text, pasted after the dK/dV kernel
// by kernel_template() (kernel_source.cpp): flex_bwd_dkdv forms dQ as well, and flex_bwd_dq only
// converts its fp32 sums. Three parts: its switches and their reasons (kernel_backward_fused_config,
// opening the #if), its walks, units, turns and adds (kernel_backward_fused_parts, in
// kernel_source_bwd_fused_parts.cpp), its kernels (kernel_backward_fused, closing the #if).
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* kernel_backward_fused_config() {
  return R"kiln_src(#if KILN_BUILD_BWD && BWD_FUSED
// FlashAttention-3's backward without its atomics. The window rows' two backward kernels re-read K / V
// (dQ) and Q / dO (dK/dV) for every 64-row tile and recompute S and dP in both: on the E = 128 window
// the dQ kernel kept L2 74 % busy (H200, session 19, Nsight Compute). Here a CTA holds 128 kv rows
// (two warpgroups of 64, K and V loaded once), streams the q tiles of its kv block through two Q / dO
// buffers, and each step also forms dQ's part dS K: each warpgroup's dS^T (bf16, as dK's product
// takes it) goes into a shared tile [128 kv x 64 q], and warpgroup w multiplies it (M-major) by K's
// columns 64 w.. (N-major); the fp32 part goes through shared memory into FlexParams::dqacc by one
// bulk reduction (cp.reduce.async.bulk .add.f32). The parts of a q tile are added in ascending kv
// block order: thread 0 waits until the tile's semaphore counts this block's rank in the tile's kv
// list, adds, waits for the writes and counts on. Each CTA walks its q tiles in descending order, so
// the parts it waits for come from lower units (launched earlier), which reach that tile early in
// their own walks. No atomics decide a sum: the same bits every run, and whatever the full / partial
// classification (the elements' arithmetic is the dK/dV kernel's). flex_bwd_dq then writes dQ =
// scale dqacc in T. Needs the merged lists (or no BlockMask), E = 128, blocks of 128 kv rows, TMA and
// paired products, no captured-tensor gradients (the host's rule). A measurement switch: its first
// version was slower than the two kernels (docs/benchmarks.md, session 19).
#if HEAD_DIM != 128 || !BWD_TMA || !BWD_PAIRED || HAS_CAP_GRAD
#error "the fused backward takes E = 128, the TMA backward's paired products and no captured-tensor gradients"
#endif
#define FUSED_THREADS (2 * NTHREADS)
#ifndef FUSED_UNORDERED
#define FUSED_UNORDERED 0  // a measurement only: parts added in any order, no waits (not deterministic)
#endif
#ifndef FUSED_REDUCER
#define FUSED_REDUCER 0  // the adds by a reducer warpgroup from two part buffers (KILN_FLEX_BWD_FUSED_REDUCER=1)
#endif
// FUSED_REDUCER: a third warpgroup whose first warp's lane 0 takes each step's turn and add, so the
// consumers never wait on them (with the adds inline, thread 0's waits cost 0.3 ms of the E 128 window's 1.76:
// H200, session 19, call 8); the consumers hand it a part through two buffers (part_full / part_empty
// mbarriers). setmaxnreg moves the reducer's registers to the consumers.
#ifndef FUSED_INPLACE
#define FUSED_INPLACE 0  // with the reducer: no zero / convert passes (KILN_FLEX_BWD_FUSED_INPLACE=1)
#endif
#if FUSED_INPLACE && (!FUSED_REDUCER || FUSED_UNORDERED)
#error "FUSED_INPLACE takes the reducer warpgroup and the ordered adds"
#endif
// FUSED_INPLACE: a q tile's first part is stored rather than added (the sums need no zeroing) and the
// reducer warp converts a tile into dQ once its last part is in (no convert pass); flex_bwd_dq then
// only zeroes the dQ of q tiles whose kv list is empty.
#ifndef FUSED_ASCENDING
#define FUSED_ASCENDING 0  // q tiles walked upward, parts from the highest kv block down (KILN_FLEX_BWD_FUSED_ASCENDING=1)
#endif
// FUSED_ASCENDING: with the descending walk and ascending turns a causal head's kv block j reaches its
// first tile (the last q tile, whose turns run 0..j) only after block j - 1 has added there: a wave
// of j idle steps per CTA, ~half a causal head's work (the fused causal row 9.8 -> 14.1 ms; H200,
// session 19, call 8). Walking upward, a unit's first tile is the one where no higher block adds
// (causal: its diagonal), and the higher blocks it waits for reach each later tile earlier in their
// own walks. Units are launched from the highest kv block of a head down, so every wait is on a CTA
// launched earlier (no CTA waits on one that may not be resident yet).
#ifndef FUSED_PERSIST
#define FUSED_PERSIST 0  // one CTA an SM walks units blockIdx.x, + gridDim.x, ... (KILN_FLEX_BWD_FUSED_PERSIST=1)
#endif
// FUSED_PERSIST: a window row's unit is ~6 steps, so each CTA's launch, its K / V load and its dK / dV
// stores were exposed once a unit (one CTA an SM, nothing beside it). Persistent, a CTA issues the next
// unit's K, V and first Q tile and then stores the last unit's dK / dV. Every unit waits only on
// lower units (launched earlier, or taken earlier in each CTA's sequence), so with all CTAs resident
// no wait is on a unit that cannot start.
// FUSED_FOR_UNITS(U) { ... }: the body for each of this CTA's units U (one CTA a unit: first_unit,
// blockIdx.x's, formed before the warpgroups part: its 64-bit divisions spilled in the reducer's 32
// registers).
#if FUSED_PERSIST
#define FUSED_FOR_UNITS(U) \
  for (i64 U##_u = blockIdx.x; U##_u < P.B * P.Hkv * P.kv_tiles; U##_u += gridDim.x) \
    if (const FusedUnit U(P, U##_u); true)
#else
#define FUSED_FOR_UNITS(U) if (const FusedUnit& U = first_unit; true)  // a CTA a unit
#endif
#ifndef FUSED_TMA_SUMS
#define FUSED_TMA_SUMS 0  // parts staged swizzled, added by bulk tensor reductions (KILN_FLEX_BWD_FUSED_TMA_SUMS=1)
#endif
// FUSED_TMA_SUMS: a part staged row-major for the plain bulk reduction takes each of its 16 float2
// stores a warp into 8 banks (rows 512 bytes apart: 8-way conflicts, 8 wavefronts for 256 bytes).
// Staged as four [64 x 32] fp32 panels with the 128-byte swizzle, a store's 8 rows land in 8
// different 16-byte chunks (2 wavefronts), and four bulk tensor reductions through FlexParams::dqmap
// add the panels (the map's bounds clip a head's last short tile).
#define FUSED_CTA_THREADS (FUSED_THREADS + (FUSED_REDUCER ? 128 : 0))
#define FUSED_PARTS (FUSED_REDUCER ? 2 : 1)  // dQ part buffers
#if FUSED_PERSIST  // the reducer's walk over units spilled 124-160 bytes at 32, still 20 at 48
#define FUSED_REDUCER_REGS 56  // (65536 - 56 x 128) / 256 = 224 for the consumers
#define FUSED_CONSUMER_REGS 224
#else
#define FUSED_REDUCER_REGS 32  // (65536 - 32 x 128) / 256 = 240 for the consumers
#define FUSED_CONSUMER_REGS 240
#endif
#define FUSED_KV 128  // kv rows a CTA
)kiln_src";
}

// The fused backward's kernels, after kernel_backward_fused_config() and kernel_backward_fused_parts()
// (kernel_source_bwd_fused_parts.cpp); closes the first one's #if.
const char* kernel_backward_fused() {
  return R"kiln_src(
__device__ __forceinline__ void fused_bar() { asm volatile("bar.sync 1, %0;" ::"n"(FUSED_THREADS) : "memory"); }


extern "C" __global__ void __launch_bounds__(FUSED_CTA_THREADS, 1) flex_bwd_dkdv(const __grid_constant__ FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Ks = wg_smem_base(smem);                    // [128 kv x E], one 128-row box
  u16* Vs = Ks + FUSED_KV * HEAD_DIM;
  u16* Qs = Vs + FUSED_KV * HEAD_DIM;              // two 64-row buffers
  u16* dOs = Qs + 2 * TILE_M * HEAD_DIM;           // two 64-row buffers
  u16* dSt = dOs + 2 * TILE_M * HEAD_DIM;          // [128 kv x 64 q], bf16, one swizzled panel
  float* dQbuf = (float*)(dSt + FUSED_KV * TILE_M);  // FUSED_PARTS x [64 q x E] fp32: row-major (dqacc's layout)
                                                     // or FUSED_TMA_SUMS's four swizzled [64 x 32] panels
  float* rows_s = dQbuf + FUSED_PARTS * TILE_M * HEAD_DIM;  // two buffers of lse2 then delta (2 x 64 floats each)
  __shared__ __align__(8) u64 bars[2];
#if FUSED_REDUCER
  __shared__ __align__(8) u64 part_full[2], part_empty[2];  // a part written by the 8 consumer warps; added
#endif
#if FUSED_INPLACE
  __shared__ __align__(8) u64 conv_bar;  // a finished tile's sums, copied into shared memory to convert
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wg = warp >> 2,
            wq = warp & 3;
  const FusedUnit first_unit(P, blockIdx.x);
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 2);
#if FUSED_REDUCER
    for (int i = 0; i < 2; ++i) {
      mbar_init_count(&part_full[i], 2 * NWARPS);
      mbar_init_count(&part_empty[i], 1);
    }
#if FUSED_INPLACE
    mbar_init_count(&conv_bar, 1);
#endif
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncthreads();  // the barriers are initialised; the consumers' block barriers below are named (fused_bar)
#if FUSED_REDUCER
  if (warp >= 2 * NWARPS) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(FUSED_REDUCER_REGS));
    if (warp == 2 * NWARPS) {  // its lane 0: the same walks as the consumers', each step's part in turn
      u32 rstep = 0;
#if FUSED_INPLACE
      u32 converts = 0;
#endif
      FUSED_FOR_UNITS(U) {
        FusedWalk rwalk(P, U.b, U.hk, U.jblk);
        i64 rg, rr0;
        bool rpart;
        for (; rwalk.next(rg, rr0, rpart); ++rstep) {
          const int x = rstep & 1;
          bool last = false;
          float* buf = dQbuf + x * TILE_M * HEAD_DIM;
          if (lane == 0) {
            mbar_wait(&part_full[x], (rstep >> 1) & 1);
            last = fused_add_part(P, U.b, U.hk * P.G + rg, rr0, U.jblk, buf);
          }
#if FUSED_INPLACE
          if (__shfl_sync(0xffffffffu, last ? 1 : 0, 0)) {  // the tile's last part: its dQ, through buf
            fused_convert_tile(P, U.b * P.Hq + U.hk * P.G + rg, rr0, lane, buf, &conv_bar, converts & 1);
            ++converts;
          }
          __syncwarp();  // every lane is done with buf
#else
          (void)last;
#endif
          if (lane == 0) mbar_arrive(&part_empty[x]);
        }
      }
      if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // FUSED_UNORDERED: the last adds
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(FUSED_CONSUMER_REGS));
  u32 step = 0;  // the consumers' step: its part buffer step & 1
#endif
  float dk[HEAD_DIM / 8][4], dv[HEAD_DIM / 8][4];
  auto zero_dk_dv = [&] {
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
      dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
      dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    }
  };
  zero_dk_dv();
  u32 phase = 0;
  int cur = 0;
  auto drain = [&] {  // the last loads and (inline adds) bulk reductions, before the kernel ends
    cp_async_wait<0>();
    if (!FUSED_REDUCER && threadIdx.x == 0)
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // FUSED_UNORDERED: the last adds
  };
#if FUSED_PERSIST
  i64 done_bhk = -1, done_cols[2] = {0, 0};  // the last unit's: its dK / dV go out as the next unit's loads fly
#endif
  FUSED_FOR_UNITS(U) {
    const i64 b = U.b, hk = U.hk, jblk = U.jblk, w0 = U.c0 + wg * 64;
    const i64 cols[2] = {w0 + wq * 16 + g, w0 + wq * 16 + g + 8};  // this thread's kv rows
    const bool kv_in = w0 + 64 <= P.S;
    FusedWalk walk(P, b, hk, jblk);
    i64 gi, r0;
    bool partial;
    bool more = walk.next(gi, r0, partial);
    auto load_q_tile = [&](int buf, i64 gq, i64 row0) {
      const i64 bh = b * P.Hq + hk * P.G + gq;
      if (threadIdx.x == 0) {
        tma_tile(Qs + buf * TILE_M * HEAD_DIM, P.qmap, &bars[buf], row0, bh, TILE_M, false);
        tma_tile(dOs + buf * TILE_M * HEAD_DIM, P.domap, &bars[buf], row0, bh, TILE_M);
      }
      load_rows(rows_s + buf * 2 * TILE_M, P, bh, row0);  // by the first 128 consumer threads
    };
    if (more && threadIdx.x == 0) {  // K and V (128-row boxes) with the first q tile
      tma_tile(Ks, P.kmap, &bars[cur], U.c0, U.bhk, FUSED_KV, false);
      tma_tile(Vs, P.vmap, &bars[cur], U.c0, U.bhk, FUSED_KV, false);
    }
    if (more) load_q_tile(cur, gi, r0);
    cp_async_commit();
#if FUSED_PERSIST
    if (done_bhk >= 0) {
      dkdv_store_rows(P, dk, dv, done_bhk, done_cols, t);
      zero_dk_dv();
    }
    done_bhk = U.bhk;
    done_cols[0] = cols[0];
    done_cols[1] = cols[1];
#endif
    while (more) {
      const i64 h = hk * P.G + gi;
      mbar_wait(&bars[cur], (phase >> cur) & 1);  // this tile's Q and dO (and K / V on the first) landed
      phase ^= 1u << cur;
      cp_async_wait<0>();  // its lse2 / delta rows
      SMEM_PROXY_FENCE();
      fused_bar();  // ... for every consumer; the other buffer and dSt are free (and dQbuf without the reducer)
      i64 gi_n, r0_n;
      bool p_n;
      const bool more_n = walk.next(gi_n, r0_n, p_n);
      if (more_n) load_q_tile(cur ^ 1, gi_n, r0_n);
      cp_async_commit();
      const u16* Qc = Qs + cur * TILE_M * HEAD_DIM;
      const u16* dOc = dOs + cur * TILE_M * HEAD_DIM;
      const float* lse2_c = rows_s + cur * 2 * TILE_M;
      float s[TILE_M / 8][4], dp[TILE_M / 8][4];
      // S^T and dP^T of this warpgroup's 64 kv rows (rows 64 wg.. of the 128-row K and V tiles).
      wg_abt_issue<64>(s, Ks, FUSED_KV, wg * 64, Qc);
      wg_abt_issue<64>(dp, Vs, FUSED_KV, wg * 64, dOc);
      dkdv_pair_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_c, nullptr, [] {});
      dkdv_pair_dk_dv(dk, dv, s, dp, Qc, dOc, [&](const u32 (*pk_ds)[2]) {
        // dS^T, as the dK product takes it, into rows 64 wg.. of the shared [128 kv x 64 q] tile.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = wg * 64 + wq * 16 + g + 8 * r;
#pragma unroll
          for (int n = 0; n < TILE_M / 8; ++n)
            *(u32*)((char*)dSt + row * 128 + ((n ^ (row & 7)) << 4) + 4 * t) = pk_ds[n][r];
        }
      });
      fence_async_smem();  // the dS^T writes, before wgmma reads them
      fused_bar();         // both warpgroups' halves are in
#if FUSED_REDUCER
      const int part = step & 1;  // the part buffer of this step
#else
      const int part = 0;
#endif
      {
        // dQ's part, columns 64 wg..: dS [64 q x 128 kv] (the dS^T tile, M-major) times K's panel wg (N-major).
        float d[8][4];
        wg_ab_tt<FUSED_KV>(d, smem_addr(dSt), smem_addr(Ks) + wg * FUSED_KV * 128);
#if FUSED_REDUCER
        mbar_wait(&part_empty[part], ((step >> 1) & 1) ^ 1);  // the reducer is done with this buffer's last part
#endif
        float* pb = dQbuf + part * TILE_M * HEAD_DIM;
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = wq * 16 + g + 8 * r;
#if FUSED_TMA_SUMS
            // Column wg 64 + 8 n + 2 t: panel 2 wg + n / 4, 16-byte chunk 2 (n % 4) + t / 2 of the row,
            // swizzled by row % 8 (= g).
            const int chunk = ((n & 3) * 2 + (t >> 1)) ^ g;
            float* at = pb + (wg * 2 + (n >> 2)) * TILE_M * 32 + row * 32 + chunk * 4 + 2 * (t & 1);
#else
            float* at = pb + row * HEAD_DIM + wg * 64 + n * 8 + 2 * t;
#endif
            *(float2*)at = make_float2(d[n][2 * r], d[n][2 * r + 1]);
          }
      }
      fence_async_smem();  // the part's writes, before the bulk reduction reads them
#if FUSED_REDUCER
      __syncwarp();
      if (lane == 0) mbar_arrive(&part_full[part]);  // the reducer takes it from here
      ++step;
#else
      fused_bar();
      if (threadIdx.x == 0) fused_add_part(P, b, h, r0, jblk, dQbuf);
#endif
      gi = gi_n;
      r0 = r0_n;
      partial = p_n;
      more = more_n;
      cur ^= 1;
    }
#if FUSED_PERSIST
    fused_bar();  // every consumer's last products are done: K, V and the Q / dO buffers take the next unit
#else
    drain();
    dkdv_store_rows(P, dk, dv, U.bhk, cols, t);
#endif
  }  // units
#if FUSED_PERSIST
  drain();
  if (done_bhk >= 0) dkdv_store_rows(P, dk, dv, done_bhk, done_cols, t);
#endif
}

#if FUSED_INPLACE
// Zero dQ for the q tiles whose kv list is empty (no part converts them): one CTA a (b, h, q tile).
extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dq(const FlexParams P) {
  const i64 tile = blockIdx.x % P.q_tiles, bh = blockIdx.x / P.q_tiles, r0 = tile * TILE_M;
  if (P.all_full || kv_count(P, bh / P.Hq, bh % P.Hq, r0 / P.QB) != 0) return;
  const i64 nrows = q_tile_rows(P, r0);
  u32* dg = (u32*)((u16*)P.dq + (bh * P.L + r0) * HEAD_DIM);
  for (i64 i = threadIdx.x; i < nrows * HEAD_DIM / 2; i += NTHREADS) dg[i] = 0u;
}
#else
// dQ = scale dqacc in T, 8 elements a thread.
extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dq(const FlexParams P) {
  const i64 i = ((i64)blockIdx.x * NTHREADS + threadIdx.x) * 8, n = P.B * P.Hq * P.L * HEAD_DIM;
  if (i >= n) return;
  const float4 a = *(const float4*)(P.dqacc + i), c = *(const float4*)(P.dqacc + i + 4);
  const float sc = P.scale_f;
  *(uint4*)((u16*)P.dq + i) =
      make_uint4(pack2(a.x * sc, a.y * sc), pack2(a.z * sc, a.w * sc), pack2(c.x * sc, c.y * sc), pack2(c.z * sc, c.w * sc));
}
#endif  // FUSED_INPLACE
#endif  // KILN_BUILD_BWD && BWD_FUSED

)kiln_src";
}

}  // namespace kiln::flex::cuda
