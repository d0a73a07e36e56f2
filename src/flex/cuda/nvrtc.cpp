// NVRTC compilation, the disk and memory caches, and module loading / launching through driver
// entry points obtained from the runtime (see nvrtc.h for why not a libcuda link).
#include "flex/cuda/nvrtc.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/tensor_map.h"
#include "core/embedded.h"
#include "core/env.h"
#include "kiln/error.h"

namespace kiln::flex::cuda {
namespace {

constexpr const char* kOp = "flex_attention";
constexpr const char* kMagic = "KILNCUBIN1";

std::atomic<int64_t> g_memory_hits{0}, g_disk_hits{0}, g_compiles{0};

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// 128 bits from two differently seeded FNV-1a passes: enough to name a handful of kernels.
std::string key_of(const std::string& text) {
  return hex64(fnv1a(text, 14695981039346656037ull)) + hex64(fnv1a(text, 0x9e3779b97f4a7c15ull));
}

// The embedded kernel sources (cmake/KilnEmbed.cmake), offered to every program as headers: the
// generated source #includes its parts by their names ("flex/cuda/wgmma.cuh").
struct Headers {
  std::vector<const char*> text, names;
  std::string key;  // of every header's name and text: part of the disk cache's key
};
const Headers& headers() {
  static const Headers h = [] {
    Headers r;
    std::string all;
    for (const kiln::detail::EmbeddedFile* f : kiln::detail::embedded_files()) {
      r.text.push_back(f->text.data());  // NUL-terminated
      r.names.push_back(f->name);
      all.append(f->name).append(1, '\0').append(f->text).append(1, '\0');
    }
    r.key = key_of(all);
    return r;
  }();
  return h;
}

#define KILN_NVRTC_CHECK(call)                                                                        \
  do {                                                                                                \
    nvrtcResult kiln_r_ = (call);                                                                     \
    if (kiln_r_ != NVRTC_SUCCESS) KILN_FAIL(kOp, #call, " failed: ", nvrtcGetErrorString(kiln_r_)); \
  } while (0)

// ---- driver entry points ----
using PfnLoad = CUresult (*)(CUmodule*, const void*);
using PfnGetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
using PfnSetAttr = CUresult (*)(CUfunction, CUfunction_attribute, int);
using PfnLaunch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void**, void**);
using PfnErrorString = CUresult (*)(CUresult, const char**);
using PfnOccupancy = CUresult (*)(int*, CUfunction, int, size_t);

struct Driver {
  PfnLoad load = nullptr;
  PfnGetFunction get_function = nullptr;
  PfnSetAttr set_attr = nullptr;
  PfnLaunch launch = nullptr;
  PfnErrorString error_string = nullptr;
  PfnOccupancy occupancy = nullptr;
};

void* entry(const char* name) { return kiln::cuda::driver_entry(name, kOp); }

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    r.load = reinterpret_cast<PfnLoad>(entry("cuModuleLoadData"));
    r.get_function = reinterpret_cast<PfnGetFunction>(entry("cuModuleGetFunction"));
    r.set_attr = reinterpret_cast<PfnSetAttr>(entry("cuFuncSetAttribute"));
    r.launch = reinterpret_cast<PfnLaunch>(entry("cuLaunchKernel"));
    r.error_string = reinterpret_cast<PfnErrorString>(entry("cuGetErrorString"));
    r.occupancy = reinterpret_cast<PfnOccupancy>(entry("cuOccupancyMaxActiveBlocksPerMultiprocessor"));
    return r;
  }();
  return d;
}

std::string driver_error(CUresult r) {
  const char* s = nullptr;
  if (driver().error_string) driver().error_string(r, &s);
  return s ? s : ("CUresult " + std::to_string(static_cast<int>(r)));
}

#define KILN_CU_CHECK(call)                                                                 \
  do {                                                                                      \
    CUresult kiln_r_ = (call);                                                              \
    if (kiln_r_ != CUDA_SUCCESS) KILN_FAIL(kOp, #call, " failed: ", driver_error(kiln_r_)); \
  } while (0)

bool read_cache_file(const std::string& path, std::string& cubin) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string magic;
  size_t size = 0;
  if (!std::getline(f, magic) || magic != kMagic || !(f >> size) || f.get() != '\n') return false;
  cubin.resize(size);
  if (!f.read(cubin.data(), static_cast<std::streamsize>(size))) return false;
  return f.peek() == std::char_traits<char>::eof();  // a truncated or padded file is not trusted
}

void write_cache_file(const std::string& path, const std::string& cubin) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return;
  static std::atomic<int> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f << kMagic << '\n' << cubin.size() << '\n';
    f.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
    if (!f) {
      f.close();
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, path, ec);  // atomic: readers see the old file or the whole new one
  if (ec) fs::remove(tmp, ec);
}

struct Loaded {
  CUmodule module[2] = {nullptr, nullptr};  // forward, backward
  FlexKernels k;
};
std::mutex g_mutex;
std::map<std::string, std::unique_ptr<Loaded>>& modules() {
  static std::map<std::string, std::unique_ptr<Loaded>> m;
  return m;
}

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  KILN_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string device_arch(int device) {
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  KILN_CHECK(major >= 8, kOp, "the CUDA kernels need compute capability 8.0 or newer (tensor-core bf16/fp16), got ",
             major, ".", minor);
  std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  if (major == 9 && minor == 0) arch += "a";
  return arch;
}

std::string compile_cubin(const std::string& source, const std::string& arch) {
  nvrtcProgram prog = nullptr;
  const Headers& h = headers();
  KILN_NVRTC_CHECK(nvrtcCreateProgram(&prog, source.c_str(), "kiln_flex.cu", static_cast<int>(h.text.size()),
                                      h.text.data(), h.names.data()));
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "-std=c++17", "-w"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    if (n) nvrtcGetProgramLog(prog, log.data());
    KILN_FAIL(kOp, "NVRTC could not compile the generated kernels for ", arch, ": ", nvrtcGetErrorString(r), "\n",
              log);
  }
  size_t size = 0;
  KILN_NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
  std::string cubin(size, '\0');
  KILN_NVRTC_CHECK(nvrtcGetCUBIN(prog, cubin.data()));
  ++g_compiles;
  return cubin;
}

std::string cache_path(const std::string& source, const std::string& arch) {
  const std::string dir = kiln::detail::cache_dir();
  if (dir.empty()) return "";
  const std::string key =
      key_of("nvrtc " + nvrtc_version() + "\narch " + arch + "\nheaders " + headers().key + "\n" + source);
  return dir + "/flex-" + key + ".cubin";
}

std::string cached_cubin(const std::string& source, const std::string& arch) {
  const std::string path = cache_path(source, arch);
  std::string cubin;
  if (!path.empty() && read_cache_file(path, cubin)) {
    ++g_disk_hits;
    return cubin;
  }
  cubin = compile_cubin(source, arch);
  if (!path.empty()) write_cache_file(path, cubin);
  return cubin;
}

CacheStats cache_stats() {
  CacheStats s;
  s.memory_hits = g_memory_hits;
  s.disk_hits = g_disk_hits;
  s.compiles = g_compiles;
  return s;
}

// load_kernels_by_id's map: caller id -> kernels (owned by modules(), or leaked by clear_kernel_cache).
std::map<std::string, const FlexKernels*>& kernels_by_id() {
  static std::map<std::string, const FlexKernels*> m;
  return m;
}

void clear_kernel_cache() {
  std::lock_guard<std::mutex> lock(g_mutex);
  kernels_by_id().clear();
  // Modules are deliberately leaked (not unloaded): a kernel may still be queued on a stream.
  for (auto& [key, loaded] : modules()) static_cast<void>(loaded.release());
  modules().clear();
}

const FlexKernels& load_kernels(const std::string& source, int device, int64_t fwd_smem, int64_t bwd_smem) {
  return load_kernels(source, source, device, fwd_smem, bwd_smem);
}

const FlexKernels& load_kernels(const std::string& fwd_source, const std::string& bwd_source, int device,
                                int64_t fwd_smem, int64_t bwd_smem) {
  const std::string key =
      key_of(fwd_source) + (fwd_source == bwd_source ? "" : "+" + key_of(bwd_source)) + "/" + std::to_string(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = modules().find(key);
  if (it != modules().end()) {
    ++g_memory_hits;
    return it->second->k;
  }
  kiln::cuda::DeviceGuard guard(device);
  KILN_CUDA_CHECK(cudaFree(nullptr));  // makes the device's primary context current
  const std::string arch = device_arch(device);
  const Driver& d = driver();
  // Two modules, forward and backward, compiled concurrently (first-call latency is the slower of
  // the two, not their sum; each part has its own disk-cache file).
  const std::string parts[2] = {"#define KILN_BUILD_FWD 1\n#define KILN_BUILD_BWD 0\n" + fwd_source,
                                "#define KILN_BUILD_FWD 0\n#define KILN_BUILD_BWD 1\n" + bwd_source};
  auto bwd_future = std::async(std::launch::async, [&] { return cached_cubin(parts[1], arch); });
  std::string cubins[2];
  cubins[0] = cached_cubin(parts[0], arch);
  cubins[1] = bwd_future.get();
  auto loaded = std::make_unique<Loaded>();
  for (int i = 0; i < 2; ++i) {
    if (d.load(&loaded->module[i], cubins[i].data()) != CUDA_SUCCESS) {
      cubins[i] = compile_cubin(parts[i], arch);  // a stale or foreign cache file: compile afresh
      KILN_CU_CHECK(d.load(&loaded->module[i], cubins[i].data()));
      const std::string path = cache_path(parts[i], arch);
      if (!path.empty()) write_cache_file(path, cubins[i]);
    }
  }
  auto get = [&](int part, const char* name, int64_t smem) {
    CUfunction f = nullptr;
    KILN_CU_CHECK(d.get_function(&f, loaded->module[part], name));
    if (smem > 0) KILN_CU_CHECK(d.set_attr(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)));
    return static_cast<void*>(f);
  };
  loaded->k.fwd = get(0, "flex_fwd", fwd_smem);
  loaded->k.bwd_pre = get(1, "flex_bwd_pre", 0);
  loaded->k.bwd_dq = get(1, "flex_bwd_dq", bwd_smem);
  loaded->k.bwd_dkdv = get(1, "flex_bwd_dkdv", bwd_smem);
  loaded->k.capgrad_reduce = get(1, "flex_capgrad_reduce", 0);
  loaded->k.mask_bits = get(0, "flex_mask_bits", 0);
  const FlexKernels& out = loaded->k;
  modules().emplace(key, std::move(loaded));
  return out;
}

const FlexKernels& load_kernels_by_id(const std::string& id, const std::function<SourcePair()>& sources, int device,
                                      int64_t fwd_smem, int64_t bwd_smem) {
  const std::string key = id + "/" + std::to_string(device) + "/" + std::to_string(fwd_smem) + "/" +
                          std::to_string(bwd_smem);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = kernels_by_id().find(key);
    if (it != kernels_by_id().end()) {
      ++g_memory_hits;
      return *it->second;
    }
  }
  const SourcePair src = sources();
  const FlexKernels& k = load_kernels(src.first, src.second, device, fwd_smem, bwd_smem);
  std::lock_guard<std::mutex> lock(g_mutex);
  // Ids are new with every compiled mod (a training step's fresh document mask): keep the map
  // bounded; a forgotten id costs one generate_source and a module-cache hit.
  if (kernels_by_id().size() >= 4096) kernels_by_id().clear();
  kernels_by_id().emplace(key, &k);
  return k;
}

void encode_tile_map(void* map, const void* base, bool bf16, int64_t outer, int64_t rows, int64_t cols, int box_rows) {
  KILN_CHECK(cols == 64 || cols == 128, kOp, "TMA tiles take 64 or 128 columns, got ", cols);
  kiln::cuda::encode_tensor_map(map, bf16 ? kiln::cuda::MapElem::BFloat16 : kiln::cuda::MapElem::Float16, base, 3,
                                outer, rows, cols, 64, box_rows, kOp);
}

int max_active_blocks(void* function, int block, int64_t smem) {
  int n = 0;
  KILN_CU_CHECK(driver().occupancy(&n, static_cast<CUfunction>(function), block, static_cast<size_t>(smem)));
  return n;
}

void launch(void* function, int64_t grid, int block, int64_t smem, void* stream, void* params) {
  if (grid <= 0) return;
  KILN_CHECK(grid <= 0x7fffffff, kOp, "too many CUDA blocks: ", grid);
  void* args[] = {params};
  KILN_CU_CHECK(driver().launch(static_cast<CUfunction>(function), static_cast<unsigned>(grid), 1, 1,
                                static_cast<unsigned>(block), 1, 1, static_cast<unsigned>(smem),
                                static_cast<CUstream>(stream), args, nullptr));
}

}  // namespace kiln::flex::cuda
