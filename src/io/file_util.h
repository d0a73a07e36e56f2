#pragma once
// Byte sources for the checkpoint parsers (a file read with pread, a memory mapping, or a buffer)
// and the atomic writer. Internal to src/io.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/io.h"

namespace kiln::io::detail {

// Where a checkpoint's bytes come from. Every read is bounds-checked against `size`.
class Source {
 public:
  static Source open_file(const std::string& path, bool map);  // map: mmap the whole file
  static Source from_memory(const void* data, size_t size);    // not owned; tensors copy

  size_t size() const { return size_; }
  // Copies [offset, offset + n) into dst; throws "[op] ... truncated" when it runs past the end.
  void read(void* dst, size_t n, uint64_t offset, const char* op) const;
  std::vector<uint8_t> read_vec(size_t n, uint64_t offset, const char* op) const;
  // CRC-32 of [offset, offset + n), read in 1 MiB pieces (bounded memory for any n).
  uint32_t crc32_range(uint64_t offset, uint64_t n, const char* op) const;
  // True when tensors may alias the mapped bytes (mmap was asked for and succeeded).
  bool zero_copy() const { return zero_copy_; }
  const uint8_t* mapped() const { return mem_; }
  const std::shared_ptr<void>& keep_alive() const { return keep_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  size_t size_ = 0;
  const uint8_t* mem_ = nullptr;  // the whole file, when mapped or in memory
  std::shared_ptr<void> keep_;    // owns the fd and/or the mapping
  int fd_ = -1;
  bool zero_copy_ = false;
};

// Opens a regular file for reading without ever blocking (a FIFO or device is refused before any
// read: O_NONBLOCK, then fstat); returns the fd and sets *size.
int open_regular(const std::string& path, const char* op, uint64_t* size);

// A tensor of `shape`/`dtype` holding bytes [offset, offset + nbytes) of the source: an alias of
// the mapping when zero-copy is possible and the data is aligned, else a fresh copy.
Tensor read_tensor(const Source& src, uint64_t offset, const Shape& shape, DType dtype, const char* op);

// Writes `path` atomically: a temporary file beside it, fsync, rename over path, fsync the folder.
// Destroyed without commit() (an exception), it removes the temporary file.
class AtomicWriter {
 public:
  explicit AtomicWriter(const std::string& path);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  void write(const void* data, size_t n);
  uint64_t position() const { return pos_; }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool committed_ = false;
};

// A byte sink that is either a growing buffer or an AtomicWriter (the writers serve both).
class Sink {
 public:
  explicit Sink(std::vector<uint8_t>* buf) : buf_(buf) {}
  explicit Sink(AtomicWriter* file) : file_(file) {}
  void write(const void* data, size_t n);
  void pad_to(uint64_t alignment);  // zero bytes up to a multiple of alignment
  uint64_t position() const { return pos_; }

 private:
  std::vector<uint8_t>* buf_ = nullptr;
  AtomicWriter* file_ = nullptr;
  uint64_t pos_ = 0;
};

// The bytes of a tensor as a contiguous CPU tensor (copies when it must).
Tensor contiguous_cpu(const Tensor& t);

// Overflow-free arithmetic on sizes read from untrusted files.
__extension__ typedef unsigned __int128 u128;

// Little-endian integer helpers.
inline uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
inline uint64_t le64(const uint8_t* p) { return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32); }
inline void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Safetensors and torch-zip entry points used by load()/save() (src/io/safetensors.cpp, torch_zip.cpp).
Checkpoint load_safetensors(const Source& src, const LoadOptions& options);
CheckpointInfo safetensors_info(const Source& src, bool checksums);
CheckpointInfo torch_zip_info(const Source& src, bool checksums);
void write_safetensors(Sink& sink, const TensorDict& tensors, const Metadata& metadata, bool checksums);
Checkpoint load_torch_zip(const Source& src, const LoadOptions& options);
void write_torch_zip(Sink& sink, const TensorDict& tensors);
// A stored zip of the given records, 64-byte aligned as torch writes them (tests, fuzz seeds).
std::vector<uint8_t> make_stored_zip(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& records);

}  // namespace kiln::io::detail
