// Graph recording: LambdaNode (an op's backward as a closure), AccumulateGrad (leaves),
// SavedTensor with its version check.
#include <atomic>

#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

std::atomic<uint64_t> g_sequence{0};

class LambdaNode : public Node {
 public:
  LambdaNode(std::string name, autograd::BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    KILN_CHECK(fn_ != nullptr, "backward",
               "trying to backward through the graph of '", name_, "' a second time (its saved tensors were "
               "freed by the first backward); pass retain_graph=true the first time");
    return fn_(grads);
  }
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  autograd::BackwardFn fn_;
};

// Whether `g` is its caller's only handle to memory that no other tensor views, whole and
// contiguous: a gradient a backward just made, which .grad may keep without a copy (as torch's
// AccumulateGrad steals). Not a root gradient the caller still holds, not one handed to several
// inputs (add), not a view of another tensor's memory.
bool sole_owner(const Tensor& g) {
  const TensorImpl& i = *g.impl();
  return TensorAccess::handles(g) == 1 && i.storage.use_count() == 1 && i.offset == 0 && g.is_contiguous() &&
         g.nbytes() == i.storage->nbytes() && !g.requires_grad();
}

// Adds incoming gradients into a leaf's .grad.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf) : leaf_(leaf.impl() ? leaf : Tensor()) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (!g.defined()) return {};
    std::unique_lock<std::recursive_mutex> lock;
    if (leaf_.impl()) lock = std::unique_lock(leaf_.impl()->meta().leaf_mutex);
    const Tensor& current = leaf_.grad();
    if (!current.defined()) {
      // Without create_graph a gradient the engine alone holds becomes .grad as it is; otherwise a
      // copy, so .grad never aliases another tensor (one backward may hand the same buffer to
      // several inputs, e.g. add; the caller keeps its root gradient) and in-place accumulation
      // stays safe.
      leaf_.set_grad(!is_grad_enabled() && sole_owner(g) ? g.detach() : g.detach().clone());
    } else if (is_grad_enabled()) {
      leaf_.set_grad(add(current, g));  // create_graph: keep the sum differentiable
    } else {
      Tensor acc = current;
      add_(acc, g);
    }
    return {};
  }

 private:
  Tensor leaf_;  // strong ref is fine: the leaf owns this node only weakly
};

}  // namespace

SavedTensor::SavedTensor(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  tensor_ = is_output ? t.detach() : t;
  version_ = t.version();
}

Tensor SavedTensor::unpack(const char* op) const {
  if (!tensor_.defined()) return tensor_;
  KILN_CHECK(tensor_.version() == version_, op,
             "a tensor saved for backward was modified by an in-place operation (version ", version_, " -> ",
             tensor_.version(), "); clone it before modifying");
  return tensor_;
}

namespace autograd {

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (auto fn = t.grad_fn()) return {fn, t.output_nr()};
  AutogradMeta& meta = t.impl()->meta();
  std::lock_guard<std::recursive_mutex> lock(meta.leaf_mutex);  // one accumulator per leaf
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    acc->output_shapes = {t.sizes()};
    acc->output_options = {t.options()};
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn, bool materialize_grads) {
  auto node = std::make_shared<LambdaNode>(name, std::move(fn));
  node->sequence_nr = g_sequence.fetch_add(1);
  node->materialize_grads = materialize_grads;
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges.push_back(gradient_edge(in));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->output_shapes.push_back(out.sizes());
    node->output_options.push_back(out.options());
    if (!is_floating_point(out.dtype())) continue;  // integer outputs (indices) carry no gradient
    AutogradMeta& meta = out.impl()->meta();
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

}  // namespace autograd
}  // namespace kiln
