// Masks and predicates, composed from where / compare / index_select (so every device those run on
// is covered and autograd comes from them). Only nonzero reads a mask on the host.
#include <limits>

#include "core/dispatch.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "ops/writable.h"

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor truth(const Tensor& x) { return x.dtype() == kBool ? x : ne(x, 0.0); }
Tensor bool_scalar(bool v, Device device) { return full({}, v ? 1.0 : 0.0, TensorOptions(kBool).device(device)); }

void check_mask(const Tensor& x, const Tensor& mask, const char* op) {
  KILN_CHECK(x.defined() && mask.defined(), op, "undefined tensor");
  KILN_CHECK(mask.dtype() == kBool, op, "expected a bool mask, got ", dtype_name(mask.dtype()));
  KILN_CHECK(broadcast_shapes(x.sizes(), mask.sizes(), op) == x.sizes(), op, "a mask of shape ",
             shape_str(mask.sizes()), " does not broadcast to the input's shape ", shape_str(x.sizes()));
}

// Linear indices of the true elements of a bool mask, int64 [count], on `device`.
Tensor true_positions(const Tensor& mask, Device device) {
  const Tensor m = mask.to(kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(m.data_ptr());
  int64_t count = 0;
  for (int64_t i = 0; i < m.numel(); ++i) count += p[i] != 0;
  Tensor out = empty({count}, kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0, j = 0; i < m.numel(); ++i)
    if (p[i]) o[j++] = i;
  return out.to(device);
}

// mask: x.shape[:k] -> (mask's element count, x.shape[k:]) after the checks torch makes.
Shape mask_rows_shape(const Tensor& x, const Tensor& mask, const char* op) {
  KILN_CHECK(x.defined() && mask.defined(), op, "undefined tensor");
  KILN_CHECK(mask.dtype() == kBool, op, "tensors used as indices must be bool or integer tensors, got ",
             dtype_name(mask.dtype()));
  KILN_CHECK(mask.dim() <= x.dim(), op, "too many indices: a ", mask.dim(), "-d mask for a ", x.dim(), "-d tensor");
  for (int64_t d = 0; d < mask.dim(); ++d)
    KILN_CHECK(mask.sizes()[d] == x.sizes()[d], op, "the shape of the mask ", shape_str(mask.sizes()), " at index ",
               d, " does not match the shape of the indexed tensor ", shape_str(x.sizes()), " at index ", d);
  Shape rows{mask.numel()};
  rows.insert(rows.end(), x.sizes().begin() + mask.dim(), x.sizes().end());
  return rows;
}

Tensor triangle(const Tensor& x, int64_t diagonal, bool lower) {
  const char* op = lower ? "tril" : "triu";
  KILN_CHECK(x.defined(), op, "input is undefined");
  KILN_CHECK(x.dim() >= 2, op, "expected a tensor with at least 2 dims, got ", x.dim());
  const int64_t m = x.size(-2), n = x.size(-1);
  const TensorOptions io = TensorOptions(kInt64).device(x.device());
  const Tensor offset = arange(static_cast<double>(n), io).unsqueeze(0) - arange(static_cast<double>(m), io).unsqueeze(1);
  const Tensor keep = lower ? le(offset, static_cast<double>(diagonal)) : ge(offset, static_cast<double>(diagonal));
  return where(keep, x, zeros({}, x.options()));
}

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_mask(x, mask, "masked_fill");
  return where(mask, full({}, value, x.options()), x);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value) {
  check_mask(x, mask, "masked_fill");
  KILN_CHECK(value.defined() && value.dim() == 0, "masked_fill", "only supports a 0-d value tensor, got one with ",
             value.defined() ? value.dim() : 0, " dims");
  return where(mask, value.to(x.device(), x.dtype()), x);
}

Tensor& masked_fill_(Tensor& self, const Tensor& mask, double value) {
  check_writable(self, "masked_fill_");
  Tensor filled;
  {
    NoGradGuard ng;
    filled = masked_fill(self.detach(), mask, value);
  }
  self.copy_(filled);
  return self;
}

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }

Tensor isnan(const Tensor& x) {
  if (!is_floating_point(x.dtype())) return zeros(x.sizes(), TensorOptions(kBool).device(x.device()));
  return ne(x, x);
}
Tensor isinf(const Tensor& x) {
  if (!is_floating_point(x.dtype())) return zeros(x.sizes(), TensorOptions(kBool).device(x.device()));
  return eq(abs(x), kInf);
}
Tensor isfinite(const Tensor& x) {
  if (!is_floating_point(x.dtype())) return ones(x.sizes(), TensorOptions(kBool).device(x.device()));
  return lt(abs(x), kInf);  // false for nan too
}

Tensor logical_and(const Tensor& a, const Tensor& b) { return where(truth(a), truth(b), bool_scalar(false, a.device())); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return where(truth(a), bool_scalar(true, a.device()), truth(b)); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return ne(truth(a), truth(b)); }
Tensor logical_not(const Tensor& x) {
  return where(truth(x), bool_scalar(false, x.device()), bool_scalar(true, x.device()));
}

Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return eq(sum(logical_not(x).to(kInt32), dims, keepdim), 0.0);
}
Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return gt(sum(truth(x).to(kInt32), dims, keepdim), 0.0);
}

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  KILN_CHECK(a.defined() && b.defined(), "isclose", "undefined tensor");
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose", "rtol and atol must be non-negative, got rtol=", rtol, " atol=", atol);
  NoGradGuard ng;
  const DType common = promote_types(a.dtype(), b.dtype());
  if (common == kBool) return eq(a, b);
  const DType ct = is_floating_point(common) ? (is_low_precision(common) ? kFloat32 : common) : kFloat64;
  const Tensor x = a.to(ct), y = b.to(ct);
  Tensor close = eq(x, y);
  if (equal_nan) close = logical_or(close, logical_and(isnan(x), isnan(y)));
  const Tensor diff = abs(x - y);
  const Tensor allowed = add(mul(abs(y), rtol), atol);
  return logical_or(close, logical_and(isfinite(diff), le(diff, allowed)));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all(isclose(a, b, rtol, atol, equal_nan)).item() != 0;
}

Tensor nonzero(const Tensor& x) {
  KILN_CHECK(x.defined(), "nonzero", "input is undefined");
  Tensor flat;
  {
    NoGradGuard ng;
    flat = true_positions(truth(x), kCPU);
  }
  const int64_t count = flat.numel(), nd = x.dim();
  Tensor out = empty({count, nd}, kInt64);
  const int64_t* f = flat.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = f[i];
    for (int64_t d = nd - 1; d >= 0; --d) {
      o[i * nd + d] = rest % x.sizes()[d];
      rest /= x.sizes()[d];
    }
  }
  return out.to(x.device());
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  KILN_CHECK(x.defined() && mask.defined(), "masked_select", "undefined tensor");
  KILN_CHECK(mask.dtype() == kBool, "masked_select", "expected a bool mask, got ", dtype_name(mask.dtype()));
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes(), "masked_select");
  Tensor positions;
  {
    NoGradGuard ng;
    positions = true_positions(mask.expand(shape), x.device());
  }
  return index_select(x.expand(shape).reshape({-1}), 0, positions);
}

Tensor index_by_mask(const Tensor& x, const Tensor& mask) {
  const Shape rows = mask_rows_shape(x, mask, "index");
  Tensor positions;
  {
    NoGradGuard ng;
    positions = true_positions(mask, x.device());
  }
  return index_select(x.reshape(rows), 0, positions);
}

Tensor& index_put_by_mask_(Tensor& self, const Tensor& mask, const Tensor& value) {
  check_writable(self, "index_put_");
  const Shape rows = mask_rows_shape(self, mask, "index_put_");
  KILN_CHECK(value.defined(), "index_put_", "value is undefined");
  Tensor updated;
  {
    NoGradGuard ng;
    const Tensor m = mask.to(kCPU).contiguous();
    const auto* p = static_cast<const uint8_t*>(m.data_ptr());
    // source[r] = the value row that lands on mask position r (row 0 where the mask is false).
    Tensor source = empty({m.numel()}, kInt64);
    int64_t* s = source.data_ptr<int64_t>();
    int64_t count = 0;
    for (int64_t r = 0; r < m.numel(); ++r) s[r] = p[r] ? count++ : 0;
    if (count == 0) return self;
    Shape value_shape = rows;
    value_shape[0] = count;
    KILN_CHECK(broadcast_shapes(value_shape, value.sizes(), "index_put_") == value_shape, "index_put_",
               "shape mismatch: value tensor of shape ", shape_str(value.sizes()),
               " cannot be broadcast to indexing result of shape ", shape_str(value_shape));
    const Tensor v = value.to(self.device(), self.dtype()).expand(value_shape).contiguous();
    const Tensor spread = index_select(v, 0, source.to(self.device())).reshape(self.sizes());
    Shape mask_shape = mask.sizes();
    mask_shape.resize(static_cast<size_t>(self.dim()), 1);
    updated = where(mask.to(self.device()).reshape(mask_shape), spread, self.detach());
  }
  self.copy_(updated);
  return self;
}

}  // namespace kiln
