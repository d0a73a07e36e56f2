// Build-time check of FlexAttention's kernels (cmake/KilnEmbed.cmake's kiln_kernel_check): the
// embedded headers in the order of the NVRTC source (codegen.cpp's generate_source), the generated
// mod functions replaced by stub_mods.cuh's causal mask, compiled by nvcc during the normal build
// under one configuration's defines (CMakeLists.txt: the sm_90 defaults at E = 64 and 128, the
// persistent forward, mma.sync). The kernels are extern "C" __global__, so nvcc emits each one and
// ptxas reports its registers and spills. Never launched.
#include "flex/cuda/device_common.cuh"
#include "flex/cuda/kernel_check/stub_mods.cuh"
#include "flex/cuda/kernels.cuh"
