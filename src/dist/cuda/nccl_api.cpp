#ifdef KILN_WITH_NCCL
#include "dist/cuda/nccl_api.h"

#include <dlfcn.h>
#include <link.h>

#include <mutex>

#include <memory>

#include "kiln/error.h"

namespace kiln::dist::detail {

namespace {

void* open_nccl(std::string& tried) {
  // RTLD_NOLOAD: an NCCL some other library (torch) already brought into the process.
  if (void* h = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) return h;
  for (const char* name : {"libnccl.so.2", KILN_NCCL_LIBRARY_PATH}) {
    if (void* h = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return h;
    const char* why = ::dlerror();
    tried += ::kiln::detail::str_cat("\n  ", name, ": ", why ? why : "not found");
  }
  return nullptr;
}

template <typename Fn>
void resolve(void* handle, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, symbol));
  if (!fn) KILN_FAIL("nccl", "the NCCL library loaded lacks ", symbol, " (kiln needs NCCL 2.27 or newer)");
}

NcclApi load() {
  std::string tried;
  void* h = open_nccl(tried);
  if (!h) KILN_FAIL("nccl", "cannot load the NCCL library (libnccl.so.2); tried:", tried);
  NcclApi api;
  resolve(h, api.GetVersion, "ncclGetVersion");
  resolve(h, api.GetErrorString, "ncclGetErrorString");
  resolve(h, api.GetLastError, "ncclGetLastError");
  resolve(h, api.GetUniqueId, "ncclGetUniqueId");
  resolve(h, api.CommInitRankConfig, "ncclCommInitRankConfig");
  resolve(h, api.CommSplit, "ncclCommSplit");
  resolve(h, api.CommShrink, "ncclCommShrink");
  resolve(h, api.CommFinalize, "ncclCommFinalize");
  resolve(h, api.CommDestroy, "ncclCommDestroy");
  resolve(h, api.CommAbort, "ncclCommAbort");
  resolve(h, api.CommGetAsyncError, "ncclCommGetAsyncError");
  resolve(h, api.GroupStart, "ncclGroupStart");
  resolve(h, api.GroupEnd, "ncclGroupEnd");
  resolve(h, api.AllReduce, "ncclAllReduce");
  resolve(h, api.AllGather, "ncclAllGather");
  resolve(h, api.ReduceScatter, "ncclReduceScatter");
  resolve(h, api.Broadcast, "ncclBroadcast");
  resolve(h, api.Send, "ncclSend");
  resolve(h, api.Recv, "ncclRecv");
  const link_map* map = nullptr;
  if (::dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) api.path = map->l_name;
  return api;
}

}  // namespace

const NcclApi& nccl() {
  // Not a function-local static: a failed load raises again on the next call instead of once.
  static std::mutex mu;
  static std::unique_ptr<NcclApi> api;
  std::lock_guard<std::mutex> lock(mu);
  if (!api) api = std::make_unique<NcclApi>(load());
  return *api;
}

}  // namespace kiln::dist::detail

namespace kiln::dist {
std::string nccl_version() {
  int code = 0;
  const ncclResult_t r = detail::nccl().GetVersion(&code);
  if (r != ncclSuccess) KILN_FAIL("nccl_version", "ncclGetVersion failed: ", detail::nccl().GetErrorString(r));
  return ::kiln::detail::str_cat(code / 10000, ".", code / 100 % 100, ".", code % 100);
}
}  // namespace kiln::dist
#endif
