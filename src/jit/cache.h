#pragma once
// The disk cache of compiled kernels: one file per key in kiln's cache folder, written atomically
// (a temporary file renamed into place), holding a magic line, the payload's size and checksum and
// the payload. A file that fails any check is reported as corrupt, never returned.
#include <cstdint>
#include <string>

namespace kiln::jit::detail {

// 128 bits of two differently seeded FNV-1a passes, as 32 hex digits.
std::string hash_hex(const std::string& text);

enum class CacheRead { missing, hit, corrupt };
CacheRead read_cache_entry(const std::string& path, std::string& payload);
// Best effort: an unwritable folder only costs the next process a compile.
void write_cache_entry(const std::string& path, const std::string& payload);

}  // namespace kiln::jit::detail
