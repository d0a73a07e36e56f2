#pragma once
// kiln's tuning values: one struct, every field's default documented beside it. An op reads
// tuning() once, at the top of a call, while it builds its plan; the layers below receive the plan
// and never read tuning values or the environment themselves.
//
// The process-wide values start as these defaults, overridden once by the KILN_* variables named
// beside each field (read in src/core/env.cpp, the only file of kiln that reads its environment).
// Tests and benchmarks pass values with TuningGuard or set_tuning instead of the environment.
#include <cstdint>
#include <string>

namespace kiln {

// FlexAttention on CUDA. 0 everywhere means "the measured rule" (src/flex/cuda/kernel_config.cpp).
struct FlexTuning {
  // KILN_FLEX_FWD_TILE=MxN: the forward's score tile (q rows x kv columns), multiples of 16 with at
  // most 256 rows; both 64 or 128 on sm_90 (wgmma), else the rule's tile stays. The BlockMask's
  // blocks must be multiples of the tile, else the forward takes 64 x 64. Rule: 128 x 128 at
  // E = 128 (64 x 64 on rows of up to 9 blocks), 64 x 64 at E = 64 (64 x 128 on rows of 6 blocks or
  // more); 64 x 64 off sm_90.
  int fwd_tile_m = 0, fwd_tile_n = 0;
  // KILN_FLEX_FWD_MIN_BLOCKS=N and KILN_FLEX_BWD_MIN_BLOCKS=DKDV,DQ (each 1 to 8): the forward's, the
  // dK/dV kernel's and the dQ kernel's minimum resident CTAs an SM (__launch_bounds__, which caps
  // their registers). Rule: 5 for the forward and 3 for dK/dV (1 with captured-tensor gradients) at
  // E = 64 with 64 x 64 forward tiles on sm_90, else 1.
  int fwd_min_blocks = 0, bwd_dkdv_min_blocks = 0, bwd_dq_min_blocks = 0;
};

// LinearCrossEntropyLoss: no process-wide knobs. Its chunk sizes and memory budget are per-call
// options (LinearCrossEntropyOptions: chunk_tokens, chunk_vocab, memory_budget), where an A/B sets them.
struct LceTuning {};

// GEMMs through cuBLASLt.
struct GemmTuning {
  // KILN_GEMM_PICK="m,n,k,trans_a,trans_b=rank;...": the heuristic's rank-th algorithm instead of
  // its first for problems of those shapes (empty: always the first).
  std::string pick;
};

// kiln::jit's compile pool (kiln/jit.h); CompileOptions override both per call.
struct JitTuning {
  // KILN_JIT_WORKERS=N: compiles running at once, each in its own worker process (0: the hardware
  // threads, at most 8).
  int workers = 0;
  // KILN_JIT_TIMEOUT=S: seconds one compile may take before its worker is killed. FlexAttention's
  // largest module compiles in about 10 s on a free core and took 70 s on 2 cores shared six ways:
  // the bound is for a hung compiler, not a slow machine.
  double timeout_s = 600;
};

// CPU threads: an op family splits its work over threads (kiln::set_num_threads, default OpenMP's
// count) only at or above its grain, as at::parallel_for does, and then uses at most one thread per
// grain of work; below it the op runs on the calling thread. A fork-join costs a few microseconds on
// an idle machine and milliseconds on a loaded one (a waiting thread is descheduled), more than a
// [512, 64] op itself (4-100 us on one thread), so the defaults keep such ops on one thread.
// KILN_CPU_GRAIN="elementwise=N,reduce=N,rows=N,gemm=N" overrides any of them (positive counts).
struct CpuTuning {
  int64_t elementwise_grain = int64_t{1} << 16;  // elements: binary/unary/compare/where, copies, fills
  int64_t reduce_grain = int64_t{1} << 16;       // input elements: sum, mean, amax, argmax, logsumexp
  int64_t rows_grain = int64_t{1} << 16;         // elements: softmax, norms, losses, rope, dropout, indexing
  // Multiply-adds of a CPU GEMM (fixed tiles, OpenBLAS per tile). 2^21: the tiny model's [512, 64] x
  // [64, 192] projections (6.3M) take 2 threads, a [512, 64] x [64, 64] one stays on 1; kiln train
  // on bench/train_bench.py --tiny's shapes, 2 threads, 60 steps: 62.3k tokens/s at 2^22, 72.4k at
  // 2^21, 73.1k at 2^20 (medians of 6).
  int64_t gemm_grain = int64_t{1} << 21;
};

struct Tuning {
  CpuTuning cpu;
  FlexTuning flex;
  LceTuning lce;
  GemmTuning gemm;
  JitTuning jit;
};

// The process-wide tuning values (a copy: safe to keep while another thread calls set_tuning).
Tuning tuning();
// Replaces the process-wide values (benchmarks' A/B runs, tests).
void set_tuning(const Tuning& t);
// The defaults above with the KILN_* variables applied; a malformed value throws kiln::Error naming
// the variable.
Tuning tuning_from_env();

// Sets the process-wide values for a scope and restores the previous ones after it.
class TuningGuard {
 public:
  explicit TuningGuard(const Tuning& t);
  ~TuningGuard();
  TuningGuard(const TuningGuard&) = delete;
  TuningGuard& operator=(const TuningGuard&) = delete;

 private:
  Tuning saved_;
};

}  // namespace kiln
