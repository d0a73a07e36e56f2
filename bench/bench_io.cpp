// Checkpoint loading speed: a 2 GiB safetensors file (made once in /tmp) loaded from the page
// cache into CPU tensors, against plain read() of the same file in the same run; and the mmap
// path (returns before reading; the data is read when touched).
//   bench_io [PATH=/tmp/kiln_bench_io_2g.safetensors] [REPS=3]
// Prints one JSON line per measurement, then a table.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/io.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTensors = 8;
constexpr int64_t kTensorBytes = int64_t{256} << 20;  // 8 x 256 MiB = 2 GiB

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

size_t file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
}

void make_file(const std::string& path) {
  // One 256 MiB tensor under eight names: 2 GiB on disk, 256 MiB in memory.
  const kiln::Tensor t = kiln::arange(static_cast<double>(kTensorBytes / 4)).to(kiln::kFloat32);
  kiln::io::TensorDict d;
  for (int64_t i = 0; i < kTensors; ++i) d.insert("layer" + std::to_string(i) + ".weight", t);
  kiln::io::save(path, d, {{"purpose", "bench_io"}});
}

// read() of the whole file into `buf` in 64 MiB calls.
void read_all(const std::string& path, char* buf, size_t n) {
  const int fd = open(path.c_str(), O_RDONLY);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = read(fd, buf + done, std::min<size_t>(n - done, size_t{64} << 20));
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  close(fd);
}

double touch(const kiln::io::Checkpoint& ck) {  // reads one byte per page of every tensor
  volatile uint64_t sum = 0;
  for (const auto& e : ck.tensors) {
    const auto* p = static_cast<const uint8_t*>(e.tensor.data_ptr());
    for (size_t i = 0; i < e.tensor.nbytes(); i += 4096) sum = sum + p[i];
  }
  return static_cast<double>(sum);
}

struct Row {
  std::string name;
  double seconds;
  double gib_s;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/tmp/kiln_bench_io_2g.safetensors";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  if (file_size(path) < static_cast<size_t>(kTensors * kTensorBytes)) make_file(path);
  const size_t n = file_size(path);
  const double gib = static_cast<double>(n) / (1 << 30);

  std::vector<char> reused(n);
  read_all(path, reused.data(), n);  // warms the page cache and the reused buffer
  std::vector<Row> rows;
  auto best = [&](const std::string& name, auto&& fn) {
    double b = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      fn();
      b = std::min(b, seconds_since(t0));
    }
    rows.push_back({name, b, gib / b});
    std::printf("{\"bench\":\"io\",\"case\":\"%s\",\"bytes\":%zu,\"seconds\":%.6f,\"gib_per_s\":%.3f,\"reps\":%d}\n",
                name.c_str(), n, b, gib / b, reps);
  };

  best("read() into a reused buffer", [&] { read_all(path, reused.data(), n); });
  best("read() into a fresh buffer", [&] {
    char* buf = static_cast<char*>(std::malloc(n));
    read_all(path, buf, n);
    std::free(buf);
  });
  best("kiln::io::load (pread into tensors)", [&] {
    const kiln::io::Checkpoint ck = kiln::io::load(path);
    if (ck.tensors.size() != kTensors) std::abort();
  });
  best("kiln::io::load mmap (returns)", [&] {
    const kiln::io::Checkpoint ck = kiln::io::load(path, {kiln::kCPU, {}, true});
    if (ck.tensors.size() != kTensors) std::abort();
  });
  best("kiln::io::load mmap + touch every page", [&] {
    const kiln::io::Checkpoint ck = kiln::io::load(path, {kiln::kCPU, {}, true});
    touch(ck);
  });

  std::printf("\n%-42s %12s %10s %14s\n", "case (2 GiB safetensors, page cache)", "seconds", "GiB/s", "vs fresh read");
  const double ref = rows[1].gib_s;
  for (const Row& r : rows)
    std::printf("%-42s %12.6f %10.2f %13.0f%%\n", r.name.c_str(), r.seconds, r.gib_s, 100.0 * r.gib_s / ref);
  return 0;
}
