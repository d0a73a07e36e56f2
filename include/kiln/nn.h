#pragma once
// Modules (torch.nn names): a Module owns named parameters, buffers and child modules;
// named_parameters() yields dotted names ("blocks.0.attn.weight") in registration order, each
// parameter once even when shared (weight tying). Subclasses keep `Tensor&` members bound to
// their registry slots, so `head->weight = embedding->weight` ties the weights for forward,
// parameters() and the optimizer alike.
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The one-tensor forward used by Sequential; modules with other signatures add their own.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string type_name() const { return "Module"; }

  // Parameters of this module and (recurse) its descendants, with dotted names, each tensor once.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;  // total elements over parameters()

  // Registers (or replaces) a parameter; it becomes a leaf that requires grad (history dropped).
  // An undefined value reserves the name (e.g. Linear without bias). Returns the registry slot.
  Tensor& register_parameter(const std::string& name, const Tensor& value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, const Tensor& value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Drops (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);
  // Training mode for this module and its descendants (dropout reads it).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers in place (their Tensor handles stay valid, as with PyTorch's
  // module.to()); a dtype applies to floating-point tensors only. Gradients move along.
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  void collect(const std::string& prefix, bool recurse, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out, std::vector<const void*>& seen) const;
  void move(const Device* device, const DType* dtype);

  std::deque<std::pair<std::string, Tensor>> params_;  // deque: slots never move
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// y = x W^T + b. weight [out, in] and bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's
// kaiming_uniform(a=sqrt(5)) bound), drawn in fp32 from the global generator.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // x: [..., in] -> [..., out]
  std::string type_name() const override { return "Linear"; }
  const int64_t in_features, out_features;
  Tensor& weight;
  Tensor& bias;  // undefined without bias
};

// Lookup table: weight [num_embeddings, embedding_dim] ~ N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options = {});
  Tensor forward(const Tensor& indices) override;  // [...] int64/int32 -> [..., dim]
  std::string type_name() const override { return "Embedding"; }
  const int64_t num_embeddings, embedding_dim;
  Tensor& weight;
};

// y = x / sqrt(mean(x^2) + eps) * weight, weight [dim] initialised to ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RMSNorm"; }
  const int64_t dim;
  const double eps;
  Tensor& weight;
};

// Dropout that follows the module's training flag.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  const double p;
};

// A parameter-free function as a module (e.g. Functional(relu) inside a Sequential).
class Functional : public Module {
 public:
  explicit Functional(std::function<Tensor(const Tensor&)> fn, std::string name = "Functional");
  Tensor forward(const Tensor& x) override { return fn_(x); }
  std::string type_name() const override { return name_; }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  std::string name_;
};

// Children "0", "1", ... applied in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
};

}  // namespace kiln::nn
