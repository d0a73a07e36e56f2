// kiln::jit's compile pool on FlexAttention's generated modules (forward and backward, causal and
// sliding-window masks, wgmma and mma.sync: eight sources, sm_90a cubins, no GPU needed): the
// pool's parallel compile beside a serial one (one worker) and beside NVRTC in this process, cold
// (no cache, alternating, median of --reps), then the warm start from the disk cache.
//
//   bench_jit [--reps N] [--workers N]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "timing.h"

#ifdef KILN_WITH_CUDA
#include "core/env.h"
#include "flex/cuda/codegen.h"
#include "kiln/flex.h"

namespace {

using namespace kiln;

std::vector<jit::Kernel> flex_modules() {
  std::vector<jit::Kernel> ks;
  for (const flex::MaskMod& m : {flex::causal_mask(), flex::sliding_window_mask(256)})
    for (bool wgmma : {true, false}) {
      const flex::detail::Program mp = flex::detail::compile(m.expr);
      flex::cuda::KernelConfig cfg;
      cfg.bf16 = true, cfg.head_dim = 64, cfg.wgmma = wgmma, cfg.fwd_tile_m = 64, cfg.fwd_tile_n = 64;
      const std::string src = flex::cuda::generate_source(nullptr, &mp, cfg);
      for (const char* part : {"#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n",
                               "#define KILN_BUILD_FWD 0\n#define KILN_BUILD_BWD 1\n"}) {
        jit::Kernel k;  // as flex/cuda/nvrtc.cpp builds it
        k.name = "kiln_flex.cu";
        k.source = part + src;
        k.options = {"-std=c++17", "-w"};
        k.headers = jit::embedded_headers();
        ks.push_back(k);
      }
    }
  return ks;
}

double run_ms(const std::vector<jit::Kernel>& ks, const jit::CompileOptions& o) {
  const double t0 = bench::now_ms();
  for (const jit::CompileResult& r : jit::compile_all(ks, o))
    if (!r.ok()) std::fprintf(stderr, "%s\n", r.error.c_str());
  return bench::now_ms() - t0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, workers = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
  }
  const std::vector<jit::Kernel> ks = flex_modules();
  jit::CompileOptions pool, serial, local;
  pool.workers = workers, pool.use_cache = false;
  serial.workers = 1, serial.use_cache = false;
  local.isolate = false, local.use_cache = false;
  std::printf("bench_jit: %zu FlexAttention modules, NVRTC %s, %d repetitions\n", ks.size(),
              jit::nvrtc_version().c_str(), reps);
  std::vector<double> tp, ts, tl;
  for (int r = 0; r < reps; ++r) {
    tp.push_back(run_ms(ks, pool));
    ts.push_back(run_ms(ks, serial));
    tl.push_back(run_ms(ks, local));
  }
  std::printf("cold, pool (%d workers)    %8.0f ms\n", workers, median(tp));
  std::printf("cold, one worker          %8.0f ms  (pool speed-up %.2fx)\n", median(ts), median(ts) / median(tp));
  std::printf("cold, in process, serial  %8.0f ms  (one worker / in process %.2fx)\n", median(tl),
              median(ts) / median(tl));
  const std::string dir = (std::filesystem::temp_directory_path() / ("kiln_bench_jit_" + std::to_string(getpid()))).string();
  kiln::detail::set_cache_dir_override(dir);
  jit::CompileOptions cached;
  cached.workers = workers;
  run_ms(ks, cached);  // fills the cache
  const jit::CompileStats s0 = jit::compile_stats();
  const double warm = run_ms(ks, cached);
  const jit::CompileStats s1 = jit::compile_stats();
  std::printf("warm (disk cache)         %8.1f ms  (%lld compiles, %lld workers started)\n", warm,
              static_cast<long long>(s1.compiles - s0.compiles),
              static_cast<long long>(s1.workers_started - s0.workers_started));
  kiln::detail::set_cache_dir_override("");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
#else
int main() {
  std::printf("bench_jit: kiln was built without CUDA (no NVRTC)\n");
  return 0;
}
#endif
