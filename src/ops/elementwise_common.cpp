// Shared plumbing of the elementwise family: dtype/device rules and backend dispatch.
#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "ops/cpu/elementwise.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise_internal.h"

namespace kiln {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(x == y || x == 1 || y == 1, op, "shapes ", shape_str(a), " and ", shape_str(b),
               " are not broadcastable");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

DType result_type(const Tensor& a, const Tensor& b) {
  const bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  const DType dimmed = a0 ? b.dtype() : a.dtype(), zero_dim = a0 ? a.dtype() : b.dtype();
  return ew::category(zero_dim) > ew::category(dimmed) ? promote_types(zero_dim, dimmed) : dimmed;
}

DType result_type(const Tensor& a, Scalar b) {
  const DType s = b.default_dtype();
  return ew::category(s) > ew::category(a.dtype()) ? s : a.dtype();
}

namespace ew {

int category(DType t) { return t == kBool ? 0 : (is_floating_point(t) ? 2 : 1); }

double wrap_integer(DType dtype, double v) {
  if (is_floating_point(dtype) || dtype == kBool || v != v) return v;
  if (v <= -9.2233720368547758e18 || v >= 9.2233720368547758e18) return v;  // beyond int64: saturate
  const auto w = static_cast<int64_t>(v);
  switch (dtype) {
    case kUInt8: return static_cast<uint8_t>(w);
    case kInt8: return static_cast<int8_t>(w);
    case kInt32: return static_cast<int32_t>(w);
    default: return static_cast<double>(w);
  }
}

Tensor scalar_operand(const Tensor& like, Scalar s) {
  return full({}, s.to_double(), TensorOptions().dtype(result_type(like, s)));  // a CPU 0-d joins any device
}

namespace {

// Converts (no autograd) and places an operand for a kernel running on `device`.
Tensor prepare(const Tensor& t, DType dtype, Device device, const Shape& shape) {
  NoGradGuard no_grad;
  Tensor r = t.detach();
  if (r.device() != device || r.dtype() != dtype) r = r.to(device, dtype);
  return r.sizes() == shape ? r : r.expand(shape);
}
}  // namespace

void check_defined(const Tensor& t, const char* op) { KILN_CHECK(t.defined(), op, "got an undefined tensor"); }

void check_not_bool(DType t, const char* op) {
  KILN_CHECK(t != kBool, op, "arithmetic on bool tensors is not supported; convert with to() first");
}

Device common_device(const std::vector<const Tensor*>& ts, const char* op) {
  const Tensor* ref = nullptr;
  for (const Tensor* t : ts)
    if (!(t->dim() == 0 && t->device().is_cpu()) && (!ref || ref->device().is_cpu())) ref = t;
  if (!ref) return kCPU;
  for (const Tensor* t : ts)
    KILN_CHECK(t->device() == ref->device() || (t->dim() == 0 && t->device().is_cpu()), op,
               "expected all tensors on one device, got ", t->device(), " and ", ref->device());
  return ref->device();
}

Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype, const EwParams& p, const char* name) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  const Device device = common_device({&a, &b}, name);
  const Tensor ax = prepare(a, dtype, device, shape), bx = prepare(b, dtype, device, shape);
  Tensor out = make_tensor(shape, dtype, device);
  if (out.numel() == 0) return out;
  if (device.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::binary(op, out, ax, bx, p));
  } else {
    cpu::binary(op, out, ax, bx, p);
  }
  return out;
}

Tensor run_binary_scalar(BinaryOp op, const Tensor& a, double b, const EwParams& p, const char* name) {
  const Tensor ax = a.detach();
  Tensor out = make_tensor(a.sizes(), a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (a.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::binary_scalar(op, out, ax, b, p));
  } else {
    cpu::binary_scalar(op, out, ax, b, p);
  }
  return out;
}

Tensor run_unary(UnaryOp op, const Tensor& x, const EwParams& p, const char* name) {
  const Tensor xx = x.detach();
  Tensor out = make_tensor(x.sizes(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  if (x.is_cuda()) {
    KILN_CUDA_ONLY(name, cuda::unary(op, out, xx, p));
  } else {
    cpu::unary(op, out, xx, p);
  }
  return out;
}

Tensor reduce_grad(const Tensor& g, const InputMeta& m) {
  Tensor r = g.sizes() == m.shape ? g : sum_to_size(g, m.shape);
  if (r.dtype() != m.dtype || r.device() != m.device) r = r.to(m.device, m.dtype);
  return r;
}

}  // namespace ew
}  // namespace kiln
