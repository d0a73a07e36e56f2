// bench_flex: the body is apps/bench_flex.cpp (shared with `kiln bench flex`).
#include "../apps/bench_flex.h"

int main(int argc, char** argv) { return kiln::apps::run_bench_flex(argc, argv); }
