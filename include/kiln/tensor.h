#pragma once
// kiln::Tensor: a shared handle to sizes/strides/offset over reference-counted storage, with
// autograd state. Copying a Tensor copies the handle (like torch.Tensor), never the data.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

using Shape = std::vector<int64_t>;
struct TensorImpl;
class Storage;
class Node;

class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}    // NOLINT: zeros({2}, kBFloat16)
  TensorOptions(Device d) : device_(d) {}  // NOLINT: zeros({2}, Device("cuda"))
  TensorOptions dtype(DType d) const { auto o = *this; o.dtype_ = d; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r) const { auto o = *this; o.requires_grad_ = r; return o; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  DType dtype_ = kFloat32;
  Device device_ = kCPU;
  bool requires_grad_ = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t storage_offset() const;     // in elements
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_contiguous() const;
  size_t element_size() const { return kiln::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  TensorOptions options() const { return TensorOptions().dtype(dtype()).device(device()); }

  // Pointer to the first element (storage base + offset).
  void* data_ptr() const;
  template <typename T> T* data_ptr() const { return static_cast<T*>(data_ptr()); }
  const std::shared_ptr<Storage>& storage() const;
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl* impl() const { return impl_.get(); }

  // ---- views (share storage; differentiable) ----
  Tensor view(const Shape& shape) const;        // one -1 allowed; requires compatible strides
  Tensor reshape(const Shape& shape) const;     // view when possible, else a copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;                             // 2-D transpose
  Tensor permute(const Shape& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;      // -1 keeps a size; new leading dims allowed
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- copies and conversions (differentiable) ----
  Tensor contiguous() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda(int index = 0) const { return to(Device(DeviceType::CUDA, index)); }
  Tensor clone() const;
  Tensor& copy_(const Tensor& src);             // broadcasts src; converts dtype and device
  Tensor& fill_(double value);
  Tensor& zero_();

  // Scalar value of a one-element tensor (synchronises with the device).
  double item() const;
  template <typename T> T item() const { return static_cast<T>(item()); }
  std::vector<double> to_vector() const;        // all elements as double, row-major
  std::string str() const;                      // torch-like printout

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool value = true);
  bool is_leaf() const;                          // no grad_fn
  const Tensor& grad() const;                    // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad) const;
  std::shared_ptr<Node> grad_fn() const;
  uint32_t output_nr() const;
  Tensor detach() const;                         // same storage, no history
  uint64_t version() const;                      // bumped by every in-place write to the storage
  void bump_version() const;
  // Computes gradients of this tensor w.r.t. graph leaves. `grad` defaults to 1 for a scalar.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;

 private:
  friend struct TensorAccess;  // internal (core/tensor_impl.h): handle counts for the autograd engine
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Shape& shape);
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Wraps a negative dim; throws "[op] dim d out of range for a k-d tensor".
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// ---- factories ----
// shape: any; options give dtype (default float32), device (default cpu) and requires_grad.
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor scalar_tensor(double value, TensorOptions options = {});  // 0-d
// [ceil((end - start) / step)]
Tensor arange(double start, double end, double step = 1, TensorOptions options = {});
Tensor arange(double end, TensorOptions options = {});
// Uniform in [0, 1); standard normal; integers in [low, high). Philox 4x32-10 streams, so one
// seed gives the same numbers on the CPU and on CUDA.
Tensor rand(const Shape& shape, TensorOptions options = {});
Tensor randn(const Shape& shape, TensorOptions options = {});
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = kInt64);
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);
// Wraps memory kiln does not own (not counted in memory stats). `deleter` runs when the last
// tensor using it dies. strides default to contiguous.
Tensor from_blob(void* data, const Shape& shape, TensorOptions options = {},
                 std::function<void(void*)> deleter = nullptr, const Shape& strides = {});
// Copies host values into a new tensor (handy in tests): tensor({1, 2, 3}, kFloat32).
Tensor tensor(const std::vector<double>& values, TensorOptions options = {});

void manual_seed(uint64_t seed);
// The CPU generator's state as an int64 [2] CPU tensor {seed (bits), counter offset} (torch's
// get_rng_state; restoring it replays the same random numbers). set_rng_state gives the CPU its
// own seed until the next manual_seed. CUDA devices: kiln::cuda::get_rng_state (kiln/cuda.h).
Tensor get_rng_state();
void set_rng_state(const Tensor& state);

}  // namespace kiln
