#pragma once
// The NVRTC that kiln links (src/jit/cuda/nvrtc_host.cpp; without CUDA every call raises).
#include <string>

#include "jit/protocol.h"

namespace kiln::jit::detail {

// The file of the loaded NVRTC library, which the workers dlopen (so they run the same compiler).
std::string nvrtc_library_path();
// The compile in this process (CompileOptions::isolate = false).
protocol::Response compile_in_process(const protocol::Request& request);

}  // namespace kiln::jit::detail
