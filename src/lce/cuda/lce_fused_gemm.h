#pragma once
// The logit GEMMs with the loss in their epilogue (lce_fused_gemm.cu, sm_90a, 16-bit inputs): the
// memory strategy's forward row statistics straight from the accumulators (no stored tile, no stats
// pass) and its backward's dz written from the recomputed logits (no stored tile, no grad pass); the
// speed strategy's chunk logits stored with their statistics (no stats pass). Plain C++: no CUDA
// headers. Measurement switches until the H200 says it pays (read per call): KILN_LCE_WGMMA=1 turns
// it on, KILN_LCE_WGMMA_CLUSTER=2 runs the GEMM in 2-CTA clusters that multicast W,
// KILN_LCE_WGMMA_EPILOGUE=warps stages the epilogue to warps of its own (hopper_gemm.cuh).
#include <cstdint>

#include "kiln/dtype.h"
#include "lce/lce_math.h"

namespace kiln::cuda::lce_k {

// The operands as the fused GEMMs see them: x [n, h], w [v, h] (T, 16-bit, contiguous, 16-byte
// aligned, h % 8 == 0), bias [v] (T) or null, cw [v] (fp32) or null, target [n] (int64).
struct FusedGemm {
  DType t = kBFloat16;
  const void* x = nullptr;
  const void* w = nullptr;
  int64_t n = 0, v = 0, h = 0;
  const void* bias = nullptr;
  const void* cw = nullptr;
  const int64_t* target = nullptr;
  lce::Consts k;
  void* stream = nullptr;
};

// Whether the switch is on and the fused GEMMs serve these operands on `device`: an sm_90 device
// with the library's sm_90a code, 16-bit T, h a positive multiple of 8, x and w 16-byte aligned.
bool fused_gemm_usable(const FusedGemm& f, int device);
// Whether `device` runs them at all: an sm_90 GPU and the library's sm_90a code.
bool fused_gemm_device(int device);
// How many fused GEMMs have run in this process (tests check the path was taken).
int64_t fused_gemm_launches();

// Rows r0.. (rows of them) against classes c0.. (cols): each row's (max, sum exp) over the window
// merged into state ([4, st] fp32: max, sum, target logit, smoothing sum; `first` overwrites),
// the target logit written where a window holds it. `part`: lce::fused_partial_bytes(k, rows, cols)
// (lce_internal.h).
// With `logits` (the speed strategy's chunk, T, row stride ld, even) the raw logits are also stored
// there, rounded to T, and the statistics are those of the rounded values.
void fused_stats(const FusedGemm& f, int64_t r0, int64_t rows, int64_t c0, int64_t cols, void* part, bool first,
                 void* state, int64_t st, void* logits = nullptr, int64_t ld = 0);
// dz [rows, cols] (T, row stride ldz, even) for tokens n0.. and classes v0..: as lce_k::grad on the
// logits recomputed in fp32 (lse [n], g: null, one value, or one per token, totals as prepare's).
void fused_grad(const FusedGemm& f, int64_t n0, int64_t rows, int64_t v0, int64_t cols, const void* lse,
                const void* g, bool g_per_token, const void* totals, void* dz, int64_t ldz);

}  // namespace kiln::cuda::lce_k
