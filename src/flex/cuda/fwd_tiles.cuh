#pragma once
// The forward's score tiles: fwd_scores (QK^T of one tile, masked and modified), the keep bits of a
// non-interior tile, the mask-bits kernel flex_mask_bits and its reader, and the output store.
// Reads Q / K tiles from shared memory, the BlockMask lists and captured tensors from global memory;
// writes out (in T) and lse (natural log). The kernel itself is flex_fwd (fwd.cuh, or persist.cuh
// under FWD_PERSIST).

#if KILN_BUILD_FWD
// f(mt, n, e, q, kv) for each of this thread's elements of the forward's tile, in register order
// (m16 block mt, column block n, element e at row q = row_base + ..., column kv = c0 + ...).
template <class F>
__device__ __forceinline__ void fwd_for_each_element(i64 row_base, i64 c0, int t, F&& f) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(mt, n, e, row_base + mt * 16 + 8 * (e >> 1), c0 + n * 8 + 2 * t + (e & 1));
}

// The forward's tile of raw scores s becomes modified, masked scores (-inf where not kept).
// kInterior: every element is kept (an interior tile of a full block), no tests.
template <bool kInterior>
__device__ __forceinline__ void fwd_scores(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], i64 b, i64 h,
                                           i64 row_base, i64 c0, int t, bool partial) {
  fwd_for_each_element(row_base, c0, t, [&](int mt, int n, int e, i64 q, i64 kv) {
    if (kInterior) {
      float x = scaled_score(P, s[mt][n][e]);
#if HAS_SCORE
      x = score_mod(x, b, h, q, kv, P);
#endif
      s[mt][n][e] = x;
    } else {
      bool keep;
      s[mt][n][e] = mod_score(P, s[mt][n][e], b, h, q, kv, partial, &keep);
    }
  });
}

// mod_score's arithmetic on element (q, kv) of s given its keep bit (the same bits).
__device__ __forceinline__ float fwd_kept_score(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv,
                                                bool keep) {
  float x = scaled_score(P, raw);
#if HAS_SCORE
  x = score_mod(x, b, h, q < P.L ? q : P.L - 1, kv < P.S ? kv : P.S - 1, P);
#endif
  return keep ? x : NEG_INF;
}

#if FWD_TMA && FWD_KEEPBITS
// FWD_KEEPBITS (the TMA forward, unless MASK_BITS): the keep bits of a tile that is not interior
// (bit i % 32 of kb[i / 32] for element i = (mt * FWD_TILE_N / 8 + n) * 4 + e): inside the lengths
// and, on partial blocks, the mask (of the element clamped into the lengths, as mod_score).
// Computed while S = QK^T is in flight, each test folded into its bit at once: with the tests
// beside the scores, ptxas kept 64 predicates live and moved them through registers (~1000 of a
// document-mask tile's ~2000 instructions; 255 -> 219 registers without spills at E = 128).
#define FWD_KB_WORDS ((FWD_MT * FWD_TILE_N / 2 + 31) / 32)
__device__ __forceinline__ void fwd_keep_bits(const FlexParams& P, u32 (&kb)[FWD_KB_WORDS], i64 b, i64 h,
                                              i64 row_base, i64 c0, int t, bool partial) {
#pragma unroll
  for (int w = 0; w < FWD_KB_WORDS; ++w) kb[w] = 0u;
  fwd_for_each_element(row_base, c0, t, [&](int mt, int n, int e, i64 q, i64 kv) {
    bool k = q < P.L && kv < P.S;
#if HAS_MASK
    const i64 qc = q < P.L ? q : P.L - 1, kvc = kv < P.S ? kv : P.S - 1;
    k = k & (!partial | (bool)mask_mod(b, h, qc, kvc, P));
#endif
    const int i = (mt * (FWD_TILE_N / 8) + n) * 4 + e;
    kb[i >> 5] |= (u32)k << (i & 31);
  });
}
// The tile's scores with the keep bits of fwd_keep_bits.
__device__ __forceinline__ void fwd_scores_bits(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4],
                                                const u32 (&kb)[FWD_KB_WORDS], i64 b, i64 h, i64 row_base, i64 c0,
                                                int t) {
  fwd_for_each_element(row_base, c0, t, [&](int mt, int n, int e, i64 q, i64 kv) {
    const int i = (mt * (FWD_TILE_N / 8) + n) * 4 + e;
    s[mt][n][e] = fwd_kept_score(P, s[mt][n][e], b, h, q, kv, (kb[i >> 5] >> (i & 31)) & 1u);
  });
}
#if MASK_RANGES
// The tile's scores kept on its rows' runs (runs[mt][r]: row row_base + mt * 16 + 8 r).
__device__ __forceinline__ void fwd_scores_runs(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4],
                                                const Run (&runs)[FWD_MT][2], i64 b, i64 h, i64 row_base, i64 c0,
                                                int t) {
  fwd_for_each_element(row_base, c0, t, [&](int mt, int n, int e, i64 q, i64 kv) {
    const bool keep = in_run(runs[mt][e >> 1], n * 8 + 2 * t + (e & 1));
    s[mt][n][e] = fwd_kept_score(P, s[mt][n][e], b, h, q, kv, keep);
  });
}
#endif
// S = Q K^T of the tile c0 at Kx into s, then the tile's modified, masked scores: a tile that is not
// interior gets its keep bits (MASK_RANGES: its rows' runs) while the product is in flight.
__device__ __forceinline__ void fwd_qk_scores(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], const u16* Qs,
                                              const u16* Kx, int warp, i64 b, i64 h, i64 row_base, i64 c0, int t,
                                              bool partial, bool rows_in) {
  wg_abt_issue<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, Kx);
  const bool interior = !partial && rows_in && c0 + FWD_TILE_N <= P.S;
#if MASK_RANGES
  Run runs[FWD_MT][2];
  if (!interior)
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) runs[mt][r] = kv_run(P, b, h, row_base + mt * 16 + 8 * r, c0, FWD_TILE_N, partial);
  wg_wait_all();
  reg_fence<FWD_TILE_N / 8>(s[0]);
  if (interior) fwd_scores<true>(P, s, b, h, row_base, c0, t, partial);
  else fwd_scores_runs(P, s, runs, b, h, row_base, c0, t);
#else
  u32 kb[FWD_KB_WORDS];
  if (!interior) fwd_keep_bits(P, kb, b, h, row_base, c0, t, partial);
  wg_wait_all();
  reg_fence<FWD_TILE_N / 8>(s[0]);
  if (interior) fwd_scores<true>(P, s, b, h, row_base, c0, t, partial);
  else fwd_scores_bits(P, s, kb, b, h, row_base, c0, t);
#endif
}
#endif

// MASK_BITS (the TMA forward of a mask that reads captured tensors): one CTA per
// (mask row, slot) of the kv lists' partial blocks writes the block's keep bits (in bounds and
// mask, of the element clamped into the lengths as mod_score), QB rows of KB / 32 words, at
// P.mbits + (row * kv_m + slot) * QB * KB / 32. The forward then reads two rows of words per
// thread instead of evaluating the mask (a document mask's partial tile: ~2000 instructions).
extern "C" __global__ void __launch_bounds__(128) flex_mask_bits(const FlexParams P) {
#if HAS_MASK
  const i64 row = blockIdx.x / P.kv_m, slot = blockIdx.x % P.kv_m;
  if (slot >= P.kv_num[row]) return;
  const i64 i = row % P.nQB, mbh = row / P.nQB, b = mbh / P.mH, h = mbh % P.mH;
  const i64 kb0 = (i64)P.kv_idx[row * P.kv_m + slot] * P.KB, qb0 = i * P.QB, wpr = P.KB / 32;
  unsigned* out = P.mbits + (row * P.kv_m + slot) * P.QB * wpr;
  for (i64 w = threadIdx.x; w < P.QB * wpr; w += blockDim.x) {
    const i64 q = qb0 + w / wpr, c = kb0 + (w % wpr) * 32;
    unsigned bits = 0u;
    for (int x = 0; x < 32; ++x) {
      const i64 kv = c + x;
      const bool in = q < P.L && kv < P.S;
      const i64 qc = q < P.L ? q : P.L - 1, kvc = kv < P.S ? kv : P.S - 1;
      bits |= (unsigned)(in && (bool)mask_mod(b, h, qc, kvc, P)) << x;
    }
    out[w] = bits;
  }
#endif
}

#if MASK_BITS
// A partial block's tile from the block's keep bits `blk` (flex_mask_bits), mod_score's arithmetic
// otherwise (the same bits): each thread loads its rows' words once.
__device__ __forceinline__ void fwd_scores_mbits(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], const unsigned* blk,
                                                 i64 b, i64 h, i64 row_base, i64 c0, int t) {
  const i64 qb0 = row_base - row_base % P.QB, wpr = P.KB / 32, col0 = (c0 % P.KB) / 32;
  unsigned w[FWD_MT][2][FWD_TILE_N / 32];
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const unsigned* rowp = blk + (row_base + mt * 16 + 8 * r - qb0) * wpr + col0;
#pragma unroll
      for (int x = 0; x < FWD_TILE_N / 32; ++x) w[mt][r][x] = rowp[x];
    }
  fwd_for_each_element(row_base, c0, t, [&](int mt, int n, int e, i64 q, i64 kv) {
    const bool keep = (w[mt][e >> 1][n >> 2] >> ((n & 3) * 8 + 2 * t + (e & 1))) & 1u;
    s[mt][n][e] = fwd_kept_score(P, s[mt][n][e], b, h, q, kv, keep);
  });
}
#endif

// Interior tiles of full blocks need neither the bounds test nor the mask: the same arithmetic
// as mod_score on the kept elements, so the same bits. The test is per tile, outside the element
// loops (per element it compiled to a branch each).
// blk: a partial block's keep bits (MASK_BITS), else null.
__device__ __forceinline__ void fwd_tile_scores(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], i64 b, i64 h,
                                                i64 row_base, i64 c0, int t, bool partial, bool rows_in,
                                                const unsigned* blk = nullptr) {
  if (!partial && rows_in && c0 + FWD_TILE_N <= P.S) fwd_scores<true>(P, s, b, h, row_base, c0, t, partial);
#if MASK_BITS
  else if (blk) fwd_scores_mbits(P, s, blk, b, h, row_base, c0, t);
#endif
  else fwd_scores<false>(P, s, b, h, row_base, c0, t, partial);
}

// Online softmax of one tile of masked scores s (rows g and g + 8 of each m16 block): p =
// 2^(s log2e - m log2e) rounded to T into pk, the running max m and this thread's partial sums l
// updated, alpha the factor for the output accumulated before this tile.
__device__ __forceinline__ void fwd_softmax(float (&s)[FWD_MT][FWD_TILE_N / 8][4], u32 (&pk)[FWD_MT][FWD_TILE_N / 8][2],
                                            float (&m)[FWD_MT][2], float (&l)[FWD_MT][2], float (&alpha)[FWD_MT][2],
                                            const float kexp) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt) {
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[mt][r], mx[r]);
      // p = 2^(x log2e - m log2e): one FFMA and the SFU per element. Nothing attended yet
      // (m_new = -inf): p = 0 from x = -inf with m taken as 0.
      const float m_log2 = (m_new == NEG_INF ? 0.f : m_new) * kexp;
      // Exactly 1 when the max did not move (the fmaf would give m log2e's rounding error, not 0,
      // and 2^err can round to 1 + 1 ulp): a tile that moves nothing, an empty one included, then
      // leaves l and o bit for bit, so skipping empty tiles (64-blocks) keeps the bits.
      alpha[mt][r] = m[mt][r] == NEG_INF ? 0.f : m_new == m[mt][r] ? 1.f : fast_exp2(fmaf(m[mt][r], kexp, -m_log2));
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], kexp, -m_log2));
          sum += s[mt][n][e];
        }
#pragma unroll
      for (int n = 0; n < FWD_TILE_N / 8; ++n) pk[mt][n][r] = pack2(s[mt][n][2 * r], s[mt][n][2 * r + 1]);
      l[mt][r] = l[mt][r] * alpha[mt][r] + sum;  // per-thread partial sum; the 4 threads of a row add up at the end
      m[mt][r] = m_new;
    }
  }
}

// o *= alpha, skipped when no row of the warp moved its max (alpha = 1 exactly, so the same
// bits): late in a row the max rarely moves, and the rescale is as many multiplies as the exps.
__device__ __forceinline__ void fwd_rescale(float (&o)[FWD_MT][HEAD_DIM / 8][4], const float (&alpha)[FWD_MT][2]) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
    if (__any_sync(0xffffffffu, alpha[mt][0] != 1.f || alpha[mt][1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n) {
        o[mt][n][0] *= alpha[mt][0];
        o[mt][n][1] *= alpha[mt][0];
        o[mt][n][2] *= alpha[mt][1];
        o[mt][n][3] *= alpha[mt][1];
      }
    }
}

#if FWD_TMA
// A partial block's keep bits from flex_mask_bits (MASK_BITS and P.mbits), else null.
__device__ __forceinline__ const unsigned* fwd_block_bits(const FlexParams& P, i64 mrow, int slot, bool partial) {
  return MASK_BITS && P.mbits && partial ? P.mbits + (mrow * P.kv_m + slot) * (P.QB * P.KB / 32) : (const unsigned*)0;
}
// The TMA loops' S = Q K^T (Q at Qbuf, K at Kbuf), the tile's scores (part: its block is partial;
// slot: that block's slot in the partial list) and the online softmax into s / pk, o rescaled. Both
// TMA forwards' loops use it with their own P, s, pk, m, l, o, warp, b, h, row_base, c0, t,
// rows_in and mrow.
#if FWD_KEEPBITS
#define FWD_TMA_SOFTMAX(Qbuf, Kbuf, part, slot)                                 \
  fwd_qk_scores(P, s, Qbuf, Kbuf, warp, b, h, row_base, c0, t, part, rows_in); \
  float alpha[FWD_MT][2];                                                      \
  fwd_softmax(s, pk, m, l, alpha, exp2_factor(P));                             \
  fwd_rescale(o, alpha);
#else
#define FWD_TMA_SOFTMAX(Qbuf, Kbuf, part, slot)                                                  \
  wg_abt<FWD_TILE_N>(s[0], Qbuf, FWD_TILE_M, (warp >> 2) * 64, Kbuf);                            \
  fwd_tile_scores(P, s, b, h, row_base, c0, t, part, rows_in, fwd_block_bits(P, mrow, slot, part)); \
  float alpha[FWD_MT][2];                                                                        \
  fwd_softmax(s, pk, m, l, alpha, exp2_factor(P));                                               \
  fwd_rescale(o, alpha);
#endif
// The staged TMA forward's K / V stages (three measured no faster: 12a98e5, fwd ms, causal and 16
// documents within noise, the E = 128 window 0.39 -> 0.63 with one CTA an SM instead of two).
#define FWD_STAGES 2
// One step of the staged TMA forward on stage x: its K landed, the scores and softmax against Q at
// Qbuf, its V landed, o += P V. Declares stage x's buffers Kx and Vx, and s and pk.
#define FWD_TMA_STAGE_STEP(Qbuf, part, slot)                                   \
  u16* Kx = Ks + x * 2 * FWD_TILE_N * HEAD_DIM;                               \
  u16* Vx = Vs + x * 2 * FWD_TILE_N * HEAD_DIM;                               \
  mbar_wait(&bars[x], (kphase >> x) & 1); /* K(c0) (and a first Q) landed */  \
  float s[FWD_MT][FWD_TILE_N / 8][4];                                         \
  u32 pk[FWD_MT][FWD_TILE_N / 8][2];                                          \
  FWD_TMA_SOFTMAX(Qbuf, Kx, part, slot)                                       \
  mbar_wait(&bars[FWD_STAGES + x], (kphase >> x) & 1); /* V(c0) landed */     \
  kphase ^= 1u << x;                                                          \
  wg_pb<FWD_TILE_N>(o[0], pk[0], Vx);
#endif  // FWD_TMA

// A row's softmax sum from this thread's partial l (the 4 threads of a row add up).
__device__ __forceinline__ float fwd_row_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  return l + __shfl_xor_sync(0xffffffffu, l, 2);
}
// The output's factor of a row of sum lr: 0 for fully masked rows (lr 0), whose lse is -inf.
__device__ __forceinline__ float fwd_row_inv(float lr) { return lr > 0.f ? 1.f / lr : 0.f; }
// A row's lse from its max m and sum lr: -inf for fully masked rows (lr 0). FOLD_SCALE: m is a raw
// score (q.k); the lse is of the scaled ones.
__device__ __forceinline__ float fwd_row_lse(const FlexParams& P, float m, float lr) {
  return lr > 0.f ? (FOLD_SCALE ? m * P.scale_f : m) + logf(lr) : NEG_INF;
}

// The output rows of one q tile (this thread's o, m, l; row_base as FWD_ROW) and their lse.
__device__ __forceinline__ void fwd_store(const FlexParams& P, const float (&o)[FWD_MT][HEAD_DIM / 8][4],
                                          const float (&m)[FWD_MT][2], const float (&l)[FWD_MT][2], i64 bh,
                                          i64 row_base, int t) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lr = fwd_row_sum(l[mt][r]);
      const i64 row = row_base + mt * 16 + 8 * r;
      if (row >= P.L) continue;
      const float inv = fwd_row_inv(lr);
      u16* og = (u16*)P.out + (bh * P.L + row) * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
        *(u32*)(og + n * 8 + 2 * t) = pack2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      if (t == 0) P.lse[bh * P.L + row] = fwd_row_lse(P, m[mt][r], lr);
    }
}
#endif  // KILN_BUILD_FWD (flex_fwd follows in fwd.cuh)
