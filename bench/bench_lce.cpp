// bench_lce: the body is apps/bench_lce.cpp (shared with `kiln bench lce`).
#include "../apps/bench_lce.h"

int main(int argc, char** argv) { return kiln::apps::run_bench_lce(argc, argv); }
