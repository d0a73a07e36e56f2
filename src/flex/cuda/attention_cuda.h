#pragma once
// CUDA FlexAttention entry points (host side of the NVRTC-compiled kernels). No CUDA headers:
// api.cpp includes this and calls through KILN_CUDA_ONLY.
#include <memory>
#include <vector>

#include "flex/cpu/attention.h"

namespace kiln::flex::cuda {

// Throws kiln::Error naming flex_attention when CUDA cannot run the problem (dtype, head dims,
// BlockMask block sizes); the CPU handles those.
void check_supported(const cpu::Problem& p, DType dtype);

// Whether p (a BlockMask of 128 x 128 blocks with a mask) should run at 64-blocks instead: on rows
// short enough that the forward takes 64 x 64 tiles anyway, a 64-block mask drops the empty halves
// of its partial blocks from every kernel's walk. KILN_FLEX_HALVE_BLOCKS=0 keeps the caller's.
bool halve_blocks(const cpu::Problem& p, int device);

// Whether the kernels should walk p's BlockMask as one merged list a row (the default;
// KILN_FLEX_MERGED_WALK=0 walks the two lists; the caller then fills p's kv_all_* / q_all_* from
// detail::merge_block_lists).
bool merged_walk(const cpu::Problem& p);

// Whether the forward of p (a 128 x 128-block mask that halve_blocks would halve) should run on
// these blocks, the backward alone on the halved ones: the persistent forward's 128 x 128 tiles
// (short rows at E = 128, a mask that reads no tensors, no score_mod; KILN_FLEX_FWD_PERSIST=0 turns
// it off).
bool forward_keeps_blocks(const cpu::Problem& p, int device);

// Device copies of the captured tensors and the compiled kernels for one call; shared by the
// forward and its backward. p's BlockMask pointers must be device pointers. fwd_p (optional): the
// forward's problem where it runs on another BlockMask than p's (forward_keeps_blocks), the same
// mods, lengths and heads.
struct State;
std::shared_ptr<State> make_state(const cpu::Problem& p, DType dtype, Device device,
                                  const cpu::Problem* fwd_p = nullptr);

// q [B, Hq, L, E], k, v [B, Hkv, S, E] contiguous on the device -> out, lse (fp32). Returns false
// when a mod read a captured tensor out of range (only checked when a mod reads tensors).
bool forward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse);

// dout / dlse may be undefined. cap_grads: one CPU double vector per score_mod buffer, sized to the
// buffer where its gradient is wanted (filled), empty otherwise. Returns false on an index error.
bool backward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dlse, Tensor& dq, Tensor& dk, Tensor& dv,
              std::vector<std::vector<double>>& cap_grads);

}  // namespace kiln::flex::cuda
