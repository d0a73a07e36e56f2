// kiln::set_num_threads / get_num_threads and the grain rule of the CPU kernels (core/cpu/parallel.h).
// The count is kept here and passed to every parallel region (num_threads), because
// omp_set_num_threads only reaches the thread that calls it, and kiln runs ops from many threads.
#include "core/cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "kiln/error.h"

namespace kiln {
namespace {
std::atomic<int> g_threads{0};  // 0: not set by set_num_threads
}  // namespace

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "set_num_threads", "the number of threads must be positive, got ", n);
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);  // the caller's own regions (kernels that pass no count) follow too
}

int get_num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  // Never set: OpenMP's count for the calling thread (which also honours an omp_set_num_threads).
  return n > 0 ? n : std::max(1, omp_get_max_threads());
}

namespace cpu {

int threads_for(int64_t work, int64_t grain) {
  if (work < grain || grain <= 0) return 1;
  const int64_t chunks = work / grain;
  return static_cast<int>(std::clamp<int64_t>(chunks, 1, get_num_threads()));
}

CpuTuning grains() { return tuning().cpu; }

}  // namespace cpu
}  // namespace kiln
