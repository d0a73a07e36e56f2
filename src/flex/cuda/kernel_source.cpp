// The FlexAttention CUDA kernels as source text, compiled at run time by NVRTC after the
// generated mod functions (codegen.cpp). Self-contained: no CUDA headers; bf16/fp16 travel as
// 16-bit patterns, tensor cores via inline PTX mma.sync m16n8k16 (sm_80+).
//
// Tiles: a CTA is 4 warps; each warp owns 16 rows of a 64 x 64 score tile and accumulates in
// fp32 registers (mma C fragments). Q/K/V/dO tiles sit in shared memory with rows padded by 16
// bytes (conflict-free ldmatrix: the 8 rows of a phase hit distinct banks). K/V (Q/dO in dK/dV)
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
  void *dq, *dk, *dv;
  const int *kv_num, *kv_idx, *fkv_num, *fkv_idx;
  const int *q_num, *q_idx, *fq_num, *fq_idx;
  int* err;
  double* slots;
  double* capgrad;
  i64 B, Hq, Hkv, L, S, G;
  i64 QB, KB, nQB, nKVB, mB, mH, kv_m, fkv_m, q_m, fq_m, all_full;
  i64 q_tiles, kv_tiles, units, nslots, grad_numel;
  double scale;
  const void* sptr[KILN_MAX_BUFFERS];
  i64 ssize[KILN_MAX_BUFFERS][3], sstride[KILN_MAX_BUFFERS][3], sgoff[KILN_MAX_BUFFERS];
  const void* mptr[KILN_MAX_BUFFERS];
  i64 msize[KILN_MAX_BUFFERS][3], mstride[KILN_MAX_BUFFERS][3];
};
static_assert(sizeof(FlexParams) == KILN_PARAMS_SIZE, "host and device FlexParams differ");

__device__ __forceinline__ i64 kiln_floordiv(i64 x, i64 y) {
  if (y == 0) return 0;
  i64 q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return q;
}
__device__ __forceinline__ i64 kiln_floormod(i64 x, i64 y) { return y == 0 ? 0 : x - kiln_floordiv(x, y) * y; }

)kiln_src";
}

const char* kernel_template() {
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
#define LOG2E 1.4426950408889634f

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

// load_tile by cp.async (16 bytes a thread, L2 only; rows past `total` zero-filled by a source
// size of 0). The caller commits the group and waits for it before a __syncthreads.
__device__ __forceinline__ void load_tile_async(u16* dst, const u16* src, i64 row0, i64 total, int rows,
                                                int nthreads = NTHREADS) {
  const int chunks = HEAD_DIM / 8;
  for (int c = threadIdx.x; c < rows * chunks; c += nthreads) {
    const int r = c / chunks, col = (c % chunks) * 8;
    const bool in = row0 + r < total;
    const u16* g = in ? src + (row0 + r) * HEAD_DIM + col : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst + r * LD + col)), "l"(g),
                 "r"(in ? 16 : 0)
                 : "memory");
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

#if FWD_WGMMA || BWD_WGMMA
// wgmma (sm_90a). Tiles in shared memory are 64-column panels of 128-byte rows whose 16-byte
// chunk c of row r sits at chunk c ^ (r % 8): the 128-byte swizzle wgmma reads without bank
// conflicts. Each panel starts on a 1024-byte boundary (the swizzle's period). As the first
// operand a tile is K-major (rows along the reduction); as the second of P V-like products it is
// read N-major (transposed). A warpgroup (4 warps) owns 64 rows, warp w rows 16 (w % 4)...,
// and its accumulators have the mma.sync m16n8 C-fragment layout per 8 columns.
#define WG_SMEM_ALIGN 1024
__device__ __forceinline__ u32 sw_offset(int r, int col8, int rows) {
  return (u32)((col8 >> 3) * rows * 128 + r * 128 + (((col8 & 7) ^ (r & 7)) << 4));
}
// load_tile_async into the swizzled panel layout (rows past `total` zero-filled).
__device__ __forceinline__ void load_tile_sw_async(u16* dst, const u16* src, i64 row0, i64 total, int rows,
                                                   int nthreads) {
  const int chunks = HEAD_DIM / 8;
  const u32 base = smem_addr(dst);
  for (int c = threadIdx.x; c < rows * chunks; c += nthreads) {
    const int r = c / chunks, col8 = c % chunks;
    const bool in = row0 + r < total;
    const u16* g = in ? src + (row0 + r) * HEAD_DIM + col8 * 8 : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(base + sw_offset(r, col8, rows)), "l"(g),
                 "r"(in ? 16 : 0)
                 : "memory");
  }
}
// The first WG_SMEM_ALIGN-aligned element of the dynamic shared memory (the host adds the slack).
__device__ __forceinline__ u16* wg_smem_base(u16* smem) {
  return smem + ((WG_SMEM_ALIGN - (smem_addr(smem) & (WG_SMEM_ALIGN - 1))) & (WG_SMEM_ALIGN - 1)) / 2;
}
// Shared-memory matrix descriptor: start address, leading / stride byte offsets (8-row groups are
// 1024 bytes apart in every tile here), 128-byte swizzle.
__device__ __forceinline__ u64 sw_desc(u32 addr, u32 leading_bytes) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(leading_bytes >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void reg_fence(float (*d)[4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
template <int N>
__device__ __forceinline__ void wgmma_ss(float (*d)[4], u64 a, u64 b, int accumulate) {
  if constexpr (N == 64) wgmma_ss_n64(d, a, b, accumulate);
  else wgmma_ss_n128(d, a, b, accumulate);
}

// d[64 x NB] = A B^T over HEAD_DIM: A is the warpgroup's 64 rows of a swizzled tile of a_rows rows
// (a_row0 its first), B a swizzled tile of NB rows.
template <int NB>
__device__ __forceinline__ void wg_abt(float (*d)[4], const u16* A, int a_rows, int a_row0, const u16* Bm) {
  const u32 aa = smem_addr(A) + a_row0 * 128, ba = smem_addr(Bm);
  reg_fence<NB / 8>(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    const u32 col = (kk & 3) * 32;  // bytes into the 128-byte rows of panel kk / 4
    wgmma_ss<NB>(d, sw_desc(aa + (kk >> 2) * a_rows * 128 + col, 16), sw_desc(ba + (kk >> 2) * NB * 128 + col, 16),
                 kk > 0);
  }
  wg_commit();
  wg_wait_all();
  reg_fence<NB / 8>(d);
}

// d[64 x HEAD_DIM] += P B where P [64 x KB] is in registers (pk[n][r]: rows g / g + 8 of column
// block n, rounded to T) and B a swizzled tile of KB rows (its panels KB * 128 bytes apart).
template <int KB>
__device__ __forceinline__ void wg_pb(float (*d)[4], const u32 (*pk)[2], const u16* Bm) {
  const u32 ba = smem_addr(Bm);
  reg_fence<HEAD_DIM / 8>(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) {
    const u32 a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
    wgmma_rs(d, a, sw_desc(ba + kk * 16 * 128, KB * 128));
  }
  wg_commit();
  wg_wait_all();
  reg_fence<HEAD_DIM / 8>(d);
}

// pk = p rounded to T, in wg_pb's A layout.
template <int NB>
__device__ __forceinline__ void pack_rows(u32 (*pk)[2], const float (*p)[4]) {
#pragma unroll
  for (int n = 0; n < NB / 8; ++n) {
    pk[n][0] = pack2(p[n][0], p[n][1]);
    pk[n][1] = pack2(p[n][2], p[n][3]);
  }
}
#define SMEM_PROXY_FENCE() fence_async_smem()
#else
#define SMEM_PROXY_FENCE()
#endif

#if FWD_WGMMA
#define FWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_sw_async(dst, src, row0, total, rows, FWD_THREADS)
#else
#define FWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_async(dst, src, row0, total, rows, FWD_THREADS)
#endif

__device__ __forceinline__ i64 mask_row(const FlexParams& P, i64 b, i64 h) {
  return (P.mB == 1 ? 0 : b) * P.mH + (P.mH == 1 ? 0 : h);
}

// Merged ascending walk of a partial list and a full list (or every block when all_full).
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
    if (all) {
      if (next >= count) return false;
      j = (int)next++;
      partial = false;
      return true;
    }
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

// The step_n-wide tiles of a BlockWalk's blocks, in order (blocks of `blk` rows, clipped to `total`).
struct TileWalk {
  BlockWalk w;
  i64 c, cend, blk, total, step_n;
  bool part;
  __device__ __forceinline__ TileWalk(const BlockWalk& walk, i64 block, i64 n, i64 step = TILE_N)
      : w(walk), c(0), cend(0), blk(block), total(n), step_n(step), part(false) {}
  __device__ __forceinline__ bool next(i64& c0, bool& partial) {
    while (c >= cend) {
      int j;
      if (!w.step(j, part)) return false;
      c = (i64)j * blk;
      cend = c + blk < total ? c + blk : total;
    }
    c0 = c;
    partial = part;
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

// The modified score of one element and whether it is kept (in bounds, and mask true on partial blocks).
__device__ __forceinline__ float mod_score(const FlexParams& P, float raw, i64 b, i64 h, i64 q, i64 kv, bool partial,
                                           bool* keep) {
  if (q >= P.L || kv >= P.S) {
    *keep = false;
    return NEG_INF;
  }
  float x = raw * (float)P.scale;
#if HAS_SCORE
  x = score_mod(x, b, h, q, kv, P);
#endif
  bool k = true;
#if HAS_MASK
  if (partial) k = mask_mod(b, h, q, kv, P);
#endif
  *keep = k;
  return k ? x : NEG_INF;
}

#if KILN_BUILD_FWD
extern "C" __global__ void __launch_bounds__(FWD_THREADS) flex_fwd(const FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
#if FWD_WGMMA
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
  const u16* kg = (const u16*)P.k + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (b * P.Hkv + hk) * P.S * HEAD_DIM;
#if FWD_WGMMA
  FWD_LOAD_TILE(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, FWD_TILE_M);  // lands with the first K tile
#else
  load_tile(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, FWD_TILE_M, FWD_THREADS);
#endif
  const float scale = (float)P.scale;
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
  bool more = walk.next(c0, partial);
  if (more) FWD_LOAD_TILE(Ks, kg, c0, P.S, FWD_TILE_N);
  cp_async_commit();
  // Pipeline per tile: V(c0) loads during S = QK^T and the softmax, K(next) during PV.
  while (more) {
    __syncthreads();  // everyone is done with Vs (previous PV)
    FWD_LOAD_TILE(Vs, vg, c0, P.S, FWD_TILE_N);
    cp_async_commit();
    cp_async_wait<1>();  // K(c0) landed (this thread's part)
    SMEM_PROXY_FENCE();
    __syncthreads();
    {
      float s[FWD_MT][FWD_TILE_N / 8][4];
      u32 pk[FWD_MT][FWD_TILE_N / 8][2];  // P rounded to T for PV: half the registers of s
#if FWD_WGMMA
      wg_abt<FWD_TILE_N>(s[0], Qs, FWD_TILE_M, (warp >> 2) * 64, Ks);
#else
      tile_abt_mt(s, Qs, warp * 16 * FWD_MT, Ks, lane);
#endif
      // Interior tiles of full blocks need neither the bounds test nor the mask: the same
      // arithmetic as mod_score on the kept elements, so the same bits.
      const bool interior = !partial && rows_in && c0 + FWD_TILE_N <= P.S;
#pragma unroll
      for (int mt = 0; mt < FWD_MT; ++mt) {
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x;
            if (interior) {
              x = s[mt][n][e] * scale;
#if HAS_SCORE
              x = score_mod(x, b, h, FWD_ROW(mt, e >> 1), c0 + n * 8 + 2 * t + (e & 1), P);
#endif
            } else {
              bool keep;
              x = mod_score(P, s[mt][n][e], b, h, FWD_ROW(mt, e >> 1), c0 + n * 8 + 2 * t + (e & 1), partial, &keep);
            }
            s[mt][n][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float m_new = fmaxf(m[mt][r], mx[r]);
          const float m_use = m_new == NEG_INF ? 0.f : m_new;  // nothing attended yet: p = 0 below
          const float alpha = m[mt][r] == NEG_INF ? 0.f : exp2f((m[mt][r] - m_new) * LOG2E);
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < FWD_TILE_N / 8; ++n)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              s[mt][n][e] = exp2f((s[mt][n][e] - m_use) * LOG2E);
              sum += s[mt][n][e];
            }
#pragma unroll
          for (int n = 0; n < FWD_TILE_N / 8; ++n) pk[mt][n][r] = pack2(s[mt][n][2 * r], s[mt][n][2 * r + 1]);
          l[mt][r] = l[mt][r] * alpha + sum;  // per-thread partial sum; the 4 threads of a row add up at the end
          m[mt][r] = m_new;
#pragma unroll
          for (int n = 0; n < HEAD_DIM / 8; ++n) {
            o[mt][n][2 * r] *= alpha;
            o[mt][n][2 * r + 1] *= alpha;
          }
        }
      }
      __syncthreads();  // everyone is done with Ks
      more = walk.next(c_next, p_next);
      if (more) FWD_LOAD_TILE(Ks, kg, c_next, P.S, FWD_TILE_N);
      cp_async_commit();
      cp_async_wait<1>();  // V(c0) landed
      SMEM_PROXY_FENCE();
      __syncthreads();
#if FWD_WGMMA
      wg_pb<FWD_TILE_N>(o[0], pk[0], Vs);
#else
      tile_pb_mt(o, pk, Vs, lane);
#endif
      c0 = c_next;
      partial = p_next;
    }
  }
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const i64 row = FWD_ROW(mt, r);
      if (row >= P.L) continue;
      const float inv = lr > 0.f ? 1.f / lr : 0.f;  // fully masked rows: 0 and lse -inf
      u16* og = (u16*)P.out + (bh * P.L + row) * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
        *(u32*)(og + n * 8 + 2 * t) = pack2(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
      if (t == 0) P.lse[bh * P.L + row] = lr > 0.f ? m[mt][r] + logf(lr) : NEG_INF;
    }
#undef FWD_ROW
}

#endif  // KILN_BUILD_FWD

#if KILN_BUILD_BWD
// The backward's tile loads and products: wgmma on sm_90a (swizzled tiles), else mma.sync (padded
// tiles). ABT: acc[64 x 64] = the CTA's 64 rows of A times B^T; PB: acc[64 x HEAD_DIM] += p B.
#if BWD_WGMMA
#if TILE_M != 64
#error "the wgmma backward's tiles are one warpgroup's 64 rows"
#endif
#define BWD_TILE_ELEMS(rows) ((rows) * HEAD_DIM)
#define BWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_sw_async(dst, src, row0, total, rows, NTHREADS)
#define BWD_ABT(acc, A, Bm, ldsm) wg_abt<64>(acc, A, 64, 0, Bm)
#define BWD_PB(acc, p, Bm, ldsm)   \
  {                                \
    u32 pk_[64 / 8][2];            \
    pack_rows<64>(pk_, p);         \
    wg_pb<64>(acc, pk_, Bm);       \
  }
#else
#define BWD_TILE_ELEMS(rows) ((rows) * LD)
#define BWD_LOAD_TILE(dst, src, row0, total, rows) load_tile_async(dst, src, row0, total, rows)
#define BWD_ABT(acc, A, Bm, ldsm) tile_abt<ldsm>(acc, A, warp * 16, Bm, lane)
#define BWD_PB(acc, p, Bm, ldsm) tile_pb<ldsm>(acc, p, Bm, lane)
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_pre(const FlexParams P) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * NWARPS + warp;
  if (row >= P.B * P.Hq * P.L) return;
  const u16* dout = (const u16*)P.dout + row * HEAD_DIM;
  const u16* out = (const u16*)P.out + row * HEAD_DIM;
  float s = 0.f;
  for (int e = lane; e < HEAD_DIM; e += 32) s += to_f(dout[e]) * to_f(out[e]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) P.delta[row] = s - (P.dlse ? P.dlse[row] : 0.f);
}

// P and dS of one element from its raw score q.k and dP = dO.v (both before scaling). kInterior:
// an element of a full block inside both lengths, which needs neither the bounds test nor the mask
// (the same arithmetic as mod_score on kept elements, so the same bits).
template <bool kInterior>
__device__ __forceinline__ void p_ds(const FlexParams& P, float raw, float dp, i64 b, i64 h, i64 q, i64 kv,
                                     bool partial, float lse, float delta, float* p_out, float* ds_post_out,
                                     float* ds_out) {
  bool keep = true;
  float y;
  if (kInterior) {
    y = raw * (float)P.scale;
#if HAS_SCORE
    y = score_mod(y, b, h, q, kv, P);
#endif
  } else {
    y = mod_score(P, raw, b, h, q, kv, partial, &keep);
  }
  const float p = (!keep || lse == NEG_INF) ? 0.f : exp2f((y - lse) * LOG2E);
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
                                           const i64* rows, i64 c0, int t, bool partial, const float* lse,
                                           const float* delta) {
#pragma unroll
  for (int n = 0; n < TILE_N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p, ds_post, ds;
      p_ds<kInterior>(P, s[n][e], dp[n][e], b, h, rows[e >> 1], c0 + n * 8 + 2 * t + (e & 1), partial, lse[e >> 1],
                      delta[e >> 1], &p, &ds_post, &ds);
      s[n][e] = ds;
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dq(const FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
#if BWD_WGMMA
  u16* Qs = wg_smem_base(smem);
#else
  u16* Qs = smem;
#endif
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M);
  u16* Ks = dOs + BWD_TILE_ELEMS(TILE_M);
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const i64 tile = P.q_tiles - 1 - (i64)blockIdx.x % P.q_tiles, bh = (i64)blockIdx.x / P.q_tiles;
  const i64 b = bh / P.Hq, h = bh % P.Hq, hk = h / P.G, r0 = tile * TILE_M;
  const u16* kg = (const u16*)P.k + (b * P.Hkv + hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (b * P.Hkv + hk) * P.S * HEAD_DIM;
#if BWD_WGMMA
  // Q and dO land with V(c0)'s group below.
  BWD_LOAD_TILE(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);
  BWD_LOAD_TILE(dOs, (const u16*)P.dout + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);
#else
  load_tile(Qs, (const u16*)P.q + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);
  load_tile(dOs, (const u16*)P.dout + bh * P.L * HEAD_DIM, r0, P.L, TILE_M);
#endif
  const i64 rows[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
  const bool rows_in = r0 + TILE_M <= P.L;
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse[r] = rows[r] < P.L ? P.lse[bh * P.L + rows[r]] : NEG_INF;
    delta[r] = rows[r] < P.L ? P.delta[bh * P.L + rows[r]] : 0.f;
  }
  float dq[HEAD_DIM / 8][4];
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  const i64 mrow = P.all_full ? 0 : mask_row(P, b, h) * P.nQB + r0 / P.QB;
  TileWalk walk(BlockWalk(P, P.kv_num, P.kv_idx, P.kv_m, P.fkv_num, P.fkv_idx, P.fkv_m, mrow, P.nKVB), P.KB, P.S);
  i64 c0, c_next;
  bool partial, p_next;
  bool more = walk.next(c0, partial);
  if (more) BWD_LOAD_TILE(Vs, vg, c0, P.S, TILE_N);
  cp_async_commit();
  if (more) BWD_LOAD_TILE(Ks, kg, c0, P.S, TILE_N);
  cp_async_commit();
  // Pipeline per tile (groups in flight at the top: V(c0), K(c0)): dP = dO V^T first, then V(next)
  // loads during S = QK^T, dS and dQ += dS K, and K(next) during the next tile's dP.
  while (more) {
    float s[TILE_N / 8][4], dp[TILE_N / 8][4];
    cp_async_wait<1>();  // V(c0) landed
    SMEM_PROXY_FENCE();
    __syncthreads();
    BWD_ABT(dp, dOs, Vs, LDSM_B_Q);
    cp_async_wait<0>();  // K(c0) landed
    SMEM_PROXY_FENCE();
    __syncthreads();     // and everyone is done with Vs
    more = walk.next(c_next, p_next);
    if (more) BWD_LOAD_TILE(Vs, vg, c_next, P.S, TILE_N);
    cp_async_commit();
    BWD_ABT(s, Qs, Ks, LDSM_B_Q);
    if (!partial && rows_in && c0 + TILE_N <= P.S) dq_tile_ds<true>(P, s, dp, b, h, rows, c0, t, partial, lse, delta);
    else dq_tile_ds<false>(P, s, dp, b, h, rows, c0, t, partial, lse, delta);
    BWD_PB(dq, s, Ks, LDSM_B_Q);  // dQ += dS K
    __syncthreads();              // everyone is done with Ks
    if (more) BWD_LOAD_TILE(Ks, kg, c_next, P.S, TILE_N);
    cp_async_commit();
    c0 = c_next;
    partial = p_next;
  }
  cp_async_wait<0>();  // nothing in flight when the CTA ends (Q and dO with an empty list)
  const float sc = (float)P.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= P.L) continue;
    u16* dg = (u16*)P.dq + (bh * P.L + rows[r]) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) *(u32*)(dg + n * 8 + 2 * t) = pack2(dq[n][2 * r] * sc, dq[n][2 * r + 1] * sc);
  }
}

// dK/dV's transposed tile (rows kv = cols[r], columns q = r0..): s (raw scores) becomes P and dp
// becomes dS; with captured-tensor gradients raw keeps the raw scores and dpost d loss / d score.
template <bool kInterior>
__device__ __forceinline__ void dkdv_tile_p_ds(const FlexParams& P, float (*s)[4], float (*dp)[4], float (*raw)[4],
                                               float (*dpost)[4], i64 b, i64 h, i64 r0, const i64* cols, int t,
                                               bool partial, const float* lse_s, const float* delta_s) {
#pragma unroll
  for (int n = 0; n < TILE_M / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qc = n * 8 + 2 * t + (e & 1);
      float p, ds_post, ds;
      p_ds<kInterior>(P, s[n][e], dp[n][e], b, h, r0 + qc, cols[e >> 1], partial, lse_s[qc], delta_s[qc], &p,
                      &ds_post, &ds);
#if HAS_CAP_GRAD
      raw[n][e] = s[n][e];
      dpost[n][e] = ds_post;
#endif
      s[n][e] = p;
      dp[n][e] = ds;
    }
}

// lse and delta of q rows r0.. of (b, h) into smem (plain stores: visible after the next __syncthreads).
__device__ __forceinline__ void load_rows(float* lse_s, float* delta_s, const FlexParams& P, i64 bh, i64 r0) {
  for (int r = threadIdx.x; r < TILE_M; r += NTHREADS) {
    lse_s[r] = r0 + r < P.L ? P.lse[bh * P.L + r0 + r] : NEG_INF;
    delta_s[r] = r0 + r < P.L ? P.delta[bh * P.L + r0 + r] : 0.f;
  }
}

extern "C" __global__ void __launch_bounds__(NTHREADS) flex_bwd_dkdv(const FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
#if BWD_WGMMA
  u16* Ks = wg_smem_base(smem);
#else
  u16* Ks = smem;
#endif
  u16* Vs = Ks + BWD_TILE_ELEMS(TILE_N);
  u16* Qs = Vs + BWD_TILE_ELEMS(TILE_N);
  u16* dOs = Qs + BWD_TILE_ELEMS(TILE_M);
  float* lse_s = (float*)(dOs + BWD_TILE_ELEMS(TILE_M));
  float* delta_s = lse_s + TILE_M;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // Units [u_begin, u_end) in order: one unit per CTA, or a fixed slot of units with captured grads.
  const i64 u_begin = (i64)blockIdx.x * P.units / gridDim.x, u_end = ((i64)blockIdx.x + 1) * P.units / gridDim.x;
#if HAS_CAP_GRAD
  double* slot = P.slots + ((i64)blockIdx.x * NWARPS + warp) * P.grad_numel;
#endif
  for (i64 u = u_begin; u < u_end; ++u) {
    const i64 tile = u % P.kv_tiles, bhk = u / P.kv_tiles, b = bhk / P.Hkv, hk = bhk % P.Hkv;
    const i64 c0 = tile * TILE_N, jblk = c0 / P.KB;
    __syncthreads();
#if BWD_WGMMA
    // K and V land with Q(r0)'s group below.
    BWD_LOAD_TILE(Ks, (const u16*)P.k + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);
    BWD_LOAD_TILE(Vs, (const u16*)P.v + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);
#else
    load_tile(Ks, (const u16*)P.k + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);
    load_tile(Vs, (const u16*)P.v + bhk * P.S * HEAD_DIM, c0, P.S, TILE_N);
#endif
    const i64 cols[2] = {c0 + warp * 16 + g, c0 + warp * 16 + g + 8};  // this thread's kv rows
    const bool kv_in = c0 + TILE_N <= P.S;
    float dk[HEAD_DIM / 8][4], dv[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
      dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
      dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    }
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
      load_rows(lse_s, delta_s, P, bh0, r0);
    }
    cp_async_commit();
    while (more) {
      const i64 h = hk * P.G + gi;
      cp_async_wait<1>();  // Q(r0) landed
      SMEM_PROXY_FENCE();
      __syncthreads();     // (and K/V, lse, delta stores)
      // Transposed tiles: rows are kv (this warp's 16), columns are q.
      float s[TILE_M / 8][4], dp[TILE_M / 8][4];
      BWD_ABT(s, Ks, Qs, LDSM_B_KV);
      cp_async_wait<0>();  // dO(r0) landed
      SMEM_PROXY_FENCE();
      __syncthreads();
      BWD_ABT(dp, Vs, dOs, LDSM_B_KV);
      float raw[HAS_CAP_GRAD ? TILE_M / 8 : 1][4], dpost[HAS_CAP_GRAD ? TILE_M / 8 : 1][4];
      if (!partial && r0 + TILE_M <= P.L && kv_in)
        dkdv_tile_p_ds<true>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse_s, delta_s);
      else
        dkdv_tile_p_ds<false>(P, s, dp, raw, dpost, b, h, r0, cols, t, partial, lse_s, delta_s);
#if HAS_CAP_GRAD
      // Captured-tensor gradients: the lanes take turns adding into the warp's slot (a fixed
      // order, no atomics); each lane walks its elements in a fixed order.
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
#endif
      BWD_PB(dk, dp, Qs, LDSM_B_KV);  // dK += dS^T Q
      __syncthreads();                        // everyone is done with Qs, lse_s, delta_s
      more = walk.next(gi_n, r0_n, p_n);
      const i64 bh_n = more ? b * P.Hq + hk * P.G + gi_n : 0;
      if (more) {
        BWD_LOAD_TILE(Qs, (const u16*)P.q + bh_n * P.L * HEAD_DIM, r0_n, P.L, TILE_M);
        load_rows(lse_s, delta_s, P, bh_n, r0_n);
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
