#pragma once
// The CPU's SIMD as kiln's kernels see it: which Highway targets libkiln was built for, which of
// them this CPU runs, and the one the runtime dispatch picked (shown by `kiln info`).
#include <string>
#include <vector>

namespace kiln {

struct CpuSimdInfo {
  std::vector<std::string> compiled;  // Highway targets built into libkiln, best first ("AVX2", "SVE2_128", "NEON")
  std::vector<std::string> runnable;  // those this CPU supports, best first
  std::string target;                 // the dispatched target: the best runnable one
  int vector_bits = 0;                // its vector width here (SVE: the process's current length)
  // The kernel families compiled for every target and dispatched at run time.
  std::vector<std::string> families;
};

// Highway's choice for this process; every dispatched family shares it (see src/core/cpu/simd_targets.cpp).
CpuSimdInfo cpu_simd_info();

}  // namespace kiln
