// The FlexAttention kernel sources as embedded files, compiled by NVRTC on the CPU (no GPU needed):
// the one FlexParams header lays the block out as the host does, and an #include finds only what the
// library embeds. (The generated sources that include the Hopper helpers compile in
// test_attention_cuda.cpp; nvcc compiles every helper at build time, kiln_kernel_check_hopper.)
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "kiln/error.h"

#ifdef KILN_WITH_CUDA
#include "flex/cuda/codegen.h"
#include "flex/cuda/nvrtc.h"
#endif

namespace kiln::flex {
namespace {

#ifdef KILN_WITH_CUDA

// Every field of the host's FlexParams, at its host offset, in the device compile of the header.
#define KILN_FLEX_PARAMS_FIELDS(X)                                                                                   \
  X(q) X(k) X(v) X(out) X(lse) X(dout) X(dlse) X(delta) X(lse2) X(dq) X(dk) X(dv) X(kv_num) X(kv_idx) X(fkv_num)   \
  X(fkv_idx) X(q_num) X(q_idx) X(fq_num) X(fq_idx) X(kv_all_num) X(kv_all_idx) X(q_all_num) X(q_all_idx) X(err)    \
  X(slots) X(capgrad) X(mbits) X(B) X(Hq) X(Hkv) X(L) X(S) X(G) X(QB) X(KB) X(nQB) X(nKVB) X(mB) X(mH)       \
  X(kv_m) X(fkv_m) X(q_m) X(fq_m) X(all_full) X(q_tiles) X(kv_tiles) X(units) X(nslots) X(grad_numel) X(kv_all_m)   \
  X(q_all_m) X(scale) X(scale_f) X(scale_log2e) X(sptr) X(ssize) X(sstride) X(sgoff) X(mptr) X(msize) X(mstride)    \
  X(qmap) X(kmap) X(vmap) X(domap) X(omap)

TEST(FlexKernelSources, ParamsHeaderMatchesTheHostLayout) {
  std::string src = "#include \"flex/cuda/flex_params.cuh\"\n";
  src += "static_assert(sizeof(FlexParams) == " + std::to_string(sizeof(cuda::FlexParams)) + ", \"size\");\n";
  src += "static_assert(alignof(FlexParams) == " + std::to_string(alignof(cuda::FlexParams)) + ", \"alignment\");\n";
  // NVRTC has no <cstddef>; its front end's __INTADDR__ is what an offsetof there expands to.
#define KILN_CHECK_OFFSET(f)                                                                               \
  src += "static_assert(__INTADDR__(&((FlexParams*)0)->" #f ") == " +                                      \
         std::to_string(offsetof(cuda::FlexParams, f)) + " && sizeof(FlexParams::" #f ") == " +           \
         std::to_string(sizeof(cuda::FlexParams::f)) + ", \"" #f "\");\n";
  KILN_FLEX_PARAMS_FIELDS(KILN_CHECK_OFFSET)
#undef KILN_CHECK_OFFSET
  src += "extern \"C\" __global__ void params_layout(const FlexParams P) { if (P.err) *P.err = (int)P.B; }\n";
  EXPECT_NO_THROW(cuda::compile_cubin(src, "sm_90a"));
  // The checks can fail: a wrong size is reported with NVRTC's log.
  const std::string wrong = "#include \"flex/cuda/flex_params.cuh\"\nstatic_assert(sizeof(FlexParams) == 8, \"\");\n";
  EXPECT_THROW(cuda::compile_cubin(wrong, "sm_90a"), Error);
}

TEST(FlexKernelSources, IncludesResolveOnlyToEmbeddedFiles) {
  try {
    cuda::compile_cubin("#include \"flex/cuda/no_such_part.cuh\"\n", "sm_90a");
    ADD_FAILURE() << "an include of a file the library does not embed compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_part.cuh"), std::string::npos) << e.what();
  }
}

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln::flex
