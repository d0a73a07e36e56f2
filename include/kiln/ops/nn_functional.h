#pragma once
// Neural-network functions (torch.nn.functional names). Statistics (softmax max/sum, rms) are
// computed in fp32 for 16-bit inputs; outputs take the input dtype.
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "kiln/tensor.h"

namespace kiln {

// x: any, softmax along dim -> x's shape
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

namespace nn::functional {

// indices: [...] int64/int32, weight: [num_embeddings, dim] -> [..., dim]
Tensor embedding(const Tensor& indices, const Tensor& weight);
// x: [..., H], weight: [H] (x's dtype and device) or undefined -> [..., H];
// y = x / sqrt(mean(x^2) + eps) * weight. One fused kernel each way; rstd per row is kept in fp32
// (fp64 for fp64) for backward; the weight gradient is reduced in a fixed order (no atomics).
// out_dtype: y's dtype (default x's), e.g. bf16 for the GEMM that reads y under autocast: the
// statistics stay in fp32 and the cast is folded into the kernel (on CUDA) instead of a pass of
// its own each way.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6,
                std::optional<DType> out_dtype = std::nullopt);
// The residual add and the norm after it: x, residual: [..., H] -> {h = x + residual,
// rms_norm(h, weight, eps, out_dtype)}, h in the promoted dtype (under autocast fp32; a bf16
// residual is read as it is). One pass forward and one backward: the gradient of h and the norm's
// are added in the dx pass, which on CUDA also writes the residual's gradient in its own dtype.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                       double eps = 1e-6, std::optional<DType> out_dtype = std::nullopt);
// SwiGLU's gate: silu(gate) * up, gate and up of one shape and dtype. One fused pass each way on
// the CPU and on CUDA.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// Rotary position embedding, half-split convention (rotate_half, as in Llama/NeoX):
// x: [B, T, H, D], cos/sin: [T, D/2] -> [B, T, H, D]
//   out[..., i] = x_i cos - x_{i+D/2} sin,  out[..., i+D/2] = x_{i+D/2} cos + x_i sin   (i < D/2)
// cos/sin are constants (requesting their gradient raises); the backward rotates by -theta.
Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin);
// A fused attention projection split into rotated q, k and plain v with heads first, the layout
// attention kernels take: qkv [B, T, 3, H, D] (contiguous), cos/sin [T, D/2] ->
// {q, k, v}, each [B, H, T, D] contiguous; q and k rotated exactly as apply_rotary_emb rotates
// them. One read and one write each way (the backward writes dqkv once), instead of select +
// rotary + transpose + contiguous per tensor and three zero-padded slice gradients.
std::tuple<Tensor, Tensor, Tensor> qkv_rotary_split(const Tensor& qkv, const Tensor& cos, const Tensor& sin);
// cos/sin tables for positions [0, T): each [T, D/2] fp32 (computed in fp64 on the host), angle
// t * theta^(-2i/D), on `device`.
std::pair<Tensor, Tensor> rotary_tables(int64_t T, int64_t D, double theta = 10000.0, Device device = kCPU);

enum class Reduction { Mean, Sum, None };

struct CrossEntropyOptions {
  Tensor weight;              // [C] class weights, optional
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  double label_smoothing = 0.0;
};
// Unfused reference: logits [N, C], target [N] int64/int32 -> [] (mean/sum) or [N] (none), in the
// logits' dtype; logsumexp in fp32 (fp64 for fp64). PyTorch's semantics: loss_i =
// (1 - ls) w[t_i] (lse_i - x_i[t_i]) + ls / C sum_c w[c] (lse_i - x_i[c]); ignored rows give 0;
// mean divides by the sum of the non-ignored targets' weights (all ignored: nan). Deterministic.
// A target outside [0, C) that is not ignore_index raises (on CUDA this reads a device flag, a sync).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// Zeroes each element with probability p and scales the rest by 1/(1-p). The mask comes from the
// global Philox generator (one seed gives the same mask on the CPU and CUDA) and is regenerated
// in backward, never stored. p = 0 or training = false return x itself; p = 1 gives zeros.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

using kiln::gelu;
using kiln::linear;
using kiln::log_softmax;
using kiln::relu;
using kiln::silu;
using kiln::softmax;

}  // namespace nn::functional
}  // namespace kiln
