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
// Tensors of the ones kiln computes with load as kiln tensors; the others (I16, U64,
// F8_*, F4, F6_*, C64) load as raw bytes tagged with their file dtype and logical shape, and save
// back as that dtype and shape, byte for byte.
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
  // fall back to copies. The file's size is checked when it is opened, but a file truncated by
  // another process while mapped raises SIGBUS on the next touch of a lost page (the kernel's
  // rule for mappings): map only files nothing rewrites in place. Off by default: loads copy.
  bool mmap = false;
  // Copying loads check every tensor they read against the checksums the file carries: the
  // CRC-32 per tensor that save(..., checksums = true) writes into safetensors metadata (key
  // kChecksumKey), and a torch zip's per-record CRC-32. A mismatch is an error naming the tensor. mmap loads skip the
  // check (it would read every page at load time).
  bool verify_checksums = true;
};

// Safetensors metadata key holding {"tensor name": "crc32 as 8 hex digits", ...} (a JSON object
// as a string), written by save(..., checksums = true) and checked by load(); load() leaves it out
// of Checkpoint.metadata.
inline constexpr const char* kChecksumKey = "kiln.crc32";

// One tensor as the file describes it, read from the header (safetensors) or the pickle (torch)
// alone: inspecting never reads or allocates tensor data, so a small file that claims a huge view
// costs nothing. Every size below is checked (no overflow, inside the file).
struct TensorInfo {
  std::string name;
  FileDType dtype = FileDType::F32;
  Shape shape;
  Shape stride;                // elements (contiguous for safetensors)
  int64_t storage_offset = 0;  // elements into its storage (torch views)
  std::string storage;         // torch: the storage record ("data/0"); safetensors: empty
  uint64_t nbytes = 0;         // numel x element size: what loading it as a dense tensor takes
  uint64_t span_offset = 0;    // the file bytes its elements span: [span_offset, span_offset + span_bytes)
  uint64_t span_bytes = 0;
  // True when the tensor's bytes are exactly the span, in order (crc32 below then equals the CRC-32
  // of the loaded tensor); false for strided / zero-stride views, whose span is smaller or gapped.
  bool dense = true;
  std::optional<uint32_t> crc32;           // of the span's bytes (inspect with checksums = true)
  std::optional<uint32_t> stored_crc32;    // the file's checksum for this tensor, where it has one
};

struct CheckpointInfo {
  Format format = Format::Safetensors;
  uint64_t file_size = 0;
  Metadata metadata;                // as load() returns it (kChecksumKey left out)
  std::vector<TensorInfo> tensors;  // in load()'s order
};

// Describes a checkpoint without loading it. checksums = true also reads each tensor's span once,
// in 1 MiB pieces (memory stays bounded whatever the file claims), and fills TensorInfo::crc32.
CheckpointInfo inspect(const std::string& path, bool checksums = false);
CheckpointInfo inspect_bytes(const void* data, size_t size, bool checksums = false);

// Detects the format from the first bytes: "PK\x03\x04" is a torch zip; a plausible safetensors
// header length followed by '{' (after whitespace) is safetensors; anything else throws.
Format detect_format(const void* data, size_t size);
Format detect_format(const std::string& path);

Checkpoint load(const std::string& path, const LoadOptions& options = {});
// Parses an in-memory file (fuzzers, tests); CPU tensors owning copies of their bytes.
Checkpoint load_bytes(const void* data, size_t size, const LoadOptions& options = {});

// safetensors, written atomically (temporary file in the same folder, fsync, rename, fsync
// folder; temporaries a killed save left beside `path` are removed first). Tensors are sorted by
// element size (largest first), then name; the header is padded with spaces to a multiple of 8
// (byte for byte what the safetensors library writes). checksums = true adds kChecksumKey to the
// metadata (a CRC-32 per tensor, checked by load). Names and metadata must be valid UTF-8; a
// tensor named "__metadata__" and a metadata key kChecksumKey are refused. Linear time in the number of tensors and metadata entries.
void save(const std::string& path, const TensorDict& tensors, const Metadata& metadata = {}, bool checksums = false);
std::vector<uint8_t> save_bytes(const TensorDict& tensors, const Metadata& metadata = {}, bool checksums = false);

// A stored zip that torch.load(path, weights_only=True) reads, written atomically (stale
// temporaries removed as for save): records
// `data.pkl` (pickle protocol 2), `byteorder`, `data/<k>` (64-byte aligned), `version`.
// Tensors that share one kiln storage share one record and load back as views of it.
void save_torch(const std::string& path, const TensorDict& tensors);
std::vector<uint8_t> save_torch_bytes(const TensorDict& tensors);

// CRC-32 (zip's polynomial) of a byte range; `inspect` prints it per tensor.
uint32_t crc32(const void* data, size_t size, uint32_t seed = 0);

// Writes `bytes` to `path` atomically, as save() writes checkpoints (for small side files such as
// a training run's state.json).
void write_file_atomic(const std::string& path, const void* bytes, size_t size);
// Reads a whole regular file of at most max_bytes; a FIFO, device or folder is refused without
// blocking (the file is opened O_NONBLOCK and checked before any read).
std::string read_small_file(const std::string& path, size_t max_bytes);

}  // namespace kiln::io
