// Checkpoint I/O (kiln.load / kiln.save) and the CUDA / memory-statistics functions (kiln.cuda.*).
#include <nanobind/stl/map.h>

#include "bind.h"
#include "kiln/cuda.h"
#include "kiln/io.h"
#include "kiln/memory.h"

namespace kiln::py {
namespace {

// A str as UTF-8; a str that has none (a lone surrogate, as os.fsdecode makes of stray bytes) is
// a KilnError naming it, not the cast error a plain conversion would raise.
std::string utf8(nb::handle text, const char* op, const char* what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
  if (p == nullptr) {
    PyErr_Clear();
    const std::string shown = nb::cast<std::string>(nb::repr(text).attr("encode")("ascii", "backslashreplace").attr("decode")("ascii"));
    KILN_FAIL(op, what, " ", shown, " is not valid Unicode text (it holds a lone surrogate) and cannot be saved");
  }
  return std::string(p, static_cast<size_t>(n));
}

// {name: kiln.Tensor | (uint8 bytes Tensor, file dtype name, shape)}: the tuples are the raw
// tensors kiln.RawTensor carries (dtypes kiln has no tensor type for), saved as that dtype.
io::TensorDict to_dict(nb::dict tensors, const char* op) {
  io::TensorDict d;
  for (auto [k, v] : tensors) {
    KILN_CHECK(nb::isinstance<nb::str>(k), op, "tensor names must be strings");
    const std::string name = utf8(k, op, "tensor name");
    if (nb::isinstance<nb::tuple>(v) && nb::len(v) == 3 && nb::isinstance<Tensor>(v[0])) {
      const std::string dt = nb::cast<std::string>(v[1]);
      const auto fd = io::parse_file_dtype(dt);
      KILN_CHECK(fd.has_value(), op, "'", name, "': unknown safetensors dtype '", dt, "'");
      d.insert_raw(name, nb::cast<Tensor>(v[0]), *fd, nb::cast<Shape>(v[2]));
      continue;
    }
    KILN_CHECK(nb::isinstance<Tensor>(v), op, "'", name, "' is not a kiln.Tensor");
    d.insert(name, nb::cast<Tensor>(v));
  }
  return d;
}

// (tensors, metadata, format name, raw) for kiln/_io.py. Raw tensors (dtypes kiln has no type for)
// come with their file dtype and logical shape.
nb::tuple checkpoint_tuple(const io::Checkpoint& ck) {
  nb::dict tensors, raw;
  for (const auto& e : ck.tensors) {
    tensors[e.name.c_str()] = e.tensor;
    if (e.raw()) raw[e.name.c_str()] = nb::make_tuple(io::file_dtype_name(e.dtype), nb::cast(e.shape));
  }
  return nb::make_tuple(tensors, ck.metadata, io::format_name(ck.format), raw);
}

// true: safetensors; false: torch (which stores no metadata).
bool check_format(const std::string& format, const io::Metadata& metadata) {
  if (format == "safetensors") return true;
  KILN_CHECK(format == "torch", "save", "format must be 'safetensors' or 'torch', got '", format, "'");
  KILN_CHECK(metadata.empty(), "save", "metadata is only stored in safetensors files");
  return false;
}

Device cuda_device(std::optional<Device> d) {
  if (!d) return Device(DeviceType::CUDA, cuda::current_device());
  return *d;
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def("_load", [](const std::string& path, Device device, bool mmap, std::vector<std::string> names) {
    io::LoadOptions o;
    o.device = device;
    o.mmap = mmap;
    o.names = std::move(names);
    io::Checkpoint ck;
    {
      nb::gil_scoped_release release;
      ck = io::load(path, o);
    }
    return checkpoint_tuple(ck);
  }, "path"_a, "device"_a, "mmap"_a, "names"_a);
  // The same from a file's bytes (kiln.load of a file object): CPU tensors owning copies.
  m.def("_load_bytes", [](nb::bytes data, std::vector<std::string> names) {
    io::LoadOptions o;
    o.names = std::move(names);
    io::Checkpoint ck;
    {
      nb::gil_scoped_release release;
      ck = io::load_bytes(data.c_str(), data.size(), o);
    }
    return checkpoint_tuple(ck);
  }, "data"_a, "names"_a);
  m.def("_save", [](nb::dict tensors, const std::string& path, const std::string& format, nb::dict meta, bool checksums) {
    io::TensorDict d = to_dict(tensors, "save");
    io::Metadata metadata;
    for (auto [k, v] : meta) metadata[utf8(k, "save", "metadata key")] = utf8(v, "save", "metadata value");
    nb::gil_scoped_release release;
    if (check_format(format, metadata)) {
      io::save(path, d, metadata, checksums);
    } else {
      io::save_torch(path, d);
    }
  }, "tensors"_a, "path"_a, "format"_a, "metadata"_a, "checksums"_a);
  // The same into bytes (kiln.save to a file object).
  m.def("_save_bytes", [](nb::dict tensors, const std::string& format, nb::dict meta, bool checksums) {
    io::TensorDict d = to_dict(tensors, "save");
    io::Metadata metadata;
    for (auto [k, v] : meta) metadata[utf8(k, "save", "metadata key")] = utf8(v, "save", "metadata value");
    std::vector<uint8_t> out;
    {
      nb::gil_scoped_release release;
      out = check_format(format, metadata) ? io::save_bytes(d, metadata, checksums) : io::save_torch_bytes(d);
    }
    return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size());
  }, "tensors"_a, "format"_a, "metadata"_a, "checksums"_a);
  m.def("_detect_format", [](const std::string& path) { return io::format_name(io::detect_format(path)); }, "path"_a);

  auto c = m.def_submodule("_cuda", "CUDA devices, streams and memory statistics");
  c.def("is_available", &cuda_is_available)
      .def("device_count", &cuda_device_count)
      .def("current_device", &cuda::current_device)
      .def("set_device", &cuda::set_device, "device"_a)
      .def("synchronize", [](std::optional<int> device) {
        nb::gil_scoped_release release;
        cuda::synchronize(device.value_or(-1));
      }, "device"_a = nb::none());
  // `with _C._cuda.ExternalStream(ptr, device):` makes a stream kiln does not own (torch's current
  // stream, as a cudaStream_t integer; 0 = legacy default) kiln's current stream for the block,
  // so kernels, allocations and frees are ordered on it; the previous stream comes back on exit.
  struct ExternalStream {
    ExternalStream(uintptr_t h, int d) : handle(h), device(d) {}
    uintptr_t handle;
    int device;
    std::optional<cuda::Stream> previous;
  };
  nb::class_<ExternalStream>(c, "ExternalStream")
      .def(nb::init<uintptr_t, int>(), "handle"_a, "device"_a)
      .def("__enter__", [](ExternalStream& s) -> ExternalStream& {
        s.previous = cuda::current_stream(s.device);
        cuda::set_current_stream(cuda::Stream::external(reinterpret_cast<void*>(s.handle), s.device));
        return s;
      }, nb::rv_policy::reference)
      .def("__exit__", [](ExternalStream& s, nb::args) {
        if (s.previous) cuda::set_current_stream(*s.previous);
        s.previous.reset();
      });
  // Memory statistics for any device (kiln.cuda.* pass CUDA devices, kiln.cpu.* the CPU).
  m.def("memory_allocated", [](std::optional<Device> d) { return memory_allocated(cuda_device(d)); }, "device"_a = nb::none())
      .def("max_memory_allocated", [](std::optional<Device> d) { return max_memory_allocated(cuda_device(d)); }, "device"_a = nb::none())
      .def("memory_reserved", [](std::optional<Device> d) { return memory_reserved(cuda_device(d)); }, "device"_a = nb::none())
      .def("max_memory_reserved", [](std::optional<Device> d) { return max_memory_reserved(cuda_device(d)); }, "device"_a = nb::none())
      .def("reset_peak_memory_stats", [](std::optional<Device> d) { reset_peak_memory_stats(cuda_device(d)); }, "device"_a = nb::none())
      .def("empty_cache", [](std::optional<Device> d) { empty_cache(cuda_device(d)); }, "device"_a = nb::none())
      .def("memory_stats", [](std::optional<Device> d) {
        MemoryStats s = memory_stats(cuda_device(d));
        nb::dict out;
        out["allocated_bytes.all.current"] = s.allocated;
        out["allocated_bytes.all.peak"] = s.peak_allocated;
        out["reserved_bytes.all.current"] = s.reserved;
        out["reserved_bytes.all.peak"] = s.peak_reserved;
        out["num_alloc_retries"] = 0;
        out["num_allocs"] = s.num_allocs;
        return out;
      }, "device"_a = nb::none());
}


}  // namespace kiln::py
