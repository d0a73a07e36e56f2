// `kiln inspect` and `kiln convert` (see io_commands.h).
#include "io_commands.h"

#include <cstdio>
#include <iomanip>

#include "kiln/io.h"

namespace kiln::apps {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_text(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

int run_inspect(const std::string& path, std::ostream& out, std::ostream& err) {
  try {
    io::LoadOptions o;
    o.mmap = true;  // reads only what the checksums touch
    const io::Checkpoint ck = io::load(path, o);
    size_t name_w = 4, total = 0;
    for (const auto& e : ck.tensors) name_w = std::max(name_w, e.name.size());
    out << "file:     " << path << "\nformat:   " << io::format_name(ck.format) << "\n";
    out << "metadata: " << (ck.metadata.empty() ? "(none)" : "") << "\n";
    for (const auto& [k, v] : ck.metadata) out << "  " << k << " = " << v << "\n";
    out << "tensors:  " << ck.tensors.size() << "\n";
    out << "  " << std::left << std::setw(static_cast<int>(name_w)) << "name" << "  " << std::setw(11) << "dtype"
        << std::setw(20) << "shape" << std::right << std::setw(14) << "bytes" << "  crc32\n";
    for (const auto& e : ck.tensors) {
      const Tensor c = e.tensor.contiguous();
      const uint32_t crc = io::crc32(c.data_ptr(), c.nbytes());
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%08x", crc);
      total += c.nbytes();
      out << "  " << std::left << std::setw(static_cast<int>(name_w)) << e.name << "  " << std::setw(11)
          << io::file_dtype_name(e.dtype) << std::setw(20) << shape_text(e.shape) << std::right << std::setw(14)
          << c.nbytes() << "  " << hex << (e.raw() ? "  (raw bytes)" : "") << "\n";
    }
    out << "total:    " << total << " bytes\n";
    return 0;
  } catch (const std::exception& e) {
    err << "kiln inspect: " << e.what() << "\n";
    return 1;
  }
}

int run_convert(const std::string& in, const std::string& out_path, std::ostream& out, std::ostream& err) {
  try {
    const bool to_st = ends_with(out_path, ".safetensors");
    const bool to_pt = ends_with(out_path, ".pt") || ends_with(out_path, ".pth") || ends_with(out_path, ".bin") ||
                       ends_with(out_path, ".ckpt");
    if (!to_st && !to_pt) {
      err << "kiln convert: cannot tell the output format from '" << out_path
          << "': use .safetensors, or .pt/.pth/.bin/.ckpt for a PyTorch checkpoint\n";
      return 2;
    }
    io::LoadOptions o;
    o.mmap = true;
    const io::Checkpoint ck = io::load(in, o);
    if (to_st) {
      io::save(out_path, ck.tensors, ck.metadata);
    } else {
      io::save_torch(out_path, ck.tensors);
    }
    out << "converted " << ck.tensors.size() << " tensors: " << io::format_name(ck.format) << " -> "
        << (to_st ? "safetensors" : "torch-zip") << " (" << out_path << ")\n";
    return 0;
  } catch (const std::exception& e) {
    err << "kiln convert: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace kiln::apps
