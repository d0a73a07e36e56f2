#pragma once
// The kernels' shared device code: the BlockMask walks (BlockWalk, TileWalk, GroupWalk), the modified
// score of one element (mod_score) and the defaults of the generated defines. A walk visits a row's
// (or column's) blocks, partial and full merged in ascending block order, so a block contributes the
// same bits whatever its classification (the mask is simply not evaluated on full blocks).

// The mma.sync forward's tile loads (padded rows, cp.async from every thread).
#define FWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_async(dst, src, row0, total, rows, FWD_THREADS)

__device__ __forceinline__ i64 mask_row(const FlexParams& P, i64 b, i64 h) {
  return (P.mB == 1 ? 0 : b) * P.mH + (P.mH == 1 ? 0 : h);
}

#ifndef MASK_BITS
#define MASK_BITS 0  // TMA forward: partial blocks' keep bits from flex_mask_bits (P.mbits)
#endif
#ifndef MERGED_WALK
#define MERGED_WALK 0  // one merged list a row (every BlockMask with a mask_mod)
#endif
// BlockWalk's step without a BlockMask (all_full): every block in turn, each full.
__device__ __forceinline__ bool step_all(i64& next, i64 count, int& j, bool& partial) {
  if (next >= count) return false;
  j = (int)next++;
  partial = false;
  return true;
}
#if MERGED_WALK
// The kernels' lists: one merged list a row (FlexParams::kv_all_* / q_all_*; no full lists).
#define KV_LISTS(P) P.kv_all_num, P.kv_all_idx, P.kv_all_m, (const int*)0, (const int*)0, (i64)0
#define Q_LISTS(P) P.q_all_num, P.q_all_idx, P.q_all_m, (const int*)0, (const int*)0, (i64)0
// Ascending walk of a row's merged list, entries 2 * block + (1 if partial) (or every block when
// all_full); the next entry is loaded a step ahead. slot: a partial block's place in the partial
// list (the partials met before it), for MASK_BITS.
struct BlockWalk {
  const int *a, *e;
  int v, slot, parts;
  i64 next, count;
  bool all;
  __device__ __forceinline__ BlockWalk(const FlexParams& P, const int* num, const int* idx, i64 m, const int*,
                                       const int*, i64, i64 row, i64 total) {
    all = P.all_full != 0;
    next = 0;
    count = total;
    a = e = 0;
    v = slot = parts = 0;
    if (!all) {
      a = idx + row * m;
      e = a + num[row];
      v = a < e ? *a : 0;
    }
  }
  __device__ __forceinline__ bool step(int& j, bool& partial) {
    if (all) return step_all(next, count, j, partial);
    if (a == e) return false;
    j = v >> 1;
    partial = v & 1;
    slot = parts;
    parts += v & 1;
    ++a;
    v = a < e ? *a : 0;
    return true;
  }
};
#else
#if MASK_BITS
#error "the mask bits' slots come from the merged walk"
#endif
#define KV_LISTS(P) P.kv_num, P.kv_idx, P.kv_m, P.fkv_num, P.fkv_idx, P.fkv_m
#define Q_LISTS(P) P.q_num, P.q_idx, P.q_m, P.fq_num, P.fq_idx, P.fq_m
// Without a mask_mod (or a BlockMask): an ascending walk of a partial list and a full list, merged
// as it goes (or every block when all_full).
struct BlockWalk {
  const int *pa, *pe, *fa, *fe;
  i64 next, count;
  bool all;
  __device__ __forceinline__ BlockWalk(const FlexParams& P, const int* num, const int* idx, i64 m, const int* fnum,
                                       const int* fidx, i64 fm, i64 row, i64 total) {
    all = P.all_full != 0;
    next = 0;
    count = total;
    pa = pe = fa = fe = 0;
    if (!all) {
      pa = idx + row * m;
      pe = pa + num[row];
      fa = fidx + row * fm;
      fe = fa + fnum[row];
    }
  }
  __device__ __forceinline__ bool step(int& j, bool& partial) {
    if (all) return step_all(next, count, j, partial);
    if (pa == pe && fa == fe) return false;
    if (fa == fe || (pa < pe && *pa < *fa)) {
      j = *pa++;
      partial = true;
    } else {
      j = *fa++;
      partial = false;
    }
    return true;
  }
};
#endif  // MERGED_WALK

// The step_n-wide tiles of a BlockWalk's blocks, in order (blocks of `blk` rows, clipped to `total`).
struct TileWalk {
  BlockWalk w;
  i64 c, cend, blk, total, step_n;
  bool part;
  __device__ __forceinline__ TileWalk(const BlockWalk& walk, i64 block, i64 n, i64 step = TILE_N)
      : w(walk), c(0), cend(0), blk(block), total(n), step_n(step), part(false) {}
  // slot: the partial list's slot of the tile's block (MASK_BITS), when asked for.
  __device__ __forceinline__ bool next(i64& c0, bool& partial, int* slot = nullptr) {
    while (c >= cend) {
      int j;
      if (!w.step(j, part)) return false;
      c = (i64)j * blk;
      cend = c + blk < total ? c + blk : total;
    }
    c0 = c;
    partial = part;
#if MASK_BITS
    if (slot) *slot = w.slot;
#endif
    c += step_n;
    return true;
  }
};

// dK/dV's q tiles: the transposed list of each q head of the kv head's group, head by head.
struct GroupWalk {
  const FlexParams& P;
  i64 b, hk, jblk, gi;
  TileWalk tw;
  __device__ __forceinline__ TileWalk head(i64 g) const {
    const i64 mcol = P.all_full ? 0 : mask_row(P, b, hk * P.G + g) * P.nKVB + jblk;
    TileWalk t(BlockWalk(P, Q_LISTS(P), mcol, P.nQB), P.QB, P.L);
    return t;
  }
  __device__ __forceinline__ GroupWalk(const FlexParams& p, i64 b_, i64 hk_, i64 jblk_)
      : P(p), b(b_), hk(hk_), jblk(jblk_), gi(0), tw(head(0)) {}
  __device__ __forceinline__ bool next(i64& g, i64& r0, bool& partial) {
    while (gi < P.G) {
      if (tw.next(r0, partial)) {
        g = gi;
        return true;
      }
      if (++gi < P.G) tw = head(gi);
    }
    return false;
  }
};

// The modified score of one element and whether it is kept (in bounds, and mask true on partial
// blocks). Branch-free: the mods see the element clamped into the lengths (an element of the same
// tile, so no new index errors) and the bounds and mask are and-ed in, so a tile's elements
// compile to selects rather than a branch each.
#ifndef FWD_LAST_ISSUES
#define FWD_LAST_ISSUES 0  // the staged TMA forward: the last warp done with a stage issues its loads
#endif
#ifndef FOLD_SCALE
#define FOLD_SCALE 0
#endif
// FOLD_SCALE (no score_mod and scale > 0, set by the host): scores stay raw (q.k) through the mask,
// the max and the online softmax, and the scale joins log2(e) in the exponent's FFMA: one multiply
// an element fewer in the forward and in both backward kernels.
__device__ __forceinline__ float scaled_score(const FlexParams& P, float raw) { return FOLD_SCALE ? raw : raw * P.scale_f; }
// The factor of a (scaled_score) score in the exponent of 2 of its softmax term.
__device__ __forceinline__ float exp2_factor(const FlexParams& P) { return FOLD_SCALE ? P.scale_log2e : LOG2E; }

__device__ __forceinline__ float mod_score(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv, bool partial,
                                           bool* keep) {
  const bool in = q < P.L && kv < P.S;
  const i64 qc = q < P.L ? q : P.L - 1, kvc = kv < P.S ? kv : P.S - 1;
  float x = scaled_score(P, raw);
#if HAS_SCORE
  x = score_mod(x, b, h, qc, kvc, P);
#endif
  bool k = in;
#if HAS_MASK
  k = k & (!partial | (bool)mask_mod(b, h, qc, kvc, P));
#endif
  *keep = k;
  return k ? x : NEG_INF;
}

#ifndef MASK_RANGES
#define MASK_RANGES 0  // the mask keeps one run a row and column: mask_kv_range / mask_q_range (codegen_ranges.cpp)
#endif
#if MASK_RANGES
// The kept elements of one row of a tile as a run of its n columns: column j is kept iff
// (unsigned)(j - lo) < (unsigned)w. mod_score's keep: inside the lengths, and on partial blocks the
// mask at the element clamped into them.
struct Run {
  int lo, w;
};
__device__ __forceinline__ Run tile_run(i64 lo, i64 hi, i64 c0, int n) {
  lo = lo - c0 < 0 ? 0 : lo - c0;
  hi = hi - c0 + 1 > n ? n : hi - c0 + 1;  // exclusive
  return Run{(int)(lo < n ? lo : n), (int)(hi > lo ? hi - lo : 0)};
}
// Row q's run of kv over the tile's n columns from c0.
__device__ __forceinline__ Run kv_run(const FlexParams& P, i64 b, i64 h, i64 q, i64 c0, int n, bool partial) {
  i64 lo = 0, hi = q < P.L ? P.S - 1 : -1;
  if (partial) {
    i64 l, u;
    mask_kv_range(b, h, q < P.L ? q : P.L - 1, 0, P, &l, &u);
    lo = l > lo ? l : lo;
    hi = u < hi ? u : hi;
  }
  return tile_run(lo, hi, c0, n);
}
// Column kv's run of q over the tile's n rows from r0 (the dK/dV kernel's transposed tiles).
__device__ __forceinline__ Run q_run(const FlexParams& P, i64 b, i64 h, i64 kv, i64 r0, int n, bool partial) {
  i64 lo = 0, hi = kv < P.S ? P.L - 1 : -1;
  if (partial) {
    i64 l, u;
    mask_q_range(b, h, 0, kv < P.S ? kv : P.S - 1, P, &l, &u);
    lo = l > lo ? l : lo;
    hi = u < hi ? u : hi;
  }
  return tile_run(lo, hi, r0, n);
}
__device__ __forceinline__ bool in_run(Run r, int j) { return (unsigned)(j - r.lo) < (unsigned)r.w; }
#endif

#ifndef FWD_TMA
#define FWD_TMA 0  // wgmma forward (sm_90a): Q, K and V tiles by TMA, two K / V stages
#endif
#ifndef FWD_PERSIST
#define FWD_PERSIST 0  // TMA only: one CTA walks several q tiles (persist.cuh)
#endif
#ifndef FWD_KEEPBITS
#define FWD_KEEPBITS 0  // TMA only: a non-interior tile's keep bits while QK^T is in flight
#endif
