// The NCCL backend when kiln is built without CUDA: new_comm("nccl", ...) raises.
#ifndef KILN_WITH_CUDA
#include "dist/backend.h"

namespace kiln::dist::detail {
std::unique_ptr<Backend> make_nccl_backend(const BackendInit&) {
  KILN_FAIL("new_comm", "the nccl backend needs CUDA: kiln was built without CUDA");
}
}  // namespace kiln::dist::detail

namespace kiln::dist {
std::string nccl_version() { KILN_FAIL("nccl_version", "NCCL needs CUDA: kiln was built without CUDA"); }
}  // namespace kiln::dist
#endif
