// NVRTC compilation (through kiln::jit: worker processes and its disk cache), the memory cache, and
// module loading / launching through driver entry points obtained from the runtime (see nvrtc.h for
// why not a libcuda link).
#include "flex/cuda/nvrtc.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/tensor_map.h"
#include "jit/cache.h"
#include "kiln/error.h"
#include "kiln/jit.h"

namespace kiln::flex::cuda {
namespace {

constexpr const char* kOp = "flex_attention";

std::atomic<int64_t> g_memory_hits{0}, g_disk_hits{0}, g_compiles{0};

// 128 bits of hash naming a module in the memory cache.
std::string key_of(const std::string& text) { return jit::detail::hash_hex(text); }

// A generated source as a kiln::jit kernel: the embedded kernel sources (cmake/KilnEmbed.cmake) are
// its headers, #included by their names ("flex/cuda/wgmma.cuh").
jit::Kernel flex_kernel(const std::string& source, const std::string& arch) {
  jit::Kernel k;
  k.name = "kiln_flex.cu";
  k.source = source;
  k.arch = arch;
  k.options = {"-std=c++17", "-w"};
  k.headers = jit::embedded_headers();
  return k;
}

// One compile through kiln::jit (a worker process; the disk cache when use_cache).
jit::CompileResult compile_through_jit(const std::string& source, const std::string& arch, bool use_cache) {
  jit::CompileOptions o;
  o.use_cache = use_cache;
  jit::CompileResult r = std::move(jit::compile_all({flex_kernel(source, arch)}, o).front());
  if (!r.ok()) KILN_FAIL(kOp, "NVRTC could not compile the generated kernels for ", arch, ": ", r.error);
  ++(r.from_cache ? g_disk_hits : g_compiles);
  return r;
}

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

std::string nvrtc_version() { return jit::nvrtc_version(); }

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
  return compile_through_jit(source, arch, false).binary;
}

std::string cache_path(const std::string& source, const std::string& arch) {
  return jit::cache_path(flex_kernel(source, arch));
}

std::string cached_cubin(const std::string& source, const std::string& arch) {
  return compile_through_jit(source, arch, true).binary;
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
  std::vector<jit::CompileResult> compiled = jit::compile_all({flex_kernel(parts[0], arch), flex_kernel(parts[1], arch)});
  auto loaded = std::make_unique<Loaded>();
  for (int i = 0; i < 2; ++i) {
    const jit::CompileResult& r = compiled[i];
    if (!r.ok()) KILN_FAIL(kOp, "NVRTC could not compile the generated kernels for ", arch, ": ", r.error);
    ++(r.from_cache ? g_disk_hits : g_compiles);
    if (d.load(&loaded->module[i], r.binary.data()) != CUDA_SUCCESS) {
      // A cache file the driver rejects (written by another driver): compile afresh, replacing it.
      std::error_code ec;
      std::filesystem::remove(cache_path(parts[i], arch), ec);
      const std::string cubin = cached_cubin(parts[i], arch);
      KILN_CU_CHECK(d.load(&loaded->module[i], cubin.data()));
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
