#pragma once
// A small residual MLP for the fully_shard tests: an input projection and a head owned by the root,
// blocks [RMSNorm -> Linear -> gelu -> Linear] + residual. Sizes are odd on purpose: rows that do
// not divide by the world size (padding) and a bias with fewer rows than ranks.
#include <memory>
#include <vector>

#include "kiln/fsdp.h"
#include "kiln/nn.h"
#include "kiln/ops.h"

namespace kiln::dist::testing {

struct TinyNetConfig {
  int64_t in = 5, dim = 10, hidden = 14, out = 3, blocks = 3;
};

class TinyBlock : public nn::Module {
 public:
  explicit TinyBlock(const TinyNetConfig& c)
      : norm(register_module("norm", std::make_shared<nn::RMSNorm>(c.dim))),
        up(register_module("up", std::make_shared<nn::Linear>(c.dim, c.hidden))),
        down(register_module("down", std::make_shared<nn::Linear>(c.hidden, c.dim))) {}
  Tensor forward(const Tensor& x) override { return add(x, (*down)(gelu((*up)((*norm)(x))))); }
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> up, down;
};

class TinyNet : public nn::Module {
 public:
  explicit TinyNet(const TinyNetConfig& c)
      : proj(register_module("proj", std::make_shared<nn::Linear>(c.in, c.dim))),
        head(register_module("head", std::make_shared<nn::Linear>(c.dim, c.out))) {
    auto list = register_module("blocks", std::make_shared<nn::Module>());
    for (int64_t i = 0; i < c.blocks; ++i)
      blocks.push_back(list->register_module(std::to_string(i), std::make_shared<TinyBlock>(c)));
  }
  // Mean squared error of the prediction for x [N, in] (the compute dtype) against y [N, out] fp32;
  // blocks run through their FSDP modules when sharded.
  Tensor loss(const Tensor& x, const Tensor& y) {
    return fsdp_forward(*this, [&] {
      Tensor h = (*proj)(x);
      for (auto& b : blocks) h = fsdp_forward(*b, [&] { return b->forward(h); });
      Tensor d = sub((*head)(h).to(kFloat32), y);  // the loss in fp32 under bf16 compute
      return mean(mul(d, d));
    });
  }
  std::shared_ptr<nn::Linear> proj, head;
  std::vector<std::shared_ptr<TinyBlock>> blocks;
};

}  // namespace kiln::dist::testing
