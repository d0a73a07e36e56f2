#pragma once
// How many threads a CPU kernel splits `work` units over: one below `grain`, else one thread per
// grain of work up to get_num_threads() (at::parallel_for's rule). Use as
//   const int nt = cpu::threads_for(n, cpu::grains().elementwise_grain);
//   #pragma omp parallel for num_threads(nt) if (nt > 1)
// grains() is the process's CpuTuning, read once at the top of a kernel call.
#include <cstdint>

#include "kiln/parallel.h"
#include "kiln/tuning.h"

namespace kiln::cpu {

int threads_for(int64_t work, int64_t grain);
CpuTuning grains();

}  // namespace kiln::cpu
