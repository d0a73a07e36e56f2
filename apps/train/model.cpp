// The GPT built from kiln ops. Weights: N(0, 0.02) for the embedding (its scale sets the initial
// logits of the tied head, so the first loss is close to ln V), nn.Linear's uniform bound for the
// projections, with the residual outputs (wo, w_down) scaled by 1/sqrt(2 n_layers) as in GPT-2.
#include "model.h"

#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "kiln/autocast.h"
#include "kiln/autograd.h"
#include "kiln/fsdp.h"
#include "kiln/lce.h"
#include "kiln/ops.h"
#include "profile.h"

namespace kiln::train {
namespace F = kiln::nn::functional;

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") return c;
  if (name == "micro") {  // tests
    c.vocab_size = 300, c.dim = 32, c.n_layers = 2, c.n_heads = 2, c.seq_len = 32;
    return c;
  }
  if (name == "small") {
    c.vocab_size = 4096, c.dim = 384, c.n_layers = 6, c.n_heads = 6, c.seq_len = 512;
    return c;
  }
  if (name == "gpt125m" || name == "gpt-125m") {
    c.vocab_size = 131072, c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.seq_len = 4096;  // SwiGLU 2048
    return c;
  }
  KILN_CHECK(false, "train", "unknown model preset '", name, "' (tiny, micro, small, gpt125m)");
  return c;
}

std::vector<std::string> model_preset_names() { return {"tiny", "micro", "small", "gpt125m"}; }

namespace {
std::vector<Tensor> pair_vector(const std::pair<Tensor, Tensor>& p) { return {p.first, p.second}; }

Tensor uniform_init(const Shape& shape, int64_t fan_in, double scale = 1.0) {
  const double bound = scale / std::sqrt(static_cast<double>(fan_in));
  return (rand(shape) * 2.0 - 1.0) * bound;
}
}  // namespace

Block::Block(const ModelConfig& c, int64_t layer)
    : c_(c),
      attn_norm(register_parameter("attn_norm", ones({c.dim}))),
      wqkv(register_parameter("wqkv", uniform_init({3 * c.dim, c.dim}, c.dim))),
      wo(register_parameter("wo",
                            uniform_init({c.dim, c.dim}, c.dim, 1.0 / std::sqrt(2.0 * c.n_layers)))),
      mlp_norm(register_parameter("mlp_norm", ones({c.dim}))),
      w_gate(register_parameter("w_gate", uniform_init({c.hidden(), c.dim}, c.dim))),
      w_up(register_parameter("w_up", uniform_init({c.hidden(), c.dim}, c.dim))),
      w_down(register_parameter("w_down",
                                uniform_init({c.dim, c.hidden()}, c.hidden(), 1.0 / std::sqrt(2.0 * c.n_layers)))) {
  (void)layer;
}

// Under autocast the projections run in bf16 (linear casts), norms in fp32 with their output
// written in bf16 for the GEMM that reads it (the cast folded into the norm), and the residual
// stream stays fp32 (fp32 + bf16 promotes).
std::optional<DType> Block::gemm_input_dtype(const Tensor& x) {
  const DeviceType d = x.device().type;
  return is_autocast_enabled(d) ? std::optional<DType>(get_autocast_dtype(d)) : std::nullopt;
}

std::pair<Tensor, Tensor> Block::forward(const Tensor& x_in, const Tensor& branch, const Tensor& cos,
                                         const Tensor& sin, const flex::BlockMask& mask) {
  const int64_t B = x_in.size(0), T = x_in.size(1), H = c_.n_heads, Dh = c_.head_dim();
  const std::optional<DType> low = gemm_input_dtype(x_in);
  Tensor x, a, m, h;
  {
    Phase ph("norms");
    // The previous block's MLP output joins the stream here, in the same pass as the norm.
    if (branch.defined()) {
      std::tie(x, a) = F::add_rms_norm(x_in, branch, attn_norm, c_.norm_eps, low);
    } else {
      x = x_in;
      a = F::rms_norm(x, attn_norm, c_.norm_eps, low);
    }
  }
  {
    // Separate phases, so the benchmark's breakdown tells apart the projections, the rotary and
    // layout work around them and the attention kernel itself.
    Tensor qkv, q, k, v, o;
    {
      Phase ph("attn proj");
      qkv = linear(a, wqkv).view({B, T, 3, H, Dh});
    }
    {
      Phase ph("attn layout");
      // FlexAttention's inputs follow autocast like a matmul's (bf16 q, k, v; fp32 softmax inside).
      // One pass each way: rotary on q and k, heads moved first (the same bits as the separate ops).
      auto [qr, kr, vr] = F::qkv_rotary_split(qkv, cos, sin);
      q = autocast::cast_lower(qr);
      k = autocast::cast_lower(kr);
      v = autocast::cast_lower(vr);
    }
    {
      Phase ph("attention");
      flex::FlexOptions fo;
      fo.block_mask = &mask;
      o = flex::flex_attention(q, k, v, fo).out;
    }
    {
      Phase ph("attn layout");
      o = o.transpose(1, 2).reshape({B, T, c_.dim});
    }
    Phase ph("attn proj");
    a = F::dropout(linear(o, wo), c_.dropout, is_training());
  }
  {
    Phase ph("norms");
    std::tie(h, m) = F::add_rms_norm(x, a, mlp_norm, c_.norm_eps, low);  // the residual add and the norm, one pass
  }
  Phase ph("mlp");
  return {h, F::dropout(linear(F::swiglu(linear(m, w_gate), linear(m, w_up)), w_down), c_.dropout, is_training())};
}

GPT::GPT(const ModelConfig& c)
    : tok_emb(register_parameter("tok_emb", randn({c.vocab_size, c.dim}) * 0.02)),
      final_norm(register_parameter("final_norm", ones({c.dim}))),
      c_(c),
      cos_(register_buffer("rope_cos", Tensor())),
      sin_(register_buffer("rope_sin", Tensor())) {
  KILN_CHECK(c.dim % c.n_heads == 0 && c.head_dim() % 2 == 0, "train", "dim ", c.dim, " must split into ",
             c.n_heads, " heads of an even size");
  // Parameter names as in nn.ModuleList: "blocks.0.wqkv".
  auto list = register_module("blocks", std::make_shared<nn::Module>());
  for (int64_t l = 0; l < c.n_layers; ++l)
    blocks_.push_back(list->register_module(std::to_string(l), std::make_shared<Block>(c, l)));
  std::tie(cos_, sin_) = F::rotary_tables(c.seq_len, c.head_dim(), c.rope_theta);
}

flex::BlockMask GPT::block_mask(const Tensor& doc_ids_in) const {
  Phase ph("block_mask");
  // The mask is analysed on the host (captured tensors live on the CPU); FlexAttention takes the
  // resulting BlockMask for CUDA inputs as well.
  const Tensor doc_ids = doc_ids_in.is_cuda() ? doc_ids_in.cpu() : doc_ids_in;
  const int64_t B = doc_ids.size(0), T = doc_ids.size(1);
  const flex::Captured docs = flex::capture(doc_ids);
  flex::MaskMod same_doc([&](flex::Expr b, flex::Expr, flex::Expr q, flex::Expr kv) {
    return docs[b][q] == docs[b][kv];
  });
  std::vector<flex::MaskMod> mods{flex::causal_mask(), same_doc};
  if (c_.sliding_window > 0) mods.push_back(flex::sliding_window_mask(c_.sliding_window));
  // 64-token blocks: at T = 256 a 128 block would leave the causal mask no empty blocks to skip.
  const int64_t block = c_.mask_block > 0 ? c_.mask_block : T >= 512 ? 128 : 64;
  return flex::create_block_mask(flex::and_masks(mods), B, 1, T, T, block);
}

Tensor GPT::hidden(const Tensor& idx, const flex::BlockMask& mask) {
  const int64_t T = idx.size(1);
  KILN_CHECK(T <= c_.seq_len, "train", "sequence of ", T, " tokens is longer than the model's ", c_.seq_len);
  const Tensor cos = cos_.narrow(0, 0, T), sin = sin_.narrow(0, 0, T);
  Tensor x;
  {
    Phase ph("embedding");
    x = F::dropout(F::embedding(idx, tok_emb), c_.dropout, is_training());
  }
  // Sharded runs (fully_shard per block) gather each block's parameters around its forward. Each
  // block hands on its stream and its MLP output unadded: the next norm adds them in its own pass.
  Tensor branch;
  for (auto& blk : blocks_) {
    const std::vector<Tensor> out =
        dist::fsdp_forward_outputs(*blk, [&] { return pair_vector(blk->forward(x, branch, cos, sin, mask)); });
    x = out[0], branch = out[1];
  }
  Phase ph("norms");
  const std::optional<DType> low = Block::gemm_input_dtype(x);  // the head's GEMM reads it
  if (!branch.defined()) return F::rms_norm(x, final_norm, c_.norm_eps, low);
  return F::add_rms_norm(x, branch, final_norm, c_.norm_eps, low).second;
}

Tensor GPT::loss(const Tensor& idx, const Tensor& target, const Tensor& doc_ids) {
  return loss(idx, target, block_mask(doc_ids));
}

Tensor GPT::loss(const Tensor& idx, const Tensor& target, const flex::BlockMask& mask) {
  return dist::fsdp_forward(*this, [&] { return unsharded_loss(idx, target, mask); });
}

Tensor GPT::unsharded_loss(const Tensor& idx, const Tensor& target, const flex::BlockMask& mask) {
  const Tensor h = hidden(idx, mask);
  Phase ph("lce");
  F::LinearCrossEntropyOptions o;
  o.ignore_index = -100;
  // Under autocast the fused head runs in bf16 like a linear; its loss comes back in fp32 (the
  // kernels' own per-token sums), fine enough for a loss curve.
  const Tensor x = autocast::cast_lower(h.reshape({-1, c_.dim})), w = autocast::cast_lower(tok_emb);
  return F::linear_cross_entropy(x, w, target.reshape({-1}), o);
}

Tensor GPT::last_logits(const Tensor& idx) {
  const int64_t T = idx.size(1);
  const flex::BlockMask mask = flex::create_block_mask(flex::causal_mask(), 1, 1, T, T, 64);
  return dist::fsdp_forward(*this, [&] {
    const Tensor h = hidden(idx, mask);
    return linear(h.select(0, 0).select(0, T - 1), tok_emb);
  });
}

}  // namespace kiln::train
