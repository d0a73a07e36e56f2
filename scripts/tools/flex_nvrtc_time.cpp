// Seconds NVRTC takes for the FlexAttention forward and backward modules of one source (causal
// mask), compiled concurrently as load_kernels does; no GPU needed. Build against a CUDA build:
//   g++ -std=c++20 -O1 -Iinclude -Isrc scripts/tools/flex_nvrtc_time.cpp build/libkiln.a -o /tmp/flex_nvrtc_time \
//     -L/usr/local/cuda/lib64 -lhwy -lnvrtc -lcudart -lcublasLt -lcublas -lopenblas -fopenmp -lpthread -ldl
// Usage: /tmp/flex_nvrtc_time HEAD_DIM WGMMA(0|1)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "flex/cuda/codegen.h"
#include "flex/cuda/nvrtc.h"
#include "flex/ir.h"
#include "kiln/kiln.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  using namespace kiln;
  const flex::detail::Program mask = flex::detail::compile(flex::causal_mask().expr);
  flex::cuda::KernelConfig cfg;
  cfg.head_dim = std::atoi(argv[1]);
  cfg.fwd_wgmma = cfg.bwd_wgmma = std::atoi(argv[2]) != 0;
  if (cfg.fwd_wgmma && cfg.head_dim == 128) cfg.fwd_tile_m = cfg.fwd_tile_n = 128;  // the default there
  const std::string src = flex::cuda::generate_source(nullptr, &mask, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  auto bwd = std::async(std::launch::async, [&] { return flex::cuda::compile_cubin("#define KILN_BUILD_FWD 0\n" + src, "sm_90a"); });
  flex::cuda::compile_cubin("#define KILN_BUILD_BWD 0\n" + src, "sm_90a");
  const auto t1 = std::chrono::steady_clock::now();
  bwd.get();
  const auto t2 = std::chrono::steady_clock::now();
  std::printf("E=%d wgmma=%d: forward %.2f s, both (concurrent) %.2f s\n", cfg.head_dim, cfg.fwd_wgmma ? 1 : 0,
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t0).count());
}
