#pragma once
// NCCL's entry points, resolved from libnccl.so.2 when a process first makes an NCCL communicator
// rather than linked into libkiln. A process that imports kiln and then torch (each built against its
// own NCCL) then loads one NCCL, not kiln's older copy that torch's libraries find lacking a symbol;
// where torch came first, kiln uses the NCCL it loaded.
#include <nccl.h>

#include <string>

namespace kiln::dist::detail {

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion;
  decltype(&::ncclGetErrorString) GetErrorString;
  decltype(&::ncclGetLastError) GetLastError;
  decltype(&::ncclGetUniqueId) GetUniqueId;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&::ncclCommSplit) CommSplit;
  decltype(&::ncclCommShrink) CommShrink;
  decltype(&::ncclCommFinalize) CommFinalize;
  decltype(&::ncclCommDestroy) CommDestroy;
  decltype(&::ncclCommAbort) CommAbort;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&::ncclGroupStart) GroupStart;
  decltype(&::ncclGroupEnd) GroupEnd;
  decltype(&::ncclAllReduce) AllReduce;
  decltype(&::ncclAllGather) AllGather;
  decltype(&::ncclReduceScatter) ReduceScatter;
  decltype(&::ncclBroadcast) Broadcast;
  decltype(&::ncclSend) Send;
  decltype(&::ncclRecv) Recv;
  std::string path;  // the file the entry points came from
};

// Loads NCCL once (an NCCL already in the process first, then libnccl.so.2 on the loader's path,
// then the library found at configure time) and returns its entry points. Raises kiln::Error naming
// the library or the missing symbol.
const NcclApi& nccl();

}  // namespace kiln::dist::detail
