#pragma once
// The backward's dK/dV kernel: its transposed tiles' helpers, flex_bwd_dkdv and flex_capgrad_reduce.
// Per (b, kv head, 64-row kv tile): dV = sum P^T dO, dK = scale * sum dS^T Q over the group's q heads
// (fixed order) and their transposed q lists; captured-tensor gradients go to per-warp double slots,
// lanes taking turns (fixed order); then flex_capgrad_reduce sums the slots in order. No atomics.
// 64 x 64 tiles, transposed (q along the columns): dK and dV, S and dP of a tile are 192 fp32
// registers a thread at E = 128 (ptxas: 250 in all), so a larger tile would not fit 255.

// A thread's two q columns n * 8 + 2t and + 1 of a rows buffer (lse2 or delta) in one 8-byte LDS:
// the buffers start 8-byte aligned, and ptxas cannot see that to pair the loads itself.
__device__ __forceinline__ float col_of_pair(const float* rows, int n, int t, int e) {
  const float2 v = *(const float2*)(rows + n * 8 + 2 * t);
  return (e & 1) ? v.y : v.x;
}

#if MASK_RANGES
// The runs of q of a thread's two kv rows cols[r] over dK/dV's transposed tile (q from r0).
__device__ __forceinline__ void dkdv_runs(const FlexParams& P, i64 b, i64 h, i64 r0, const i64* cols, bool partial,
                                          Run (&runs)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) runs[r] = q_run(P, b, h, cols[r], r0, TILE_M, partial);
}
#endif
// The tile helpers' kRuns (MASK_RANGES, a tile that is not interior): the keep of its columns' runs.
#if MASK_RANGES
#define DKDV_RUNS_ARG , const Run* runs
#define DKDV_KEEP(e, qc) (kRuns ? in_run(runs[(e) >> 1], qc) : true)
#else
#define DKDV_RUNS_ARG , const void* runs
#define DKDV_KEEP(e, qc) true
#endif

// dK/dV's transposed tile (rows kv = cols[r], columns q = r0..): s (raw scores) becomes P and dp
// becomes dS; with captured-tensor gradients raw keeps the raw scores and dpost d loss / d score.
template <bool kInterior, bool kRuns = false>
__device__ __forceinline__ void dkdv_tile_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], float (*raw)[4],
                                               float (*dpost)[4], i64 b, i64 h, i64 r0, const i64* cols, int t,
                                               bool partial, const float* lse2_s, const float* delta_s
                                               DKDV_RUNS_ARG = nullptr) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = n * 8 + 2 * t + (e & 1);
      float p, ds_post, ds;
      p_ds<kInterior, kRuns>(P, s[n][e], dp[n][e], b, h, r0 + qc, cols[e >> 1], partial, col_of_pair(lse2_s, n, t, e),
                             col_of_pair(delta_s, n, t, e), &p, &ds_post, &ds, DKDV_KEEP(e, qc));
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
          if (qi < P.L && kv < P.S) score_grad(raw[n][e] * P.scale_f, b, h, qi, kv, dpost[n][e], P, slot);
        }
    }
    __syncwarp();
  }
}
#endif

#if BWD_SPLIT_P
// dK/dV's transposed tile (rows kv = cols[r], columns q = r0..): s becomes P (see dq_tile_p) ...
template <bool kInterior, bool kRuns = false>
__device__ __forceinline__ void dkdv_tile_p(const FlexParams& P, float (*s)[4], i64 b, i64 h, i64 r0, const i64* cols,
                                            int t, bool partial, const float* lse2_s DKDV_RUNS_ARG = nullptr) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = n * 8 + 2 * t + (e & 1);
      s[n][e] = elem_p<kInterior, kRuns>(P, s[n][e], b, h, r0 + qc, cols[e >> 1], partial, col_of_pair(lse2_s, n, t, e),
                                         DKDV_KEEP(e, qc));
    }
}
// ... and dp becomes dS (column qc's delta).
__device__ __forceinline__ void dkdv_tile_ds_from_p(float (*dp)[4], const float (*p)[4], int t, const float* delta_s) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = p[n][e] * (dp[n][e] - col_of_pair(delta_s, n, t, e));
}
#endif

// P and dS of one transposed tile (interior tiles of full blocks skip the bounds test and the
// mask), then its captured-tensor gradients into this warp's slot.
__device__ __forceinline__ void dkdv_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], i64 b, i64 h, i64 r0,
                                          const i64* cols, int lane, int t, bool partial, bool kv_in,
                                          const float* lse2_s, const float* delta_s, double* slot) {
  float raw[HAS_CAP_GRAD ? TILE_M / 8 : 1][4], dpost[HAS_CAP_GRAD ? TILE_M / 8 : 1][4];
  if (!partial && r0 + TILE_M <= P.L && kv_in) {
    dkdv_tile_p_ds<true>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse2_s, delta_s);
  } else {
#if MASK_RANGES
    Run runs[2];
    dkdv_runs(P, b, h, r0, cols, partial, runs);
    dkdv_tile_p_ds<false, true>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse2_s, delta_s, runs);
#else
    dkdv_tile_p_ds<false>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse2_s, delta_s);
#endif
  }
#if HAS_CAP_GRAD
  add_cap_grads(P, raw, dpost, b, h, r0, cols, lane, t, slot);
#endif
}

// This thread's two kv rows cols[r] of (b, kv head) row bhk of dK (scaled) and dV, in T (rows past S skipped).
__device__ __forceinline__ void dkdv_store_rows(const FlexParams& P, const float (*dk)[4], const float (*dv)[4], i64 bhk,
                                                const i64* cols, int t) {
  const float sc = P.scale_f;
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

#if BWD_TMA
// A tile whose S^T and dP^T were issued as a pair (S^T first): s becomes P and dp dS (split P: P while
// dP^T is in flight), with the captured-tensor gradients into slot (the joint path's). rows: the
// tile's lse2, then its delta.
__device__ __forceinline__ void dkdv_pair_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], i64 b, i64 h, i64 r0,
                                               const i64* cols, int lane, int t, bool partial, bool kv_in,
                                               const float* rows, double* slot) {
#if BWD_SPLIT_P
  const bool interior = !partial && r0 + TILE_M <= P.L && kv_in;
#if MASK_RANGES
  Run runs[2];  // a tile that is not interior: its columns' runs, while the products are in flight
  if (!interior) dkdv_runs(P, b, h, r0, cols, partial, runs);
#endif
  wg_wait<1>();  // S^T landed: its P while dP^T is in flight
  reg_fence<TILE_M / 8>(s);
  if (interior) {
    dkdv_tile_p<true>(P, s, b, h, r0, cols, t, partial, rows);
  } else {
#if MASK_RANGES
    dkdv_tile_p<false, true>(P, s, b, h, r0, cols, t, partial, rows, runs);
#else
    dkdv_tile_p<false>(P, s, b, h, r0, cols, t, partial, rows);
#endif
  }
  wg_wait<0>();
  reg_fence<TILE_M / 8>(dp);
  dkdv_tile_ds_from_p(dp, s, t, rows + TILE_M);
  (void)slot;  // split P: no captured-tensor gradients (SCORE_GRAD_ONE)
  (void)lane;
#else
  wg_wait_all();
  reg_fence<TILE_M / 8>(s);
  reg_fence<TILE_M / 8>(dp);
  dkdv_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, rows, rows + TILE_M, slot);
#endif
}

// dK += dS^T Q and dV += P^T dO from the tile's dS (dp) and P (s), issued together and waited for.
__device__ __forceinline__ void dkdv_pair_dk_dv(float (*dk)[4], float (*dv)[4], const float (*s)[4],
                                                const float (*dp)[4], const u16* Qc, const u16* dOc) {
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
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, BWD_DKDV_MIN_BLOCKS) flex_bwd_dkdv(const __grid_constant__ FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Ks = BWD_SMEM_BASE(smem);
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
  u16* Qs = Vs + BWD_TILE_ELEMS(TILE_N);
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M) * BWD_QSETS;
  float* lse2_s = (float*)(dOs + BWD_TILE_ELEMS(TILE_M) * BWD_QSETS);  // 2 sets: Qs, Qs2, dOs, dOs2
#if !BWD_TMA
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
#if BWD_TMA
    // Two buffers of Q, dO, lse2 and delta: the next q tile's loads are issued at the top of a
    // tile, right after the one barrier that frees the other buffer, and land during the whole
    // tile's work (one barrier a tile instead of four): the tiles from thread 0 on bars[buffer],
    // the rows by cp.async.
    {
      GroupWalk walk(P, b, hk, jblk);
      i64 gi, r0;
      bool partial;
      bool more = walk.next(gi, r0, partial);
      int cur = 0;
      auto load_q_tile = [&](int buf, i64 g, i64 row0) {
        const i64 bh = b * P.Hq + hk * P.G + g;
        if (threadIdx.x == 0) {
          tma_tile(Qs + buf * BWD_TILE_ELEMS(TILE_M), P.qmap, &bars[buf], row0, bh, TILE_M, false);
          tma_tile(dOs + buf * BWD_TILE_ELEMS(TILE_M), P.domap, &bars[buf], row0, bh, TILE_M);
        }
        load_rows(lse2_s + buf * 2 * TILE_M, P, bh, row0);
      };
      if (more && threadIdx.x == 0) {  // K and V with the first q tile (the unit's barrier freed them)
        tma_tile(Ks, P.kmap, &bars[0], c0, bhk, TILE_N, false);
        tma_tile(Vs, P.vmap, &bars[0], c0, bhk, TILE_N, false);
      }
      if (more) load_q_tile(0, gi, r0);
      cp_async_commit();
      while (more) {
        const i64 h = hk * P.G + gi;
        mbar_wait(&bars[cur], (phase >> cur) & 1);  // this tile's Q and dO (and K / V on the first) landed
        phase ^= 1u << cur;
        cp_async_wait<0>();  // this tile's Q, dO, lse2, delta (and K/V on the first) landed
        SMEM_PROXY_FENCE();
        __syncthreads();     // ... for every thread, and the previous tile is done with the other buffer
        i64 gi_n, r0_n;
        bool p_n;
        const bool more_n = walk.next(gi_n, r0_n, p_n);
        if (more_n) load_q_tile(cur ^ 1, gi_n, r0_n);
        cp_async_commit();
        const u16* Qc = Qs + cur * BWD_TILE_ELEMS(TILE_M);
        const u16* dOc = dOs + cur * BWD_TILE_ELEMS(TILE_M);
        const float* lse2_c = lse2_s + cur * 2 * TILE_M;
        float s[TILE_M / 8][4], dp[TILE_M / 8][4];
        // S^T and dP^T issued together, then dK and dV: one wait for each pair.
        wg_abt_issue<64>(s, Kw, 64, 0, Qc);
        wg_abt_issue<64>(dp, Vw, 64, 0, dOc);
        dkdv_pair_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_c, slot);
        dkdv_pair_dk_dv(dk, dv, s, dp, Qc, dOc);
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
    while (more) {
      const i64 h = hk * P.G + gi;
      cp_async_wait<1>();  // Q(r0) landed
      __syncthreads();     // (and K/V; lse2 and delta land with Q)
      // Transposed tiles: rows are kv (this warp's 16), columns are q.
      float s[TILE_M / 8][4], dp[TILE_M / 8][4];
      BWD_ABT(s, Ks, Qs, LDSM_B_KV);
      cp_async_wait<0>();  // dO(r0) landed
      __syncthreads();
      BWD_ABT(dp, Vs, dOs, LDSM_B_KV);
      dkdv_p_ds(P, s, dp, b, h, r0, cols, lane, t, partial, kv_in, lse2_s, delta_s, slot);
      BWD_PB(dk, dp, Qs, LDSM_B_KV);  // dK += dS^T Q
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
      gi = gi_n;
      r0 = r0_n;
      partial = p_n;
    }
#endif
    cp_async_wait<0>();  // K and V of a tile without q tiles must land before the next unit reuses Ks / Vs
    dkdv_store_rows(P, dk, dv, bhk, cols, t);
  }
}

// capgrad[x] = sum over slots (slot-major, then warp) of slots[.][x]: a fixed order.
extern "C" __global__ void flex_capgrad_reduce(const FlexParams P) {
  const i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= P.grad_numel) return;
  double s = 0.0;
  for (i64 k = 0; k < P.nslots * NWARPS; ++k) s += P.slots[k * P.grad_numel + x];
  P.capgrad[x] = s;
}
