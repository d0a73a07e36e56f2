// kiln::jit's NVRTC entry points when kiln is built without CUDA: every compile raises.
#ifndef KILN_WITH_CUDA
#include "jit/nvrtc_host.h"
#include "kiln/error.h"
#include "kiln/jit.h"

namespace kiln::jit {
std::string nvrtc_version() { KILN_FAIL("jit", "kiln was built without CUDA: there is no NVRTC"); }
namespace detail {
std::string nvrtc_library_path() { KILN_FAIL("jit", "kiln was built without CUDA: there is no NVRTC"); }
protocol::Response compile_in_process(const protocol::Request& request) {
  KILN_FAIL("jit", "kiln was built without CUDA: there is no NVRTC to compile '", request.name, "'");
}
}  // namespace detail
}  // namespace kiln::jit
#endif
