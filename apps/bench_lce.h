#pragma once
// `kiln bench lce`: fused linear cross-entropy (memory and speed strategies) against the unfused
// path and the three GEMMs alone: peak extra memory and forward+backward time.
namespace kiln::apps {

// --device cpu|cuda --tokens N --hidden H --vocab V --dtype bf16|f32 [--iters K] [--json]
int run_bench_lce(int argc, char** argv);

}  // namespace kiln::apps
