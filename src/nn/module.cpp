// Module: the parameter/buffer/child registry, names, train/eval, zero_grad and in-place moves.
// Moves rewrite the TensorImpl behind each parameter (storage, dtype, geometry), so every
// handle to it (module members, an optimizer's list, a tied module) sees the moved tensor.
#include <algorithm>

#include "core/tensor_impl.h"
#include "kiln/autograd.h"
#include "kiln/nn.h"

namespace kiln::nn {
namespace {

void check_name(const std::string& name, const char* what) {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module", what, " name '", name,
             "' must be non-empty and contain no '.'");
}

template <typename Slots>
Tensor& upsert(Slots& slots, const std::string& name, const Tensor& value) {
  for (auto& [n, t] : slots)
    if (n == name) return t = value;
  slots.emplace_back(name, value);
  return slots.back().second;
}

// Re-points t's impl at a copy on `device` in `dtype` (handles to t stay valid).
void move_tensor(const Tensor& t, Device device, DType dtype) {
  if (!t.defined() || (t.device() == device && t.dtype() == dtype)) return;
  Tensor moved;
  {
    NoGradGuard no_grad;
    moved = t.detach().to(device, dtype).contiguous();
  }
  TensorImpl* impl = t.impl();
  const TensorImpl* src = moved.impl();
  impl->storage = src->storage;
  impl->sizes = src->sizes;
  impl->strides = src->strides;
  impl->offset = src->offset;
  impl->dtype = src->dtype;
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  KILN_FAIL("Module", type_name(), " has no one-tensor forward");
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out, std::vector<const void*>& seen) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_) {
    if (!t.defined()) continue;
    if (std::find(seen.begin(), seen.end(), t.impl()) != seen.end()) continue;  // shared: listed once
    seen.push_back(t.impl());
    out.emplace_back(prefix + name, t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", true, buffers, out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const void*> seen;
  collect("", recurse, false, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const void*> seen;
  collect("", recurse, true, out, seen);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

Tensor& Module::register_parameter(const std::string& name, const Tensor& value, bool requires_grad) {
  check_name(name, "parameter");
  Tensor p;
  if (value.defined()) {
    KILN_CHECK(!requires_grad || is_floating_point(value.dtype()), "Module", "parameter '", name,
               "' must be floating point to require grad, got ", dtype_name(value.dtype()));
    p = value.is_leaf() ? value : value.detach();
    p.requires_grad_(requires_grad);
  }
  return upsert(params_, name, p);
}

Tensor& Module::register_buffer(const std::string& name, const Tensor& value) {
  check_name(name, "buffer");
  return upsert(buffers_, name, value.defined() ? value.detach() : value);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(name, "module");
  KILN_CHECK(module != nullptr, "Module", "child module '", name, "' is null");
  for (auto& [n, m] : children_)
    if (n == name) {
      m = std::move(module);
      return;
    }
  children_.emplace_back(name, std::move(module));
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      Tensor g = p.grad();
      g.zero_();
    }
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::move(const Device* device, const DType* dtype) {
  auto apply = [&](const Tensor& t) {
    const Device d = device ? *device : t.device();
    const DType dt = dtype && is_floating_point(t.dtype()) ? *dtype : t.dtype();
    move_tensor(t, d, dt);
    if (t.grad().defined()) {
      const Tensor& g = t.grad();
      move_tensor(g, d, is_floating_point(g.dtype()) && dtype ? *dtype : g.dtype());
    }
  };
  for (auto& [name, t] : named_parameters()) apply(t);
  for (auto& [name, t] : named_buffers()) apply(t);
}

void Module::to(Device device) { move(&device, nullptr); }
void Module::to(DType dtype) { move(nullptr, &dtype); }
void Module::to(Device device, DType dtype) { move(&device, &dtype); }

}  // namespace kiln::nn
