// The speed strategy's fused row pass (sm_90): statistics and gradient of each chunk row in one
// read of its logits. A row of a 128k vocabulary (250 KB of bf16) does not fit one CTA's shared
// memory, so a cluster of C CTAs holds it, each a contiguous slice:
//   1. each CTA loads its slice into shared memory (16-byte vectors, four in flight per thread),
//      keeping an online (max, sum exp) and the smoothing sum as the stats pass does;
//   2. the CTA's pairs merge in a fixed tree; every CTA merges the cluster's C partials in rank
//      order through distributed shared memory, so all hold the same lse; rank 0 writes the
//      token's lse and loss terms;
//   3. each CTA writes dz over its own slice of the tile, from shared memory.
// The two-pass path reads the tile twice (stats, then grad) and writes it once; this reads it once:
// ~1 GB less traffic per 2048-token chunk at V = 128256. Deterministic: fixed orders throughout.
// Off by default (KILN_LCE_ROWPASS=1 turns it on): on the H200 it ran at ~1 TB/s, 1.38 ms a
// 2752-token chunk against 1.00 ms for the two passes; each CTA's phases (load, two cluster
// barriers, write) run back to back with only 4 CTAs an SM to overlap them.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "core/cuda/check.h"
#include "core/cuda/device_types.cuh"
#include "core/dispatch.h"
#include "lce/cuda/lce_device.cuh"
#include "lce/cuda/lce_kernels.h"

namespace kiln::cuda::lce_k {
namespace {

namespace cg = cooperative_groups;

constexpr int kRowThreads = 256;
// A CTA's share of a row: 4 CTAs an SM fit. KILN_LCE_ROWPASS_SLICE_KB (a measurement knob, read
// once) sets another.
size_t slice_bytes() {
  static const size_t b = [] {
    const char* e = std::getenv("KILN_LCE_ROWPASS_SLICE_KB");
    const long kb = e ? std::strtol(e, nullptr, 10) : 48;
    KILN_CHECK(kb >= 4 && kb <= 200, "linear_cross_entropy", "KILN_LCE_ROWPASS_SLICE_KB=", e, ": 4 to 200");
    return static_cast<size_t>(kb) << 10;
  }();
  return b;
}

// One CTA's statistics of its slice, read by the other CTAs of the cluster.
struct Partial {
  float m, s, ws, s_y;
  int has_y;
};

template <typename T, int VW>
__global__ void __launch_bounds__(kRowThreads, 4) rowpass_kernel(T* tile, int64_t cols, int64_t ld, int64_t n0,
                                                             int64_t slice_vecs, const T* bias, const float* cw,
                                                             const int64_t* target, lce::Consts k,
                                                             const float* totals, float* lse_all, float* terms,
                                                             int64_t n_total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using V = Vec<T, VW>;
  constexpr int kInFlight = 4;  // 16-byte loads per thread before their use
  extern __shared__ uint4 slice_raw[];  // one untyped array: the template instances share the name
  V* slice = reinterpret_cast<V*>(slice_raw);
  __shared__ float sm[kRowThreads], ss[kRowThreads], sw[kRowThreads];
  __shared__ Partial part;
  __shared__ float row_lse;
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int64_t r = blockIdx.x / C, i = n0 + r, y = target[i];
  T* z = tile + r * ld;
  // Column indices in int: the launcher keeps cols below 2^31.
  const int c0 = rank * static_cast<int>(slice_vecs) * VW, n_cols_all = static_cast<int>(cols);  // first column
  const int n_cols = n_cols_all - c0 < slice_vecs * VW ? (n_cols_all - c0 > 0 ? n_cols_all - c0 : 0)
                                                         : static_cast<int>(slice_vecs) * VW;
  const int n_vecs = (n_cols + VW - 1) / VW;
  const float cap = static_cast<float>(k.softcap);
  const bool smooth = k.eps != 0.0;
  auto logit = [&](T raw, int j) {  // column j's logit: bias and soft-cap applied
    float v = convert<float>(raw);
    if (bias) v += convert<float>(bias[j]);
    return softcap(v, cap);
  };
  float m = -INFINITY, s = 0, ws = 0;
  for (int q0 = threadIdx.x; q0 < n_vecs; q0 += kRowThreads * kInFlight) {
    V in[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {  // loads first, four in flight
      const int q = q0 + u * kRowThreads, j = c0 + q * VW;
      if (q >= n_vecs) break;
      if (j + VW <= n_cols_all) {
        in[u] = *reinterpret_cast<const V*>(z + j);
      } else {
        for (int e = 0; e < VW; ++e) in[u].v[e] = j + e < n_cols_all ? z[j + e] : convert<T>(0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int q = q0 + u * kRowThreads, j = c0 + q * VW;
      if (q >= n_vecs) break;
      slice[q] = in[u];
      const int n = n_cols_all - j < VW ? n_cols_all - j : VW;
      float v[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) v[e] = e < n ? logit(in[u].v[e], j + e) : -INFINITY;
      take_vector<float, T, VW>(v, n, cw, j, smooth, m, s, ws);  // as the stats pass
    }
  }
  block_merge_stats(m, s, ws, sm, ss, sw);
  if (threadIdx.x == 0) {
    const bool mine = y >= c0 && y < c0 + n_cols;
    const int yl = mine ? static_cast<int>(y) - c0 : 0;
    part = Partial{sm[0], ss[0], sw[0], mine ? logit(slice[yl / VW].v[yl % VW], c0 + yl) : 0.f, mine ? 1 : 0};
  }
  cluster.sync();
  if (threadIdx.x == 0) {  // the cluster's partials in rank order: every CTA gets the same bits
    float mm = -INFINITY, sv = 0, wsum = 0, s_y = 0;
    for (int q = 0; q < C; ++q) {
      const Partial p = *cluster.map_shared_rank(&part, q);
      merge(mm, sv, p.m, p.s);
      wsum += p.ws;
      if (p.has_y) s_y = p.s_y;
    }
    if (rank == 0) {
      row_lse = finish_token<float>(i, y, mm, sv, s_y, smooth ? wsum : 0.f, cw, totals, k, lse_all, terms, n_total);
    } else {
      row_lse = mm + dlog<float>(sv);  // finish_token's lse, without its stores
    }
  }
  cluster.sync();  // every remote read done before any CTA moves on (and row_lse visible)
  const RowGrad<float> rg = row_grad<float>(y, row_lse, 1.f, cw, totals, k);
  Vec<T, VW> o;
  for (int q = threadIdx.x; q < n_vecs; q += kRowThreads) {
    const int j = c0 + q * VW;
    const V raw = slice[q];
#pragma unroll
    for (int e = 0; e < VW; ++e)
      o.v[e] = convert<T>(rg.dead || j + e >= n_cols_all ? 0.f
                                                   : element_grad<float, T>(logit(raw.v[e], j + e), j + e, y, rg, cw, cap));
    if (j + VW <= n_cols_all) {
      *reinterpret_cast<V*>(z + j) = o;
    } else {
      for (int e = 0; e < VW && j + e < n_cols_all; ++e) z[j + e] = o.v[e];
    }
  }
#endif
}

}  // namespace

bool rowpass(DType t, void* tile, int64_t rows, int64_t cols, int64_t ld, int64_t n0, const void* bias,
             const void* cw, const int64_t* target, const lce::Consts& k, const void* totals, void* lse, void* terms,
             int64_t n_total, void* stream) {
  if (rows == 0 || cols == 0) return true;
  if (t != kBFloat16 && t != kFloat16) return false;
  int device = 0, major = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9 || reinterpret_cast<uintptr_t>(tile) % 16 != 0 || (ld * 2) % 16 != 0) return false;
  constexpr int VW = 8;  // 16-byte vectors of a 16-bit tile
  const int64_t vecs = (cols + VW - 1) / VW;
  int C = 1;
  const size_t slice_max = slice_bytes();
  while (C < 8 && static_cast<size_t>((vecs + C - 1) / C) * 16 > slice_max) C *= 2;
  const int64_t slice_vecs = (vecs + C - 1) / C;
  const size_t smem = static_cast<size_t>(slice_vecs) * 16;
  if (smem > (size_t{200} << 10) || rows * C > INT32_MAX || cols > INT32_MAX - 64) return false;  // two passes
  bool done = false;
  dispatch_floating(t, "linear_cross_entropy", [&](auto tag) {
    using T = device_t<typename decltype(tag)::type>;
    if constexpr (is_16bit_float_v<T>) {
      auto kernel = rowpass_kernel<T, VW>;
      KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(rows * C));
      cfg.blockDim = dim3(kRowThreads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = static_cast<cudaStream_t>(stream);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = static_cast<unsigned>(C);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<T*>(tile), cols, ld, n0, slice_vecs,
                                         static_cast<const T*>(bias), static_cast<const float*>(cw), target, k,
                                         static_cast<const float*>(totals), static_cast<float*>(lse),
                                         static_cast<float*>(terms), n_total));
      done = true;
    }
  });
  return done;
}

}  // namespace kiln::cuda::lce_k
