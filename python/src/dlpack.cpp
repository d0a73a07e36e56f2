// DLPack both ways, zero-copy, and Tensor.numpy().
//
// Export (Tensor.__dlpack__): a capsule whose manager context holds a kiln::Tensor handle, so the
// storage lives until the consumer calls the deleter. Strided tensors export their strides as is.
// CUDA streams: the consumer passes its stream (DLPack: None = legacy default, 1 = legacy default,
// 2 = per-thread default, -1 = no synchronisation, else a cudaStream_t). kiln records an event on
// its current stream and makes the consumer's stream wait on it: no host synchronisation.
// Import (_from_dlpack_capsule): the producer was asked (by kiln/_dlpack.py) to order its work
// before kiln's current stream; the tensor wraps the memory with from_blob, whose deleter calls
// the producer's deleter.
#include <nanobind/ndarray.h>

#include "bind.h"
#include "kiln/cuda.h"
#include "kiln/error.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln::py {
namespace {

// The DLPack ABI (dlpack.h v1.0), declared from the specification.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data; DLDevice device; int32_t ndim; DLDataType dtype;
  int64_t* shape; int64_t* strides; uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version; void* manager_ctx; void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags; DLTensor dl_tensor;
};
enum : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
constexpr uint64_t kFlagReadOnly = 1;
constexpr const char* kOp = "dlpack";

DLDataType to_dl(DType d) {
  const uint8_t bits = static_cast<uint8_t>(element_size(d) * 8);
  switch (d) {
    case kFloat32: case kFloat64: case kFloat16: return {kDLFloat, bits, 1};
    case kBFloat16: return {kDLBfloat, 16, 1};
    case kInt64: case kInt32: case kInt8: return {kDLInt, bits, 1};
    case kUInt8: case kUInt16: case kUInt32: return {kDLUInt, bits, 1};
    case kBool: return {kDLBool, 8, 1};
  }
  KILN_FAIL(kOp, "unknown dtype");
}

DType from_dl(DLDataType t) {
  KILN_CHECK(t.lanes == 1, kOp, "vector dtypes (lanes ", t.lanes, ") are not supported");
  if (t.code == kDLFloat && t.bits == 32) return kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return kBFloat16;
  if (t.code == kDLInt && t.bits == 64) return kInt64;
  if (t.code == kDLInt && t.bits == 32) return kInt32;
  if (t.code == kDLInt && t.bits == 8) return kInt8;
  if (t.code == kDLUInt && t.bits == 8) return kUInt8;
  if (t.code == kDLUInt && t.bits == 16) return kUInt16;
  if (t.code == kDLUInt && t.bits == 32) return kUInt32;
  if (t.code == kDLBool && t.bits == 8) return kBool;
  KILN_FAIL(kOp, "unsupported DLPack dtype (code ", int(t.code), ", bits ", int(t.bits),
            "); kiln has float32/64, float16, bfloat16, int64/32/8, uint32/16/8 and bool");
}

template <typename Managed>
struct ExportCtx {
  Tensor tensor;
  Shape shape, strides;
  Managed managed{};
};

template <typename Managed>
Managed* make_managed(const Tensor& t) {
  auto* ctx = new ExportCtx<Managed>{t, t.sizes(), t.strides()};
  Managed& m = ctx->managed;
  DLTensor& dl = m.dl_tensor;
  dl.data = t.data_ptr();
  dl.device = {t.is_cuda() ? kDLCUDA : kDLCPU, t.is_cuda() ? t.device().index : 0};
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = to_dl(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  m.manager_ctx = ctx;
  m.deleter = [](Managed* self) { delete static_cast<ExportCtx<Managed>*>(self->manager_ctx); };
  return &m;
}

// Makes the consumer's stream wait for the work queued on kiln's current stream of `device`.
void order_for_consumer(const Tensor& t, std::optional<int64_t> stream) {
  if (!t.is_cuda()) return;
#ifdef KILN_WITH_CUDA
  const int64_t s = stream.value_or(1);
  if (s == -1) return;
  KILN_CHECK(s != 0, kOp, "stream 0 is ambiguous in DLPack; pass 1 for the legacy default stream");
  cudaStream_t consumer = s == 1   ? cudaStreamLegacy
                          : s == 2 ? cudaStreamPerThread
                                   : reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s));
  const int dev = t.device().index;
  auto producer = static_cast<cudaStream_t>(cuda::current_stream(dev).handle());
  if (producer == consumer || (producer == nullptr && consumer == cudaStreamLegacy)) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(dev);
  cudaEvent_t ev = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(ev, producer);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(consumer, ev, 0);
  if (ev) cudaEventDestroy(ev);  // released once the wait has been satisfied
  cudaSetDevice(previous);
  KILN_CHECK(err == cudaSuccess, kOp, "ordering the consumer's stream failed: ", cudaGetErrorString(err));
#else
  (void)stream;
  KILN_FAIL(kOp, "kiln was built without CUDA");
#endif
}

void capsule_destructor_v0(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;  // consumed ("used_dltensor"): the consumer owns it
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

void capsule_destructor_v1(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, "dltensor_versioned")) return;
  auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
  if (m && m->deleter) m->deleter(m);
}

nb::object to_dlpack(const Tensor& t, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                     nb::handle copy) {
  KILN_CHECK(t.defined(), kOp, "undefined tensor");
  KILN_CHECK(copy.is_none() || !nb::cast<bool>(copy), kOp, "copy=True is not supported (kiln exports views)");
  if (!dl_device.is_none()) {
    auto dev = nb::cast<std::pair<int, int>>(dl_device);
    const bool same = t.is_cuda() ? (dev.first == kDLCUDA && dev.second == t.device().index) : dev.first == kDLCPU;
    KILN_CHECK(same, kOp, "export to another device (", dev.first, ", ", dev.second, ") is not supported");
  }
  order_for_consumer(t, stream.is_none() ? std::nullopt : std::optional<int64_t>(nb::cast<int64_t>(stream)));
  bool versioned = false;
  if (!max_version.is_none()) versioned = nb::cast<std::pair<int, int>>(max_version).first >= 1;
  if (versioned) {
    auto* m = make_managed<DLManagedTensorVersioned>(t);
    m->version = {1, 0};
    m->flags = 0;
    PyObject* cap = PyCapsule_New(m, "dltensor_versioned", capsule_destructor_v1);
    if (!cap) { m->deleter(m); throw nb::python_error(); }
    return nb::steal(cap);
  }
  auto* m = make_managed<DLManagedTensor>(t);
  PyObject* cap = PyCapsule_New(m, "dltensor", capsule_destructor_v0);
  if (!cap) { m->deleter(m); throw nb::python_error(); }
  return nb::steal(cap);
}

template <typename Managed>
Tensor wrap(Managed* m, bool read_only) {
  const DLTensor& dl = m->dl_tensor;
  Device device;
  switch (dl.device.device_type) {
    case kDLCPU: case kDLCUDAHost: device = kCPU; break;
    case kDLCUDA: case kDLCUDAManaged:
#ifndef KILN_WITH_CUDA
      KILN_FAIL("from_dlpack", "a CUDA tensor was given but kiln was built without CUDA");
#endif
      device = Device(DeviceType::CUDA, dl.device.device_id);
      break;
    default:
      KILN_FAIL("from_dlpack", "unsupported DLPack device type ", dl.device.device_type);
  }
  const DType dtype = from_dl(dl.dtype);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : Shape();
  for (int64_t s : strides)
    KILN_CHECK(s >= 0, "from_dlpack", "negative strides are not supported (copy the array first)");
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  Tensor t = from_blob(data, shape, TensorOptions().dtype(dtype).device(device),
                       [m](void*) { if (m->deleter) m->deleter(m); }, strides);
  // kiln has no read-only tensors: a read-only producer (e.g. a NumPy view of immutable bytes) gets
  // a private copy instead of letting kiln write into memory it must not touch.
  return read_only ? t.clone() : t;
}

Tensor from_capsule(nb::handle cap) {
  PyObject* c = cap.ptr();
  KILN_CHECK(PyCapsule_CheckExact(c), "from_dlpack", "expected a DLPack capsule");
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    KILN_CHECK(m->version.major == 1, "from_dlpack", "unsupported DLPack major version ", m->version.major);
    PyCapsule_SetName(c, "used_dltensor_versioned");  // from here on kiln owns it
    return wrap(m, (m->flags & kFlagReadOnly) != 0);
  }
  if (PyCapsule_IsValid(c, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    PyCapsule_SetName(c, "used_dltensor");
    return wrap(m, false);
  }
  KILN_FAIL("from_dlpack", "the capsule was already consumed or is not a DLPack tensor");
}

// The stream a producer should order its work before (DLPack's convention: 1 = legacy default).
int64_t consumer_stream(int device) {
  void* h = cuda::current_stream(device).handle();
  return h ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(h)) : 1;
}

nb::object numpy_view(const Tensor& t) {
  KILN_CHECK(!t.is_cuda(), "numpy", "a CUDA tensor cannot be viewed as a NumPy array; call .cpu() first");
  KILN_CHECK(!t.requires_grad(), "numpy", "can't call numpy() on a tensor that requires grad; use "
             "tensor.detach().numpy()");
  nb::dlpack::dtype dt;
  switch (t.dtype()) {
    case kFloat32: dt = nb::dtype<float>(); break;
    case kFloat64: dt = nb::dtype<double>(); break;
    case kFloat16: dt = {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case kBFloat16: dt = nb::dtype<uint16_t>(); break;  // re-viewed as ml_dtypes.bfloat16 by kiln/_tensor.py
    case kInt64: dt = nb::dtype<int64_t>(); break;
    case kInt32: dt = nb::dtype<int32_t>(); break;
    case kInt8: dt = nb::dtype<int8_t>(); break;
    case kUInt8: dt = nb::dtype<uint8_t>(); break;
    case kBool: dt = nb::dtype<bool>(); break;
    case kUInt16: dt = nb::dtype<uint16_t>(); break;
    case kUInt32: dt = nb::dtype<uint32_t>(); break;
  }
  std::vector<size_t> shape(t.sizes().begin(), t.sizes().end());
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> arr(t.data_ptr(), shape.size(), shape.data(), owner, t.strides().data(), dt);
  return arr.cast();
}

}  // namespace

void bind_dlpack(nb::module_& m, nb::class_<Tensor>& cls) {
  cls.def("__dlpack__", &to_dlpack, "stream"_a = nb::none(), "max_version"_a = nb::none(),
          "dl_device"_a = nb::none(), "copy"_a = nb::none(),
          "A DLPack capsule viewing this tensor (zero-copy); on CUDA the consumer's `stream` is made to "
          "wait for kiln's current stream (an event, no host synchronisation).")
      .def("__dlpack_device__", [](const Tensor& t) {
        return std::make_pair(t.is_cuda() ? int(kDLCUDA) : int(kDLCPU), t.is_cuda() ? t.device().index : 0);
      })
      .def("_numpy_view", &numpy_view);
  m.def("_from_dlpack_capsule", &from_capsule, "capsule"_a);
  m.def("_consumer_stream", &consumer_stream, "device"_a);
}

}  // namespace kiln::py
