// Writes the generated FlexAttention forward source (no mods) for the wgmma probe.
// Usage: gen HEAD_DIM TILE_M TILE_N > generated.cu
#include <cstdlib>
#include <iostream>

#include "flex/cuda/codegen.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  kiln::flex::cuda::KernelConfig cfg;
  cfg.head_dim = std::atoi(argv[1]);
  cfg.fwd_tile_m = std::atoi(argv[2]);
  cfg.fwd_tile_n = std::atoi(argv[3]);
  cfg.fwd_wgmma = true;
  std::cout << "#define KILN_BUILD_BWD 0\n" << kiln::flex::cuda::generate_source(nullptr, nullptr, cfg);
}
