#pragma once
// `kiln bench flex`: FlexAttention (forward, forward+backward, memory, BlockMask creation) against
// kiln's dense attention, in one run.
namespace kiln::apps {

// --device cpu|cuda --batch B --heads H --seq S --head-dim D --mask causal|sliding:W|document[:N]|...
// [--score none|alibi|softcap:C] [--dtype f32|bf16|f16] [--json]; returns the exit status.
int run_bench_flex(int argc, char** argv);

}  // namespace kiln::apps
