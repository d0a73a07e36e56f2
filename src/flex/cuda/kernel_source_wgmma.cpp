// The wgmma (sm_90a) tiles of the FlexAttention kernels, pasted between the prelude and the walks by
// kernel_template() (kernel_source.cpp): an #include of flex/cuda/wgmma.cuh (which includes the
// Hopper helpers, core/cuda/hopper.cuh), resolved by compile_cubin from the embedded sources.
#include "flex/cuda/codegen.h"

namespace kiln::flex::cuda {

const char* wgmma_helpers_source() { return "#include \"flex/cuda/wgmma.cuh\"\n"; }

}  // namespace kiln::flex::cuda
