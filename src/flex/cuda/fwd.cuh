#pragma once
// flex_fwd, the staged forward (unless FWD_PERSIST, where persist.cuh's persistent kernel is flex_fwd):
// per (b, q head, q tile) an online softmax over the tile's kv list; reads Q once and K / V tiles by
// TMA (wgmma) or cp.async (mma.sync), the next tile's load issued as soon as its buffer is free;
// writes out in T and lse. Never materialises the scores beyond one tile in registers.
// The tile (FWD_TILE_M x FWD_TILE_N) is kernel_config.cpp's rule, its measurements beside it.

#if KILN_BUILD_FWD
#if !FWD_PERSIST  // else flex_fwd is the persistent kernel of persist.cuh
extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_MIN_BLOCKS) flex_fwd(const __grid_constant__ FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
#if FWD_TMA
  u16* Qs = wg_smem_base(smem);
  u16* Ks = Qs + FWD_TILE_M * HEAD_DIM;
  u16* Vs = Ks + FWD_TILE_N * HEAD_DIM;
#else
  u16* Qs = smem;
  u16* Ks = Qs + FWD_TILE_M * LD;
  u16* Vs = Ks + FWD_TILE_N * LD;
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // Heaviest (last) q tiles first: causal rows at the end list the most blocks.
  const i64 q_tiles = (P.L + FWD_TILE_M - 1) / FWD_TILE_M;
  const i64 tile = q_tiles - 1 - (i64)blockIdx.x % q_tiles, bh = (i64)blockIdx.x / q_tiles;
  const i64 b = bh / P.Hq, h = bh % P.Hq, hk = h / P.G, r0 = tile * FWD_TILE_M;
#if FWD_TMA
  // FWD_STAGES stages, K and V of stage x on bars[x] and bars[FWD_STAGES + x] (Q joins stage 0's
  // first K), each wait flipping the stage's phase.
  __shared__ __align__(8) u64 bars[2 * FWD_STAGES];
  u32 kphase = 0;
#if FWD_LAST_ISSUES
  __shared__ u32 stage_done[FWD_STAGES];  // warps done with each stage, counted over the whole walk
#endif
#else
  const u16* kg = (const u16*)P.k + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  load_tile(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, FWD_TILE_M, FWD_THREADS);
#endif
  const bool rows_in = r0 + FWD_TILE_M <= P.L;

  float o[FWD_MT][HEAD_DIM / 8][4];
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  float m[FWD_MT][2], l[FWD_MT][2];
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt) m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
  // Global row of this thread's row 0 (g; row 1 is g + 8) in m16 block 0.
  const i64 row_base = r0 + warp * 16 * FWD_MT + g;

  const i64 mrow = P.all_full ? 0 : mask_row(P, b, h) * P.nQB + r0 / P.QB;
  TileWalk walk(BlockWalk(P, KV_LISTS(P), mrow, P.nKVB), P.KB, P.S, FWD_TILE_N);
  i64 c0;
  bool partial;
  int slot0 = 0;  // the partial list's slot of c0's block (MASK_BITS)
  bool more = walk.next(c0, partial, &slot0);
#if FWD_TMA
  // Tile c0 is in stage x while c1 loads into the other; once every warp is done with stage x it
  // takes the tile after c1. No load waits behind a product of the same step. kphase bit x: stage
  // x's parity (K and V flip together).
  const i64 bhk = b * P.Hkv + hk;
  i64 c1 = 0;  // the tile after c0, already loading into the other stage
  bool p1 = false;
  int slot1 = 0;
  bool more1 = more && walk.next(c1, p1, &slot1);
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 2 * FWD_STAGES);
    if (more) {
      tma_tile(Qs, P.qmap, &bars[0], r0, bh, FWD_TILE_M, false);  // Q's bytes join the first K's phase
      tma_tile(Ks, P.kmap, &bars[0], c0, bhk, FWD_TILE_N);
    }
    if (more) tma_tile(Vs, P.vmap, &bars[FWD_STAGES], c0, bhk, FWD_TILE_N);
    if (more1) {
      tma_tile(Ks + 2 * FWD_TILE_N * HEAD_DIM, P.kmap, &bars[1], c1, bhk, FWD_TILE_N);
      tma_tile(Vs + 2 * FWD_TILE_N * HEAD_DIM, P.vmap, &bars[FWD_STAGES + 1], c1, bhk, FWD_TILE_N);
    }
#if FWD_LAST_ISSUES
    for (int i = 0; i < FWD_STAGES; ++i) stage_done[i] = 0u;
#endif
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  int x = 0;
  u32 step_n = 0;  // this step's index in the walk (stage x's use step_n / FWD_STAGES)
  while (more) {
    FWD_TMA_STAGE_STEP(Qs, partial, slot0)
    i64 cn = 0;  // the tile to load into stage x
    bool pn = false;
    int slotn = 0;
    const bool moren = more1 && walk.next(cn, pn, &slotn);
#if FWD_LAST_ISSUES
    // The last warp done with stage x (its products waited for: their reads are over) issues the
    // tile after next into it. No block barrier: a warpgroup that is ahead goes on into the other
    // stage, already loaded, instead of waiting each step for the slower one.
    __syncwarp();
    if (lane == 0 && atomicAdd(&stage_done[x], 1u) == FWD_WARPS * (step_n / FWD_STAGES + 1) - 1 && moren) {
#else
    __syncthreads();  // every warp is done with stage x
    if (moren && threadIdx.x == 0) {
#endif
      tma_tile(Kx, P.kmap, &bars[x], cn, bhk, FWD_TILE_N);
      tma_tile(Vx, P.vmap, &bars[FWD_STAGES + x], cn, bhk, FWD_TILE_N);
    }
    ++step_n;
    c0 = c1, partial = p1, more = more1, slot0 = slot1;
    c1 = cn, p1 = pn, more1 = moren, slot1 = slotn;
    x ^= 1;
  }
#else
  if (more) FWD_LOAD_TILE(Ks, kg, c0, P.S, FWD_TILE_N);
  cp_async_commit();
  // Pipeline per tile: V(c0) loads during S = QK^T and the softmax, K(next) during PV.
  i64 c_next;
  bool p_next;
  while (more) {
    __syncthreads();  // everyone is done with Vs (previous PV)
    FWD_LOAD_TILE(Vs, vg, c0, P.S, FWD_TILE_N);
    cp_async_commit();
    cp_async_wait<1>();  // K(c0) landed (this thread's part)
    __syncthreads();
    {
      float s[FWD_MT][FWD_TILE_N / 8][4];
      u32 pk[FWD_MT][FWD_TILE_N / 8][2];  // P rounded to T for PV: half the registers of s
      tile_abt_mt(s, Qs, warp * 16 * FWD_MT, Ks, lane);
      fwd_tile_scores(P, s, b, h, row_base, c0, t, partial, rows_in);
      float alpha[FWD_MT][2];
      fwd_softmax(s, pk, m, l, alpha, exp2_factor(P));
      fwd_rescale(o, alpha);
      __syncthreads();  // everyone is done with Ks
      more = walk.next(c_next, p_next);
      if (more) FWD_LOAD_TILE(Ks, kg, c_next, P.S, FWD_TILE_N);
      cp_async_commit();
      cp_async_wait<1>();  // V(c0) landed
      __syncthreads();
      tile_pb_mt(o, pk, Vs, lane);
      c0 = c_next;
      partial = p_next;
    }
  }
#endif  // FWD_TMA
  fwd_store(P, o, m, l, bh, row_base, t);
}
#endif  // !FWD_PERSIST

#endif  // KILN_BUILD_FWD
