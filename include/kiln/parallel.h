#pragma once
// The CPU threads kiln's kernels use (OpenMP). Each op family splits its work over threads only at
// or above its grain size (kiln::Tuning::cpu in kiln/tuning.h), so small ops run on the calling
// thread and large ones on every thread; the results never depend on the thread count.
namespace kiln {

// Threads a large CPU op uses from now on, in every thread of the process (as torch.set_num_threads);
// n >= 1. The default is OpenMP's (OMP_NUM_THREADS, else one per core).
void set_num_threads(int n);
int get_num_threads();

}  // namespace kiln
