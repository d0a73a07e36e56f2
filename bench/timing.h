#pragma once
// Timing shared by the benchmarks.
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median time of fn over reps: CUDA events on the current stream, or the wall clock on the CPU.
inline double median_ms(const Device& dev, const std::function<void()>& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    if (dev.is_cuda()) {
      cuda::Event a, b;
      a.record();
      fn();
      b.record();
      b.synchronize();
      t.push_back(a.elapsed_ms(b));
    } else {
      const double t0 = now_ms();
      fn();
      t.push_back(now_ms() - t0);
    }
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace kiln::bench
