#pragma once
// What a Tensor handle points to. Internal: ops and kernels include it, users do not.
#include <memory>
#include <mutex>

#include "core/storage.h"
#include "kiln/autograd.h"
#include "kiln/tensor.h"

namespace kiln {

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves: the node that adds into .grad
  // Guards grad and grad_accumulator: threads running graphs that share a leaf accumulate into it
  // at once. Recursive: with create_graph the sum is recorded, which may reach this leaf's edge.
  std::recursive_mutex leaf_mutex;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // elements
  DType dtype = kFloat32;
  std::unique_ptr<AutogradMeta> autograd;

  AutogradMeta& meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

// Internal access to a Tensor's handle: how many Tensor objects share its TensorImpl.
struct TensorAccess {
  static long handles(const Tensor& t) { return t.impl_.use_count(); }
};

Shape contiguous_strides(const Shape& sizes);
// A new handle over `base`'s storage with the given geometry and no autograd history.
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);
// A fresh tensor with no history.
Tensor make_tensor(const Shape& sizes, DType dtype, Device device);

}  // namespace kiln
