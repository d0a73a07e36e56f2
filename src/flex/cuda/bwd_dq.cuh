#pragma once
// The backward's dQ kernel: dQ's tile helpers (P / dS, keep bits, split P) and flex_bwd_dq, per
// (b, q head, q tile): dQ = scale * sum dS K over its kv list. Reads Q, dO, lse2, delta and K / V tiles;
// writes dQ in T. Deterministic: one CTA owns a tile's rows, no atomics.
// 64 x 64 tiles (TILE_M x TILE_N): dQ's fp32 accumulators and a tile's S and dP fit the registers.

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
#endif

#if MASK_BITS || MASK_RANGES
// dQ's tile that is not interior, each element's keep given: keep(n, e) (mod_score's arithmetic
// otherwise, the same bits).
template <class Keep>
__device__ __forceinline__ void dq_tile_ds_keep(const FlexParams& P, float (*s)[4], const float (*dp)[4], i64 b, i64 h,
                                                const i64* rows, i64 c0, int t, const float* lse2, const float* delta,
                                                Keep&& keep) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p, ds_post, ds;
      p_ds<false, true>(P, s[n][e], dp[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), true, lse2[e >> 1],
                        delta[e >> 1], &p, &ds_post, &ds, keep(n, e));
      s[n][e] = ds;
    }
}
#endif

#if MASK_BITS
// dQ's tile of a partial block from the block's keep bits `blk`.
__device__ __forceinline__ void dq_tile_ds_bits(const FlexParams& P, float (*s)[4], const float (*dp)[4], i64 b, i64 h,
                                                const i64* rows, i64 c0, int t, const float* lse2, const float* delta,
                                                const unsigned* blk) {
  unsigned w[2][TILE_N / 32];
  dq_row_bits(P, rows, c0, blk, w);
  dq_tile_ds_keep(P, s, dp, b, h, rows, c0, t, lse2, delta, [&](int n, int e) { return dq_bit(w, n, e, t); });
}
#endif

#if !MASK_RANGES
#define DQ_RUNS() (void)0
#else
// The runs of a thread's two rows over dQ's tile (columns c0..), and its element (n, e)'s keep.
__device__ __forceinline__ void dq_runs(const FlexParams& P, i64 b, i64 h, const i64* rows, i64 c0, bool partial,
                                        Run (&runs)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) runs[r] = kv_run(P, b, h, rows[r], c0, TILE_N, partial);
}
// A tile that is not interior: its rows' runs into the step's `runs`, taken while its products are
// in flight.
#define DQ_RUNS() \
  if (!interior) dq_runs(P, b, h, rows, c0, partial, runs)
__device__ __forceinline__ bool dq_run_keep(const Run (&runs)[2], int n, int e, int t) {
  return in_run(runs[e >> 1], n * 8 + 2 * t + (e & 1));
}
// dQ's tile that is not interior from its rows' runs.
__device__ __forceinline__ void dq_tile_ds_runs(const FlexParams& P, float (*s)[4], const float (*dp)[4], i64 b, i64 h,
                                                const i64* rows, i64 c0, int t, const float* lse2, const float* delta,
                                                const Run (&runs)[2]) {
  dq_tile_ds_keep(P, s, dp, b, h, rows, c0, t, lse2, delta, [&](int n, int e) { return dq_run_keep(runs, n, e, t); });
}
#endif

#if BWD_SPLIT_P
// Without a score_mod (or with one of gradient 1) dS = P (dP - delta), so the tiles split in two:
// P from the raw scores while dP's product is still in flight, then dS. The same arithmetic as
// p_ds, so the same bits (up to the sign of a zero dS).
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
#if MASK_RANGES
// dQ's tile that is not interior: s becomes P from its rows' runs.
__device__ __forceinline__ void dq_tile_p_runs(const FlexParams& P, float (*s)[4], i64 b, i64 h, const i64* rows,
                                               i64 c0, int t, const float* lse2, const Run (&runs)[2]) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[n][e] = elem_p<false, true>(P, s[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), true, lse2[e >> 1],
                                    dq_run_keep(runs, n, e, t));
}
#endif
// dQ's tile: p becomes dS (row r's delta).
__device__ __forceinline__ void dq_tile_ds_from_p(float (*p)[4], const float (*dp)[4], const float* delta) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[n][e] = p[n][e] * (dp[n][e] - delta[e >> 1]);
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, BWD_DQ_MIN_BLOCKS) flex_bwd_dq(const __grid_constant__ FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = BWD_SMEM_BASE(smem);
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M);
  u16* Ks = dOs + BWD_TILE_ELEMS(TILE_M);
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
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
  TileWalk walk(BlockWalk(P, KV_LISTS(P), mrow, P.nKVB), P.KB, P.S);
  i64 c0, c_next;
  bool partial, p_next;
  int slot0 = 0, s_next = 0;  // the partial list's slot of c0's block (MASK_BITS)
  bool more = walk.next(c0, partial, &slot0);
#if BWD_TMA
  // Two K and two V buffers: bars[slot] their K tiles (Q joins slot 0's first phase), bars[2 + slot]
  // their V tiles (dO joins slot 0's). Thread 0 issues the next tile's K and V at the top of a step,
  // into the buffers the previous step freed (a whole step ahead).
  __shared__ __align__(8) u64 bars[4];
  u16* Ks2 = Vs + BWD_TILE_ELEMS(TILE_N);
  u16* Vs2 = Ks2 + BWD_TILE_ELEMS(TILE_N);
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
  bool more_next = more && walk.next(c_next, p_next, &s_next);
  for (int step = 0; more; ++step) {
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
    const bool interior = !partial && rows_in && c0 + TILE_N <= P.S;  // a full block's tile inside both lengths
#if MASK_RANGES
    Run runs[2];  // DQ_RUNS: the rows' runs of a tile that is not interior
#endif
    const int slot = step & 1;
    const u32 phase = (step >> 1) & 1;  // each slot's barriers flip once a use
    u16* Kb = slot ? Ks2 : Ks;
    u16* Vb = slot ? Vs2 : Vs;
    if (more_next && threadIdx.x == 0) {  // the other slot, freed by the previous step's last barrier
      tma_tile(slot ? Vs : Vs2, P.vmap, &bars[2 + (slot ^ 1)], c_next, bhk, TILE_N);
      tma_tile(slot ? Ks : Ks2, P.kmap, &bars[slot ^ 1], c_next, bhk, TILE_N);
    }
#if BWD_SPLIT_P
    mbar_wait(&bars[slot], phase);  // K(c0) (and Q on the first tile) landed
    wg_abt_issue<64>(s, Qw, 64, 0, Kb);  // S first: its P while dP = dO V^T is in flight
    mbar_wait(&bars[2 + slot], phase);   // V(c0) (and dO on the first tile) landed
    wg_abt_issue<64>(dp, dOw, 64, 0, Vb);
    DQ_RUNS();
    wg_wait<1>();
    reg_fence<TILE_N / 8>(s);
    if (interior) dq_tile_p<true>(P, s, b, h, rows, c0, t, partial, lse2);
#if MASK_BITS
    else if (P.mbits && partial)
      dq_tile_p<false, true>(P, s, b, h, rows, c0, t, true, lse2, P.mbits + (mrow * P.kv_m + slot0) * (P.QB * P.KB / 32));
#endif
#if MASK_RANGES
    else dq_tile_p_runs(P, s, b, h, rows, c0, t, lse2, runs);
#else
    else dq_tile_p<false>(P, s, b, h, rows, c0, t, partial, lse2);
#endif
    wg_wait<0>();
    reg_fence<TILE_N / 8>(dp);
    dq_tile_ds_from_p(s, dp, delta);
#else
    mbar_wait(&bars[2 + slot], phase);  // V(c0) (and dO on the first tile) landed
    wg_abt_issue<64>(dp, dOw, 64, 0, Vb);  // dP = dO V^T in flight while K lands and S is issued
    mbar_wait(&bars[slot], phase);         // K(c0) (and Q on the first tile) landed
    wg_abt_issue<64>(s, Qw, 64, 0, Kb);
    DQ_RUNS();
    wg_wait_all();
    reg_fence<TILE_N / 8>(dp);
    reg_fence<TILE_N / 8>(s);
    if (interior) dq_tile_ds<true>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
#if MASK_BITS
    else if (P.mbits && partial)
      dq_tile_ds_bits(P, s, dp, b, h, rows, c0, t, lse2, delta,
                      P.mbits + (mrow * P.kv_m + slot0) * (P.QB * P.KB / 32));
#endif
#if MASK_RANGES
    else dq_tile_ds_runs(P, s, dp, b, h, rows, c0, t, lse2, delta, runs);
#else
    else dq_tile_ds<false>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
#endif
#endif  // BWD_SPLIT_P
    BWD_PB(dq, s, Kb, LDSM_B_Q);  // dQ += dS K
    __syncthreads();              // everyone is done with this slot's K (and V)
    more = more_next;
    c0 = c_next;
    partial = p_next;
    slot0 = s_next;
    if (more) more_next = walk.next(c_next, p_next, &s_next);
  }
#else
  if (more) BWD_LOAD_TILE(Vs, vg, c0, P.S, TILE_N);
  cp_async_commit();
  if (more) BWD_LOAD_TILE(Ks, kg, c0, P.S, TILE_N);
  cp_async_commit();
  // Pipeline per tile (groups in flight at the top: V(c0), K(c0)): dP = dO V^T first, then V(next)
  // loads during S = QK^T, dS and dQ += dS K, and K(next) during the next tile's dP.
  while (more) {
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
    cp_async_wait<1>();  // V(c0) landed
    __syncthreads();
    BWD_ABT(dp, dOs, Vs, LDSM_B_Q);
    cp_async_wait<0>();  // K(c0) landed
    __syncthreads();     // and everyone is done with Vs
    more = walk.next(c_next, p_next);
    if (more) BWD_LOAD_TILE(Vs, vg, c_next, P.S, TILE_N);
    cp_async_commit();
    BWD_ABT(s, Qs, Ks, LDSM_B_Q);
    if (!partial && rows_in && c0 + TILE_N <= P.S) dq_tile_ds<true>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
    else dq_tile_ds<false>(P, s, dp, b, h, rows, c0, t, partial, lse2, delta);
    BWD_PB(dq, s, Ks, LDSM_B_Q);  // dQ += dS K
    __syncthreads();  // everyone is done with Ks
    if (more) BWD_LOAD_TILE(Ks, kg, c_next, P.S, TILE_N);
    cp_async_commit();
    c0 = c_next;
    partial = p_next;
  }
  cp_async_wait<0>();  // nothing in flight when the CTA ends (Q and dO with an empty list)
#endif
  const float sc = P.scale_f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= P.L) continue;
    u16* dg = (u16*)P.dq + (bh * P.L + rows[r]) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) *(u32*)(dg + n * 8 + 2 * t) = pack2(dq[n][2 * r] * sc, dq[n][2 * r + 1] * sc);
  }
}
