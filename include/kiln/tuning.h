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
  // KILN_FLEX_FWD_TILE=MxN: the forward's score tile (q rows x kv columns); both 64 or 128 on
  // sm_90 (wgmma), and they must divide the BlockMask's blocks, else the rule's tile stays.
  int fwd_tile_m = 0, fwd_tile_n = 0;
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

struct Tuning {
  FlexTuning flex;
  LceTuning lce;
  GemmTuning gemm;
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
