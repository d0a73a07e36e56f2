// libFuzzer target: the zip reader, the restricted unpickler (deep nesting, memo sharing) and
// storage/view reconstruction (zero and overflowing strides), lazy inspection, materialising the
// small views, plus a save_torch / re-read round trip when a file parses. Only kiln::Error may
// come out.
#include <cstdint>
#include <cstring>

#include "kiln/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kiln::io::CheckpointInfo info = kiln::io::inspect_bytes(data, size, /*checksums=*/true);
    for (const auto& t : info.tensors)
      if (t.span_offset > size || t.span_bytes > size - t.span_offset) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  try {
    const kiln::io::Checkpoint ck = kiln::io::load_bytes(data, size);
    size_t total = 0;
    for (const auto& e : ck.tensors) total += e.tensor.nbytes();
    if (ck.format == kiln::io::Format::TorchZip && total <= (size_t{1} << 20)) {
      const std::vector<uint8_t> again = kiln::io::save_torch_bytes(ck.tensors);
      const kiln::io::Checkpoint back = kiln::io::load_bytes(again.data(), again.size());
      if (back.tensors.size() != ck.tensors.size()) __builtin_trap();
      for (const auto& e : ck.tensors) {
        const auto& b = back.tensors.entry(e.name);
        const kiln::Tensor x = e.tensor.contiguous(), y = b.tensor.contiguous();
        if (b.dtype != e.dtype || b.shape != e.shape || x.nbytes() != y.nbytes() ||
            (x.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0))
          __builtin_trap();
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
