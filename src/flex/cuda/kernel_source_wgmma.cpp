// The wgmma (sm_90a) FlexAttention forward as source text, appended after kernel_template() (it
// uses that template's helpers: tile walks, softmax_step, store_rows, the wg_* products).
//
// Software-pipelined: K and V tiles are double-buffered and one cp.async group per step brings
// tile j + 2's K and tile j + 1's V. Step j issues S(j+1) = Q K(j+1)^T and then O += P(j) V(j) as
// two wgmma groups, waits for the first and runs the softmax of S(j+1) on the CUDA cores while the
// tensor cores still work on P(j) V(j); only the rescale of O and the packing of P(j+1) wait for
// the second. Per element the arithmetic is the unpipelined order (o * alpha then + P V), so the
// bits do not depend on the pipelining. A warpgroup owns 64 q rows; FWD_TILE_M / 64 of them.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* fwd_wgmma_template() {
  return R"kiln_src(
#if KILN_BUILD_FWD && FWD_WGMMA
// Buffer (j % 2) of the double-buffered K and V tiles after Q.
#define FWD_KBUF(j) (Qs + FWD_TILE_M * HEAD_DIM + ((j) & 1) * FWD_TILE_N * HEAD_DIM)
#define FWD_VBUF(j) (Qs + (FWD_TILE_M + 2 * FWD_TILE_N) * HEAD_DIM + ((j) & 1) * FWD_TILE_N * HEAD_DIM)

extern "C" __global__ void __launch_bounds__(FWD_THREADS) flex_fwd(const FlexParams P) {
  extern __shared__ __align__(16) u16 smem[];
  u16* Qs = wg_smem_base(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const FwdTile ft(P);
  const u16* kg = (const u16*)P.k + (ft.b * P.Hkv + ft.hk) * P.S * HEAD_DIM;
  const u16* vg = (const u16*)P.v + (ft.b * P.Hkv + ft.hk) * P.S * HEAD_DIM;
  const bool rows_in = ft.r0 + FWD_TILE_M <= P.L;
  const i64 row_base = ft.r0 + warp * 16 + g;  // this thread's rows: row_base, row_base + 8
  const int wg_row0 = (warp >> 2) * 64;        // the warpgroup's first row in the Q tile
  float o[HEAD_DIM / 8][4];
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
  float s[FWD_TILE_N / 8][4];
  u32 pk[FWD_TILE_N / 8][2];  // P(j) rounded to T: the A operand of O += P V

  // Tiles j, j + 1, j + 2 of the walk (c: first kv column, p: partial block, has: exists).
  TileWalk walk = ft.walk(P);
  i64 c_j = 0, c_j1 = 0, c_j2 = 0;
  bool p_j = false, p_j1 = false, p_j2 = false;
  bool has_j = walk.next(c_j, p_j);
  bool has_j1 = has_j && walk.next(c_j1, p_j1);
  load_tile_sw_async(Qs, (const u16*)P.q + ft.bh * P.L * HEAD_DIM, ft.r0, P.L, FWD_TILE_M, FWD_THREADS);
  if (has_j) load_tile_sw_async(FWD_KBUF(0), kg, c_j, P.S, FWD_TILE_N, FWD_THREADS);
  cp_async_commit();
  if (has_j) load_tile_sw_async(FWD_VBUF(0), vg, c_j, P.S, FWD_TILE_N, FWD_THREADS);
  if (has_j1) load_tile_sw_async(FWD_KBUF(1), kg, c_j1, P.S, FWD_TILE_N, FWD_THREADS);
  cp_async_commit();
  cp_async_wait<1>();  // Q and K(0) landed
  fence_async_smem();
  __syncthreads();
  if (has_j) {
    float alpha[2];  // o is still 0
    wg_abt<FWD_TILE_N>(s, Qs, FWD_TILE_M, wg_row0, FWD_KBUF(0));
    softmax_step(P, s, m, l, alpha, ft.b, ft.h, row_base, c_j, p_j, rows_in, t);
    pack_rows<FWD_TILE_N>(pk, s);
  }
  for (int j = 0; has_j; ++j) {
    // Everyone is done with S(j) (K buffer j % 2) and P(j-1) V(j-1) (V buffer (j + 1) % 2).
    __syncthreads();
    const bool has_j2 = has_j1 && walk.next(c_j2, p_j2);
    if (has_j1) load_tile_sw_async(FWD_VBUF(j + 1), vg, c_j1, P.S, FWD_TILE_N, FWD_THREADS);
    if (has_j2) load_tile_sw_async(FWD_KBUF(j), kg, c_j2, P.S, FWD_TILE_N, FWD_THREADS);
    cp_async_commit();
    cp_async_wait<1>();  // V(j) and K(j+1) landed
    fence_async_smem();
    __syncthreads();
    // Unconditional so that ptxas sees one group order (after the last tile S reads a stale K
    // buffer and is dropped).
    wg_abt_issue<FWD_TILE_N>(s, Qs, FWD_TILE_M, wg_row0, FWD_KBUF(j + 1));
    wg_pb_issue<FWD_TILE_N>(o, pk, FWD_VBUF(j));
    wg_wait<1>();  // S(j+1) done; P(j) V(j) may still run
    reg_fence<FWD_TILE_N / 8>(s);
    float alpha[2] = {1.f, 1.f};
    if (has_j1) softmax_step(P, s, m, l, alpha, ft.b, ft.h, row_base, c_j1, p_j1, rows_in, t);
    wg_wait<0>();
    reg_fence<HEAD_DIM / 8>(o);
    reg_fence_u32<FWD_TILE_N / 8>(pk);
    if (has_j1) {
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
      pack_rows<FWD_TILE_N>(pk, s);
    }
    has_j = has_j1;
    c_j = c_j1;
    p_j = p_j1;
    has_j1 = has_j2;
    c_j1 = c_j2;
    p_j1 = p_j2;
  }
  cp_async_wait<0>();  // nothing in flight when the CTA ends
  store_rows(P, o, m, l, ft.bh, row_base, t);
}
#endif  // KILN_BUILD_FWD && FWD_WGMMA
)kiln_src";
}

}  // namespace kiln::flex::cuda
