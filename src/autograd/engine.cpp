// The backward engine: counts how many gradients each node will receive, then runs nodes
// newest-first (a priority queue on creation order) once all their inputs have arrived. The
// order is fixed by the graph alone, so gradients are bitwise reproducible.
#include <atomic>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "autograd/engine.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln::autograd {
namespace {

struct NewestFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

struct GraphTask {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  // autograd::grad(): capture gradients arriving at these edges instead of accumulating.
  std::unordered_map<Node*, std::unordered_map<uint32_t, size_t>> capture;
  std::vector<Tensor> captured;
};

void accumulate(std::vector<Tensor>& slot_list, uint32_t slot, const Tensor& g) {
  if (slot_list.size() <= slot) slot_list.resize(slot + 1);
  Tensor& s = slot_list[slot];
  s = s.defined() ? add(s, g) : g;
}

void count_dependencies(GraphTask& task, const std::vector<Edge>& roots) {
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : roots) {
    if (e.fn && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      task.dependencies[e.fn.get()] += 1;
      task.keep_alive[e.fn.get()] = e.fn;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
}

thread_local bool t_graph_freed = false;
std::atomic<BackwardObserver> g_observer{nullptr};

void run(GraphTask& task, const std::vector<Edge>& roots, const std::vector<Tensor>& root_grads, bool retain_graph,
         bool create_graph, bool accumulate_leaves) {
  struct FreedFlag {  // restored on exit: a backward may run inside another's closure
    bool saved = t_graph_freed;
    explicit FreedFlag(bool v) { t_graph_freed = v; }
    ~FreedFlag() { t_graph_freed = saved; }
  } freed_flag(!retain_graph);
  count_dependencies(task, roots);
  std::priority_queue<Node*, std::vector<Node*>, NewestFirst> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    Node* n = roots[i].fn.get();
    if (!n) continue;
    task.keep_alive[n] = roots[i].fn;
    accumulate(task.buffers[n], roots[i].input_nr, root_grads[i]);
  }
  std::unordered_set<Node*> queued;
  for (const Edge& e : roots) {
    if (e.fn && task.dependencies[e.fn.get()] == 0 && queued.insert(e.fn.get()).second) ready.push(e.fn.get());
  }

  std::optional<NoGradGuard> no_grad;
  if (!create_graph) no_grad.emplace();
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(task.buffers[n]);
    task.buffers.erase(n);
    grads.resize(std::max<size_t>(grads.size(), n->output_shapes.size()));

    if (auto it = task.capture.find(n); it != task.capture.end()) {
      for (auto [slot, index] : it->second)
        if (slot < grads.size()) task.captured[index] = grads[slot];
    }
    std::vector<Tensor> input_grads;
    const bool is_leaf_accumulator = n->next_edges.empty() && n->name() == "AccumulateGrad";
    if (!is_leaf_accumulator || accumulate_leaves) {
      bool any = false;
      for (const Tensor& g : grads) any = any || g.defined();
      if (any) {
        // Outputs that received nothing get zeros, so every backward sees a full list (unless the
        // node handles undefined ones itself).
        for (size_t i = 0; n->materialize_grads && i < grads.size() && i < n->output_shapes.size(); ++i)
          if (!grads[i].defined()) grads[i] = zeros(n->output_shapes[i], n->output_options[i]);
        const BackwardObserver obs = g_observer.load(std::memory_order_relaxed);
        const std::string name = obs ? n->name() : std::string();
        if (obs) obs(name, true);
        input_grads = n->apply(grads);
        if (obs) obs(name, false);
      }
      if (!retain_graph) n->release();
    }
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      Node* next = e.fn.get();
      if (i < input_grads.size() && input_grads[i].defined()) {
        Tensor g = input_grads[i];
        const Shape& expected = next->output_shapes.at(e.input_nr);
        KILN_CHECK(g.sizes() == expected, "backward", "'", n->name(), "' returned a gradient of shape ",
                   shape_str(g.sizes()), " for an input of shape ", shape_str(expected));
        accumulate(task.buffers[next], e.input_nr, g);
      }
      if (--task.dependencies[next] == 0) ready.push(next);
    }
  }
}

std::vector<Edge> root_edges(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                             std::vector<Tensor>& grads_out) {
  std::vector<Edge> edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    KILN_CHECK(r.defined(), "backward", "undefined root tensor");
    KILN_CHECK(r.requires_grad(), "backward",
               "element ", i, " of tensors does not require grad and does not have a grad_fn");
    Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!g.defined()) {
      KILN_CHECK(r.numel() == 1, "backward", "grad can be implicitly created only for scalar outputs; got shape ",
                 shape_str(r.sizes()));
      g = ones(r.sizes(), r.options());
    }
    KILN_CHECK(g.sizes() == r.sizes(), "backward", "gradient shape ", shape_str(g.sizes()),
               " does not match output shape ", shape_str(r.sizes()));
    edges.push_back(gradient_edge(r));
    grads_out.push_back(g);
  }
  return edges;
}

}  // namespace

namespace detail {
bool graph_freed_after_use() { return t_graph_freed; }
}  // namespace detail

void set_backward_observer(BackwardObserver observer) { g_observer.store(observer); }

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph,
              bool create_graph) {
  std::vector<Tensor> grads;
  const std::vector<Edge> edges = root_edges(roots, grad_roots, grads);
  GraphTask task;
  run(task, edges, grads, retain_graph || create_graph, create_graph, /*accumulate_leaves=*/true);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph) {
  std::vector<Tensor> grads;
  const std::vector<Edge> edges = root_edges(outputs, grad_outputs, grads);
  GraphTask task;
  task.captured.resize(inputs.size());
  std::vector<std::shared_ptr<Node>> hold;  // leaf accumulators must outlive the run
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].requires_grad(), "grad", "input ", i, " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    hold.push_back(e.fn);
    task.capture[e.fn.get()][e.input_nr] = i;
  }
  run(task, edges, grads, retain_graph || create_graph, create_graph, /*accumulate_leaves=*/false);
  return task.captured;
}

}  // namespace kiln::autograd
