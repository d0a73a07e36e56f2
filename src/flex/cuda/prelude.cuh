#pragma once
// The kernels' prelude: the generated defines' defaults, bf16 / fp16 conversions, mma.sync m16n8k16
// and ldmatrix helpers, tile loads by plain stores or cp.async (padded rows, or wgmma's swizzled
// layout), and the mma.sync score / output products of the backward's 64 x 64 tiles and the
// forward's tile. Everything the other parts use.

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
// panels of 128-byte rows, chunk c of row r stored at chunk c ^ (r % 8) (wgmma.cuh, core/cuda/hopper.cuh).
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

// The forward's products: a warp owns FWD_MT m16 row blocks, each B fragment read from shared memory
// feeding FWD_MT mmas. Per element the mma sequence is tile_abt / tile_pb's, so the bits are too. The
// forward's tile (FWD_TILE_M q rows, FWD_TILE_N kv columns a step) comes from KernelConfig; one m16
// block a warp (two with only 2 warps of 64 rows measured slower on the H200, 997af05: causal
// 4x16x8192x128 fwd 8.83 vs 7.84 ms).
#define FWD_MT 1
#define FWD_WARPS (FWD_TILE_M / (16 * FWD_MT))
#define FWD_THREADS (32 * FWD_WARPS)

__device__ __forceinline__ void tile_abt_mt(float (*acc)[FWD_TILE_N / 8][4], const u16* A, int ra, const u16* Bm,
                                            int lane) {
#pragma unroll
  for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
    for (int n = 0; n < FWD_TILE_N / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
#pragma unroll
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
