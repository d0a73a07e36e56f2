// Byte sources (pread / mmap / memory), aligned tensor reads, and the atomic writer.
#include "io/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/size_check.h"
#include "core/tensor_impl.h"

namespace kiln::io::detail {
namespace {

constexpr const char* kOp = "io";
// Reads above this size are split into chunks read by several threads: each thread then also
// takes the page faults of its own part of the freshly allocated destination.
constexpr size_t kParallelReadMin = size_t{64} << 20;
constexpr size_t kReadChunk = size_t{16} << 20;

std::string errno_text() { return std::strerror(errno); }

struct FileHandle {
  int fd = -1;
  void* map = nullptr;
  size_t map_size = 0;
  ~FileHandle() {
    if (map != nullptr) munmap(map, map_size);
    if (fd >= 0) close(fd);
  }
};

void pread_all(int fd, uint8_t* dst, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const size_t want = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t got = ::pread(fd, dst, want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    KILN_CHECK(got > 0, kOp, "reading ", path, " at offset ", offset, " failed: ",
               got < 0 ? errno_text() : std::string("unexpected end of file"));
    dst += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// Fresh memory is faulted in page by page as pread fills it; for large tensors that costs as
// much as the copy itself. Transparent huge pages (where the system allows them on request)
// take 512x fewer faults. Advice only: failure changes nothing.
void advise_huge_pages(void* p, size_t n) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (n < 2 * kHuge) return;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p;
  (void)n;
#endif
}

// The existing file's permissions, or 0666 less the process umask (read from /proc: umask()
// itself would change it, racing other threads).
mode_t file_mode_for(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) return st.st_mode & 07777;
  mode_t mask = 022;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned m = 0;
      if (std::sscanf(line, "Umask: %o", &m) == 1) mask = static_cast<mode_t>(m);
    }
    std::fclose(f);
  }
  return 0666 & ~mask;
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

int open_regular(const std::string& path, const char* op, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; the mode is checked
  // before a byte is read, and blocking reads come back for the regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KILN_CHECK(fd >= 0, op, "cannot open ", path, ": ", errno_text());
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const std::string why = !stat_ok ? "cannot stat it: " + errno_text() : std::string("it is ") + file_kind(st.st_mode);
    ::close(fd);
    KILN_FAIL(op, "cannot read ", path, ": ", why, "; only regular files are read");
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

Source Source::open_file(const std::string& path, bool map) {
  auto h = std::make_shared<FileHandle>();
  uint64_t size = 0;
  h->fd = open_regular(path, kOp, &size);
  Source s;
  s.path_ = path;
  s.size_ = static_cast<size_t>(size);
  s.fd_ = h->fd;
  if (map && s.size_ > 0) {
    // Private and writable: tensors may be modified in place (copy-on-write pages); the file
    // never changes.
    void* p = mmap(nullptr, s.size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, h->fd, 0);
    KILN_CHECK(p != MAP_FAILED, kOp, "cannot mmap ", path, ": ", errno_text());
    h->map = p;
    h->map_size = s.size_;
    // Headers and directories are read with pread, not through the mapping: a fault there would
    // make the kernel read around it (read_ahead_kb, often 8 MiB), pulling tensor
    // data in at load time. FADV_RANDOM keeps those small preads from reading ahead as well.
    ::posix_fadvise(h->fd, 0, 0, POSIX_FADV_RANDOM);
    s.mem_ = static_cast<const uint8_t*>(p);
    s.zero_copy_ = true;
  }
  s.keep_ = h;
  return s;
}

Source Source::from_memory(const void* data, size_t size) {
  Source s;
  s.path_ = "<memory>";
  s.size_ = size;
  s.mem_ = static_cast<const uint8_t*>(data);
  return s;
}

void Source::read(void* dst, size_t n, uint64_t offset, const char* op) const {
  KILN_CHECK(offset <= size_ && n <= size_ - offset, op, "file truncated: ", n, " bytes at offset ", offset,
             " run past the end of the file (", size_, " bytes)");
  if (n == 0) return;
  auto* out = static_cast<uint8_t*>(dst);
  if (fd_ < 0) {  // in-memory source
    std::memcpy(out, mem_ + offset, n);
    return;
  }
  if (n < kParallelReadMin) {
    pread_all(fd_, out, n, offset, path_);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((n + kReadChunk - 1) / kReadChunk);
  std::string error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kReadChunk;
    const size_t len = std::min(kReadChunk, n - begin);
    try {
      pread_all(fd_, out + begin, len, offset + begin, path_);
    } catch (const Error& e) {
#pragma omp critical(kiln_io_read_error)
      error = e.what();
    }
  }
  if (!error.empty()) throw Error(error);
}

std::vector<uint8_t> Source::read_vec(size_t n, uint64_t offset, const char* op) const {
  KILN_CHECK(offset <= size_ && n <= size_ - offset, op, "file truncated: ", n, " bytes at offset ", offset,
             " run past the end of the file (", size_, " bytes)");
  std::vector<uint8_t> v(n);
  read(v.data(), n, offset, op);
  return v;
}

uint32_t Source::crc32_range(uint64_t offset, uint64_t n, const char* op) const {
  KILN_CHECK(offset <= size_ && n <= size_ - offset, op, "file truncated: ", n, " bytes at offset ", offset,
             " run past the end of the file (", size_, " bytes)");
  if (mem_ != nullptr && fd_ < 0) return io::crc32(mem_ + offset, n);
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(n, kPiece)));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < n;) {
    const size_t k = static_cast<size_t>(std::min(n - done, kPiece));
    pread_all(fd_, buf.data(), k, offset + done, path_);
    crc = io::crc32(buf.data(), k, crc);
    done += k;
  }
  return crc;
}

Tensor read_tensor(const Source& src, uint64_t offset, const Shape& shape, DType dtype, const char* op) {
  const size_t nbytes = static_cast<size_t>(checked_nbytes(shape, element_size(dtype) * 8, dtype_name(dtype), op));
  KILN_CHECK(offset <= src.size() && nbytes <= src.size() - offset, op, "file truncated: tensor data at offset ",
             offset, " (", nbytes, " bytes) runs past the end of the file");
  if (src.zero_copy() && (offset % element_size(dtype)) == 0) {
    // The deleter owns a reference to the mapping, so it outlives every tensor over it.
    std::shared_ptr<void> keep = src.keep_alive();
    void* p = const_cast<uint8_t*>(src.mapped() + offset);  // a private, writable mapping
    return from_blob(p, shape, dtype, [keep](void*) mutable { keep.reset(); });
  }
  Tensor t = empty(shape, dtype);
  advise_huge_pages(t.data_ptr(), nbytes);
  src.read(t.data_ptr(), nbytes, offset, op);
  return t;
}

namespace {

// Removes the ".NAME.tmp.XXXXXX" files a killed writer of `dir` + `base` left. A live writer holds
// an exclusive flock on its temporary file until it is renamed, so only abandoned ones are taken.
void remove_stale_temporaries(const std::string& dir, const std::string& base) {
  DIR* d = opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = "." + base + ".tmp.";
  std::vector<std::string> stale;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0) stale.push_back(name);
  }
  closedir(d);
  for (const std::string& name : stale) {
    const std::string p = dir + name;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) unlink(p.c_str());
    close(fd);
  }
}

}  // namespace

AtomicWriter::AtomicWriter(const std::string& path) : path_(path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  remove_stale_temporaries(dir, base);
  // Another writer's cleanup may unlink this file between mkostemp and flock; then try again.
  for (int attempt = 0; attempt < 8 && fd_ < 0; ++attempt) {
    std::string tmpl = dir + "." + base + ".tmp.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = mkostemp(buf.data(), O_CLOEXEC);
    KILN_CHECK(fd >= 0, "save", "cannot create a temporary file beside ", path, ": ", errno_text());
    struct stat st {};
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0) {
      fd_ = fd;
      tmp_ = buf.data();
    } else {
      close(fd);
    }
  }
  KILN_CHECK(fd_ >= 0, "save", "cannot create and lock a temporary file beside ", path);
  // mkostemp makes the file 0600; a checkpoint gets the mode a plain open() would give it.
  fchmod(fd_, file_mode_for(path));
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) close(fd_);
  if (!committed_ && !tmp_.empty()) unlink(tmp_.c_str());
}

void AtomicWriter::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    KILN_CHECK(w > 0, "save", "writing ", tmp_, " failed: ", errno_text());
    p += w;
    n -= static_cast<size_t>(w);
    pos_ += static_cast<uint64_t>(w);
  }
}

void AtomicWriter::commit() {
  KILN_CHECK(fsync(fd_) == 0, "save", "fsync of ", tmp_, " failed: ", errno_text());
  // Renamed while still open (and locked), so no cleanup can take it for abandoned.
  KILN_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "save", "renaming ", tmp_, " to ", path_,
             " failed: ", errno_text());
  committed_ = true;
  const int rc = close(fd_);
  fd_ = -1;
  KILN_CHECK(rc == 0, "save", "closing ", path_, " failed: ", errno_text());
  // The rename is durable only once the folder's entry is on disk.
  const size_t slash = path_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

void Sink::write(const void* data, size_t n) {
  if (n == 0) return;
  if (buf_ != nullptr) {
    const auto* p = static_cast<const uint8_t*>(data);
    buf_->insert(buf_->end(), p, p + n);
  } else {
    file_->write(data, n);
  }
  pos_ += n;
}

void Sink::pad_to(uint64_t alignment) {
  static const uint8_t kZeros[64] = {};
  while (pos_ % alignment != 0) write(kZeros, std::min<uint64_t>(alignment - pos_ % alignment, sizeof(kZeros)));
}

Tensor contiguous_cpu(const Tensor& t) {
  Tensor c = t.detach();
  if (!c.device().is_cpu()) c = c.to(kCPU);
  if (!c.is_contiguous()) c = c.contiguous();
  return c;
}

}  // namespace kiln::io::detail
