// The FlexAttention backward kernels as source text (the last part of kernel_template(),
// kernel_source.cpp): delta preprocessing, dQ per q tile, dK/dV per kv tile over the group's q
// heads, and the fixed-order reduction of captured-tensor gradient slots. No atomics.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* backward_kernels_source() {
  return R"kiln_src(#if KILN_BUILD_BWD
#ifndef BWD_KBUF
#define BWD_KBUF 1  // dQ kernel: 2 loads the next K with the next V a step earlier (TMA: 2 K and 2 V buffers)
#endif
#ifndef BWD_QBUF
#define BWD_QBUF 1  // Q / dO tiles of the dK/dV kernel: 2 loads the next q tile a whole tile ahead
#endif
#ifndef BWD_TMA
#define BWD_TMA 0  // wgmma only: Q, dO, K and V tiles by TMA (dQ: one K / V buffer; dK/dV: two Q / dO)
#endif
#if BWD_TMA && !BWD_WGMMA
#error "the TMA backward loads the wgmma tile layout"
#endif
#ifndef BWD_PAIRED
#define BWD_PAIRED 0  // TMA only: the tile's two products issued together, one wait a pair
#endif
#if BWD_PAIRED && !BWD_TMA
#error "the paired products are the TMA backward's"
#endif
#ifndef BWD_SPLIT_P
#define BWD_SPLIT_P 0  // paired TMA products, two dQ stages, no score_mod: P computed while dP is in flight
#endif
#if BWD_SPLIT_P && !(BWD_PAIRED && BWD_KBUF == 2 && !HAS_SCORE)
#error "the split P / dS needs the paired products, two dQ stages and no score_mod"
#endif
#define BWD_QSETS (BWD_TMA ? 2 : BWD_QBUF)  // dK/dV's buffers of Q, dO and rows
// Both kernels run one warpgroup (NTHREADS threads) a CTA, so their wg = threadIdx.x / NTHREADS is
// 0; it stays a run-time value in their tile and row offsets (dQ: Qw, dOw, r0; dK/dV: Kw, Vw, w0),
// and warp stays (threadIdx.x >> 5) % NWARPS, because ptxas allocates the kernels better so
// (sm_90a, nvcc 13.0, E = 128 causal: dK/dV 255 registers without spills, 70 bytes of spills with
// the offsets folded away). This is the SASS measured on the H200 in session 13.
// The backward's tile loads and products: wgmma on sm_90a (swizzled tiles), else mma.sync (padded
// tiles). ABT: acc[64 x 64] = the CTA's 64 rows of A times B^T; PB: acc[64 x HEAD_DIM] += p B.
#if BWD_WGMMA
#if TILE_M != 64
#error "the wgmma backward's tiles are one warpgroup's 64 rows"
#endif
#define BWD_SMEM_BASE(smem) wg_smem_base(smem)
#define BWD_TILE_ELEMS(rows) ((rows) * HEAD_DIM)
#define BWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_async<true>(dst, src, row0, total, rows)
// Tiles that stay for the whole tile walk (Q and dO in dQ, K and V in dK/dV): by cp.async, landing
// with the walk's first group (mma.sync: plain loads, visible after the first barrier).
#define BWD_LOAD_RESIDENT(dst, src, row0, total, rows) BWD_LOAD_TILE(dst, src, row0, total, rows)
#define BWD_ABT(acc, A, Bm, ldsm) wg_abt<64>(acc, A, 64, 0, Bm)
#define BWD_PB(acc, p, Bm, ldsm)   \
  {                                \
    u32 pk_[64 / 8][2];            \
    pack_rows<64>(pk_, p);         \
    wg_pb<64>(acc, pk_, Bm);       \
  }
#else
#define BWD_SMEM_BASE(smem) (smem)
#define BWD_TILE_ELEMS(rows) ((rows) * LD)
#define BWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_async(dst, src, row0, total, rows)
#define BWD_LOAD_RESIDENT(dst, src, row0, total, rows) load_tile(dst, src, row0, total, rows)
#define BWD_ABT(acc, A, Bm, ldsm) tile_abt<ldsm>(acc, A, warp * 16, Bm, lane)
#define BWD_PB(acc, p, Bm, ldsm) tile_pb<ldsm>(acc, p, Bm, lane)
#endif

// PRE_LANES lanes a row, each with one 16-byte load of dO and of O (8 elements): a warp per row
// with 2-byte loads ran at ~1.3 TB/s (H200, session 13: 51 us of a 0.55 ms fwd+bwd at 1x8x32768x64).
#define PRE_LANES (HEAD_DIM / 8)
extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_pre(const FlexParams P) {
  const int sub = threadIdx.x % PRE_LANES;
  const i64 row = (i64)blockIdx.x * (NTHREADS / PRE_LANES) + threadIdx.x / PRE_LANES;
  const bool live = row < P.B * P.Hq * P.L;
  const u16* dout = (const u16*)P.dout + row * HEAD_DIM + sub * 8;
  const u16* out = (const u16*)P.out + row * HEAD_DIM + sub * 8;
  float s = 0.f;
  if (live && (((unsigned long long)P.dout | (unsigned long long)P.out) & 15) == 0) {
    const uint4 a = *(const uint4*)dout, b = *(const uint4*)out;
    const u32 av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      s += to_f((u16)(av[j] & 0xffffu)) * to_f((u16)(bv[j] & 0xffffu)) + to_f((u16)(av[j] >> 16)) * to_f((u16)(bv[j] >> 16));
  } else if (live) {  // a dO not 16-byte aligned (a caller's view at an odd offset)
#pragma unroll
    for (int e = 0; e < 8; ++e) s += to_f(dout[e]) * to_f(out[e]);
  }
#pragma unroll
  for (int off = PRE_LANES / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (live && sub == 0) {
    P.delta[row] = s - (P.dlse ? P.dlse[row] : 0.f);
    const float lse = P.lse[row];
    P.lse2[row] = lse == NEG_INF ? POS_INF : lse * LOG2E;  // fully masked rows: p = 2^(y - inf) = 0
  }
}

// P of one element from its raw score q.k (before scaling), with lse2 = lse log2(e) of its row
// (+inf when the row is fully masked: p = 0). kInterior: an element of a full block inside both
// lengths, which needs neither the bounds test nor the mask (the same arithmetic as mod_score on
// kept elements, so the same bits). kBits (MASK_BITS): a partial block's element whose keep bit is
// `bit` (mod_score's arithmetic with the mask read from flex_mask_bits, the same bits).
template <bool kInterior, bool kBits = false>
__device__ __forceinline__ float elem_p(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv, bool partial,
                                        float lse2, bool bit = true) {
  bool keep = true;
  float y;
  if (kInterior) {
    y = raw * (float)P.scale;
#if HAS_SCORE
    y = score_mod(y, b, h, q, kv, P);
#endif
  } else if (kBits) {
    y = raw * (float)P.scale;
#if HAS_SCORE
    y = score_mod(y, b, h, q < P.L ? q : P.L - 1, kv < P.S ? kv : P.S - 1, P);
#endif
    y = bit ? y : NEG_INF;
  } else {
    y = mod_score(P, raw, b, h, q, kv, partial, &keep);
  }
  return fast_exp2(fmaf(y, LOG2E, -lse2));  // y = -inf where not kept: p = 0
}

// P and dS of one element (elem_p's arguments, and dP = dO.v before scaling).
template <bool kInterior, bool kBits = false>
__device__ __forceinline__ void p_ds(const FlexParams& P, float raw, float dp, i64 b, i64 h, i64 q, i64 kv,
                                     bool partial, float lse2, float delta, float* p_out, float* ds_post_out,
                                     float* ds_out, bool bit = true) {
  const float p = elem_p<kInterior, kBits>(P, raw, b, h, q, kv, partial, lse2, bit);
  float ds = p * (dp - delta);
  *ds_post_out = ds;  // d loss / d modified score
#if HAS_SCORE
  if (kInterior || (q < P.L && kv < P.S)) ds = score_grad(raw * (float)P.scale, b, h, q, kv, ds, P, (double*)0);
  else ds = 0.f;
#endif
  *p_out = p;
  *ds_out = ds;
}

// dQ's tile: s (raw scores) becomes dS, from dp, row by row (rows[r], columns c0..).
template <bool kInterior>
__device__ __forceinline__ void dq_tile_ds(const FlexParams& P, float (*s)[4], const float (*dp)[4], i64 b, i64 h,
                                           const i64* rows, i64 c0, int t, bool partial, const float* lse2,
                                           const float* delta) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p, ds_post, ds;
      p_ds<kInterior>(P, s[n][e], dp[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), partial, lse2[e >> 1],
                      delta[e >> 1], &p, &ds_post, &ds);
      s[n][e] = ds;
    }
}

#if MASK_BITS
// The keep-bit words of a thread's two rows over dQ's tile of a partial block (columns c0..), from
// the block's bits `blk` (flex_mask_bits): each thread loads them once; dq_bit picks element (n, e).
__device__ __forceinline__ void dq_row_bits(const FlexParams& P, const i64* rows, i64 c0, const unsigned* blk,
                                            unsigned (*w)[TILE_N / 32]) {
  const i64 qb0 = rows[0] - rows[0] % P.QB, wpr = P.KB / 32, col0 = (c0 % P.KB) / 32;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int x = 0; x < TILE_N / 32; ++x) w[r][x] = blk[(rows[r] - qb0) * wpr + col0 + x];
}
__device__ __forceinline__ bool dq_bit(const unsigned (*w)[TILE_N / 32], int n, int e, int t) {
  return (w[e >> 1][n >> 2] >> ((n & 3) * 8 + 2 * t + (e & 1))) & 1u;
}

// dQ's tile of a partial block from the block's keep bits `blk`.
__device__ __forceinline__ void dq_tile_ds_bits(const FlexParams& P, float (*s)[4], const float (*dp)[4], i64 b, i64 h,
                                                const i64* rows, i64 c0, int t, const float* lse2, const float* delta,
                                                const unsigned* blk) {
  unsigned w[2][TILE_N / 32];
  dq_row_bits(P, rows, c0, blk, w);
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p, ds_post, ds;
      p_ds<false, true>(P, s[n][e], dp[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), true, lse2[e >> 1],
                        delta[e >> 1], &p, &ds_post, &ds, dq_bit(w, n, e, t));
      s[n][e] = ds;
    }
}
#endif

#if BWD_SPLIT_P
// Without a score_mod dS = P (dP - delta), so the tiles split in two: P from the raw scores while
// dP's product is still in flight, then dS. The same arithmetic as p_ds, so the same bits.
// dQ's tile (rows[r], columns c0..): s becomes P; kBits: a partial block's keep bits `blk`.
template <bool kInterior, bool kBits = false>
__device__ __forceinline__ void dq_tile_p(const FlexParams& P, float (*s)[4], i64 b, i64 h, const i64* rows, i64 c0,
                                          int t, bool partial, const float* lse2, const unsigned* blk = nullptr) {
#if MASK_BITS
  unsigned w[2][TILE_N / 32];
  if (kBits) dq_row_bits(P, rows, c0, blk, w);
#endif
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#if MASK_BITS
      const bool bit = kBits ? dq_bit(w, n, e, t) : true;
#else
      const bool bit = true;
#endif
      s[n][e] = elem_p<kInterior, kBits>(P, s[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), partial,
                                         lse2[e >> 1], bit);
    }
}
// dQ's tile: p becomes dS (row r's delta).
__device__ __forceinline__ void dq_tile_ds_from_p(float (*p)[4], const float (*dp)[4], const float* delta) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[n][e] = p[n][e] * (dp[n][e] - delta[e >> 1]);
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dq(const __grid_constant__ FlexParams P) {
  PROF_DECL
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = BWD_SMEM_BASE(smem);
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M);
  u16* Ks = dOs + BWD_TILE_ELEMS(TILE_M);
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
  u16* Ks2 = Vs + BWD_TILE_ELEMS(TILE_N);  // BWD_KBUF 2: the second K buffer
#if !BWD_TMA
  u16* Kcur = Ks;  // K of the current tile
#endif
  const int wg = threadIdx.x / NTHREADS, warp = (threadIdx.x >> 5) % NWARPS, lane = threadIdx.x & 31, g = lane >> 2,
            t = lane & 3;  // wg: 0, kept a run-time value (the note at the top)
  const i64 tile = P.q_tiles - 1 - (i64)blockIdx.x % P.q_tiles, bh = (i64)blockIdx.x / P.q_tiles;
  const i64 b = bh / P.Hq, h = bh % P.Hq, hk = h / P.G, u0 = tile * TILE_M, r0 = u0 + wg * TILE_M;
  const u16* Qw = Qs + wg * BWD_TILE_ELEMS(TILE_M);  // = Qs, dOs
  const u16* dOw = dOs + wg * BWD_TILE_ELEMS(TILE_M);
#if !BWD_TMA
  const u16* kg = (const u16*)P.k + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  BWD_LOAD_RESIDENT(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);  // with V(c0)'s group
  BWD_LOAD_RESIDENT(dOs, (const u16*)P.dout + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);
#endif
  const i64 rows[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
  const bool rows_in = r0 + TILE_M <= P.L;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = rows[r] < P.L ? P.lse2[bh * P.L + rows[r]] : POS_INF;
    delta[r] = rows[r] < P.L ? P.delta[bh * P.L + rows[r]] : 0.f;
  }
  float dq[HEAD_DIM / 8][4];
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  const i64 mrow = P.all_full ? 0 : mask_row(P, b, h) * P.nQB + u0 / P.QB;
  TileWalk walk(BlockWalk(P, P.kv_num, P.kv_idx, P.kv_m, P.fkv_num, P.fkv_idx, P.fkv_m, mrow, P.nKVB), P.KB, P.S);
  i64 c0, c_next;
  bool partial, p_next;
  int slot0 = 0, s_next = 0;  // the partial list's slot of c0's block (MASK_BITS)
  bool more = walk.next(c0, partial, &slot0);
#if BWD_TMA
  // bars[slot]: K tiles (Q joins slot 0's first phase); bars[2 + slot]: V tiles (dO joins slot 0's).
  // Thread 0 issues the loads. BWD_KBUF 1: one K and one V buffer, each refilled within the step
  // once every warp is done with it; BWD_KBUF 2: two of each, the next tile's K and V issued at
  // the top of a step into the buffers the previous step freed (a whole step ahead).
  __shared__ __align__(8) u64 bars[4];
  u16* Vs2 = Ks2 + BWD_TILE_ELEMS(TILE_N);  // BWD_KBUF 2: the second V buffer
  const i64 bhk = b * P.Hkv + hk;
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 4);
    if (more) {
      tma_tile(dOs, P.domap, &bars[2], u0, bh, TILE_M, false);
      tma_tile(Qs, P.qmap, &bars[0], u0, bh, TILE_M, false);
      tma_tile(Vs, P.vmap, &bars[2], c0, bhk, TILE_N);
      tma_tile(Ks, P.kmap, &bars[0], c0, bhk, TILE_N);
    }
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
#if BWD_KBUF == 2
  bool more_next = more && walk.next(c_next, p_next, &s_next);
#endif
  PROF_MARK(0);
  for (int step = 0; more; ++step) {
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
    const int slot = BWD_KBUF == 2 ? step & 1 : 0;
    const u32 phase = BWD_KBUF == 2 ? (step >> 1) & 1 : step & 1;  // each slot's barriers flip once a use
    u16* Kb = slot ? Ks2 : Ks;
    u16* Vb = slot ? Vs2 : Vs;
#if BWD_KBUF == 2
    if (more_next && threadIdx.x == 0) {  // the other slot, freed by the previous step's last barrier
      tma_tile(slot ? Vs : Vs2, P.vmap, &bars[2 + (slot ^ 1)], c_next, bhk, TILE_N);
      tma_tile(slot ? Ks : Ks2, P.kmap, &bars[slot ^ 1], c_next, bhk, TILE_N);
    }
#endif
#if BWD_SPLIT_P
    mbar_wait(&bars[slot], phase);  // K(c0) (and Q on the first tile) landed
    PROF_MARK(1);
    wg_abt_issue<64>(s, Qw, 64, 0, Kb);  // S first: its P while dP = dO V^T is in flight
    mbar_wait(&bars[2 + slot], phase);   // V(c0) (and dO on the first tile) landed
    PROF_MARK(3);
    wg_abt_issue<64>(dp, dOw, 64, 0, Vb);
    wg_wait<1>();
    reg_fence<TILE_N / 8>(s);
    if (!partial && rows_in && c0 + TILE_N <= P.S) dq_tile_p<true>(P, s, b, h, rows, c0, t, partial, lse2);
#if MASK_BITS
    else if (P.mbits && partial)
      dq_tile_p<false, true>(P, s, b, h, rows, c0, t, true, lse2, P.mbits + (mrow * P.kv_m + slot0) * (P.QB * P.KB / 32));
#endif
    else dq_tile_p<false>(P, s, b, h, rows, c0, t, partial, lse2);
    wg_wait<0>();
    reg_fence<TILE_N / 8>(dp);
    PROF_MARK(4);
    dq_tile_ds_from_p(s, dp, delta);
#else
    mbar_wait(&bars[2 + slot], phase);  // V(c0) (and dO on the first tile) landed
    PROF_MARK(1);
#if BWD_KBUF == 2 && BWD_PAIRED
    wg_abt_issue<64>(dp, dOw, 64, 0, Vb);  // dP = dO V^T in flight while K lands and S is issued
    mbar_wait(&bars[slot], phase);         // K(c0) (and Q on the first tile) landed
    PROF_MARK(3);
    wg_abt_issue<64>(s, Qw, 64, 0, Kb);
    wg_wait_all();
    reg_fence<TILE_N / 8>(dp);
    reg_fence<TILE_N / 8>(s);
#else
    BWD_ABT(dp, dOw, Vb, LDSM_B_Q);
    PROF_MARK(2);
#if BWD_KBUF == 1
    more = walk.next(c_next, p_next, &s_next);
    __syncthreads();  // everyone is done with Vs
    if (more && threadIdx.x == 0) tma_tile(Vs, P.vmap, &bars[2], c_next, bhk, TILE_N);
#endif
    mbar_wait(&bars[slot], phase);  // K(c0) (and Q on the first tile) landed
    PROF_MARK(3);
    BWD_ABT(s, Qw, Kb, LDSM_B_Q);
#endif
    PROF_MARK(4);
    if (!partial && rows_in && c0 + TILE_N <= P.S) dq_tile_ds<true>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
#if MASK_BITS
    else if (P.mbits && partial)
      dq_tile_ds_bits(P, s, dp, b, h, rows, c0, t, lse2, delta,
                      P.mbits + (mrow * P.kv_m + slot0) * (P.QB * P.KB / 32));
#endif
    else dq_tile_ds<false>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
#endif  // BWD_SPLIT_P
    PROF_MARK(5);
    BWD_PB(dq, s, Kb, LDSM_B_Q);  // dQ += dS K
    __syncthreads();              // everyone is done with this slot's K (and V)
#if BWD_KBUF == 1
    if (more && threadIdx.x == 0) tma_tile(Ks, P.kmap, &bars[0], c_next, bhk, TILE_N);
#else
    more = more_next;
#endif
    PROF_MARK(6);
    c0 = c_next;
    partial = p_next;
    slot0 = s_next;
#if BWD_KBUF == 2
    if (more) more_next = walk.next(c_next, p_next, &s_next);
#endif
  }
#else
  if (more) BWD_LOAD_TILE(Vs, vg, c0, P.S, TILE_N);
  cp_async_commit();
  if (more) BWD_LOAD_TILE(Ks, kg, c0, P.S, TILE_N);
  cp_async_commit();
  PROF_MARK(0);
  // Pipeline per tile (groups in flight at the top: V(c0), K(c0)): dP = dO V^T first, then V(next)
  // loads during S = QK^T, dS and dQ += dS K, and K(next) during the next tile's dP (BWD_KBUF 1)
  // or, into the other K buffer, with V(next) (BWD_KBUF 2).
  while (more) {
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
#if BWD_KBUF == 2
    cp_async_wait<0>();  // V(c0) and K(c0) landed
#else
    cp_async_wait<1>();  // V(c0) landed
#endif
    SMEM_PROXY_FENCE();
    __syncthreads();
    PROF_MARK(1);
    BWD_ABT(dp, dOs, Vs, LDSM_B_Q);
    PROF_MARK(2);
#if BWD_KBUF == 2
    __syncthreads();  // everyone is done with Vs and with the other K buffer (the previous tile's)
    u16* Knext = Kcur == Ks ? Ks2 : Ks;
    more = walk.next(c_next, p_next);
    if (more) {
      BWD_LOAD_TILE(Vs, vg, c_next, P.S, TILE_N);
      BWD_LOAD_TILE(Knext, kg, c_next, P.S, TILE_N);
    }
    cp_async_commit();
#else
    cp_async_wait<0>();  // K(c0) landed
    SMEM_PROXY_FENCE();
    __syncthreads();     // and everyone is done with Vs
    more = walk.next(c_next, p_next);
    if (more) BWD_LOAD_TILE(Vs, vg, c_next, P.S, TILE_N);
    cp_async_commit();
#endif
    PROF_MARK(3);
    BWD_ABT(s, Qs, Kcur, LDSM_B_Q);
    PROF_MARK(4);
    if (!partial && rows_in && c0 + TILE_N <= P.S) dq_tile_ds<true>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
    else dq_tile_ds<false>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
    PROF_MARK(5);
    BWD_PB(dq, s, Kcur, LDSM_B_Q);  // dQ += dS K
#if BWD_KBUF == 2
    Kcur = Knext;
#else
    __syncthreads();  // everyone is done with Ks
    if (more) BWD_LOAD_TILE(Ks, kg, c_next, P.S, TILE_N);
    cp_async_commit();
#endif
    PROF_MARK(6);
    c0 = c_next;
    partial = p_next;
  }
  cp_async_wait<0>();  // nothing in flight when the CTA ends (Q and dO with an empty list)
#endif
  const float sc = (float)P.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= P.L) continue;
    u16* dg = (u16*)P.dq + (bh * P.L + rows[r]) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) *(u32*)(dg + n * 8 + 2 * t) = pack2(dq[n][2 * r] * sc, dq[n][2 * r + 1] * sc);
  }
  PROF_MARK(7);
  PROF_FLUSH(8);
}

// dK/dV's transposed tile (rows kv = cols[r], columns q = r0..): s (raw scores) becomes P and dp
// becomes dS; with captured-tensor gradients raw keeps the raw scores and dpost d loss / d score.
template <bool kInterior>
__device__ __forceinline__ void dkdv_tile_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], float (*raw)[4],
                                               float (*dpost)[4], i64 b, i64 h, i64 r0, const i64* cols, int t,
                                               bool partial, const float* lse2_s, const float* delta_s) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = n * 8 + 2 * t + (e & 1);
      float p, ds_post, ds;
      p_ds<kInterior>(P, s[n][e], dp[n][e], b, h, r0 + qc, cols[e >> 1], partial, lse2_s[qc], delta_s[qc], &p,
                      &ds_post, &ds);
#if HAS_CAP_GRAD
      raw[n][e] = s[n][e];
      dpost[n][e] = ds_post;
#endif
      s[n][e] = p;
      dp[n][e] = ds;
    }
}

// lse2 and delta of q rows r0.. of (b, h) into smem (lse2_s, then delta_s right after it) by
// cp.async in the caller's group: no thread waits for them here (a plain load stalled each q
// tile of dK/dV for a global round trip). Rows past L read 0: their elements are out of bounds,
// so y = -inf and p = 0 whatever lse2 is.
__device__ __forceinline__ void load_rows(float* lse2_s, const FlexParams& P, i64 bh, i64 r0) {
  for (int i = threadIdx.x; i < 2 * TILE_M; i += NTHREADS) {
    const int r = i % TILE_M;
    const bool in = r0 + r < P.L;
    const float* src = (i < TILE_M ? P.lse2 : P.delta) + (in ? bh * P.L + r0 + r : 0);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(lse2_s + i)), "l"(src), "r"(in ? 4 : 0)
                 : "memory");
  }
}

#if HAS_CAP_GRAD
// Captured-tensor gradients of one transposed tile: the lanes take turns adding into the warp's
// slot (a fixed order, no atomics); each lane walks its elements in a fixed order.
__device__ __forceinline__ void add_cap_grads(const FlexParams& P, const float (*raw)[4], const float (*dpost)[4], i64 b,
                                              i64 h, i64 r0, const i64* cols, int lane, int t, double* slot) {
  for (int turn = 0; turn < 32; ++turn) {
    if (lane == turn) {
      for (int n = 0; n < TILE_M / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const i64 qi = r0 + n * 8 + 2 * t + (e & 1), kv = cols[e >> 1];
          if (qi < P.L && kv < P.S) score_grad(raw[n][e] * (float)P.scale, b, h, qi, kv, dpost[n][e], P, slot);
        }
    }
    __syncwarp();
  }
}
#endif

#if BWD_SPLIT_P
// dK/dV's transposed tile (rows kv = cols[r], columns q = r0..): s becomes P (see dq_tile_p) ...
template <bool kInterior>
__device__ __forceinline__ void dkdv_tile_p(const FlexParams& P, float (*s)[4], i64 b, i64 h, i64 r0, const i64* cols,
                                            int t, bool partial, const float* lse2_s) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = n * 8 + 2 * t + (e & 1);
      s[n][e] = elem_p<kInterior>(P, s[n][e], b, h, r0 + qc, cols[e >> 1], partial, lse2_s[qc]);
    }
}
// ... and dp becomes dS (column qc's delta).
__device__ __forceinline__ void dkdv_tile_ds_from_p(float (*dp)[4], const float (*p)[4], int t, const float* delta_s) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = p[n][e] * (dp[n][e] - delta_s[n * 8 + 2 * t + (e & 1)]);
}
#endif

// P and dS of one transposed tile (interior tiles of full blocks skip the bounds test and the
// mask), then its captured-tensor gradients into this warp's slot.
__device__ __forceinline__ void dkdv_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], i64 b, i64 h, i64 r0,
                                          const i64* cols, int lane, int t, bool partial, bool kv_in,
                                          const float* lse2_s, const float* delta_s, double* slot) {
  float raw[HAS_CAP_GRAD ? TILE_M / 8 : 1][4], dpost[HAS_CAP_GRAD ? TILE_M / 8 : 1][4];
  if (!partial && r0 + TILE_M <= P.L && kv_in)
    dkdv_tile_p_ds<true>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse2_s, delta_s);
  else
    dkdv_tile_p_ds<false>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse2_s, delta_s);
#if HAS_CAP_GRAD
  add_cap_grads(P, raw, dpost, b, h, r0, cols, lane, t, slot);
#endif
}

extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dkdv(const __grid_constant__ FlexParams P) {
  PROF_DECL
  extern __shared__ __align__(16) u16 smem[];
  u16* Ks = BWD_SMEM_BASE(smem);
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
  u16* Qs = Vs + BWD_TILE_ELEMS(TILE_N);
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M) * BWD_QSETS;
  float* lse2_s = (float*)(dOs + BWD_TILE_ELEMS(TILE_M) * BWD_QSETS);  // 2 sets: Qs, Qs2, dOs, dOs2
#if !BWD_TMA && BWD_QBUF == 1
  float* delta_s = lse2_s + TILE_M;  // each rows buffer: lse2 then delta (load_rows), 2 TILE_M floats
#endif
  const int wg = threadIdx.x / NTHREADS, warp = (threadIdx.x >> 5) % NWARPS, lane = threadIdx.x & 31, g = lane >> 2,
            t = lane & 3;  // wg: 0, kept a run-time value (the note at the top)
  const u16* Kw = Ks + wg * BWD_TILE_ELEMS(TILE_N);  // = Ks, Vs
  const u16* Vw = Vs + wg * BWD_TILE_ELEMS(TILE_N);
  // Units [u_begin, u_end) in order: one unit per CTA, or a fixed slot of units with captured grads.
  const i64 u_begin = (i64)blockIdx.x * P.units / gridDim.x, u_end = ((i64)blockIdx.x + 1) * P.units / gridDim.x;
#if HAS_CAP_GRAD
  double* slot = P.slots + ((i64)blockIdx.x * NWARPS + warp) * P.grad_numel;
#else
  double* const slot = nullptr;
#endif
#if BWD_TMA
  // bars[x]: buffer x's Q and dO tiles (K and V join the first q tile's phase); phase bit x its
  // parity, carried across units (every load issued is waited for).
  __shared__ __align__(8) u64 bars[2];
  u32 phase = 0;
  if (threadIdx.x == 0) mbar_init_all(bars, 2);  // before the unit's first block barrier
#endif
  for (i64 u = u_begin; u < u_end; ++u) {
    const i64 tile = u % P.kv_tiles, bhk = u / P.kv_tiles, b = bhk / P.Hkv, hk = bhk % P.Hkv;
    const i64 c0 = tile * TILE_N, jblk = c0 / P.KB, w0 = c0 + wg * TILE_N;  // w0 = c0
    __syncthreads();
#if !BWD_TMA
    BWD_LOAD_RESIDENT(Ks, (const u16*)P.k + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);  // with Q(r0)'s group
    BWD_LOAD_RESIDENT(Vs, (const u16*)P.v + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);
#endif
    const i64 cols[2] = {w0 + warp * 16 + g, w0 + warp * 16 + g + 8};  // this thread's kv rows
    const bool kv_in = w0 + TILE_N <= P.S;
    float dk[HEAD_DIM / 8][4], dv[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
      dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
      dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    }
#if BWD_QBUF == 2 || BWD_TMA
    // Two buffers of Q, dO, lse2 and delta: the next q tile's loads are issued at the top of a
    // tile, right after the one barrier that frees the other buffer, and land during the whole
    // tile's work (one barrier a tile instead of four). With TMA, the tiles from thread 0 on
    // bars[buffer] and the rows by cp.async.
    {
      GroupWalk walk(P, b, hk, jblk);
      i64 gi, r0;
      bool partial;
      bool more = walk.next(gi, r0, partial);
      int cur = 0;
      auto load_q_tile = [&](int buf, i64 g, i64 row0) {
        const i64 bh = b * P.Hq + hk * P.G + g;
#if BWD_TMA
        if (threadIdx.x == 0) {
          tma_tile(Qs + buf * BWD_TILE_ELEMS(TILE_M), P.qmap, &bars[buf], row0, bh, TILE_M, false);
          tma_tile(dOs + buf * BWD_TILE_ELEMS(TILE_M), P.domap, &bars[buf], row0, bh, TILE_M);
        }
#else
        BWD_LOAD_TILE(Qs + buf * BWD_TILE_ELEMS(TILE_M), (const u16*)P.q + bh * P.L * HEAD_DIM, row0, P.L, TILE_M);
        BWD_LOAD_TILE(dOs + buf * BWD_TILE_ELEMS(TILE_M), (const u16*)P.dout + bh * P.L * HEAD_DIM, row0, P.L, TILE_M);
#endif
        load_rows(lse2_s + buf * 2 * TILE_M, P, bh, row0);
      };
#if BWD_TMA
      if (more && threadIdx.x == 0) {  // K and V with the first q tile (the unit's barrier freed them)
        tma_tile(Ks, P.kmap, &bars[0], c0, bhk, TILE_N, false);
        tma_tile(Vs, P.vmap, &bars[0], c0, bhk, TILE_N, false);
      }
#endif
      if (more) load_q_tile(0, gi, r0);
      cp_async_commit();
      PROF_MARK(0);
      while (more) {
        const i64 h = hk * P.G + gi;
#if BWD_TMA
        mbar_wait(&bars[cur], (phase >> cur) & 1);  // this tile's Q and dO (and K / V on the first) landed
        phase ^= 1u << cur;
#endif
        cp_async_wait<0>();  // this tile's Q, dO, lse2, delta (and K/V on the first) landed
        SMEM_PROXY_FENCE();
        __syncthreads();     // ... for every thread, and the previous tile is done with the other buffer
        PROF_MARK(1);
        i64 gi_n, r0_n;
        bool p_n;
        const bool more_n = walk.next(gi_n, r0_n, p_n);
        if (more_n) load_q_tile(cur ^ 1, gi_n, r0_n);
        cp_async_commit();
        const u16* Qc = Qs + cur * BWD_TILE_ELEMS(TILE_M);
        const u16* dOc = dOs + cur * BWD_TILE_ELEMS(TILE_M);
        const float* lse2_c = lse2_s + cur * 2 * TILE_M;
        float s[TILE_M / 8][4], dp[TILE_M / 8][4];
#if BWD_PAIRED
        // S^T and dP^T issued together, then dK and dV: one wait for each pair.
        wg_abt_issue<64>(s, Kw, 64, 0, Qc);
        wg_abt_issue<64>(dp, Vw, 64, 0, dOc);
#if BWD_SPLIT_P
        wg_wait<1>();  // S^T landed: its P while dP^T is in flight
        reg_fence<TILE_M / 8>(s);
        if (!partial && r0 + TILE_M <= P.L && kv_in) dkdv_tile_p<true>(P, s, b, h, r0, cols, t, partial, lse2_c);
        else dkdv_tile_p<false>(P, s, b, h, r0, cols, t, partial, lse2_c);
        wg_wait<0>();
        reg_fence<TILE_M / 8>(dp);
        PROF_MARK(4);
        dkdv_tile_ds_from_p(dp, s, t, lse2_c + TILE_M);
        (void)slot;  // no captured-tensor gradients without a score_mod
#else
        wg_wait_all();
        reg_fence<TILE_M / 8>(s);
        reg_fence<TILE_M / 8>(dp);
        PROF_MARK(4);
        dkdv_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_c, lse2_c + TILE_M, slot);
#endif
        PROF_MARK(5);
        {
          u32 pk_ds[TILE_M / 8][2], pk_p[TILE_M / 8][2];
          pack_rows<TILE_M>(pk_ds, dp);
          pack_rows<TILE_M>(pk_p, s);
          wg_pb_issue<TILE_M>(dk, pk_ds, Qc);  // dK += dS^T Q
          wg_pb_issue<TILE_M>(dv, pk_p, dOc);  // dV += P^T dO
          wg_wait_all();
          reg_fence<HEAD_DIM / 8>(dk);
          reg_fence<HEAD_DIM / 8>(dv);
          reg_fence_pk<TILE_M / 8>(pk_ds);
          reg_fence_pk<TILE_M / 8>(pk_p);
        }
#else
        BWD_ABT(s, Kw, Qc, LDSM_B_KV);
        PROF_MARK(2);
        BWD_ABT(dp, Vw, dOc, LDSM_B_KV);
        PROF_MARK(4);
        dkdv_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_c, lse2_c + TILE_M, slot);
        PROF_MARK(5);
        BWD_PB(dk, dp, Qc, LDSM_B_KV);  // dK += dS^T Q
        PROF_MARK(6);
        BWD_PB(dv, s, dOc, LDSM_B_KV);  // dV += P^T dO
#endif
        PROF_MARK(7);
        gi = gi_n;
        r0 = r0_n;
        partial = p_n;
        more = more_n;
        cur ^= 1;
      }
    }
#else
    // Pipeline per q tile (groups in flight at the top: Q(r0), dO(r0)): S = K Q^T while dO lands;
    // Q(next) loads during dV += P^T dO, dO(next) during the next S.
    GroupWalk walk(P, b, hk, jblk);
    i64 gi, r0, gi_n, r0_n;
    bool partial, p_n;
    bool more = walk.next(gi, r0, partial);
    const i64 bh0 = more ? b * P.Hq + hk * P.G + gi : 0;
    if (more) BWD_LOAD_TILE(Qs, (const u16*)P.q + bh0 * P.L * HEAD_DIM, r0, P.L, TILE_M);
    cp_async_commit();
    if (more) {
      BWD_LOAD_TILE(dOs, (const u16*)P.dout + bh0 * P.L * HEAD_DIM, r0, P.L, TILE_M);
      load_rows(lse2_s, P, bh0, r0);
    }
    cp_async_commit();
    PROF_MARK(0);
    while (more) {
      const i64 h = hk * P.G + gi;
      cp_async_wait<1>();  // Q(r0) landed
      SMEM_PROXY_FENCE();
      __syncthreads();     // (and K/V; lse2 and delta land with Q)
      PROF_MARK(1);
      // Transposed tiles: rows are kv (this warp's 16), columns are q.
      float s[TILE_M / 8][4], dp[TILE_M / 8][4];
      BWD_ABT(s, Ks, Qs, LDSM_B_KV);
      PROF_MARK(2);
      cp_async_wait<0>();  // dO(r0) landed
      SMEM_PROXY_FENCE();
      __syncthreads();
      PROF_MARK(3);
      BWD_ABT(dp, Vs, dOs, LDSM_B_KV);
      PROF_MARK(4);
      dkdv_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_s, delta_s, slot);
      PROF_MARK(5);
      BWD_PB(dk, dp, Qs, LDSM_B_KV);  // dK += dS^T Q
      PROF_MARK(6);
      __syncthreads();                        // everyone is done with Qs, lse2_s, delta_s
      more = walk.next(gi_n, r0_n, p_n);
      const i64 bh_n = more ? b * P.Hq + hk * P.G + gi_n : 0;
      if (more) {
        BWD_LOAD_TILE(Qs, (const u16*)P.q + bh_n * P.L * HEAD_DIM, r0_n, P.L, TILE_M);
        load_rows(lse2_s, P, bh_n, r0_n);
      }
      cp_async_commit();
      BWD_PB(dv, s, dOs, LDSM_B_KV);  // dV += P^T dO
      __syncthreads();                // everyone is done with dOs
      if (more) BWD_LOAD_TILE(dOs, (const u16*)P.dout + bh_n * P.L * HEAD_DIM, r0_n, P.L, TILE_M);
      cp_async_commit();
      PROF_MARK(7);
      gi = gi_n;
      r0 = r0_n;
      partial = p_n;
    }
#endif
    cp_async_wait<0>();  // K and V of a tile without q tiles must land before the next unit reuses Ks / Vs
    const float sc = (float)P.scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (cols[r] >= P.S) continue;
      u16* dkg = (u16*)P.dk + (bhk * P.S + cols[r]) * HEAD_DIM;
      u16* dvg = (u16*)P.dv + (bhk * P.S + cols[r]) * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n) {
        *(u32*)(dkg + n * 8 + 2 * t) = pack2(dk[n][2 * r] * sc, dk[n][2 * r + 1] * sc);
        *(u32*)(dvg + n * 8 + 2 * t) = pack2(dv[n][2 * r], dv[n][2 * r + 1]);
      }
    }
  }
  PROF_FLUSH(16);
}

// capgrad[x] = sum over slots (slot-major, then warp) of slots[.][x]: a fixed order.
extern "C" __global__ void flex_capgrad_reduce(const FlexParams P) {
  const i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= P.grad_numel) return;
  double s = 0.0;
  for (i64 k = 0; k < P.nslots * NWARPS; ++k) s += P.slots[k * P.grad_numel + x];
  P.capgrad[x] = s;
}
#endif  // KILN_BUILD_BWD
)kiln_src";
}

}  // namespace kiln::flex::cuda
