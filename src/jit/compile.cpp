// kiln::jit's compile service (kiln/jit.h): the disk cache in front, the worker pool (pool.cpp)
// or the in-process NVRTC behind it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "core/embedded.h"
#include "core/env.h"
#include "jit/cache.h"
#include "jit/nvrtc_host.h"
#include "jit/pool.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "kiln/tuning.h"

namespace kiln::jit {
namespace {

constexpr const char* kOp = "jit";

std::atomic<int64_t> g_disk_hits{0}, g_compiles{0}, g_failures{0}, g_corrupt{0};
std::atomic<int64_t> g_compile_ns{0};  // wall time of the compiles (cache misses), summed over calls

const char* output_name(Output o) { return o == Output::ptx ? "ptx" : "cubin"; }

std::vector<std::string> nvrtc_options(const Kernel& k) {
  std::vector<std::string> o{"--gpu-architecture=" + k.arch};
  o.insert(o.end(), k.options.begin(), k.options.end());
  return o;
}

// Everything that decides the compiler's output.
std::string cache_key(const Kernel& k) {
  std::string headers;
  for (const Header& h : k.headers) headers.append(h.name).append(1, '\0').append(h.text).append(1, '\0');
  std::string text = "nvrtc " + nvrtc_version() + "\noutput " + output_name(k.output) + "\nname " + k.name + "\n";
  for (const std::string& o : nvrtc_options(k)) text.append("option ").append(o).append(1, '\n');
  text += "headers " + detail::hash_hex(headers) + "\n" + k.source;
  return detail::hash_hex(text);
}

void check_kernel(const Kernel& k) {
  KILN_CHECK(!k.name.empty(), kOp, "a kernel needs a name");
  KILN_CHECK(!k.source.empty(), kOp, "kernel '", k.name, "' has no source");
  KILN_CHECK(!k.arch.empty(), kOp, "kernel '", k.name, "' has no architecture");
}

}  // namespace

const std::vector<Header>& embedded_headers() {
  static const std::vector<Header> h = [] {
    std::vector<Header> r;
    for (const kiln::detail::EmbeddedFile* f : kiln::detail::embedded_files()) r.push_back({f->name, f->text});
    return r;
  }();
  return h;
}

std::string cache_path(const Kernel& kernel) {
  const std::string dir = kiln::detail::cache_dir();
  if (dir.empty()) return "";
  return dir + "/jit-" + cache_key(kernel) + "." + output_name(kernel.output);
}

std::vector<CompileResult> compile_all(const std::vector<Kernel>& kernels, const CompileOptions& options) {
  const JitTuning t = tuning().jit;
  int workers = options.workers > 0 ? options.workers : t.workers;
  if (workers <= 0) workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  const double timeout_s = options.timeout_s > 0 ? options.timeout_s : t.timeout_s;
  KILN_CHECK(timeout_s > 0, kOp, "the compile timeout must be positive, got ", timeout_s);
  std::vector<CompileResult> results(kernels.size());
  std::vector<std::string> paths(kernels.size());
  std::vector<size_t> misses;
  for (size_t i = 0; i < kernels.size(); ++i) {
    check_kernel(kernels[i]);
    if (options.use_cache) paths[i] = cache_path(kernels[i]);
    if (!paths[i].empty()) {
      const detail::CacheRead r = detail::read_cache_entry(paths[i], results[i].binary);
      if (r == detail::CacheRead::hit) {
        results[i].from_cache = true;
        ++g_disk_hits;
        continue;
      }
      if (r == detail::CacheRead::corrupt) ++g_corrupt;
    }
    misses.push_back(i);
  }
  if (misses.empty()) return results;
  const auto started = std::chrono::steady_clock::now();
  std::vector<protocol::Request> requests(misses.size());
  for (size_t m = 0; m < misses.size(); ++m) {
    const Kernel& k = kernels[misses[m]];
    protocol::Request& r = requests[m];
    r.output = output_name(k.output), r.name = k.name, r.source = k.source, r.options = nvrtc_options(k);
    for (const Header& h : k.headers) r.headers.emplace_back(h.name, h.text);
  }
  std::vector<detail::WorkerOutcome> outcomes(misses.size());
  if (options.isolate) {
    std::vector<detail::WorkerJob> jobs(misses.size());
    const std::string nvrtc = detail::nvrtc_library_path();
    for (size_t m = 0; m < misses.size(); ++m) {
      requests[m].nvrtc_path = nvrtc;
      jobs[m] = {kernels[misses[m]].name, protocol::encode_request(requests[m]), kernels[misses[m]].fault_for_tests};
    }
    outcomes = detail::run_in_workers(jobs, workers, timeout_s);
  } else {
    for (size_t m = 0; m < misses.size(); ++m) {
      const Kernel& k = kernels[misses[m]];
      KILN_CHECK(k.fault_for_tests == WorkerFault::none, kOp, "kernel '", k.name,
                 "': a worker fault needs an isolated compile (CompileOptions::isolate)");
      protocol::Response r = detail::compile_in_process(requests[m]);
      outcomes[m].ok = r.ok;
      if (r.ok) outcomes[m].binary = std::move(r.binary);
      else outcomes[m].error = "compiling kernel '" + k.name + "': NVRTC failed:\n" + r.log;
    }
  }
  for (size_t m = 0; m < misses.size(); ++m) {
    const size_t i = misses[m];
    detail::WorkerOutcome& o = outcomes[m];
    if (!o.ok) {
      ++g_failures;
      results[i].binary.clear();
      results[i].error = o.error.empty() ? "compiling kernel '" + kernels[i].name + "' failed" : o.error;
      continue;
    }
    ++g_compiles;
    results[i].binary = std::move(o.binary);
    if (!paths[i].empty()) detail::write_cache_entry(paths[i], results[i].binary);
  }
  g_compile_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return results;
}

std::string compile(const Kernel& kernel, const CompileOptions& options) {
  CompileResult r = std::move(compile_all({kernel}, options).front());
  if (!r.ok()) KILN_FAIL(kOp, r.error);
  return std::move(r.binary);
}

CompileStats compile_stats() {
  CompileStats s;
  s.disk_hits = g_disk_hits;
  s.compiles = g_compiles;
  s.compile_seconds = static_cast<double>(g_compile_ns.load()) * 1e-9;
  s.failures = g_failures;
  s.workers_started = detail::workers_started();
  s.corrupt_entries = g_corrupt;
  return s;
}

}  // namespace kiln::jit
