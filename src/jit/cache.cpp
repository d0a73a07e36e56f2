// The compile cache's files (cache.h).
#include "jit/cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::jit::detail {
namespace {

constexpr const char* kMagic = "KILNJIT1";

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string hash_hex(const std::string& text) {
  return hex64(fnv1a(text, 14695981039346656037ull)) + hex64(fnv1a(text, 0x9e3779b97f4a7c15ull));
}

CacheRead read_cache_entry(const std::string& path, std::string& payload) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return CacheRead::missing;
  std::string magic, sum;
  size_t size = 0;
  if (!std::getline(f, magic) || magic != kMagic || !(f >> size) || f.get() != '\n' || !std::getline(f, sum))
    return CacheRead::corrupt;
  payload.resize(size);
  if (!f.read(payload.data(), static_cast<std::streamsize>(size)) || f.peek() != std::char_traits<char>::eof() ||
      sum != hash_hex(payload)) {
    payload.clear();
    return CacheRead::corrupt;
  }
  return CacheRead::hit;
}

void write_cache_entry(const std::string& path, const std::string& payload) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return;
  static std::atomic<int> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f << kMagic << '\n' << payload.size() << '\n' << hash_hex(payload) << '\n';
    f.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    if (!f) {
      f.close();
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, path, ec);  // readers see the old file or the whole new one
  if (ec) fs::remove(tmp, ec);
}

}  // namespace kiln::jit::detail
