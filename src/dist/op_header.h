#pragma once
// The input-check header: what a rank is about to do, all-gathered before each collective (and
// swapped between the two ranks of a send / recv) so ranks that disagree fail together.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dist.h"

namespace kiln::dist::detail {

enum HeaderWord { kMagic, kSeq, kOpCode, kDType, kInNumel, kOutNumel, kRoot, kRedOp, kRejected, kHeaderWords };
constexpr int64_t kHeaderMagic = 0x6b696c6e;  // "kiln"

enum class OpCode : int64_t {
  kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kBarrier, kSend, kRecv
};

inline std::vector<int64_t> make_header(OpCode code, int dtype, int64_t in_numel, int64_t out_numel, int root,
                                        int reduce_op) {
  std::vector<int64_t> h(kHeaderWords, 0);
  h[kMagic] = kHeaderMagic;
  h[kOpCode] = static_cast<int64_t>(code);
  h[kDType] = dtype;
  h[kInNumel] = in_numel;
  h[kOutNumel] = out_numel;
  h[kRoot] = root;
  h[kRedOp] = reduce_op;
  return h;
}

// "all_reduce(sum) float32 numel 1024" for messages.
std::string describe_header(const int64_t* h);

}  // namespace kiln::dist::detail
