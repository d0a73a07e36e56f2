#pragma once
// Fused linear cross-entropy: the vocabulary projection z = x W^T (+ b) and the cross-entropy on
// it in one op that never materialises the [tokens, vocab] logits (torch.nn.LinearCrossEntropyLoss,
// with what PyTorch lacks: z-loss, logit soft-capping, a memory/speed strategy switch, extra
// outputs for logging).
//
// Semantics (PyTorch's cross_entropy on s = softcap(z), softcap(z) = c * tanh(z / c) when c > 0):
//   lse_n  = logsumexp_v s_nv
//   loss_n = (1 - eps) * w_y * (lse_n - s_ny) + (eps / V) * sum_v w_v * (lse_n - s_nv)
//            (w = class weights, or 1), 0 for tokens whose target == ignore_index
//   z_n    = z_loss * lse_n^2 for non-ignored tokens (PaLM's auxiliary loss)
//   reduction none: loss_n + z_n per token;  sum: sum_n loss_n + sum_n z_n;
//   mean: sum_n loss_n / sum_n w_{y_n} + sum_n z_n / count   (sums over non-ignored tokens).
// The loss comes back in fp32 (fp64 for fp64 inputs) whatever the input dtype: the kernels sum in
// fp32, and a bf16 loss of ~12 would carry only 2-3 digits; loss_in_input_dtype rounds it to the
// input's dtype instead (as torch's unfused cross_entropy on bf16 logits returns it).
// use_token_scaling (Liger-Kernel's): each token's loss_n + z_n is multiplied by its detached
// probability of the target, p_n = exp(s_ny - lse_n), which also scales its gradient.
// return_predicted_tokens: argmax_v s_nv per token (the first maximum), -1 for ignored tokens;
// return_token_accuracy: the fraction of non-ignored tokens whose argmax is the target (mean/sum;
// NaN when every target is ignored), or per token 1/0 (none; 0 for ignored tokens). Both come from
// the row maxima the logsumexp already finds, without the logits.
// The z-loss term of `mean` divides by the NUMBER of non-ignored tokens, not by the class-weight
// sum: it is a per-token regulariser of the normaliser, independent of class weights. With every
// target ignored, mean gives NaN (0 / 0), as PyTorch does.
//
// Strategies (both bitwise deterministic run to run, and on the CPU for any thread count):
//   memory: the forward keeps only lse [N] (fp32) for backward; the backward recomputes logit tiles
//           (about four GEMMs). Working memory: one [chunk_tokens, chunk_vocab] tile, one
//           [chunk_vocab, H] fp32 weight-gradient slice (only when the tokens span several
//           chunks) and one [N, H] fp32 input-gradient accumulator (16-bit inputs); never
//           anything of size N * V. CUDA default tile: up to 8192 tokens x the widest
//           vocabulary slice that keeps the working memory within N*H*4 + 128 MiB.
//   speed:  (reductions mean/sum) the forward computes the gradients too, per [chunk_tokens, V]
//           logit chunk (three GEMMs); backward only scales them by the upstream gradient.
//           On CUDA, dW of 16-bit weights is summed over the chunks in the weight's dtype (one
//           rounding per chunk; the memory strategy rounds once); on the CPU in a fp32
//           accumulator. reduction none always uses memory.
//   auto:   speed when gradients are needed, the reduction is mean/sum and a chunk of at least
//           kMinSpeedChunk tokens (plus, on the CPU, a V x H fp32 accumulator for 16-bit weights)
//           fits memory_budget; memory otherwise (and always without gradients: the forward is
//           then one GEMM pass).
// On CUDA the logit tiles of 16-bit inputs are in the input dtype (each logit rounded once, as
// torch's linear rounds it): twice the tokens per budget of fp32 tiles.
#include <cstdint>

#include "kiln/ops.h"  // nn_functional.h (Reduction) needs the other op headers
#include "kiln/tensor.h"

namespace kiln::nn {
namespace functional {

enum class LceStrategy { Auto, Memory, Speed };

struct LinearCrossEntropyOptions {
  Tensor linear_bias;                 // [V], x's dtype, optional
  Tensor weight;                      // [V] class weights (any floating dtype), optional
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;       // eps in [0, 1]
  double z_loss = 0.0;                // coefficient of lse^2, >= 0
  double logit_softcap = 0.0;         // c > 0 soft-caps the logits; 0 turns it off
  LceStrategy strategy = LceStrategy::Auto;
  int64_t chunk_tokens = 0;           // 0: chosen from the shapes and the device
  int64_t chunk_vocab = 0;            // 0: chosen (memory strategy's V-tile)
  int64_t memory_budget = 0;          // bytes auto/speed may use for working buffers; 0: 32 MiB
                                      // on the CPU, 768 MiB on CUDA
  bool loss_in_input_dtype = false;   // loss in the input's dtype instead of fp32 (fp64)
  bool use_token_scaling = false;     // loss_n, z_n times detached p(target) (Liger's token scaling)
  bool return_token_accuracy = false;     // fill LinearCrossEntropyResult::token_accuracy
  bool return_predicted_tokens = false;   // fill LinearCrossEntropyResult::predicted_tokens
};

struct LinearCrossEntropyResult {
  Tensor loss;    // [] (mean/sum) or target's shape (none), fp32 (fp64 for fp64 inputs; the input's
                  // dtype with loss_in_input_dtype); differentiable
  Tensor lse;     // target's shape, fp32 (fp64 for fp64 inputs), detached, every token
  Tensor z_loss;  // the z-loss term included in `loss`, reduced like it; fp32 (fp64), detached
  Tensor token_accuracy;    // with return_token_accuracy: [] (mean/sum) or target's shape (none), fp32
  Tensor predicted_tokens;  // with return_predicted_tokens: target's shape int64, -1 where ignored
  LceStrategy strategy = LceStrategy::Memory;  // the strategy that ran
  int64_t chunk_tokens = 0, chunk_vocab = 0;   // its logit tile: tokens x classes (speed: all V)
};

// input: [N, H] or [B, T, H]; linear_weight: [V, H] (input's dtype and device);
// target: [N] / [B, T] int64 or int32, values in [0, V) or ignore_index
//   -> loss: [] for mean/sum, target's shape for none (fp32; fp64 for fp64 input).
// Gradients flow to input, linear_weight and options.linear_bias (in their dtypes).
// On CUDA an out-of-range target is not checked on the host (that would synchronise): it makes
// the loss NaN instead.
Tensor linear_cross_entropy(const Tensor& input, const Tensor& linear_weight, const Tensor& target,
                            const LinearCrossEntropyOptions& options = {});
// The same, with the per-token logsumexp and the z-loss term for logging.
LinearCrossEntropyResult linear_cross_entropy_with_stats(const Tensor& input, const Tensor& linear_weight,
                                                         const Tensor& target,
                                                         const LinearCrossEntropyOptions& options = {});

}  // namespace functional

// The loss as a module owning (or sharing) the projection. Standalone for now (no nn::Module
// base yet): parameters() lists what an optimizer should update.
class LinearCrossEntropyLoss {
 public:
  // weight [num_classes, in_features] and optional bias [num_classes], drawn like nn.Linear
  // (uniform in +-1/sqrt(in_features)), requires_grad.
  LinearCrossEntropyLoss(int64_t in_features, int64_t num_classes, bool bias = false,
                         functional::LinearCrossEntropyOptions options = {}, TensorOptions tensor_options = {});
  // Ties the projection to an existing parameter (e.g. the token embedding [V, H]): no copy, so
  // gradients from both uses accumulate into the one tensor.
  static LinearCrossEntropyLoss tied(const Tensor& weight, const Tensor& bias = Tensor(),
                                     functional::LinearCrossEntropyOptions options = {});

  // input: [N, H] or [B, T, H]; target: [N] / [B, T] -> loss
  Tensor forward(const Tensor& input, const Tensor& target) const;
  Tensor operator()(const Tensor& input, const Tensor& target) const { return forward(input, target); }
  functional::LinearCrossEntropyResult forward_with_stats(const Tensor& input, const Tensor& target) const;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  std::vector<Tensor> parameters() const;
  functional::LinearCrossEntropyOptions& options() { return options_; }
  const functional::LinearCrossEntropyOptions& options() const { return options_; }

 private:
  LinearCrossEntropyLoss() = default;
  Tensor weight_, bias_;
  functional::LinearCrossEntropyOptions options_;
};

}  // namespace kiln::nn
