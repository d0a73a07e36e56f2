// Comparisons (bool outputs, no autograd) and where(condition, a, b).
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cpu/elementwise.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise_internal.h"

namespace kiln {
namespace {

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b, const char* name) {
  ew::check_defined(a, name);
  ew::check_defined(b, name);
  const DType dt = result_type(a, b);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  const Device device = ew::common_device({&a, &b}, name);
  NoGradGuard no_grad;
  const Tensor ax = a.detach().to(device, dt).expand(shape), bx = b.detach().to(device, dt).expand(shape);
  Tensor out = make_tensor(shape, kBool, device);
  if (out.numel() == 0) return out;
  if (device.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::compare(op, out, ax, bx));
  } else {
    cpu::compare(op, out, ax, bx);
  }
  return out;
}

// Compared in result_type(a, b): int64 [N] < 2.5 compares 2 < 2.5, not 2 < 2.
Tensor compare(CompareOp op, const Tensor& a, Scalar b, const char* name) {
  ew::check_defined(a, name);
  Tensor out = make_tensor(a.sizes(), kBool, a.device());
  if (out.numel() == 0) return out;
  NoGradGuard no_grad;
  const DType dt = result_type(a, b);
  const Tensor ax = dt == a.dtype() ? a.detach() : a.detach().to(dt);
  if (a.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::compare_scalar(op, out, ax, b.to_double()));
  } else {
    cpu::compare_scalar(op, out, ax, b.to_double());
  }
  return out;
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare(CompareOp::Eq, a, b, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(CompareOp::Ne, a, b, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(CompareOp::Lt, a, b, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(CompareOp::Le, a, b, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(CompareOp::Gt, a, b, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(CompareOp::Ge, a, b, "ge"); }
Tensor eq(const Tensor& a, Scalar b) { return compare(CompareOp::Eq, a, b, "eq"); }
Tensor ne(const Tensor& a, Scalar b) { return compare(CompareOp::Ne, a, b, "ne"); }
Tensor lt(const Tensor& a, Scalar b) { return compare(CompareOp::Lt, a, b, "lt"); }
Tensor le(const Tensor& a, Scalar b) { return compare(CompareOp::Le, a, b, "le"); }
Tensor gt(const Tensor& a, Scalar b) { return compare(CompareOp::Gt, a, b, "gt"); }
Tensor ge(const Tensor& a, Scalar b) { return compare(CompareOp::Ge, a, b, "ge"); }

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  ew::check_defined(condition, "where");
  ew::check_defined(a, "where");
  ew::check_defined(b, "where");
  KILN_CHECK(condition.dtype() == kBool, "where", "condition must be a bool tensor, got ",
             dtype_name(condition.dtype()));
  const DType dt = result_type(a, b);
  const Shape shape = broadcast_shapes(condition.sizes(), broadcast_shapes(a.sizes(), b.sizes(), "where"), "where");
  const Device device = ew::common_device({&condition, &a, &b}, "where");
  Tensor out = make_tensor(shape, dt, device);
  if (out.numel() > 0) {
    NoGradGuard no_grad;
    const Tensor cx = condition.detach().to(device).expand(shape);
    const Tensor ax = a.detach().to(device, dt).expand(shape), bx = b.detach().to(device, dt).expand(shape);
    if (device.is_cuda()) {
      KILN_CUDA_ONLY("where", cuda::where(out, cx, ax, bx));
    } else {
      cpu::where(out, cx, ax, bx);
    }
  }
  if (autograd::needs_grad({a, b})) {
    const ew::InputMeta ma(a), mb(b);
    const SavedTensor sc(condition);
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    autograd::record("where", {out}, {a, b}, [=](const std::vector<Tensor>& g) {
      const Tensor c = sc.unpack("where");
      const Tensor zero = zeros({}, g[0].options());  // broadcast 0-d: no full-size zeros
      return std::vector<Tensor>{ra ? ew::reduce_grad(where(c, g[0], zero), ma) : Tensor(),
                                 rb ? ew::reduce_grad(where(c, zero, g[0]), mb) : Tensor()};
    });
  }
  return out;
}

Tensor where(const Tensor& condition, const Tensor& a, Scalar b) {
  ew::check_defined(a, "where");
  return where(condition, a, ew::scalar_operand(a, b));
}
Tensor where(const Tensor& condition, Scalar a, const Tensor& b) {
  ew::check_defined(b, "where");
  return where(condition, ew::scalar_operand(b, a), b);
}

}  // namespace kiln
