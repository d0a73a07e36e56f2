#pragma once
// Hopper (sm_90a) building blocks as inline PTX, for kernels that nvcc compiles and for sources
// that NVRTC compiles at run time (this file is embedded into the library: cmake/KilnEmbed.cmake).
// Shared-memory addresses; the async-proxy fences; mbarriers; TMA bulk copies (tensor tiles through a
// CUtensorMap passed as kernel argument bytes, plain byte ranges) and their bulk groups; wgmma's
// fences, shared-memory matrix descriptors and the m64nNk16 products with fp32 accumulators.
// Self-contained: no includes (NVRTC has no CUDA headers), plain types only. Callers compile for
// sm_90a. Accumulators are `float (*d)[4]`: d[n] is the mma.sync m16n8 C fragment of columns 8n..8n+7
// of the warp's 16 rows (warp w % 4 of a warpgroup owns rows 16 (w % 4)..).
namespace kiln::hopper {

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// ---- proxies ----
// cp.async and st.shared writes are generic-proxy writes; wgmma and TMA read through the async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Global memory written by generic stores, before bulk copies read it (and the other way round).
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// ---- mbarriers (64-bit, in shared memory) ----
// A barrier expecting one arrival a phase; `count` arrivals a phase.
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_init_count(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// The inits, visible to the async proxy (TMA completes transactions on them) and the cluster.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One thread initialises a CTA's n single-arrival barriers (before a block barrier, after which
// anyone may wait on them).
__device__ __forceinline__ void mbar_init_all(unsigned long long* bars, int n) {
  for (int i = 0; i < n; ++i) mbar_init(&bars[i]);
  fence_mbar_init();
}
// Waits until the phase of parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}"
      ::"r"(smem_u32(bar)), "r"(phase)
      : "memory");
}
// One arrival (a consumer's release, a producer's end marker); n arrivals.
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_n(unsigned long long* bar, unsigned n) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(n) : "memory");
}
// The current phase also waits for `bytes` of bulk-copy transactions: with the calling thread's
// arrival, or (expect_tx) without one, for bytes that share a phase with a later arrival.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// ---- TMA: bulk copies ----
// The box of a 3-d tensor map (`map`: the 128-byte CUtensorMap, in kernel parameter or global
// memory) at coordinates {c0, c1, c2} (innermost first) into shared memory at dst; its bytes
// complete on `bar` (out-of-bounds elements arrive as zeros and still count).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, unsigned long long* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
// Shared memory at src into the box at {c0, c1, c2} (out-of-bounds elements are not written), in the
// thread's current bulk group.
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(map), "r"(c0),
               "r"(c1), "r"(c2), "r"(smem_u32(src))
               : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src into shared dst,
// completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// The thread's bulk stores so far become a group; wait until at most N groups are in flight (all
// done), or (read) until at most N still read their shared memory.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// ---- wgmma ----
// Tiles in shared memory for wgmma here are 64-column panels of 128-byte rows whose 16-byte chunk c of
// row r sits at chunk c ^ (r % 8) (the 128-byte swizzle, no bank conflicts), each panel on a
// 1024-byte boundary. The descriptor of such an operand at shared address `addr`: 8-row groups 1024
// bytes apart, `leading_bytes` between the operand's core matrices along its other dimension.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned leading_bytes) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(leading_bytes >> 4) << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
// Before a warpgroup's first wgmma of a group (after its registers or shared operands were written);
// the issued wgmmas become a group; wait until at most N groups are in flight.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void reg_fence(float (*d)[4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
// Keeps a register A operand live (and unmoved) until the wgmma that reads it has been waited for.
template <int N>
__device__ __forceinline__ void reg_fence_pk(unsigned (*pk)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(pk[i][0]), "+r"(pk[i][1])::"memory");
}

// The products, written out because each names every accumulator register (N / 2 a thread).
#define KILN_WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define KILN_WG_D64 \
  KILN_WG_D(0), KILN_WG_D(1), KILN_WG_D(2), KILN_WG_D(3), KILN_WG_D(4), KILN_WG_D(5), KILN_WG_D(6), KILN_WG_D(7)
#define KILN_WG_D128                                                                                            \
  KILN_WG_D64, KILN_WG_D(8), KILN_WG_D(9), KILN_WG_D(10), KILN_WG_D(11), KILN_WG_D(12), KILN_WG_D(13), \
      KILN_WG_D(14), KILN_WG_D(15)
#define KILN_WG_R64                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KILN_WG_R128                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// Both operands from shared memory: descriptors a, b, then the predicate's int, trans-a, trans-b.
#define KILN_WGMMA_SS(N, T, A, B, ACC, TA, TB)                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ACC ", 0;\n"                                              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " KILN_WG_R##N ", %" A ", %" B \
               ", p, 1, 1, %" TA ", %" TB ";\n}\n"                                                           \
               : KILN_WG_D##N                                                                                 \
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB))
// A from registers (four 32-bit pairs a thread, the mma.sync A fragment), B by descriptor.
#define KILN_WGMMA_RS(N, T, A, B, ACC, TB)                                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ACC ", 0;\n"                                              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " KILN_WG_R##N ", {%" A "}, %" B  \
               ", p, 1, 1, %" TB ";\n}\n"                                                                    \
               : KILN_WG_D##N                                                                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(kTransB))

// d[64 x N] = A B (+ d when accumulate != 0) over k = 16, 16-bit inputs (bf16, else fp16). A and B
// are shared-memory descriptors; trans 0 reads an operand K-major (rows along the reduction), 1
// M-/N-major. A warpgroup issues it; d is read only after wg_wait and reg_fence.
template <int N, bool kBf16, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_m64_ss(float (*d)[4], unsigned long long a, unsigned long long b,
                                             int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_m64_ss: N is 64 or 128");
  if constexpr (N == 64 && kBf16) KILN_WGMMA_SS(64, "bf16", "32", "33", "34", "35", "36");
  else if constexpr (N == 64) KILN_WGMMA_SS(64, "f16", "32", "33", "34", "35", "36");
  else if constexpr (kBf16) KILN_WGMMA_SS(128, "bf16", "64", "65", "66", "67", "68");
  else KILN_WGMMA_SS(128, "f16", "64", "65", "66", "67", "68");
}
// The same with A from registers (a[4]: rows g / g + 8 of the thread's two k halves, as for mma.sync).
template <int N, bool kBf16, int kTransB = 1>
__device__ __forceinline__ void wgmma_m64_rs(float (*d)[4], const unsigned* a, unsigned long long b,
                                             int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_m64_rs: N is 64 or 128");
  if constexpr (N == 64 && kBf16) KILN_WGMMA_RS(64, "bf16", "32, %33, %34, %35", "36", "37", "38");
  else if constexpr (N == 64) KILN_WGMMA_RS(64, "f16", "32, %33, %34, %35", "36", "37", "38");
  else if constexpr (kBf16) KILN_WGMMA_RS(128, "bf16", "64, %65, %66, %67", "68", "69", "70");
  else KILN_WGMMA_RS(128, "f16", "64, %65, %66, %67", "68", "69", "70");
}
#undef KILN_WGMMA_RS
#undef KILN_WGMMA_SS
#undef KILN_WG_R128
#undef KILN_WG_R64
#undef KILN_WG_D128
#undef KILN_WG_D64
#undef KILN_WG_D

}  // namespace kiln::hopper
