// Modules: dotted parameter names, registration rules, zero_grad, train/eval, in-place moves,
// weight tying (one parameter used twice accumulates both gradients), Linear/Embedding/RMSNorm
// against float64 references, and a short MLP training run with AdamW.
#include <cmath>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "kiln/optim.h"
#include "support/testing.h"

namespace kiln {
namespace {

using testing::tolerance;

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

// A block with nested children, as a transformer layer would be.
class Block : public nn::Module {
 public:
  explicit Block(int64_t dim)
      : norm(register_module("norm", std::make_shared<nn::RMSNorm>(dim))),
        proj(register_module("proj", std::make_shared<nn::Linear>(dim, dim, /*bias=*/false))) {
    register_buffer("scale", full({1}, 2.0));
  }
  Tensor forward(const Tensor& x) override { return proj->forward(norm->forward(x)); }
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> proj;
};

TEST(Module, NamedParametersUseDottedNamesInRegistrationOrder) {
  nn::Module model;
  auto emb = model.register_module("embed", std::make_shared<nn::Embedding>(10, 4));
  auto blocks = model.register_module("blocks", std::make_shared<nn::Sequential>());
  blocks->push_back(std::make_shared<Block>(4));
  blocks->push_back(std::make_shared<Block>(4));
  model.register_module("head", std::make_shared<nn::Linear>(4, 10));
  const std::vector<std::string> expected = {"embed.weight",       "blocks.0.norm.weight", "blocks.0.proj.weight",
                                             "blocks.1.norm.weight", "blocks.1.proj.weight", "head.weight",
                                             "head.bias"};
  EXPECT_EQ(names(model), expected);
  EXPECT_EQ(model.parameters().size(), expected.size());
  EXPECT_EQ(model.num_parameters(), 10 * 4 + 2 * (4 + 16) + 40 + 10);
  EXPECT_EQ(model.named_parameters(/*recurse=*/false).size(), 0u);
  EXPECT_EQ(model.named_buffers().size(), 2u);
  EXPECT_EQ(model.named_buffers()[1].first, "blocks.1.scale");
  for (const Tensor& p : model.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  EXPECT_EQ(emb->weight.sizes(), (Shape{10, 4}));
}

TEST(Module, LinearWithoutBiasAndRegistrationErrors) {
  nn::Linear lin(3, 5, /*bias=*/false);
  EXPECT_FALSE(lin.bias.defined());
  EXPECT_EQ(names(lin), std::vector<std::string>{"weight"});
  nn::Module m;
  EXPECT_THROW(m.register_parameter("a.b", randn({2})), Error);
  EXPECT_THROW(m.register_parameter("", randn({2})), Error);
  EXPECT_THROW(m.register_parameter("i", randint(0, 3, {2})), Error);
  EXPECT_THROW(nn::Linear(0, 3), Error);
  EXPECT_THROW(m.forward(randn({2})), Error);
  // Re-registering a name replaces the slot.
  m.register_parameter("w", randn({2}));
  m.register_parameter("w", randn({3}));
  ASSERT_EQ(m.parameters().size(), 1u);
  EXPECT_EQ(m.parameters()[0].sizes(), (Shape{3}));
}

TEST(Module, LinearInitBoundAndForwardMatchReference) {
  manual_seed(1);
  nn::Linear lin(50, 20);
  const double bound = 1.0 / std::sqrt(50.0);
  double max_abs = 0;
  for (double v : lin.weight.to_vector()) {
    EXPECT_LE(std::abs(v), bound);
    max_abs = std::max(max_abs, std::abs(v));
  }
  EXPECT_GT(max_abs, 0.9 * bound);
  for (double v : lin.bias.to_vector()) EXPECT_LE(std::abs(v), bound);

  Tensor x = randn({3, 50});
  Tensor y = lin(x);
  const auto xv = x.to_vector(), wv = lin.weight.to_vector(), bv = lin.bias.to_vector();
  std::vector<double> ref(3 * 20);
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 20; ++o) {
      double s = bv[o];
      for (int k = 0; k < 50; ++k) s += xv[i * 50 + k] * wv[o * 50 + k];
      ref[i * 20 + o] = s;
    }
  EXPECT_CLOSE(y, tensor(ref, kFloat64).view({3, 20}), tolerance(kFloat32));
}

TEST(Module, EmbeddingAndRmsNormForward) {
  nn::Embedding emb(7, 3);
  Tensor idx = tensor({4, 0, 4}, kInt64);
  const auto out = emb(idx).to_vector(), w = emb.weight.to_vector();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(out[j], w[4 * 3 + j]);
    EXPECT_EQ(out[3 + j], w[j]);
  }
  nn::RMSNorm norm(3, 1e-5);
  for (double v : norm.weight.to_vector()) EXPECT_EQ(v, 1.0);
  Tensor x = randn({2, 3});
  EXPECT_CLOSE(norm(x), nn::functional::rms_norm(x, Tensor(), 1e-5), 0.0);
}

TEST(Module, ZeroGrad) {
  nn::RMSNorm norm(4);
  Tensor x = randn({3, 4});
  norm(x).backward(randn({3, 4}));
  ASSERT_TRUE(norm.weight.grad().defined());
  norm.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(norm.weight.grad().defined());
  for (double v : norm.weight.grad().to_vector()) EXPECT_EQ(v, 0.0);
  norm.zero_grad();
  EXPECT_FALSE(norm.weight.grad().defined());
}

TEST(Module, TrainEvalReachesChildren) {
  nn::Sequential seq{std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Dropout>(0.5)};
  Tensor x = randn({20});
  EXPECT_TRUE(seq.is_training());
  seq.eval();
  EXPECT_FALSE(seq[1]->is_training());
  EXPECT_EQ(seq(x).to_vector(), x.to_vector());
  seq.train();
  EXPECT_TRUE(seq[0]->is_training());
  EXPECT_NE(seq(x).to_vector(), x.to_vector());
  EXPECT_THROW(seq[2], Error);
}

TEST(Module, TiedWeightAccumulatesBothGradients) {
  // Two norms sharing one weight vs two norms with equal but separate weights.
  auto a = std::make_shared<nn::RMSNorm>(5), b = std::make_shared<nn::RMSNorm>(5);
  {
    NoGradGuard g;
    a->weight.copy_(randn({5}));
  }
  b->weight = a->weight;  // tie: the registry slot now holds a's parameter
  nn::Sequential tied{a, b};
  EXPECT_EQ(tied.parameters().size(), 1u);
  EXPECT_EQ(names(tied), std::vector<std::string>{"0.weight"});

  nn::RMSNorm c(5), d(5);
  {
    NoGradGuard g;
    c.weight.copy_(a->weight);
    d.weight.copy_(a->weight);
  }
  Tensor x = randn({4, 5}), gy = randn({4, 5});
  tied(x).backward(gy);
  d(c(x)).backward(gy);
  std::vector<double> sum = c.weight.grad().to_vector();
  const auto dv = d.weight.grad().to_vector();
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += dv[i];
  EXPECT_CLOSE(a->weight.grad(), tensor(sum, kFloat64), 1e-6);
}

TEST(Module, TiedEmbeddingAndHeadShareOneParameter) {
  nn::Module model;
  auto emb = model.register_module("embed", std::make_shared<nn::Embedding>(6, 4));
  auto head = model.register_module("head", std::make_shared<nn::Linear>(4, 6, /*bias=*/false));
  head->weight = emb->weight;
  EXPECT_EQ(names(model), std::vector<std::string>{"embed.weight"});
  Tensor idx = tensor({1, 3, 1}, kInt64);
  Tensor logits = head->forward(emb->forward(idx));
  Tensor gy = randn({3, 6});
  logits.backward(gy);
  // Reference: d/dW of sum(gy * (E[idx] W^T)) = gy^T E[idx] (head use) + scatter of gy W (embed use).
  const auto W = emb->weight.to_vector(), g = gy.to_vector();
  const int64_t ids[3] = {1, 3, 1};
  std::vector<double> ref(24, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int v = 0; v < 6; ++v)
      for (int k = 0; k < 4; ++k) {
        ref[v * 4 + k] += g[i * 6 + v] * W[ids[i] * 4 + k];
        ref[ids[i] * 4 + k] += g[i * 6 + v] * W[v * 4 + k];
      }
  EXPECT_CLOSE(emb->weight.grad(), tensor(ref, kFloat64).view({6, 4}), 1e-5);
}

TEST(Module, ToConvertsParametersInPlace) {
  Block block(4);
  Tensor handle = block.norm->weight;  // an outside handle (as an optimizer would hold)
  block(randn({2, 4})).backward(randn({2, 4}));
  block.to(kFloat64);
  EXPECT_EQ(handle.dtype(), kFloat64);
  EXPECT_EQ(block.proj->weight.dtype(), kFloat64);
  EXPECT_EQ(block.norm->weight.grad().dtype(), kFloat64);
  EXPECT_EQ(block.named_buffers()[0].second.dtype(), kFloat64);
  EXPECT_TRUE(handle.requires_grad());
  Tensor y = block(randn({2, 4}, kFloat64));
  EXPECT_EQ(y.dtype(), kFloat64);
}

TEST(ModuleCuda, ToDeviceMovesParametersInPlace) {
  KILN_REQUIRE_CUDA();
  Block block(8);
  Tensor handle = block.proj->weight;
  const auto before = handle.to_vector();
  block.to(Device("cuda"));
  EXPECT_TRUE(handle.is_cuda());
  EXPECT_EQ(handle.to_vector(), before);
  Tensor y = block(randn({3, 8}).cuda());
  EXPECT_TRUE(y.is_cuda());
  block.to(kCPU, kBFloat16);
  EXPECT_EQ(handle.dtype(), kBFloat16);
  EXPECT_FALSE(handle.is_cuda());
}

TEST(Module, MlpTrainsWithAdamW) {
  manual_seed(0);
  nn::Sequential mlp{std::make_shared<nn::Linear>(2, 32), std::make_shared<nn::Functional>(
                                                              [](const Tensor& x) { return relu(x); }, "ReLU"),
                     std::make_shared<nn::Linear>(32, 2)};
  // XOR-like labels: class 1 when the coordinates share a sign.
  Tensor x = randn({256, 2});
  const auto xv = x.to_vector();
  std::vector<double> labels;
  for (int i = 0; i < 256; ++i) labels.push_back(xv[2 * i] * xv[2 * i + 1] > 0 ? 1 : 0);
  Tensor y = tensor(labels, kInt64);
  optim::AdamWOptions o;
  o.lr = 2e-2;
  optim::AdamW opt(mlp.parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    Tensor loss = nn::functional::cross_entropy(mlp(x), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace kiln
