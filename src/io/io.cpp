// kiln::io entry points: dtype tables, TensorDict, CRC-32, format detection, load/save.
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "io/file_util.h"

namespace kiln::io {
namespace {

struct DTypeInfo {
  FileDType dtype;
  const char* name;
  int bits;
};
constexpr std::array<DTypeInfo, 22> kDTypes{{
    {FileDType::BOOL, "BOOL", 8},      {FileDType::F4, "F4", 4},
    {FileDType::F6_E2M3, "F6_E2M3", 6}, {FileDType::F6_E3M2, "F6_E3M2", 6},
    {FileDType::U8, "U8", 8},          {FileDType::I8, "I8", 8},
    {FileDType::F8_E5M2, "F8_E5M2", 8}, {FileDType::F8_E4M3, "F8_E4M3", 8},
    {FileDType::F8_E8M0, "F8_E8M0", 8}, {FileDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {FileDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8}, {FileDType::I16, "I16", 16},
    {FileDType::U16, "U16", 16},       {FileDType::F16, "F16", 16},
    {FileDType::BF16, "BF16", 16},     {FileDType::I32, "I32", 32},
    {FileDType::U32, "U32", 32},       {FileDType::F32, "F32", 32},
    {FileDType::C64, "C64", 64},       {FileDType::F64, "F64", 64},
    {FileDType::I64, "I64", 64},       {FileDType::U64, "U64", 64},
}};

std::array<uint32_t, 8 * 256> make_crc_tables() {
  std::array<uint32_t, 8 * 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s * 256 + i] = (t[(s - 1) * 256 + i] >> 8) ^ t[t[(s - 1) * 256 + i] & 0xff];
  return t;
}

}  // namespace

const char* format_name(Format format) { return format == Format::Safetensors ? "safetensors" : "torch-zip"; }

const char* file_dtype_name(FileDType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }
int file_dtype_bits(FileDType dtype) { return kDTypes[static_cast<size_t>(dtype)].bits; }

std::optional<FileDType> parse_file_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::optional<DType> to_kiln_dtype(FileDType dtype) {
  switch (dtype) {
    case FileDType::BOOL: return kBool;
    case FileDType::U8: return kUInt8;
    case FileDType::U16: return kUInt16;
    case FileDType::U32: return kUInt32;
    case FileDType::I8: return kInt8;
    case FileDType::I32: return kInt32;
    case FileDType::I64: return kInt64;
    case FileDType::F16: return kFloat16;
    case FileDType::BF16: return kBFloat16;
    case FileDType::F32: return kFloat32;
    case FileDType::F64: return kFloat64;
    default: return std::nullopt;
  }
}

FileDType to_file_dtype(DType dtype) {
  switch (dtype) {
    case kBool: return FileDType::BOOL;
    case kUInt8: return FileDType::U8;
    case kUInt16: return FileDType::U16;
    case kUInt32: return FileDType::U32;
    case kInt8: return FileDType::I8;
    case kInt32: return FileDType::I32;
    case kInt64: return FileDType::I64;
    case kFloat16: return FileDType::F16;
    case kBFloat16: return FileDType::BF16;
    case kFloat32: return FileDType::F32;
    case kFloat64: return FileDType::F64;
  }
  KILN_FAIL("io", "unknown dtype ", static_cast<int>(dtype));
}

TensorDict::TensorDict(std::initializer_list<std::pair<std::string, Tensor>> items) {
  for (const auto& [name, t] : items) insert(name, t);
}
TensorDict::TensorDict(const std::vector<std::pair<std::string, Tensor>>& items) {
  for (const auto& [name, t] : items) insert(name, t);
}

void TensorDict::insert(const std::string& name, const Tensor& tensor) {
  KILN_CHECK(tensor.defined(), "io", "tensor '", name, "' is undefined");
  insert(TensorEntry{name, tensor, to_file_dtype(tensor.dtype()), tensor.sizes()});
}

void TensorDict::insert_raw(const std::string& name, const Tensor& bytes, FileDType dtype, const Shape& shape) {
  KILN_CHECK(bytes.defined() && bytes.dtype() == kUInt8 && bytes.dim() == 1, "io", "raw tensor '", name,
             "' must be a 1-D uint8 tensor of bytes");
  int64_t bits = file_dtype_bits(dtype);
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0, "io", "raw tensor '", name, "' has a negative size");
    bits *= s;
  }
  KILN_CHECK(bits % 8 == 0 && bits / 8 == bytes.numel(), "io", "raw tensor '", name, "': ", bytes.numel(),
             " bytes do not hold shape ", shape_str(shape), " of ", file_dtype_name(dtype));
  insert(TensorEntry{name, bytes, dtype, shape});
}

void TensorDict::insert(TensorEntry entry) {
  KILN_CHECK(!contains(entry.name), "io", "duplicate tensor name '", entry.name, "'");
  index_.emplace(entry.name, entries_.size());
  entries_.push_back(std::move(entry));
}

const TensorEntry& TensorDict::entry(const std::string& name) const {
  auto it = index_.find(name);
  KILN_CHECK(it != index_.end(), "io", "no tensor named '", name, "'");
  return entries_[it->second];
}

std::vector<std::string> TensorDict::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

uint32_t crc32(const void* data, size_t size, uint32_t seed) {
  static const std::array<uint32_t, 8 * 256> t = make_crc_tables();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~seed;
  while (size >= 8) {  // slicing-by-8
    const uint32_t a = c ^ detail::le32(p), b = detail::le32(p + 4);
    c = t[7 * 256 + (a & 0xff)] ^ t[6 * 256 + ((a >> 8) & 0xff)] ^ t[5 * 256 + ((a >> 16) & 0xff)] ^
        t[4 * 256 + (a >> 24)] ^ t[3 * 256 + (b & 0xff)] ^ t[2 * 256 + ((b >> 8) & 0xff)] ^
        t[1 * 256 + ((b >> 16) & 0xff)] ^ t[b >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = t[(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

namespace {
// avail: bytes at p (the head of the file); size: the whole file's size.
Format detect_impl(const uint8_t* p, size_t avail, uint64_t size) {
  if (avail >= 4 && std::memcmp(p, "PK\x03\x04", 4) == 0) return Format::TorchZip;
  KILN_CHECK(avail >= 8, "io", "unrecognised checkpoint format: the file has only ", size,
             " bytes (neither a zip nor a safetensors header)");
  const uint64_t n = detail::le64(p);
  // safetensors: the JSON opens with '{' (possibly after whitespace), or at least the length is
  // plausible; the parser then names whichever rule the header breaks.
  for (size_t i = 8; i < avail; ++i) {
    if (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') continue;
    if (p[i] == '{') return Format::Safetensors;
    break;
  }
  if (n <= 100'000'000ULL && n <= size - 8) return Format::Safetensors;
  KILN_FAIL("io", "unrecognised checkpoint format: not a zip (PK\\x03\\x04) and not a safetensors header");
}
}  // namespace

Format detect_format(const void* data, size_t size) {
  return detect_impl(static_cast<const uint8_t*>(data), size, size);
}

Format detect_format(const std::string& path) {
  detail::Source src = detail::Source::open_file(path, false);
  const size_t n = std::min<size_t>(src.size(), 4096);
  std::vector<uint8_t> head = src.read_vec(n, 0, "io");
  return detect_impl(head.data(), head.size(), src.size());
}

namespace {
Checkpoint load_from(const detail::Source& src, const LoadOptions& options) {
  const size_t n = std::min<size_t>(src.size(), 4096);
  std::vector<uint8_t> head = src.read_vec(n, 0, "io");
  const Format f = detect_impl(head.data(), head.size(), src.size());
  return f == Format::TorchZip ? detail::load_torch_zip(src, options) : detail::load_safetensors(src, options);
}


CheckpointInfo info_from(const detail::Source& src, bool checksums) {
  const size_t n = std::min<size_t>(src.size(), 4096);
  std::vector<uint8_t> head = src.read_vec(n, 0, "io");
  const Format f = detect_impl(head.data(), head.size(), src.size());
  return f == Format::TorchZip ? detail::torch_zip_info(src, checksums) : detail::safetensors_info(src, checksums);
}
}  // namespace

CheckpointInfo inspect(const std::string& path, bool checksums) {
  return info_from(detail::Source::open_file(path, false), checksums);
}

CheckpointInfo inspect_bytes(const void* data, size_t size, bool checksums) {
  return info_from(detail::Source::from_memory(data, size), checksums);
}

Checkpoint load(const std::string& path, const LoadOptions& options) {
  const bool map = options.mmap && options.device.is_cpu();
  return load_from(detail::Source::open_file(path, map), options);
}

Checkpoint load_bytes(const void* data, size_t size, const LoadOptions& options) {
  return load_from(detail::Source::from_memory(data, size), options);
}

void save(const std::string& path, const TensorDict& tensors, const Metadata& metadata, bool checksums) {
  detail::AtomicWriter w(path);
  detail::Sink sink(&w);
  detail::write_safetensors(sink, tensors, metadata, checksums);
  w.commit();
}

std::vector<uint8_t> save_bytes(const TensorDict& tensors, const Metadata& metadata, bool checksums) {
  std::vector<uint8_t> out;
  detail::Sink sink(&out);
  detail::write_safetensors(sink, tensors, metadata, checksums);
  return out;
}

void save_torch(const std::string& path, const TensorDict& tensors) {
  detail::AtomicWriter w(path);
  detail::Sink sink(&w);
  detail::write_torch_zip(sink, tensors);
  w.commit();
}

void write_file_atomic(const std::string& path, const void* bytes, size_t size) {
  detail::AtomicWriter w(path);
  w.write(bytes, size);
  w.commit();
}

std::string read_small_file(const std::string& path, size_t max_bytes) {
  uint64_t size = 0;
  const int fd = detail::open_regular(path, "io", &size);
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  KILN_CHECK(size <= max_bytes, "io", path, " has ", size, " bytes, more than the ", max_bytes, " expected");
  std::string out(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, "io", "reading ", path, " failed: ", n < 0 ? std::strerror(errno) : "it shrank while read");
    done += static_cast<size_t>(n);
  }
  return out;
}

std::vector<uint8_t> save_torch_bytes(const TensorDict& tensors) {
  std::vector<uint8_t> out;
  detail::Sink sink(&out);
  detail::write_torch_zip(sink, tensors);
  return out;
}

}  // namespace kiln::io
