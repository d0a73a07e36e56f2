// kiln's compile worker: one NVRTC compile in its own process, so that a compiler crash or hang
// costs one kernel, not the program that asked for it (src/jit/pool.cpp starts it). Reads one
// request (protocol.h) from stdin until EOF, dlopens the NVRTC library the request names (the one
// the parent process has loaded), writes one response to stdout. Built on its own and embedded into
// libkiln as bytes, so any program linking kiln can start it (no file to install or find).
//
// Test hooks, by argument only: --fault=crash dies of SIGSEGV once the request is read,
// --fault=hang never answers.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "jit/protocol.h"

namespace {

using namespace kiln::jit::protocol;

bool read_all(int fd, std::string& out) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

int respond(bool ok, const std::string& log, const std::string& binary) {
  return write_all(1, encode({ok ? "ok" : "error", log, binary})) ? 0 : 3;
}

template <typename F>
bool load(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::string fault;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--fault=", 8) == 0) fault = argv[i] + 8;
  std::string message;
  std::vector<std::string> parts;
  Request request;
  if (!read_all(0, message) || !decode(message, parts) || !decode_request(parts, request))
    return respond(false, "the compile worker received a malformed request", "");
  if (fault == "crash") {
    raise(SIGSEGV);
  } else if (fault == "hang") {
    for (;;) pause();
  }
  void* lib = dlopen(request.nvrtc_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) return respond(false, std::string("could not load NVRTC: ") + dlerror(), "");
  NvrtcApi api;
  const bool found = load(lib, "nvrtcCreateProgram", api.create) && load(lib, "nvrtcCompileProgram", api.compile) &&
                     load(lib, "nvrtcDestroyProgram", api.destroy) &&
                     load(lib, "nvrtcGetProgramLogSize", api.log_size) && load(lib, "nvrtcGetProgramLog", api.log) &&
                     load(lib, "nvrtcGetCUBINSize", api.cubin_size) && load(lib, "nvrtcGetCUBIN", api.cubin) &&
                     load(lib, "nvrtcGetPTXSize", api.ptx_size) && load(lib, "nvrtcGetPTX", api.ptx) &&
                     load(lib, "nvrtcGetErrorString", api.error_string);
  if (!found) return respond(false, "NVRTC at " + request.nvrtc_path + " lacks an entry point: " + dlerror(), "");
  const Response r = run_nvrtc(api, request);
  return respond(r.ok, r.log, r.binary);
}
