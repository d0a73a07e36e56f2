#pragma once
// A persistent, warp-specialised sm_90a GEMM whose epilogue is the caller's: Z = X W^T over a
// window [m, n] of X [*, K] and W [*, K] (16-bit, K contiguous, fp32 accumulation), never stored
// unless the epilogue stores it. 128 x 256 tiles; two consumer warpgroups of 64 rows (wgmma
// m64n256k16) and one producer thread issuing TMA loads into a ring of 48 KB stages; tiles walked
// in groups of 16 row tiles so each W tile serves them from L2. MC = 2: clusters of two CTAs on
// adjacent row tiles, each loading half of their shared W tile and multicasting it to both (32 KB a
// stage from L2 instead of 48).
// Two epilogue schedules (kStaged):
//   registers (4 stages): the consumers run `Epi::apply` on a finished tile's accumulators:
//     d[4 j + 2 h + e] is row `row + 8 h` and column `col + 8 j + e` of the window (h, e in {0, 1},
//     j < 32), rows and columns past the window included (masked by the epilogue). The tensor cores
//     idle meanwhile.
//   staged (3 stages): the consumers round the tile to bf16 into a 64 KB staging buffer and go on to
//     the next tile; warps 1-3 of the producer's warpgroup run `Epi::row` on it, a row at a time
//     (each lane 8 columns), beside the next tile's products.
// Header-only (lce_fused_gemm.cu instantiates it); everything Hopper-only sits under
// __CUDA_ARCH_FEAT_SM90_ALL, so the library's 80-virtual PTX holds an empty kernel.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lce/cuda/wgmma_m64n256k16.h"

namespace kiln::cuda::hopper {

constexpr int BM = 128, BN = 256, BK = 64, GROUP_M = 16;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int THREADS = 384;  // warpgroup 0: the producer (its first thread); 1 and 2: the consumers
constexpr int STAGING_BYTES = BM * BN * 2;  // the staged schedule's bf16 tile, 512-byte rows
constexpr int EPI_WARPS = 3;                // the staged schedule's epilogue: warps 1-3 of warpgroup 0
template <bool kStaged>
constexpr int ring_stages() {
  return kStaged ? 3 : 4;
}
// Dynamic shared memory: the ring, the staging tile, and slack to align the ring to 1024 bytes.
template <bool kStaged>
constexpr int smem_bytes() {
  return ring_stages<kStaged>() * STAGE_BYTES + (kStaged ? STAGING_BYTES : 0) + 1024;
}

// X [*, K] and W [*, K] (boxes {64, 128}, {64, 256}, {64, 128}: the 128-byte swizzle) and the window:
// rows x_row0.. of X, rows w_row0.. of W.
struct GemmMaps {
  CUtensorMap x, w, w_half;
  int m = 0, n = 0, k = 0;
  int x_row0 = 0, w_row0 = 0;
};

template <class Epi>
struct GemmArgs {
  GemmMaps g;
  Epi epi;
};

// The tile counts of a window and how many units (tiles, or pairs of row tiles at MC = 2) it has.
template <int MC>
struct Work {
  int tiles_m, tiles_n, kblocks, units;
  __host__ __device__ explicit Work(const GemmMaps& g)
      : tiles_m((g.m + BM - 1) / BM),
        tiles_n((g.n + BN - 1) / BN),
        kblocks((g.k + BK - 1) / BK),
        units((tiles_m + MC - 1) / MC * tiles_n) {}
#ifdef __CUDACC__
  __device__ int first() const { return blockIdx.x / MC; }
  __device__ int stride() const { return gridDim.x / MC; }
#endif
};

#if defined(__CUDACC__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// K-major operand, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrives on the barrier at `bar`'s offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// A box into the same shared-memory offset (completing on the same barrier offset) of every CTA in mask.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}

// Unit w of the grouped raster for CTA `rank` of its cluster (MC = 2: the cluster's two CTAs take
// row tiles 2 m2 and 2 m2 + 1 of one column tile).
template <int MC>
__device__ __forceinline__ void unit_coords(int w, int tiles_m, int tiles_n, uint32_t rank, int& tm, int& tn) {
  const int units_m = (tiles_m + MC - 1) / MC, gm = GROUP_M / MC;
  const int group = w / (gm * tiles_n), first = group * gm;
  const int rows = min(gm, units_m - first), local = w % (gm * tiles_n);
  tm = (first + local % rows) * MC + (int)rank;
  tn = local / rows;
}

template <int MC, int STAGES>
__device__ void produce(const GemmMaps& g, uint8_t* ring, uint64_t* full, uint64_t* empty, uint32_t rank) {
  const Work<MC> W(g);
  uint32_t it = 0;
  for (int w = W.first(); w < W.units; w += W.stride()) {
    int tm, tn;
    unit_coords<MC>(w, W.tiles_m, W.tiles_n, rank, tm, tn);
    for (int kb = 0; kb < W.kblocks; ++kb, ++it) {
      const int s = it % STAGES;
      mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);  // every consumer (of both CTAs, MC = 2) released it
      uint8_t* a = ring + s * STAGE_BYTES;
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])),
                   "r"(STAGE_BYTES)
                   : "memory");
      tma_load_2d(a, &g.x, &full[s], kb * BK, g.x_row0 + tm * BM);
      if constexpr (MC == 1) {
        tma_load_2d(a + A_BYTES, &g.w, &full[s], kb * BK, g.w_row0 + tn * BN);
      } else {  // this CTA's half of the W tile, into both CTAs
        tma_load_2d_multicast(a + A_BYTES + rank * (B_BYTES / 2), &g.w_half, &full[s], kb * BK,
                              g.w_row0 + tn * BN + (int)rank * (BN / 2), 0x3);
      }
    }
  }
}

template <bool kBf16>
__device__ __forceinline__ void mma_m64n256k16(float* d, uint64_t a, uint64_t b, int accumulate) {
  if constexpr (kBf16) wgmma_m64n256k16_bf16(d, a, b, accumulate);
  else wgmma_m64n256k16_f16(d, a, b, accumulate);
}

// The staged schedule's layout: row r's 16-byte chunk c (columns 8 c .. 8 c + 7) at chunk c ^ (r & 7),
// so the consumers' 4-byte stores (8 rows a warp) and the epilogue's row reads both spread over all banks.
__device__ __forceinline__ uint32_t staging_offset(int r, int chunk) { return r * 512 + ((chunk ^ (r & 7)) << 4); }

// Signals that are shared between the ring's consumers and the staged epilogue.
struct StagingBars {
  uint64_t full;   // the consumers' 256 threads stored a tile
  uint64_t empty;  // the epilogue's 96 threads read it
};

template <bool kBf16, bool kStaged, class Epi, int MC>
__device__ void consume(const GemmMaps& g, const Epi& epi, uint8_t* ring, uint64_t* full, uint64_t* empty,
                        uint8_t* staging, StagingBars* sb, uint32_t rank) {
  constexpr int STAGES = ring_stages<kStaged>();
  const Work<MC> W(g);
  const int lane = threadIdx.x & 31, warp_in_wg = (threadIdx.x / 32) & 3, cw = threadIdx.x / 128 - 1;
  auto release = [&](int s) {  // one thread of the warpgroup, once its products from stage s are done
    if ((threadIdx.x & 127) != 0) return;
    if constexpr (MC == 1) {
      mbar_arrive(&empty[s]);
    } else {
      mbar_arrive_cluster(&empty[s], 0);
      mbar_arrive_cluster(&empty[s], 1);
    }
  };
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;  // overwritten by each tile's first product (accumulate 0)
  uint32_t it = 0, tile = 0;
  for (int w = W.first(); w < W.units; w += W.stride(), ++tile) {
    int tm, tn;
    unit_coords<MC>(w, W.tiles_m, W.tiles_n, rank, tm, tn);
    for (int kb = 0; kb < W.kblocks; ++kb, ++it) {
      const int s = it % STAGES;
      mbar_wait(&full[s], (it / STAGES) & 1);
      const uint32_t a = smem_u32(ring + s * STAGE_BYTES) + cw * 64 * 128;
      const uint32_t b = smem_u32(ring + s * STAGE_BYTES + A_BYTES);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)  // 16 columns = 32 bytes into the swizzled 128-byte rows
        mma_m64n256k16<kBf16>(d, sw128_desc(a + kk * 32), sw128_desc(b + kk * 32), kb > 0 || kk > 0);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if (kb > 0) {  // the previous stage's products are done: release it
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        release((it - 1) % STAGES);
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    release((it - 1) % STAGES);
    if constexpr (kStaged) {
      mbar_wait(&sb->empty, (tile & 1) ^ 1);  // the epilogue has read the previous tile
      // The base taken afresh each tile: hoisted out of the unit loop, the 64 store addresses took
      // 64 registers beside the accumulators (spills).
      uint32_t base;
      asm volatile("mov.u32 %0, %1;" : "=r"(base) : "r"(smem_u32(staging)));
      const int g8 = lane >> 2, q = lane & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = cw * 64 + warp_in_wg * 16 + g8 + 8 * h;
        const uint32_t row = base + r * 512 + 4 * q;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
          const uint32_t addr = row + (((j ^ (r & 7)) << 4));  // staging_offset(r, j) + 4 q
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&v)) : "memory");
        }
      }
      mbar_arrive(&sb->full);  // release semantics: this thread's stores land first
    } else {
      epi.apply(d, tm * BM + cw * 64 + warp_in_wg * 16 + (lane >> 2), tn * BN + 2 * (lane & 3), tn);
    }
  }
}

// Copies of the 4-byte words of a trivially copyable P from lane `src`.
template <class P>
__device__ __forceinline__ P shfl_struct(const P& p, int src) {
  static_assert(sizeof(P) % 4 == 0, "row parameters are shuffled in 4-byte words");
  P out;
  const uint32_t* in = reinterpret_cast<const uint32_t*>(&p);
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(P) / 4); ++i) o[i] = __shfl_sync(0xffffffffu, in[i], src);
  return out;
}

// The staged schedule's epilogue warp e (0..2): rows e, e + 3, ... of each staged tile, in batches
// of 32 whose per-row parameters (Epi::row_params, loaded by one lane each) are then broadcast.
// Every lane of the warp calls Epi::row for every row (warp-wide reductions inside).
template <class Epi, int MC>
__device__ void epilogue_warps(const GemmMaps& g, const Epi& epi, const uint8_t* staging, StagingBars* sb,
                               uint32_t rank, int e) {
  const Work<MC> W(g);
  const int lane = threadIdx.x & 31;
  constexpr int ROWS = (BM + EPI_WARPS - 1) / EPI_WARPS;  // 43: the first warp's share
  uint32_t tile = 0;
  for (int w = W.first(); w < W.units; w += W.stride(), ++tile) {
    int tm, tn;
    unit_coords<MC>(w, W.tiles_m, W.tiles_n, rank, tm, tn);
    mbar_wait(&sb->full, tile & 1);
    for (int b0 = 0; b0 < ROWS; b0 += 32) {
      const int mine = e + EPI_WARPS * (b0 + lane);  // the tile row whose parameters this lane loads
      const auto params = epi.row_params(tm * BM + (mine < BM ? mine : 0));
      for (int k = 0; k < 32 && b0 + k < ROWS; ++k) {
        const int r = e + EPI_WARPS * (b0 + k);
        if (r >= BM) break;
        const auto p = shfl_struct(params, k);
        uint4 raw;  // ld.shared (a generic load of a shared address takes the slower generic path)
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                     : "r"(smem_u32(staging) + staging_offset(r, lane))
                     : "memory");
        const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
        float v[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(pair[i]);
          v[2 * i] = f.x;
          v[2 * i + 1] = f.y;
        }
        epi.row(v, tm * BM + r, tn * BN + 8 * lane, tn, p);
      }
    }
    mbar_arrive(&sb->empty);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#ifdef __CUDACC__
// One launch over the window: grid = min(units, SMs / MC) * MC CTAs of THREADS threads,
// smem_bytes<kStaged>() of dynamic shared memory, cluster dimension MC. Without sm_90a code the
// kernel does nothing: hosts check for it first (lce_fused_gemm.cu's probe).
template <bool kBf16, bool kStaged, class Epi, int MC>
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(const __grid_constant__ GemmArgs<Epi> args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int STAGES = ring_stages<kStaged>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = (uint8_t*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint8_t* staging = ring + STAGES * STAGE_BYTES;
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
  __shared__ StagingBars sb;
  const uint32_t rank = MC > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * MC);  // one arrival from each consumer warpgroup of each CTA
    }
    mbar_init(&sb.full, 256);
    mbar_init(&sb.empty, EPI_WARPS * 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (MC > 1) cluster_sync();  // the peer's barriers exist before anything is multicast into it
  else __syncthreads();
  if (threadIdx.x / 128 == 0) {  // warpgroup 0: the producer (its first thread), the staged epilogue (warps 1-3)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
    if (threadIdx.x == 0) produce<MC, STAGES>(args.g, ring, full, empty, rank);
    if constexpr (kStaged)
      if (threadIdx.x >= 32) epilogue_warps<Epi, MC>(args.g, args.epi, staging, &sb, rank, threadIdx.x / 32 - 1);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");
    consume<kBf16, kStaged, Epi, MC>(args.g, args.epi, ring, full, empty, staging, &sb, rank);
  }
  __syncwarp();                          // the producer warp whole again for the aligned barrier
  if constexpr (MC > 1) cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
#endif
}
#endif  // __CUDACC__

}  // namespace kiln::cuda::hopper
