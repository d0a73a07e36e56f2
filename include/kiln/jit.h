#pragma once
// kiln::jit: the compile service behind kiln's generated CUDA kernels (FlexAttention's today).
//
// Compiles run NVRTC in worker processes, several at once and each bounded by a timeout: a
// compiler that crashes or hangs costs its kernel a kiln::Error naming the kernel and the cause
// (the signal, the timeout, the compiler's log), never the calling process. The worker is embedded
// in the library and started from memory, so any program that links kiln (the kiln command, a
// trainer, the Python extension) has it. Results are kept on disk (kiln's cache folder: the
// KILN_CACHE_DIR setting), keyed by the source, headers, options, architecture and NVRTC version,
// each file checksummed: a damaged entry is compiled again, never loaded.
//
//   kiln::jit::Kernel k{.name = "scale", .source = "extern \"C\" __global__ void scale(float* x) {...}"};
//   std::string cubin = kiln::jit::compile(k);  // sm_90a cubin; no GPU needed
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jit {

enum class Output { cubin, ptx };

// A test hook: the worker compiling the kernel crashes (SIGSEGV) or never answers.
enum class WorkerFault { none, crash, hang };

struct Header {
  std::string_view name;  // as the source #includes it
  std::string_view text;
};

struct Kernel {
  std::string name;                  // named in errors; also NVRTC's program name
  std::string source;                // CUDA C++
  std::string arch = "sm_90a";       // --gpu-architecture (sm_XY[a] for a cubin, compute_XY for PTX too)
  std::vector<std::string> options;  // further NVRTC options ("-std=c++17", "-w", "-DX=1")
  std::vector<Header> headers;       // viewed, not copied: they must outlive the call
  Output output = Output::cubin;
  WorkerFault fault_for_tests = WorkerFault::none;
};

// The library's embedded kernel sources (src/**/cuda/*.cuh), offered as headers by their paths.
const std::vector<Header>& embedded_headers();

struct CompileOptions {
  int workers = 0;         // compiles at once; 0: tuning().jit.workers
  double timeout_s = 0;    // per compile; 0: tuning().jit.timeout_s
  bool isolate = true;     // false: NVRTC runs in this process (no worker; a crash is the caller's)
  bool use_cache = true;   // read and write the disk cache
};

struct CompileResult {
  std::string binary;      // the cubin or PTX; empty on failure
  std::string error;       // why the compile failed ("" on success)
  bool from_cache = false;
  bool ok() const { return error.empty(); }
};

// Compiles every kernel (cache hits first, the misses in parallel workers); one kernel's failure
// is its result's error and leaves the others alone.
std::vector<CompileResult> compile_all(const std::vector<Kernel>& kernels, const CompileOptions& options = {});
// One kernel; throws kiln::Error ("[jit] ...", naming the kernel) on failure.
std::string compile(const Kernel& kernel, const CompileOptions& options = {});
// Where `kernel`'s cache entry lives ("" without a cache folder).
std::string cache_path(const Kernel& kernel);

// NVRTC's "major.minor"; throws when kiln was built without CUDA.
std::string nvrtc_version();

struct CompileStats {
  int64_t disk_hits = 0;        // kernels served from the disk cache
  int64_t compiles = 0;         // successful compiles (in workers or in process)
  int64_t failures = 0;         // compiles that failed (compiler error, crash, timeout)
  int64_t workers_started = 0;  // worker processes started
  int64_t corrupt_entries = 0;  // cache files that failed their check (then recompiled)
  double compile_seconds = 0;   // wall time of the calls that compiled (misses), workers in parallel
};
CompileStats compile_stats();

}  // namespace kiln::jit
