// The mmap path reads nothing until a tensor is touched: after dropping the file from the page
// cache, loading with mmap leaves the data pages non-resident (mincore); touching a tensor brings
// its pages in (the kernel's own readahead may then prefetch the next tensor, which is fine).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/io.h"
#include "support/testing.h"

using namespace kiln;

namespace {

// Fraction of [p, p + n) resident in memory.
double resident_fraction(const void* p, size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  std::vector<unsigned char> vec((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return -1;
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(vec.size());
}

// Drops the file's clean pages from the page cache; false if the kernel kept them.
bool drop_from_page_cache(const std::string& path, size_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return false;
  const double frac = resident_fraction(m, size);
  ::munmap(m, size);
  return frac >= 0 && frac < 0.05;
}

}  // namespace

TEST(IoMmap, ReadsNothingUntilTouched) {
  const std::string path = ::testing::TempDir() + "kiln_mmap_lazy.safetensors";
  const int64_t n = 4 << 20;  // two 16 MiB tensors
  io::save(path, io::TensorDict{{"a", randn({n})}, {"b", randn({n})}});
  const size_t file_size = static_cast<size_t>(2 * n * 4 + 4096);
  if (!drop_from_page_cache(path, file_size)) GTEST_SKIP() << "the kernel kept the file in the page cache";

  io::LoadOptions options;
  options.mmap = true;
  const io::Checkpoint ck = io::load(path, options);
  const Tensor& a = ck.tensors.at("a");
  const Tensor& b = ck.tensors.at("b");
  EXPECT_LT(resident_fraction(a.data_ptr(), a.nbytes()), 0.05) << "loading read tensor a";
  EXPECT_LT(resident_fraction(b.data_ptr(), b.nbytes()), 0.05) << "loading read tensor b";

  double s = 0;
  for (double v : a.to_vector()) s += v;  // touch a only
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_GT(resident_fraction(a.data_ptr(), a.nbytes()), 0.95);
  std::remove(path.c_str());
}
