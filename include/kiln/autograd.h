#pragma once
// Reverse-mode autograd: each differentiable op records a Node holding what its backward needs;
// Tensor::backward() walks the graph in reverse creation order and accumulates into leaves.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which output of `fn` the gradient flows into
};

class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grad_outputs: one per output of the op (undefined where no gradient flowed); returns one
  // gradient per input (next_edges), undefined where none.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  // Frees what backward needed; a later apply() must raise.
  virtual void release() {}

  std::vector<Edge> next_edges;
  std::vector<Shape> output_shapes;  // to build zero grads for outputs that got none
  std::vector<TensorOptions> output_options;
  uint64_t sequence_nr = 0;          // creation order; backward runs newest first
  // False: apply() sees undefined grads for outputs that got none, instead of zeros (torch's
  // ctx.set_materialize_grads(False)); for ops that skip the work, e.g. an unused logsumexp.
  bool materialize_grads = true;
};

// A tensor kept for backward. Remembers the storage version at save time, so a later in-place
// write is caught on unpack. Outputs are saved without their grad_fn to avoid a cycle.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output = false);  // NOLINT
  Tensor unpack(const char* op) const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Disables graph recording in its scope (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Bitwise-deterministic algorithms only (torch.use_deterministic_algorithms).
void use_deterministic_algorithms(bool enabled);
bool are_deterministic_algorithms_enabled();

namespace autograd {

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// True when grad mode is on and any input requires grad.
bool needs_grad(const std::vector<Tensor>& inputs);
// Attaches a node running `fn` to `outputs` (grad_fn) with edges to `inputs`.
// Call only when needs_grad(inputs). materialize_grads: as Node's (false: `fn` handles undefined
// grad_outputs).
void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn, bool materialize_grads = true);
// The edge a gradient for `t` flows along (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph = false, bool create_graph = false);
// Gradients of `outputs` w.r.t. `inputs` without touching .grad (torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool create_graph = false);

// Profiling hook: called with the node's name before (begin = true) and after each backward
// node runs, on the thread running backward. nullptr (the default) turns it off. Used by
// `kiln train --bench-steps` for its per-op breakdown; one observer per process.
using BackwardObserver = void (*)(const std::string& op, bool begin);
void set_backward_observer(BackwardObserver observer);

}  // namespace autograd
}  // namespace kiln
