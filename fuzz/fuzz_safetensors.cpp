// libFuzzer target: the safetensors parser, lazy inspection (with checksums), and, when a file
// parses, a write/re-read round trip that must reproduce every tensor. Only kiln::Error may come
// out; anything else is a bug.
#include <cstdint>
#include <cstring>

#include "kiln/io.h"

namespace {

// Bytes of a parsed checkpoint: tiny files may claim huge shapes; only small ones are materialised.
bool small_enough(const kiln::io::Checkpoint& ck) {
  size_t total = 0;
  for (const auto& e : ck.tensors) total += e.tensor.nbytes();
  return total <= (size_t{1} << 20);
}

void round_trip(const kiln::io::Checkpoint& ck, bool checksums) {
  const std::vector<uint8_t> again = kiln::io::save_bytes(ck.tensors, ck.metadata, checksums);
  const kiln::io::Checkpoint back = kiln::io::load_bytes(again.data(), again.size());
  if (back.tensors.size() != ck.tensors.size() || back.metadata != ck.metadata) __builtin_trap();
  for (const auto& e : ck.tensors) {
    const auto& b = back.tensors.entry(e.name);
    const kiln::Tensor x = e.tensor.contiguous(), y = b.tensor.contiguous();
    if (b.dtype != e.dtype || b.shape != e.shape || x.nbytes() != y.nbytes() ||
        (x.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0))
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kiln::io::CheckpointInfo info = kiln::io::inspect_bytes(data, size, /*checksums=*/true);
    for (const auto& t : info.tensors)
      if (t.span_offset > size || t.span_bytes > size - t.span_offset) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  try {
    const kiln::io::Checkpoint ck = kiln::io::load_bytes(data, size);
    if (ck.format == kiln::io::Format::Safetensors && small_enough(ck)) round_trip(ck, size % 2 == 0);
  } catch (const kiln::Error&) {
  }
  return 0;
}
