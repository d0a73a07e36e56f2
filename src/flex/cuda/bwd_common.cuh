#pragma once
// The backward's shared part: its switches, tile macros, flex_bwd_pre (delta = rowsum(dO * O) - dlse,
// lse2 = lse log2(e)), elem_p and p_ds (P and dS of one element). kernels.cuh includes it, then
// bwd_dq.cuh and bwd_dkdv.cuh, inside one #if KILN_BUILD_BWD.

#ifndef BWD_TMA
#define BWD_TMA 0  // wgmma (sm_90a): Q, dO, K and V tiles by TMA, two K / V stages in dQ and two Q / dO in
                   // dK/dV, each tile's two products issued as a pair
#endif
#if BWD_TMA && !BWD_WGMMA
#error "the TMA backward loads the wgmma tile layout"
#endif
#ifndef BWD_SPLIT_P
#define BWD_SPLIT_P 0  // TMA, d score_mod / d score = 1: P while dP is in flight
#endif
#ifndef SCORE_GRAD_ONE
#define SCORE_GRAD_ONE 0  // the score_mod's gradient is the identity, no captured-tensor gradients
#endif
#if BWD_SPLIT_P && !(BWD_TMA && (!HAS_SCORE || SCORE_GRAD_ONE))
#error "the split P / dS needs the TMA backward and no score_mod or one of gradient 1"
#endif
#define BWD_QSETS (BWD_TMA ? 2 : 1)  // dK/dV's buffers of Q, dO and rows
// Both kernels run one warpgroup (NTHREADS threads) a CTA, so their wg = threadIdx.x / NTHREADS is
// 0; it stays a run-time value in their tile and row offsets (dQ: Qw, dOw, r0; dK/dV: Kw, Vw, w0),
// and warp stays (threadIdx.x >> 5) % NWARPS, because ptxas allocates the kernels better so
// (sm_90a, nvcc 13.0, E = 128 causal: dK/dV 255 registers without spills, 70 bytes of spills with
// the offsets folded away).
// The backward's tiles and products: wgmma on sm_90a (swizzled tiles by TMA), else mma.sync (padded
// tiles by cp.async; those that stay for the whole tile walk, Q and dO in dQ, K and V in dK/dV, by
// plain loads, visible after the first barrier). ABT: acc[64 x 64] = the CTA's 64 rows of A times
// B^T; PB: acc[64 x HEAD_DIM] += p B.
#if BWD_WGMMA
#if TILE_M != 64
#error "the wgmma backward's tiles are one warpgroup's 64 rows"
#endif
#define BWD_SMEM_BASE(smem) wg_smem_base(smem)
#define BWD_TILE_ELEMS(rows) ((rows) * HEAD_DIM)
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
// with 2-byte loads ran at ~1.3 TB/s (H200: 51 us of a 0.55 ms fwd+bwd at 1x8x32768x64). Each lane
// group takes PRE_ROWS rows (a grid's width apart) and issues all their loads, lse's and dlse's
// included, before it uses any (there: 67 MB in 21.4 -> 19.9 us, ~3.4 TB/s).
#define PRE_LANES (HEAD_DIM / 8)
extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_pre(const FlexParams P) {
  constexpr int kGroups = NTHREADS / PRE_LANES;
  const int sub = threadIdx.x % PRE_LANES;
  const i64 rows = P.B * P.Hq * P.L, first = (i64)blockIdx.x * kGroups * PRE_ROWS + threadIdx.x / PRE_LANES;
  uint4 a[PRE_ROWS], b[PRE_ROWS];
  float lse[PRE_ROWS], dlse[PRE_ROWS];
#pragma unroll
  for (int r = 0; r < PRE_ROWS; ++r) {  // dO and O are 16-byte aligned: O is kiln's own, dO passed through kernel_operand (api.cpp)
    const i64 row = first + r * kGroups;
    a[r] = b[r] = make_uint4(0, 0, 0, 0);
    lse[r] = dlse[r] = 0.f;
    if (row < rows) {
      a[r] = *(const uint4*)((const u16*)P.dout + row * HEAD_DIM + sub * 8);
      b[r] = *(const uint4*)((const u16*)P.out + row * HEAD_DIM + sub * 8);
      if (sub == 0) {
        lse[r] = P.lse[row];
        dlse[r] = P.dlse ? P.dlse[row] : 0.f;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < PRE_ROWS; ++r) {
    const i64 row = first + r * kGroups;
    const u32 av[4] = {a[r].x, a[r].y, a[r].z, a[r].w}, bv[4] = {b[r].x, b[r].y, b[r].z, b[r].w};
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      s += to_f((u16)(av[j] & 0xffffu)) * to_f((u16)(bv[j] & 0xffffu)) + to_f((u16)(av[j] >> 16)) * to_f((u16)(bv[j] >> 16));
#pragma unroll
    for (int off = PRE_LANES / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (row < rows && sub == 0) {
      P.delta[row] = s - dlse[r];
      P.lse2[row] = lse[r] == NEG_INF ? POS_INF : lse[r] * LOG2E;  // fully masked rows: p = 2^(y - inf) = 0
    }
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
    y = scaled_score(P, raw);
#if HAS_SCORE
    y = score_mod(y, b, h, q, kv, P);
#endif
  } else if (kBits) {
    y = scaled_score(P, raw);
#if HAS_SCORE
    y = score_mod(y, b, h, q < P.L ? q : P.L - 1, kv < P.S ? kv : P.S - 1, P);
#endif
    y = bit ? y : NEG_INF;
  } else {
    y = mod_score(P, raw, b, h, q, kv, partial, &keep);
  }
  return fast_exp2(fmaf(y, exp2_factor(P), -lse2));  // y = -inf where not kept: p = 0
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
  if (kInterior || (q < P.L && kv < P.S)) ds = score_grad(raw * P.scale_f, b, h, q, kv, ds, P, (double*)0);
  else ds = 0.f;
#endif
  *p_out = p;
  *ds_out = ds;
}
