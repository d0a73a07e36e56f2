// The FlexAttention CUDA kernels as source text, compiled at run time by NVRTC after the
// generated mod functions (codegen.cpp). Self-contained: no CUDA headers; bf16/fp16 travel as
// 16-bit patterns, tensor cores via inline PTX: mma.sync m16n8k16 (sm_80+) or, on sm_90a, wgmma
// (the helpers in kernel_source_wgmma.cpp; FWD_WGMMA / BWD_WGMMA pick per kernel group). This
// file holds the prelude and the forward; the backward kernels are in kernel_source_bwd.cpp.
//
// Tiles (mma.sync): a CTA is 4 warps; each warp owns 16 rows of a 64 x 64 score tile and
// accumulates in fp32 registers (mma C fragments). Q/K/V/dO tiles sit in shared memory with rows
// padded by 16 bytes (conflict-free ldmatrix: the 8 rows of a phase hit distinct banks). With
// wgmma a warpgroup owns 64 rows, tiles are swizzled and unpadded, the accumulators keep the same
// per-thread layout, so the softmax and mask code is shared. K/V (Q/dO in dK/dV)
// tiles arrive by cp.async, the next one's load issued as soon as its buffer is free, so it
// overlaps the current tile's MMAs. 64 x 64 divides the BlockMask's 128 blocks; a CTA walks
// the BlockMask lists, partial and full merged in ascending block order, so a block contributes
// the same bits whatever its classification (the mask is simply not evaluated on full blocks).
//   flex_fwd:       per (b, q head, 64-row q tile): online softmax, out in T, lse (natural log).
//   flex_bwd_pre:   delta = rowsum(dO * O) - dlse, one warp per row.
//   flex_bwd_dq:    per (b, q head, q tile): dQ = scale * sum dS K over its kv list.
//   flex_bwd_dkdv:  per (b, kv head, 64-row kv tile): dV = sum P^T dO, dK = scale * sum dS^T Q over
//                   the group's q heads (fixed order) and their transposed q lists; captured-tensor
//                   gradients go to per-warp double slots, lanes taking turns (fixed order);
//                   then flex_capgrad_reduce sums the slots in order. No atomics anywhere.
#include "flex/cuda/codegen.h"

#include <string>

namespace kiln::flex::cuda {

const char* params_struct_source() {
  return R"kiln_src(
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct FlexParams {
  const void *q, *k, *v;
  void* out;
  float* lse;
  const void* dout;
  const float* dlse;
  float* delta;
  float* lse2;
  void *dq, *dk, *dv;
  const int *kv_num, *kv_idx, *fkv_num, *fkv_idx;
  const int *q_num, *q_idx, *fq_num, *fq_idx;
  int* err;
  double* slots;
  double* capgrad;
  unsigned long long* prof;
  unsigned* mbits;
  i64 B, Hq, Hkv, L, S, G;
  i64 QB, KB, nQB, nKVB, mB, mH, kv_m, fkv_m, q_m, fq_m, all_full;
  i64 q_tiles, kv_tiles, units, nslots, grad_numel;
  double scale;
  const void* sptr[KILN_MAX_BUFFERS];
  i64 ssize[KILN_MAX_BUFFERS][3], sstride[KILN_MAX_BUFFERS][3], sgoff[KILN_MAX_BUFFERS];
  const void* mptr[KILN_MAX_BUFFERS];
  i64 msize[KILN_MAX_BUFFERS][3], mstride[KILN_MAX_BUFFERS][3];
  alignas(64) unsigned char qmap[128], kmap[128], vmap[128], domap[128];
};
static_assert(sizeof(FlexParams) == KILN_PARAMS_SIZE, "host and device FlexParams differ");

__device__ __forceinline__ i64 kiln_floordiv(i64 x, i64 y) {
  if (y == 0) return 0;
  i64 q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
__device__ __forceinline__ i64 kiln_floormod(i64 x, i64 y) { return y == 0 ? 0 : x - kiln_floordiv(x, y) * y; }
// The narrow-int locals' (never INT32_MIN, so neither x / y nor x % y overflows). The remainder is
// corrected rather than x - q * y, whose product can leave 32 bits when the result does not.
__device__ __forceinline__ int kiln_floordiv(int x, int y) {
  if (y == 0) return 0;
  int q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
__device__ __forceinline__ int kiln_floormod(int x, int y) {
  if (y == 0) return 0;
  const int r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
// tanh on the SFU (sm_75+): max relative error ~2^-11, under bf16 / fp16 resolution; tanhf is a
// polynomial or an exp and a reciprocal, with a branch between them.
__device__ __forceinline__ float kiln_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

)kiln_src";
}

// Types, mma.sync and ldmatrix helpers, tile loads: everything the other parts use.
const char* kernel_prelude() {
  return R"kiln_src(
#ifndef KILN_BUILD_FWD
#define KILN_BUILD_FWD 1
#endif
#ifndef KILN_BUILD_BWD
#define KILN_BUILD_BWD 1
#endif
#define LD (HEAD_DIM + 8)
// B operands by ldmatrix (true) or per-thread loads (false; the same fragments, so the same bits).
// A switch per kernel group because ptxas batches ldmatrix results ahead of the mmas: in dK/dV
// (dK, dV, S and dP: 192 live fp32 registers at E = 128) that costs ~20 spilled bytes on sm_90a.
#define LDSM_B_Q true
#define LDSM_B_KV true
#if TILE_M != TILE_N
#error "the transposed dK/dV tiles assume square 64 x 64 tiles"
#endif
#define NEG_INF __uint_as_float(0xff800000u)
#define POS_INF __uint_as_float(0x7f800000u)
#define LOG2E 1.4426950408889634f
// 2^x on the SFU alone (ex2.approx.ftz: results below 2^-126 flush to 0). exp2f adds a range
// test and two predicated multiplies per call, a third of the softmax's instructions.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#if KILN_BF16
__device__ __forceinline__ float to_f(u16 x) { return __uint_as_float(((u32)x) << 16); }
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#define MMA_T "bf16"
#else
__device__ __forceinline__ float to_f(u16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#define MMA_T "f16"
#endif

// c += a (16x16, row) * b (16x8, col); fp32 accumulate.
__device__ __forceinline__ void mma(float* c, const u32* a, const u32* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Shared-memory address of a generic pointer into smem (for ldmatrix / cp.async).
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// rows x HEAD_DIM tile from global rows row0.. (rows past `total` are zero) into smem (stride LD).
__device__ __forceinline__ void load_tile(u16* dst, const u16* src, i64 row0, i64 total, int rows,
                                          int nthreads = NTHREADS) {
  const int chunks = HEAD_DIM / 8;
  for (int c = threadIdx.x; c < rows * chunks; c += nthreads) {
    const int r = c / chunks, col = (c % chunks) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < total) val = *(const uint4*)(src + (row0 + r) * HEAD_DIM + col);
    *(uint4*)(dst + r * LD + col) = val;
  }
}

// Byte offset of 16-byte chunk col8 of row r in wgmma's swizzled tile of `rows` rows: 64-column
// panels of 128-byte rows, chunk c of row r stored at chunk c ^ (r % 8) (kernel_source_wgmma.cpp).
__device__ __forceinline__ u32 sw_offset(int r, int col8, int rows) {
  return (u32)((col8 >> 3) * rows * 128 + r * 128 + (((col8 & 7) ^ (r & 7)) << 4));
}

// load_tile by cp.async (16 bytes a thread, L2 only; rows past `total` zero-filled by a source
// size of 0) into the padded layout or, kSwizzled, wgmma's swizzled one. The caller commits the
// group and waits for it before a __syncthreads.
template <bool kSwizzled = false>
__device__ __forceinline__ void load_tile_async(u16* dst, const u16* src, i64 row0, i64 total, int rows,
                                                int nthreads = NTHREADS) {
  const int chunks = HEAD_DIM / 8;
  const u32 base = smem_addr(dst);
  for (int c = threadIdx.x; c < rows * chunks; c += nthreads) {
    const int r = c / chunks, col = (c % chunks) * 8;
    const bool in = row0 + r < total;
    const u16* g = in ? src + (row0 + r) * HEAD_DIM + col : src;
    u32 to;
    if constexpr (kSwizzled) to = base + sw_offset(r, col / 8, rows);
    else to = smem_addr(dst + r * LD + col);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(g), "r"(in ? 16 : 0) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight (groups complete in order).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8 x 8 16-bit matrices; lane l gives the row address of row l % 8 of matrix l / 8. With
// .trans each lane receives a column pair instead of a row pair. Rows are 16 bytes, LD pads a row
// by 16 bytes, so the 8 rows of a phase fall on distinct bank quads (conflict-free).
__device__ __forceinline__ void ldsm4(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4_t(u32* r, const u16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// A fragment (16 x 16 at rows r0.., cols k0..) of a row-major smem tile: matrices (rows +0/+8) x
// (cols +0/+8) in the mma's a0..a3 order.
__device__ __forceinline__ void frag_a(u32* a, const u16* tile, int r0, int k0, int lane) {
  ldsm4(a, tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + k0 + (lane >> 4) * 8);
}

// acc[16 x 64] = A[16 rows at ra, HEAD_DIM] * B^T where B is a 64 x HEAD_DIM smem tile (both row-major).
template <bool kLdsm>  // kLdsm: B fragments by ldmatrix, else per-thread loads
__device__ __forceinline__ void tile_abt(float (*acc)[4], const u16* A, int ra, const u16* Bm, int lane) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
    u32 a[4];
    frag_a(a, A, ra, k0, lane);
#pragma unroll
    for (int n = 0; n < TILE_N / 8; n += 2) {
      // B fragments of column blocks n and n + 1: rows n*8.. of Bm, cols k0 and k0 + 8.
      u32 b[4];
      if (kLdsm) {
        ldsm4(b, Bm + (n * 8 + ((lane >> 4) * 8) + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8);
      } else {
        const u16* q0 = Bm + (n * 8 + (lane >> 2)) * LD + k0 + 2 * (lane & 3);
        b[0] = *(const u32*)q0;
        b[1] = *(const u32*)(q0 + 8);
        b[2] = *(const u32*)(q0 + 8 * LD);
        b[3] = *(const u32*)(q0 + 8 * LD + 8);
      }
      mma(acc[n], a, b);
      mma(acc[n + 1], a, b + 2);
    }
  }
}

// acc[16 x HEAD_DIM] += P[16 x 64] (C fragments, rounded to T) * Bm (64 x HEAD_DIM smem, row-major).
template <bool kLdsm>  // kLdsm: B fragments by ldmatrix, else per-thread loads
__device__ __forceinline__ void tile_pb(float (*acc)[4], const float (*p)[4], const u16* Bm, int lane) {
#pragma unroll
  for (int kk = 0; kk < TILE_N / 16; ++kk) {
    u32 a[4];
    a[0] = pack2(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack2(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; n += 2) {
      // B fragments (k down the rows) of column blocks n and n + 1 by transposed loads: rows
      // kk*16 + 0..7 / 8..15, cols n*8 / (n+1)*8.
      u32 b[4];
      if (kLdsm) {
        ldsm4_t(b, Bm + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (n + (lane >> 4)) * 8);
      } else {
        const u16* q0 = Bm + (kk * 16 + 2 * (lane & 3)) * LD + n * 8 + (lane >> 2);
        b[0] = (u32)q0[0] | ((u32)q0[LD] << 16);
        b[1] = (u32)q0[8 * LD] | ((u32)q0[9 * LD] << 16);
        b[2] = (u32)q0[8] | ((u32)q0[LD + 8] << 16);
        b[3] = (u32)q0[8 * LD + 8] | ((u32)q0[9 * LD + 8] << 16);
      }
      mma(acc[n], a, b);
      mma(acc[n + 1], a, b + 2);
    }
  }
}

// The forward's products with FWD_MT m16 row blocks per warp; each B fragment read from shared
// memory feeds FWD_MT mmas. Per element the mma sequence is tile_abt / tile_pb's, so the bits are
// too. The forward's tile (FWD_TILE_M q rows, FWD_TILE_N kv columns a step, FWD_MT) comes from
// KernelConfig; FWD_MT = 2 with only 2 warps (64 rows) measured slower on the H200 (2026-12-03,
// 997af05: causal 4x16x8192x128 fwd 8.83 vs 7.84 ms).
#define FWD_WARPS (FWD_TILE_M / (16 * FWD_MT))
#define FWD_THREADS (32 * FWD_WARPS)

__device__ __forceinline__ void tile_abt_mt(float (*acc)[FWD_TILE_N / 8][4], const u16* A, int ra, const u16* Bm,
                                            int lane) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  // Not unrolled at two m blocks: ptxas would hoist every B fragment and spill at E = 128.
#if FWD_MT == 1
#pragma unroll
#else
#pragma unroll 1
#endif
  for (int k0 = 0; k0 < HEAD_DIM; k0 += 16) {
    u32 a[FWD_MT][4];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt) frag_a(a[mt], A, ra + 16 * mt, k0, lane);
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; n += 2) {
      u32 b[4];
      ldsm4(b, Bm + (n * 8 + ((lane >> 4) * 8) + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < FWD_MT; ++mt) {
        mma(acc[mt][n], a[mt], b);
        mma(acc[mt][n + 1], a[mt], b + 2);
      }
    }
  }
}

// pk: P already rounded to T, pk[mt][n][r] = the pair of row r (g, g + 8) in column block n.
__device__ __forceinline__ void tile_pb_mt(float (*acc)[HEAD_DIM / 8][4], const u32 (*pk)[FWD_TILE_N / 8][2],
                                           const u16* Bm, int lane) {
#pragma unroll
  for (int kk = 0; kk < FWD_TILE_N / 16; ++kk) {
    u32 a[FWD_MT][4];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt) {
      a[mt][0] = pk[mt][2 * kk][0];
      a[mt][1] = pk[mt][2 * kk][1];
      a[mt][2] = pk[mt][2 * kk + 1][0];
      a[mt][3] = pk[mt][2 * kk + 1][1];
    }
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; n += 2) {
      u32 b[4];
      ldsm4_t(b, Bm + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (n + (lane >> 4)) * 8);
#pragma unroll
      for (int mt = 0; mt < FWD_MT; ++mt) {
        mma(acc[mt][n], a[mt], b);
        mma(acc[mt][n + 1], a[mt], b + 2);
      }
    }
  }
}

)kiln_src";
}

// Block walks, the modified score and the forward kernel (after the wgmma helpers).
const char* kernel_forward() {
  return R"kiln_src(
#define FWD_LOAD_TILE(dst, src, row0, total, rows) \
  load_tile_async<(FWD_WGMMA != 0)>(dst, src, row0, total, rows, FWD_THREADS)

__device__ __forceinline__ i64 mask_row(const FlexParams& P, i64 b, i64 h) {
  return (P.mB == 1 ? 0 : b) * P.mH + (P.mH == 1 ? 0 : h);
}

#ifndef MASK_BITS
#define MASK_BITS 0  // TMA forward: partial blocks' keep bits from flex_mask_bits (P.mbits)
#endif
#ifndef WALK_AHEAD
#define WALK_AHEAD 0  // the lists' next entries loaded a step ahead (KILN_FLEX_WALK_AHEAD=1)
#endif
// Merged ascending walk of a partial list and a full list (or every block when all_full). With
// WALK_AHEAD the heads of both lists (va = *pa, vf = *fa) are loaded one step ahead, so a step
// reads registers and its global load's latency hides behind the tile's work.
struct BlockWalk {
  const int *pa, *pe, *fa, *fe;
  const int* p0;  // the partial list's start: a partial block's slot is its offset from here
  int va, vf, slot;
  i64 next, count;
  bool all;
  __device__ __forceinline__ BlockWalk(const FlexParams& P, const int* num, const int* idx, i64 m, const int* fnum,
                                       const int* fidx, i64 fm, i64 row, i64 total) {
    all = P.all_full != 0;
    next = 0;
    count = total;
    pa = pe = fa = fe = p0 = 0;
    va = vf = slot = 0;
    if (!all) {
      pa = p0 = idx + row * m;
      pe = pa + num[row];
      fa = fidx + row * fm;
      fe = fa + fnum[row];
#if WALK_AHEAD
      va = pa < pe ? *pa : 0;
      vf = fa < fe ? *fa : 0;
#endif
    }
  }
  __device__ __forceinline__ bool step(int& j, bool& partial) {
    if (all) {
      if (next >= count) return false;
      j = (int)next++;
      partial = false;
      return true;
    }
    if (pa == pe && fa == fe) return false;
#if WALK_AHEAD
    if (fa == fe || (pa < pe && va < vf)) {
      j = va;
      partial = true;
#if MASK_BITS
      slot = (int)(pa - p0);
#endif
      ++pa;
      va = pa < pe ? *pa : 0;
    } else {
      j = vf;
      partial = false;
      ++fa;
      vf = fa < fe ? *fa : 0;
    }
#else
    if (fa == fe || (pa < pe && *pa < *fa)) {
#if MASK_BITS
      slot = (int)(pa - p0);
#endif
      j = *pa++;
      partial = true;
    } else {
      j = *fa++;
      partial = false;
    }
#endif
    return true;
  }
};

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
    return TileWalk(BlockWalk(P, P.q_num, P.q_idx, P.q_m, P.fq_num, P.fq_idx, P.fq_m, mcol, P.nQB), P.QB, P.L);
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
__device__ __forceinline__ float mod_score(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv, bool partial,
                                           bool* keep) {
  const bool in = q < P.L && kv < P.S;
  const i64 qc = q < P.L ? q : P.L - 1, kvc = kv < P.S ? kv : P.S - 1;
  float x = raw * (float)P.scale;
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

// KILN_FLEX_PROFILE (a measurement tool): per-phase clock64 cycles of each CTA's thread 0, added
// with atomics into 8 counters per kernel at P.prof + base. Forward phases: prologue, wait K,
// S = QK^T, softmax, wait V, PV, epilogue.
#ifndef FLEX_PROFILE
#define FLEX_PROFILE 0
#endif
#ifndef FWD_KBUF
#define FWD_KBUF 1  // K tiles in shared memory: 2 loads the next K a whole step ahead (TMA: 2 K/V stages)
#endif
#ifndef FWD_OVERLAP
#define FWD_OVERLAP 0  // wgmma only: the softmax of a tile beside the previous tile's P V
#endif
#ifndef FWD_TMA
#define FWD_TMA 0  // wgmma only, not with FWD_OVERLAP: Q, K and V tiles by TMA
#endif
#ifndef FWD_PERSIST
#define FWD_PERSIST 0  // TMA with two stages only: one CTA walks several q tiles (kernel_source_persist.cpp)
#endif
#ifndef FWD_KEEPBITS
#define FWD_KEEPBITS 0  // TMA only: a non-interior tile's keep bits while QK^T is in flight
#endif
#define PROFILE_SLOTS 8
#if FLEX_PROFILE
#define PROF_DECL                                  \
  unsigned long long prof_[PROFILE_SLOTS] = {0}; \
  unsigned long long prof_t_ = clock64();
#define PROF_MARK(i)                              \
  {                                               \
    const unsigned long long now_ = clock64();    \
    prof_[i] += now_ - prof_t_;                   \
    prof_t_ = now_;                               \
  }
#define PROF_FLUSH(base) \
  if (threadIdx.x == 0)  \
    for (int i_ = 0; i_ < PROFILE_SLOTS; ++i_) atomicAdd(P.prof + (base) + i_, prof_[i_]);
#else
#define PROF_DECL
#define PROF_MARK(i)
#define PROF_FLUSH(base)
#endif

#if KILN_BUILD_FWD
// The forward's tile of raw scores s becomes modified, masked scores (-inf where not kept).
// kInterior: every element is kept (an interior tile of a full block), no tests.
template <bool kInterior>
__device__ __forceinline__ void fwd_scores(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], i64 b, i64 h,
                                           i64 row_base, i64 c0, int t, bool partial) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 q = row_base + mt * 16 + 8 * (e >> 1), kv = c0 + n * 8 + 2 * t + (e & 1);
        if (kInterior) {
          float x = s[mt][n][e] * (float)P.scale;
#if HAS_SCORE
          x = score_mod(x, b, h, q, kv, P);
#endif
          s[mt][n][e] = x;
        } else {
          bool keep;
          s[mt][n][e] = mod_score(P, s[mt][n][e], b, h, q, kv, partial, &keep);
        }
      }
}

// mod_score's arithmetic on element (q, kv) of s given its keep bit (the same bits).
__device__ __forceinline__ float fwd_kept_score(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv,
                                                bool keep) {
  float x = raw * (float)P.scale;
#if HAS_SCORE
  x = score_mod(x, b, h, q < P.L ? q : P.L - 1, kv < P.S ? kv : P.S - 1, P);
#endif
  return keep ? x : NEG_INF;
}

#if FWD_TMA && FWD_KEEPBITS
// FWD_KEEPBITS (the sm_90 default; KILN_FLEX_FWD_KEEPBITS=0 turns it off): the keep bits of a tile that is not interior
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
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 q = row_base + mt * 16 + 8 * (e >> 1), kv = c0 + n * 8 + 2 * t + (e & 1);
        bool k = q < P.L && kv < P.S;
#if HAS_MASK
        const i64 qc = q < P.L ? q : P.L - 1, kvc = kv < P.S ? kv : P.S - 1;
        k = k & (!partial | (bool)mask_mod(b, h, qc, kvc, P));
#endif
        const int i = (mt * (FWD_TILE_N / 8) + n) * 4 + e;
        kb[i >> 5] |= (u32)k << (i & 31);
      }
}
// The tile's scores with the keep bits of fwd_keep_bits.
__device__ __forceinline__ void fwd_scores_bits(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4],
                                                const u32 (&kb)[FWD_KB_WORDS], i64 b, i64 h, i64 row_base, i64 c0,
                                                int t) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = (mt * (FWD_TILE_N / 8) + n) * 4 + e;
        s[mt][n][e] = fwd_kept_score(P, s[mt][n][e], b, h, row_base + mt * 16 + 8 * (e >> 1),
                                     c0 + n * 8 + 2 * t + (e & 1), (kb[i >> 5] >> (i & 31)) & 1u);
      }
}
// S = Q K^T of the tile at Kx into s with its modified, masked scores: a tile that is not interior
// gets its keep bits while the product is in flight.
__device__ __forceinline__ void fwd_qk_scores(const FlexParams& P, float (*s)[FWD_TILE_N / 8][4], const u16* Qs,
                                              const u16* Kx, int warp, i64 b, i64 h, i64 row_base, i64 c0, int t,
                                              bool partial, bool rows_in) {
  wg_abt_issue<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, Kx);
  const bool interior = !partial && rows_in && c0 + FWD_TILE_N <= P.S;
  u32 kb[FWD_KB_WORDS];
  if (!interior) fwd_keep_bits(P, kb, b, h, row_base, c0, t, partial);
  wg_wait_all();
  reg_fence<FWD_TILE_N / 8>(s[0]);
  if (interior) fwd_scores<true>(P, s, b, h, row_base, c0, t, partial);
  else fwd_scores_bits(P, s, kb, b, h, row_base, c0, t);
}
#endif

// MASK_BITS (masks that read captured tensors; the sm_90 default, KILN_FLEX_MASK_BITS=0 turns it off): one CTA per
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
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][n][e] = fwd_kept_score(P, s[mt][n][e], b, h, row_base + mt * 16 + 8 * (e >> 1),
                                     c0 + n * 8 + 2 * t + (e & 1),
                                     (w[mt][e >> 1][n >> 2] >> ((n & 3) * 8 + 2 * t + (e & 1))) & 1u);
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
                                            float (&m)[FWD_MT][2], float (&l)[FWD_MT][2], float (&alpha)[FWD_MT][2]) {
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
      const float m_log2 = (m_new == NEG_INF ? 0.f : m_new) * LOG2E;
      alpha[mt][r] = m[mt][r] == NEG_INF ? 0.f : fast_exp2(fmaf(m[mt][r], LOG2E, -m_log2));
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], LOG2E, -m_log2));
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
  PROF_MARK(2);                                                                \
  float alpha[FWD_MT][2];                                                      \
  fwd_softmax(s, pk, m, l, alpha);                                             \
  fwd_rescale(o, alpha);
#else
#define FWD_TMA_SOFTMAX(Qbuf, Kbuf, part, slot)                                                  \
  wg_abt<FWD_TILE_N>(s[0], Qbuf, FWD_TILE_M, (warp >> 2) * 64, Kbuf);                            \
  PROF_MARK(2);                                                                                  \
  fwd_tile_scores(P, s, b, h, row_base, c0, t, part, rows_in, fwd_block_bits(P, mrow, slot, part)); \
  float alpha[FWD_MT][2];                                                                        \
  fwd_softmax(s, pk, m, l, alpha);                                                               \
  fwd_rescale(o, alpha);
#endif
#endif  // FWD_TMA

// The output rows of one q tile (this thread's o, m, l; row_base as FWD_ROW) and their lse.
__device__ __forceinline__ void fwd_store(const FlexParams& P, const float (&o)[FWD_MT][HEAD_DIM / 8][4],
                                          const float (&m)[FWD_MT][2], const float (&l)[FWD_MT][2], i64 bh,
                                          i64 row_base, int t) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const i64 row = row_base + mt * 16 + 8 * r;
      if (row >= P.L) continue;
      const float inv = lr > 0.f ? 1.f / lr : 0.f;  // fully masked rows: 0 and lse -inf
      u16* og = (u16*)P.out + (bh * P.L + row) * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
        *(u32*)(og + n * 8 + 2 * t) = pack2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      if (t == 0) P.lse[bh * P.L + row] = lr > 0.f ? m[mt][r] + logf(lr) : NEG_INF;
    }
}

#if !FWD_PERSIST  // else flex_fwd is the persistent kernel of kernel_source_persist.cpp
extern "C" __global__ void __launch_bounds__(FWD_THREADS) flex_fwd(const __grid_constant__ FlexParams P) {
  PROF_DECL
  extern __shared__ __align__(16) u16 smem[];
#if FWD_WGMMA
  u16* Qs = wg_smem_base(smem);
  u16* Ks = Qs + FWD_TILE_M * HEAD_DIM;
  u16* Vs = Ks + FWD_TILE_N * HEAD_DIM;
  u16* Ks2 = Vs + FWD_TILE_N * HEAD_DIM;  // FWD_KBUF 2 / FWD_OVERLAP: the second K buffer
  u16* Vs2 = Ks2 + FWD_TILE_N * HEAD_DIM;  // FWD_OVERLAP: the second V buffer
#else
  u16* Qs = smem;
  u16* Ks = Qs + FWD_TILE_M * LD;
  u16* Vs = Ks + FWD_TILE_N * LD;
  u16* Ks2 = Vs + FWD_TILE_N * LD;
#endif
#if !FWD_OVERLAP
  u16* Kcur = Ks;  // K of the current tile (FWD_KBUF 2 alternates Ks and Ks2)
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // Heaviest (last) q tiles first: causal rows at the end list the most blocks.
  const i64 q_tiles = (P.L + FWD_TILE_M - 1) / FWD_TILE_M;
  const i64 tile = q_tiles - 1 - (i64)blockIdx.x % q_tiles, bh = (i64)blockIdx.x / q_tiles;
  const i64 b = bh / P.Hq, h = bh % P.Hq, hk = h / P.G, r0 = tile * FWD_TILE_M;
  const u16* kg = (const u16*)P.k + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (b * P.Hkv + hk) * P.S * HEAD_DIM;
#if FWD_TMA
  // Q and the first K on bars[0], then K on bars[0] and V on bars[1], each wait flipping its phase.
  // FWD_KBUF 2: two stages, K and V of stage x on bars[x] and bars[2 + x].
  __shared__ __align__(8) u64 bars[2 * FWD_KBUF];
  u32 kphase = 0, vphase = 0;
#elif FWD_WGMMA
  FWD_LOAD_TILE(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, FWD_TILE_M);  // lands with the first K tile
#else
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
  // Global row of this thread's row r (0: g, 1: g + 8) in m16 block mt.
  const i64 row_base = r0 + warp * 16 * FWD_MT + g;
#define FWD_ROW(mt, r) (row_base + (mt) * 16 + 8 * (r))

  const i64 mrow = P.all_full ? 0 : mask_row(P, b, h) * P.nQB + r0 / P.QB;
  TileWalk walk(BlockWalk(P, P.kv_num, P.kv_idx, P.kv_m, P.fkv_num, P.fkv_idx, P.fkv_m, mrow, P.nKVB), P.KB, P.S, FWD_TILE_N);
  i64 c0, c_next;
  bool partial, p_next;
  int slot0 = 0;  // the partial list's slot of c0's block (MASK_BITS)
  bool more = walk.next(c0, partial, &slot0);
#if FWD_TMA
  const i64 bhk = b * P.Hkv + hk;
#if FWD_KBUF == 2
  i64 c1 = 0;  // the tile after c0, already loading into the other stage
  bool p1 = false;
  int slot1 = 0;
  bool more1 = more && walk.next(c1, p1, &slot1);
#endif
  if (threadIdx.x == 0) {
    mbar_init_all(bars, 2 * FWD_KBUF);
    if (more) {
      tma_tile(Qs, P.qmap, &bars[0], r0, bh, FWD_TILE_M, false);  // Q's bytes join the first K's phase
      tma_tile(Ks, P.kmap, &bars[0], c0, bhk, FWD_TILE_N);
    }
#if FWD_KBUF == 2
    if (more) tma_tile(Vs, P.vmap, &bars[2], c0, bhk, FWD_TILE_N);
    if (more1) {
      tma_tile(Ks + 2 * FWD_TILE_N * HEAD_DIM, P.kmap, &bars[1], c1, bhk, FWD_TILE_N);
      tma_tile(Vs + 2 * FWD_TILE_N * HEAD_DIM, P.vmap, &bars[3], c1, bhk, FWD_TILE_N);
    }
#endif
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
#else
  if (more) FWD_LOAD_TILE(Ks, kg, c0, P.S, FWD_TILE_N);
  cp_async_commit();
#endif
  PROF_MARK(0);
#if FWD_OVERLAP
  // The softmax of tile j runs while the tensor cores do P V of tile j - 1: both products are
  // issued, S(j) waited for, the softmax done, then P V(j - 1) waited for and the output rescaled
  // (FlashAttention-3's intra-warpgroup overlap). K(j + 1) and V(j) load during iteration j into
  // the other of two buffers each; P(j - 1) stays in registers until its product is done.
#define KB_(i) (((i) & 1) ? Ks2 : Ks)  // selects, not an array: an indexed array lives in local memory
#define VB_(i) (((i) & 1) ? Vs2 : Vs)
  int j = 0;
  bool more_next = false;
  // Loads K(j + 1) and V(j), then waits for K(j) and V(j - 1).
  auto stage = [&]() {
    more_next = walk.next(c_next, p_next);
    __syncthreads();  // everyone is done with KB_(j + 1) (S of j - 1) and VB_(j) (P V of j - 2)
    if (more_next) FWD_LOAD_TILE(KB_(j + 1), kg, c_next, P.S, FWD_TILE_N);
    FWD_LOAD_TILE(VB_(j), vg, c0, P.S, FWD_TILE_N);
    cp_async_commit();
    cp_async_wait<1>();  // K(j) and V(j - 1) landed (this thread's part)
    SMEM_PROXY_FENCE();
    __syncthreads();
    PROF_MARK(1);
  };
  auto advance = [&]() {
    c0 = c_next;
    partial = p_next;
    more = more_next;
    ++j;
  };
  // P of the previous tile and of this one alternate between two register sets (the loop is
  // unrolled by two): a copy from one to the other would define wgmma operand registers inside
  // the stage, and ptxas then serializes every wgmma.
  u32 pk_a[FWD_MT][FWD_TILE_N / 8][2], pk_b[FWD_MT][FWD_TILE_N / 8][2];
  auto step = [&](u32 (&prev)[FWD_MT][FWD_TILE_N / 8][2], u32 (&cur)[FWD_MT][FWD_TILE_N / 8][2]) {
    stage();
    float s[FWD_MT][FWD_TILE_N / 8][4];
    reg_fence<HEAD_DIM / 8>(o[0]);
    wg_abt_issue<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, KB_(j));
    wg_pb_issue<FWD_TILE_N>(o[0], prev[0], VB_(j + 1));
    wg_wait<1>();  // S(j) done; P V(j - 1) may still run
    reg_fence<FWD_TILE_N / 8>(s[0]);
    PROF_MARK(2);
    fwd_tile_scores(P, s, b, h, row_base, c0, t, partial, rows_in);
    float alpha[FWD_MT][2];
    fwd_softmax(s, cur, m, l, alpha);
    PROF_MARK(3);
    wg_wait<0>();
    reg_fence<HEAD_DIM / 8>(o[0]);
    reg_fence_pk<FWD_TILE_N / 8>(prev[0]);  // P(j - 1) stays put until its product is done
    PROF_MARK(4);
    fwd_rescale(o, alpha);
    PROF_MARK(5);
    advance();
  };
  if (more) {  // the first tile: no P V to overlap yet
    stage();
    float s[FWD_MT][FWD_TILE_N / 8][4];
    float alpha[FWD_MT][2];
    wg_abt<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, KB_(j));
    PROF_MARK(2);
    fwd_tile_scores(P, s, b, h, row_base, c0, t, partial, rows_in);
    fwd_softmax(s, pk_a, m, l, alpha);
    PROF_MARK(3);
    advance();
  }
  bool last_in_a = true;
  while (more) {
    step(pk_a, pk_b);
    last_in_a = false;
    if (!more) break;
    step(pk_b, pk_a);
    last_in_a = true;
  }
  if (j > 0) {  // P V of the last tile
    cp_async_wait<0>();
    SMEM_PROXY_FENCE();
    __syncthreads();
    if (last_in_a) wg_pb<FWD_TILE_N>(o[0], pk_a[0], VB_(j + 1));
    else wg_pb<FWD_TILE_N>(o[0], pk_b[0], VB_(j + 1));
  }
#undef KB_
#undef VB_
#elif FWD_TMA && FWD_KBUF == 2
  // Two stages (K, V) at Ks / Vs and 2 tiles further on: tile c0 is in stage x while c1 loads into
  // the other; once every warp is done with stage x it takes the tile after c1. No load waits
  // behind a product of the same step. kphase bit x: stage x's parity (K and V flip together).
  int x = 0;
  while (more) {
    u16* Kx = Ks + x * 2 * FWD_TILE_N * HEAD_DIM;
    u16* Vx = Vs + x * 2 * FWD_TILE_N * HEAD_DIM;
    mbar_wait(&bars[x], (kphase >> x) & 1);  // K(c0) (and Q on the first tile) landed
    PROF_MARK(1);
    float s[FWD_MT][FWD_TILE_N / 8][4];
    u32 pk[FWD_MT][FWD_TILE_N / 8][2];
    FWD_TMA_SOFTMAX(Qs, Kx, partial, slot0)
    PROF_MARK(3);
    mbar_wait(&bars[2 + x], (kphase >> x) & 1);  // V(c0) landed
    kphase ^= 1u << x;
    PROF_MARK(4);
    wg_pb<FWD_TILE_N>(o[0], pk[0], Vx);
    PROF_MARK(5);
    i64 c2 = 0;
    bool p2 = false;
    int slot2 = 0;
    const bool more2 = more1 && walk.next(c2, p2, &slot2);
    __syncthreads();  // every warp is done with stage x
    if (more2 && threadIdx.x == 0) {
      tma_tile(Kx, P.kmap, &bars[x], c2, bhk, FWD_TILE_N);
      tma_tile(Vx, P.vmap, &bars[2 + x], c2, bhk, FWD_TILE_N);
    }
    c0 = c1, partial = p1, more = more1, slot0 = slot1;
    c1 = c2, p1 = p2, more1 = more2, slot1 = slot2;
    x ^= 1;
  }
#elif FWD_TMA
  // As the default loop below (one K and one V buffer), the loads by TMA from thread 0.
  while (more) {
    __syncthreads();  // everyone is done with Vs (previous PV)
    if (threadIdx.x == 0) tma_tile(Vs, P.vmap, &bars[1], c0, bhk, FWD_TILE_N);
    mbar_wait(&bars[0], kphase);  // Q (first tile) and K(c0) landed
    kphase ^= 1;
    PROF_MARK(1);
    float s[FWD_MT][FWD_TILE_N / 8][4];
    u32 pk[FWD_MT][FWD_TILE_N / 8][2];
    FWD_TMA_SOFTMAX(Qs, Ks, partial, slot0)
    PROF_MARK(3);
    __syncthreads();  // everyone is done with Ks
    more = walk.next(c_next, p_next, &slot0);  // slot0 is read again only for c_next
    if (more && threadIdx.x == 0) tma_tile(Ks, P.kmap, &bars[0], c_next, bhk, FWD_TILE_N);
    mbar_wait(&bars[1], vphase);  // V(c0) landed
    vphase ^= 1;
    PROF_MARK(4);
    wg_pb<FWD_TILE_N>(o[0], pk[0], Vs);
    PROF_MARK(5);
    c0 = c_next;
    partial = p_next;
  }
#else
  // Pipeline per tile: V(c0) loads during S = QK^T and the softmax, K(next) during PV (FWD_KBUF 1)
  // or, into the other K buffer, with V(c0) a whole step ahead (FWD_KBUF 2).
  while (more) {
    __syncthreads();  // everyone is done with Vs (previous PV)
    FWD_LOAD_TILE(Vs, vg, c0, P.S, FWD_TILE_N);
#if FWD_KBUF == 2
    u16* Knext = Kcur == Ks ? Ks2 : Ks;  // S(previous) read it: done (the barrier above)
    const bool more_next = walk.next(c_next, p_next);
    if (more_next) FWD_LOAD_TILE(Knext, kg, c_next, P.S, FWD_TILE_N);
#endif
    cp_async_commit();
    cp_async_wait<1>();  // K(c0) landed (this thread's part)
    SMEM_PROXY_FENCE();
    __syncthreads();
    PROF_MARK(1);
    {
      float s[FWD_MT][FWD_TILE_N / 8][4];
      u32 pk[FWD_MT][FWD_TILE_N / 8][2];  // P rounded to T for PV: half the registers of s
#if FWD_WGMMA
      wg_abt<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, Kcur);
#else
      tile_abt_mt(s, Qs, warp * 16 * FWD_MT, Kcur, lane);
#endif
      PROF_MARK(2);
      fwd_tile_scores(P, s, b, h, row_base, c0, t, partial, rows_in);
      float alpha[FWD_MT][2];
      fwd_softmax(s, pk, m, l, alpha);
      fwd_rescale(o, alpha);
      PROF_MARK(3);
#if FWD_KBUF == 2
      cp_async_wait<0>();  // V(c0) and K(next) landed
#else
      __syncthreads();  // everyone is done with Ks
      more = walk.next(c_next, p_next);
      if (more) FWD_LOAD_TILE(Ks, kg, c_next, P.S, FWD_TILE_N);
      cp_async_commit();
      cp_async_wait<1>();  // V(c0) landed
#endif
      SMEM_PROXY_FENCE();
      __syncthreads();
      PROF_MARK(4);
#if FWD_WGMMA
      wg_pb<FWD_TILE_N>(o[0], pk[0], Vs);
#else
      tile_pb_mt(o, pk, Vs, lane);
#endif
      PROF_MARK(5);
#if FWD_KBUF == 2
      Kcur = Knext;
      more = more_next;
#endif
      c0 = c_next;
      partial = p_next;
    }
  }
#endif  // FWD_OVERLAP
  fwd_store(P, o, m, l, bh, row_base, t);
#undef FWD_ROW
  PROF_MARK(6);
  PROF_FLUSH(0);
}
#endif  // !FWD_PERSIST

#endif  // KILN_BUILD_FWD

)kiln_src";
}

const std::string& kernel_template() {
  static const std::string source =
      std::string(kernel_prelude()) + wgmma_helpers_source() + kernel_forward() + kernel_forward_persist() +
      backward_kernels_source();
  return source;
}

}  // namespace kiln::flex::cuda
