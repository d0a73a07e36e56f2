// Tensor accessors, geometry helpers, copies and conversions.
#include <cmath>

#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/size_check.h"
#include "core/tensor_impl.h"
#include "kiln/autograd.h"

namespace kiln {

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  KILN_CHECK(impl != nullptr, "tensor", "use of an undefined tensor");
  return *impl;
}
}  // namespace

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  bool over = false;
  for (int64_t s : shape) {
    if (s == 0) return 0;
    over |= __builtin_mul_overflow(n, s, &n);
  }
  KILN_CHECK(!over, "numel", "shape ", shape_str(shape), " has more elements than an int64 can count");
  return n;
}

namespace {
__extension__ typedef unsigned __int128 u128;

std::string u128_str(u128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

std::string what_prefix(std::string_view what) { return what.empty() ? std::string() : std::string(what); }
}  // namespace

int64_t checked_numel(const Shape& shape, const char* op, std::string_view what) {
  u128 n = 1;
  bool over = false, empty = false;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0, op, what_prefix(what), "shape ", shape_str(shape), " has a negative size");
    empty |= s == 0;
    if (over) continue;
    n *= static_cast<uint64_t>(s);
    if (n > static_cast<u128>(INT64_MAX)) over = true;  // keep checking the rest for negatives
  }
  if (empty) return 0;
  if (over) {
    // The exact count may pass 2^128: report it in powers of two.
    double log2 = 0;
    for (int64_t s : shape) log2 += std::log2(static_cast<double>(s));
    KILN_FAIL(op, what_prefix(what), "shape ", shape_str(shape), " has about 2^", static_cast<int64_t>(log2),
              " elements: overflows the 2^63 - 1 elements a tensor may hold");
  }
  return static_cast<int64_t>(n);
}

uint64_t checked_nbytes(const Shape& shape, uint64_t element_bits, std::string_view dtype_name, const char* op,
                        std::string_view what) {
  const int64_t n = checked_numel(shape, op, what);
  const u128 bits = static_cast<u128>(static_cast<uint64_t>(n)) * element_bits;
  const u128 bytes = (bits + 7) / 8;
  KILN_CHECK(bytes <= kMaxTensorBytes, op, what_prefix(what), "shape ", shape_str(shape), " of ", dtype_name, " is ",
             n, " elements x ", element_bits % 8 == 0 ? std::to_string(element_bits / 8) + " bytes"
                                                      : std::to_string(element_bits) + " bits",
             " = ", u128_str(bytes), " bytes: overflows the 2^63 - 1 bytes a tensor may span");
  KILN_CHECK(bits % 8 == 0, op, what_prefix(what), "shape ", shape_str(shape), " of ", dtype_name, " (",
             element_bits, " bits per element) is not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape_str(shape); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  KILN_CHECK(dim >= -n && dim < n, op, "dim ", dim, " out of range for a ", ndim, "-d tensor");
  return dim < 0 ? dim + n : dim;
}

Tensor make_tensor(const Shape& sizes, DType dtype, Device device) {
  const uint64_t nbytes = checked_nbytes(sizes, element_size(dtype) * 8, dtype_name(dtype), "allocate");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(device, static_cast<size_t>(nbytes));
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

const Shape& Tensor::sizes() const { return checked(impl_).sizes; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(sizes().size()); }
int64_t Tensor::size(int64_t d) const {
  KILN_CHECK(dim() > 0, "size", "a 0-d tensor has no dims");
  return sizes()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  KILN_CHECK(dim() > 0, "stride", "a 0-d tensor has no dims");
  return strides()[wrap_dim(d, dim(), "stride")];
}
int64_t Tensor::numel() const { return shape_numel(sizes()); }
int64_t Tensor::storage_offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }

bool Tensor::is_contiguous() const {
  const auto& sz = sizes();
  const auto& st = strides();
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (sz[d] == 1) continue;
    if (st[d] != expected) return false;
    expected *= sz[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const TensorImpl& i = checked(impl_);
  char* base = static_cast<char*>(i.storage->data());
  if (base == nullptr) return nullptr;
  return base + i.offset * static_cast<int64_t>(element_size());
}

uint64_t Tensor::version() const { return storage()->version(); }
void Tensor::bump_version() const { storage()->bump_version(); }

// ---- copies ----

namespace {
// Raises when an in-place write would corrupt the autograd graph.
void check_inplace(const Tensor& t, const char* op) {
  if (is_grad_enabled() && t.requires_grad()) {
    KILN_CHECK(!t.is_leaf(), op, "a leaf tensor that requires grad is used in an in-place operation; "
               "wrap the update in kiln::NoGradGuard");
    KILN_FAIL(op, "in-place operations on tensors that are part of a graph are not differentiable in kiln; "
              "use the out-of-place op");
  }
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  KILN_CHECK(src.defined() && defined(), "copy_", "undefined tensor");
  check_inplace(*this, "copy_");
  KILN_CHECK(!(is_grad_enabled() && src.requires_grad()), "copy_",
             "copying from a tensor that requires grad is not differentiable; use clone() or to()");
  Tensor s = src.expand(sizes());
  if (numel() == 0) return *this;
  if (device() == s.device()) {
    if (device().is_cpu()) {
      cpu::copy(*this, s);
    } else {
      KILN_CUDA_ONLY("copy_", cuda::copy(*this, s));
    }
  } else if (device().is_cuda() && s.device().is_cpu()) {
    // host -> device: pack on the host in the source dtype, upload, then convert/scatter there.
    Tensor host = s.is_contiguous() ? s : s.contiguous();
    Tensor staged = is_contiguous() && dtype() == host.dtype() ? *this : make_tensor(sizes(), host.dtype(), device());
    KILN_CUDA_ONLY("copy_", cuda::memcpy_host_to_device(staged.data_ptr(), host.data_ptr(), host.nbytes(),
                                                        device().index));
    if (!staged.is_same(*this)) KILN_CUDA_ONLY("copy_", cuda::copy(*this, staged));
  } else if (device().is_cpu() && s.device().is_cuda()) {
    Tensor dev = s.is_contiguous() ? s : s.contiguous();
    Tensor staged = is_contiguous() && dtype() == dev.dtype() ? *this : make_tensor(sizes(), dev.dtype(), kCPU);
    KILN_CUDA_ONLY("copy_", cuda::memcpy_device_to_host(staged.data_ptr(), dev.data_ptr(), dev.nbytes(),
                                                        s.device().index));
    if (!staged.is_same(*this)) cpu::copy(*this, staged);
  } else {  // cuda:i -> cuda:j through the host; peer copies can come later
    copy_(s.cpu());
  }
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  if (numel() == 0) return *this;
  if (device().is_cpu()) {
    cpu::fill(*this, value);
  } else {
    KILN_CUDA_ONLY("fill_", cuda::fill(*this, value));
  }
  bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

// Out-of-place conversion into a fresh tensor with the given dtype/device; differentiable.
static Tensor converted_copy(const Tensor& src, Device device, DType dtype, const char* op) {
  Tensor out = make_tensor(src.sizes(), dtype, device);
  {
    NoGradGuard no_grad;
    out.copy_(src);
  }
  if (autograd::needs_grad({src})) {
    KILN_CHECK(is_floating_point(dtype), op, "only floating-point tensors can require gradients, got ",
               dtype_name(dtype));
    const Device src_device = src.device();
    const DType src_dtype = src.dtype();
    autograd::record(op, {out}, {src}, [src_device, src_dtype](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(src_device, src_dtype)};
    });
  }
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return converted_copy(*this, device(), dtype(), "contiguous");
}
Tensor Tensor::clone() const { return converted_copy(*this, device(), dtype(), "clone"); }
Tensor Tensor::to(Device d) const { return to(d, dtype()); }
Tensor Tensor::to(DType t) const { return to(device(), t); }
Tensor Tensor::to(Device d, DType t) const {
  if (d == device() && t == dtype()) return *this;
  return converted_copy(*this, d, t, "to");
}

std::vector<double> Tensor::to_vector() const {
  Tensor host = make_tensor(sizes(), kFloat64, kCPU);
  {
    NoGradGuard no_grad;
    host.copy_(*this);
  }
  const double* p = host.data_ptr<double>();
  return std::vector<double>(p, p + host.numel());
}

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "item", "a tensor with ", numel(), " elements cannot be converted to a scalar");
  return to_vector()[0];
}

// ---- autograd state ----

bool Tensor::requires_grad() const {
  const TensorImpl& i = checked(impl_);
  return i.autograd && (i.autograd->requires_grad || i.autograd->grad_fn);
}

Tensor& Tensor::requires_grad_(bool value) {
  KILN_CHECK(!value || is_floating_point(dtype()), "requires_grad_",
             "only floating-point tensors can require gradients, got ", dtype_name(dtype()));
  KILN_CHECK(is_leaf(), "requires_grad_", "can only change requires_grad of a leaf tensor");
  impl_->meta().requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const {
  const TensorImpl& i = checked(impl_);
  return !i.autograd || !i.autograd->grad_fn;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const TensorImpl& i = checked(impl_);
  return i.autograd ? i.autograd->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    KILN_CHECK(grad.sizes() == sizes(), "set_grad", "gradient shape ", shape_str(grad.sizes()),
               " does not match tensor shape ", shape_str(sizes()));
  }
  AutogradMeta& meta = impl_->meta();
  std::lock_guard<std::recursive_mutex> lock(meta.leaf_mutex);
  meta.grad = grad;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const TensorImpl& i = checked(impl_);
  return i.autograd ? i.autograd->grad_fn : nullptr;
}

uint32_t Tensor::output_nr() const {
  const TensorImpl& i = checked(impl_);
  return i.autograd ? i.autograd->output_nr : 0;
}

Tensor Tensor::detach() const { return make_view(*this, sizes(), strides(), storage_offset()); }

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, {grad}, retain_graph, create_graph);
}

}  // namespace kiln
