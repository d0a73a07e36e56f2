#pragma once
// The GPT's loss computed from its parameters with the unfused ops (rms_norm, a separate residual
// add, silu(gate) * up): the reference the fused model (apps/train/model.cpp: add_rms_norm,
// swiglu) is checked against in tests/train and timed against in bench/bench_fusions.cpp. No
// dropout, no sharding; under autocast the norms give fp32 and each linear casts, as in PyTorch.
#include <map>
#include <string>

#include "kiln/flex.h"
#include "kiln/lce.h"
#include "kiln/ops.h"
#include "model.h"

namespace kiln::train::testing {

inline Tensor unfused_gpt_loss(const GPT& model, const Tensor& idx, const Tensor& target, const flex::BlockMask& mask) {
  namespace F = kiln::nn::functional;
  const ModelConfig& c = model.config();
  std::map<std::string, Tensor> p;
  for (const auto& [name, t] : model.named_parameters()) p[name] = t;
  const int64_t B = idx.size(0), T = idx.size(1), H = c.n_heads, Dh = c.head_dim();
  auto [cos, sin] = F::rotary_tables(T, Dh, c.rope_theta, p.at("tok_emb").device());
  Tensor x = F::embedding(idx, p.at("tok_emb"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto w = [&](const char* n) { return p.at("blocks." + std::to_string(l) + "." + n); };
    const Tensor a = F::rms_norm(x, w("attn_norm"), c.norm_eps);
    auto [q, k, v] = F::qkv_rotary_split(linear(a, w("wqkv")).view({B, T, 3, H, Dh}), cos, sin);
    flex::FlexOptions fo;
    fo.block_mask = &mask;
    const Tensor o = flex::flex_attention(q, k, v, fo).out.transpose(1, 2).reshape({B, T, c.dim});
    const Tensor h = x + linear(o, w("wo"));
    const Tensor m = F::rms_norm(h, w("mlp_norm"), c.norm_eps);
    x = h + linear(silu(linear(m, w("w_gate"))) * linear(m, w("w_up")), w("w_down"));
  }
  const Tensor h = F::rms_norm(x, p.at("final_norm"), c.norm_eps);
  F::LinearCrossEntropyOptions o;
  o.ignore_index = -100;
  return F::linear_cross_entropy_with_stats(h.reshape({-1, c.dim}), p.at("tok_emb"), target.reshape({-1}), o).loss;
}

}  // namespace kiln::train::testing
