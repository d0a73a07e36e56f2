// The basic layers: Linear, Embedding, RMSNorm, Dropout, Functional, Sequential.
#include <cmath>

#include "kiln/autograd.h"
#include "kiln/nn.h"

namespace kiln::nn {
namespace {

// U(-bound, bound) drawn in fp32 on the CPU (so one seed gives the same init everywhere), then
// converted to the requested dtype and device.
Tensor uniform(const Shape& shape, double bound, const TensorOptions& options) {
  Tensor t = rand(shape);  // [0, 1) fp32
  float* p = t.data_ptr<float>();
  const float b = static_cast<float>(bound);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = (2.0f * p[i] - 1.0f) * b;
  return t.to(options.device(), options.dtype());
}

// Checked in the member-initialiser list, before any tensor is allocated.
int64_t positive(int64_t v, const char* op, const char* what) {
  KILN_CHECK(v > 0, op, what, " must be positive, got ", v);
  return v;
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, TensorOptions options)
    : in_features(positive(in, "Linear", "in_features")),
      out_features(positive(out, "Linear", "out_features")),
      weight(register_parameter("weight", uniform({out, in}, 1.0 / std::sqrt(static_cast<double>(in)), options))),
      bias(register_parameter("bias", with_bias ? uniform({out}, 1.0 / std::sqrt(static_cast<double>(in)), options)
                                                : Tensor())) {}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim, TensorOptions options)
    : num_embeddings(positive(num, "Embedding", "num_embeddings")),
      embedding_dim(positive(dim, "Embedding", "embedding_dim")),
      weight(register_parameter("weight", randn({num, dim}).to(options.device(), options.dtype()))) {}

Tensor Embedding::forward(const Tensor& indices) { return functional::embedding(indices, weight); }

RMSNorm::RMSNorm(int64_t d, double e, TensorOptions options)
    : dim(positive(d, "RMSNorm", "dim")), eps(e), weight(register_parameter("weight", ones({d}, options))) {}

Tensor RMSNorm::forward(const Tensor& x) { return functional::rms_norm(x, weight, eps); }

Dropout::Dropout(double prob) : p(prob) {
  KILN_CHECK(p >= 0 && p <= 1, "Dropout", "probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return functional::dropout(x, p, is_training()); }

Functional::Functional(std::function<Tensor(const Tensor&)> fn, std::string name)
    : fn_(std::move(fn)), name_(std::move(name)) {
  KILN_CHECK(fn_ != nullptr, "Functional", "function is empty");
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  add_child(std::to_string(named_children().size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, m] : named_children()) h = m->forward(h);
  return h;
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  const auto children = named_children();
  KILN_CHECK(i < children.size(), "Sequential", "index ", i, " out of range for ", children.size(), " modules");
  return children[i].second;
}

}  // namespace kiln::nn
