// The NVRTC kiln links: its version, its file (for the workers) and the in-process compile.
#include <dlfcn.h>
#include <nvrtc.h>

#include "jit/nvrtc_host.h"
#include "kiln/error.h"
#include "kiln/jit.h"

namespace kiln::jit {

std::string nvrtc_version() {
  int major = 0, minor = 0;
  const nvrtcResult r = nvrtcVersion(&major, &minor);
  KILN_CHECK(r == NVRTC_SUCCESS, "jit", "nvrtcVersion failed: ", nvrtcGetErrorString(r));
  return std::to_string(major) + "." + std::to_string(minor);
}

namespace detail {

std::string nvrtc_library_path() {
  static const std::string path = [] {
    Dl_info info{};
    KILN_CHECK(dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname, "jit",
               "cannot find the file of the NVRTC library this process loaded");
    return std::string(info.dli_fname);
  }();
  return path;
}

protocol::Response compile_in_process(const protocol::Request& request) {
  protocol::NvrtcApi api;
  api.create = [](void** p, const char* src, const char* name, int n, const char* const* headers,
                  const char* const* names) {
    return static_cast<int>(nvrtcCreateProgram(reinterpret_cast<nvrtcProgram*>(p), src, name, n, headers, names));
  };
  api.compile = [](void* p, int n, const char* const* o) {
    return static_cast<int>(nvrtcCompileProgram(static_cast<nvrtcProgram>(p), n, o));
  };
  api.destroy = [](void** p) { return static_cast<int>(nvrtcDestroyProgram(reinterpret_cast<nvrtcProgram*>(p))); };
  api.log_size = [](void* p, size_t* n) { return static_cast<int>(nvrtcGetProgramLogSize(static_cast<nvrtcProgram>(p), n)); };
  api.log = [](void* p, char* s) { return static_cast<int>(nvrtcGetProgramLog(static_cast<nvrtcProgram>(p), s)); };
  api.cubin_size = [](void* p, size_t* n) { return static_cast<int>(nvrtcGetCUBINSize(static_cast<nvrtcProgram>(p), n)); };
  api.cubin = [](void* p, char* s) { return static_cast<int>(nvrtcGetCUBIN(static_cast<nvrtcProgram>(p), s)); };
  api.ptx_size = [](void* p, size_t* n) { return static_cast<int>(nvrtcGetPTXSize(static_cast<nvrtcProgram>(p), n)); };
  api.ptx = [](void* p, char* s) { return static_cast<int>(nvrtcGetPTX(static_cast<nvrtcProgram>(p), s)); };
  api.error_string = [](int r) { return nvrtcGetErrorString(static_cast<nvrtcResult>(r)); };
  return protocol::run_nvrtc(api, request);
}

}  // namespace detail
}  // namespace kiln::jit
