#pragma once
// The GPT: token embedding -> N x [RMSNorm -> attention (rotary, FlexAttention with a causal +
// document (+ sliding window) mask) -> residual, RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm ->
// output projection tied to the embedding, fused with the loss (LinearCrossEntropyLoss).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/flex.h"
#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::train {

// Defaults = the "tiny" preset: ~250k parameters, sized for a few minutes on 2 CPU cores (about
// compute-optimal for that budget: a wider model learned less in the same time).
struct ModelConfig {
  int64_t vocab_size = 512;
  int64_t dim = 64;
  int64_t n_layers = 4;
  int64_t n_heads = 2;
  int64_t mlp_hidden = 0;      // 0: 8/3 dim rounded up to a multiple of 32
  int64_t seq_len = 128;
  int64_t sliding_window = 0;  // 0: none
  // BlockMask block size in tokens (0: 128 from 512 tokens, else 64). Run-time only: not saved
  // with checkpoints; CUDA runs its kernels on multiples of 64 (others take the CPU kernels).
  int64_t mask_block = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double dropout = 0.0;        // on the embedding and the residual branches (training mode only)
  int64_t hidden() const { return mlp_hidden > 0 ? mlp_hidden : (8 * dim / 3 + 31) / 32 * 32; }
  int64_t head_dim() const { return dim / n_heads; }
};

// Named presets: "tiny" (the default CPU run), "micro" (tests), "small", "gpt125m" (12 layers,
// d 768, 12 heads, 128k vocabulary, sequence 4096: the GPU benchmark's model; "gpt-125m" is an
// alias).
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

class Block : public nn::Module {
 public:
  Block(const ModelConfig& c, int64_t layer);
  // x: the residual stream [B, T, D]; branch: the previous block's MLP output [B, T, D], not yet
  // added (undefined for the first block) -> {the stream after attention, this block's MLP
  // output}, both [B, T, D]; the next block's norm (or the final norm) adds them.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& branch, const Tensor& cos, const Tensor& sin,
                                    const flex::BlockMask& mask);
  std::string type_name() const override { return "Block"; }

 private:
  // The dtype the norms write their outputs in: autocast's when it is on for x's device.
  static std::optional<DType> gemm_input_dtype(const Tensor& x);
  friend class GPT;
  ModelConfig c_;
  Tensor &attn_norm, &wqkv, &wo, &mlp_norm, &w_gate, &w_up, &w_down;
};

class GPT : public nn::Module {
 public:
  explicit GPT(const ModelConfig& c);
  const ModelConfig& config() const { return c_; }

  // The mask for a batch: causal & same document (& sliding window). doc_ids: [B, T] int32.
  flex::BlockMask block_mask(const Tensor& doc_ids) const;
  // Final hidden states: idx [B, T] int64 -> [B, T, D] (in the autocast dtype under autocast: the
  // head is a GEMM)
  Tensor hidden(const Tensor& idx, const flex::BlockMask& mask);
  // Mean cross-entropy over non-ignored targets (fused projection + loss; logits never built).
  Tensor loss(const Tensor& idx, const Tensor& target, const Tensor& doc_ids);
  // The same with the batch's block mask built beforehand (block_mask(doc_ids)).
  Tensor loss(const Tensor& idx, const Tensor& target, const flex::BlockMask& mask);
  // Logits of the last position of a single sequence: idx [1, T] -> [V]
  Tensor last_logits(const Tensor& idx);

  Tensor& tok_emb;
  Tensor& final_norm;
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }

 private:
  Tensor unsharded_loss(const Tensor& idx, const Tensor& target, const flex::BlockMask& mask);
  ModelConfig c_;
  std::vector<std::shared_ptr<Block>> blocks_;
  Tensor& cos_;  // rotary tables, registered as buffers so module.to(device) moves them
  Tensor& sin_;
};

}  // namespace kiln::train
