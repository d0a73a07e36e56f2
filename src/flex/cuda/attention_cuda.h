#pragma once
// CUDA FlexAttention entry points (host side of the NVRTC-compiled kernels). No CUDA headers:
// api.cpp includes this and calls through KILN_CUDA_ONLY. A call decides its plan once
// (kernel_config.h: block_plan_for, then plan_for) and hands it to make_state.
#include <memory>
#include <vector>

#include "flex/cpu/attention.h"
#include "flex/cuda/kernel_config.h"

namespace kiln::flex::cuda {

// Throws kiln::Error naming flex_attention when CUDA cannot run the problem (dtype, head dims,
// BlockMask block sizes); the CPU handles those.
void check_supported(const cpu::Problem& p, DType dtype);

// The compute capability major of `device` (the plan's rules take it).
int device_major(int device);

// Device copies of the captured tensors and the compiled kernels for one call, made for `plan`
// (plan_for of the same problems); shared by the forward and its backward. p: the backward's
// problem, its BlockMask pointers device pointers; fwd_p: the forward's where plan.separate_forward
// (the same mods, lengths and heads on the caller's BlockMask), else null.
struct State;
std::shared_ptr<State> make_state(const cpu::Problem& p, const cpu::Problem* fwd_p, DType dtype, Device device,
                                  const Plan& plan);

// q [B, Hq, L, E], k, v [B, Hkv, S, E] contiguous on the device -> out, lse (fp32). Returns false
// when a mod read a captured tensor out of range (only checked when a mod reads tensors).
bool forward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse);

// dout / dlse may be undefined. cap_grads: one CPU double vector per score_mod buffer, sized to the
// buffer where its gradient is wanted (filled), empty otherwise. Returns false on an index error.
bool backward(const State& st, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dlse, Tensor& dq, Tensor& dk, Tensor& dv,
              std::vector<std::vector<double>>& cap_grads);

}  // namespace kiln::flex::cuda
