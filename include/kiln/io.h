#pragma once
// Checkpoint I/O: safetensors and PyTorch zip checkpoints, read natively (no Python) and safely
// (a hostile file raises kiln::Error; nothing in it is ever executed). The format is detected
// from the bytes, never from the file name.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::io {

enum class Format { Safetensors, TorchZip };
const char* format_name(Format format);  // "safetensors", "torch-zip"

// Every element type of the safetensors format, in the reference implementation's order.
// Tensors of the ones kiln computes with load as kiln tensors; the others load as raw bytes.
enum class FileDType : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64
};
const char* file_dtype_name(FileDType dtype);                     // "F32", "F8_E4M3", ...
int file_dtype_bits(FileDType dtype);                             // 4, 6, 8, ..., 64
std::optional<FileDType> parse_file_dtype(std::string_view name);  // inverse of file_dtype_name
std::optional<DType> to_kiln_dtype(FileDType dtype);              // nullopt: kiln stores raw bytes
FileDType to_file_dtype(DType dtype);

// One tensor of a checkpoint. For kiln dtypes `tensor` has `dtype`'s kiln type and `shape`;
// otherwise `tensor` is a 1-D uint8 tensor of the file's bytes and `shape` is the logical shape.
struct TensorEntry {
  std::string name;
  Tensor tensor;
  FileDType dtype = FileDType::F32;
  Shape shape;
  bool raw() const { return !to_kiln_dtype(dtype).has_value(); }
};

// Ordered name -> tensor map (insertion order; names unique).
class TensorDict {
 public:
  TensorDict() = default;
  TensorDict(std::initializer_list<std::pair<std::string, Tensor>> items);
  explicit TensorDict(const std::vector<std::pair<std::string, Tensor>>& items);

  // Inserts a kiln tensor; throws on a duplicate name.
  void insert(const std::string& name, const Tensor& tensor);
  // Inserts raw bytes (1-D uint8) tagged with a file dtype and logical shape.
  void insert_raw(const std::string& name, const Tensor& bytes, FileDType dtype, const Shape& shape);
  void insert(TensorEntry entry);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const Tensor& at(const std::string& name) const { return entry(name).tensor; }
  const TensorEntry& entry(const std::string& name) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> names() const;
  std::vector<TensorEntry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<TensorEntry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<TensorEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

using Metadata = std::map<std::string, std::string>;

struct Checkpoint {
  Format format = Format::Safetensors;
  TensorDict tensors;
  // safetensors: `__metadata__`. torch: the non-tensor leaves of the pickled object
  // (e.g. "step" -> "1000"), nested names joined with '.'.
  Metadata metadata;
};

struct LoadOptions {
  Device device = kCPU;            // load straight to cuda:N (through a CPU staging copy)
  std::vector<std::string> names;  // empty: every tensor; a missing name is an error
  // CPU only: zero-copy tensors backed by a private mapping of the file; nothing is read until
  // touched. In-place writes go to copy-on-write pages, never to the file. The mapping lives as
  // long as any tensor uses it. Data not aligned to its element size, and big-endian torch files,
  // fall back to copies.
  bool mmap = false;
};

// Detects the format from the first bytes: "PK\x03\x04" is a torch zip; a plausible safetensors
// header length followed by '{' (after whitespace) is safetensors; anything else throws.
Format detect_format(const void* data, size_t size);
Format detect_format(const std::string& path);

Checkpoint load(const std::string& path, const LoadOptions& options = {});
// Parses an in-memory file (fuzzers, tests); CPU tensors owning copies of their bytes.
Checkpoint load_bytes(const void* data, size_t size, const LoadOptions& options = {});

// safetensors, written atomically (temporary file in the same folder, fsync, rename, fsync
// folder). Tensors are sorted by element size (largest first), then name; the header is padded
// with spaces to a multiple of 8. A tensor named "__metadata__" is refused.
void save(const std::string& path, const TensorDict& tensors, const Metadata& metadata = {});
std::vector<uint8_t> save_bytes(const TensorDict& tensors, const Metadata& metadata = {});

// A stored zip that torch.load(path, weights_only=True) reads, written atomically: records
// `data.pkl` (pickle protocol 2), `byteorder`, `data/<k>` (64-byte aligned), `version`.
// Tensors that share one kiln storage share one record and load back as views of it.
void save_torch(const std::string& path, const TensorDict& tensors);
std::vector<uint8_t> save_torch_bytes(const TensorDict& tensors);

// CRC-32 (zip's polynomial) of a byte range; `inspect` prints it per tensor.
uint32_t crc32(const void* data, size_t size, uint32_t seed = 0);

}  // namespace kiln::io
