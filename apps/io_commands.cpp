// `kiln inspect` and `kiln convert` (see io_commands.h).
#include "io_commands.h"

#include <algorithm>
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

std::string hex32(uint32_t v) {
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", v);
  return hex;
}

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

int run_inspect(const std::string& path, std::ostream& out, std::ostream& err) {
  try {
    const io::CheckpointInfo ck = io::inspect(path, /*checksums=*/true);
    size_t name_w = 4;
    uint64_t total = 0;
    for (const auto& t : ck.tensors) name_w = std::max(name_w, t.name.size());
    out << "file:     " << path << "\nformat:   " << io::format_name(ck.format) << "\n";
    out << "metadata: " << (ck.metadata.empty() ? "(none)" : "") << "\n";
    for (const auto& [k, v] : ck.metadata) out << "  " << k << " = " << v << "\n";
    out << "tensors:  " << ck.tensors.size() << "\n";
    out << "  " << std::left << std::setw(static_cast<int>(name_w)) << "name" << "  " << std::setw(11) << "dtype"
        << std::setw(20) << "shape" << std::right << std::setw(14) << "bytes" << "  crc32\n";
    std::vector<std::string> bad;
    size_t verified = 0;
    for (const auto& t : ck.tensors) {
      total = saturating_add(total, t.nbytes);
      out << "  " << std::left << std::setw(static_cast<int>(name_w)) << t.name << "  " << std::setw(11)
          << io::file_dtype_name(t.dtype) << std::setw(20) << shape_text(t.shape) << std::right << std::setw(14)
          << t.nbytes << "  " << hex32(t.crc32.value_or(0));
      if (!io::to_kiln_dtype(t.dtype)) out << "  (raw bytes)";
      if (!t.dense) {
        out << "  (view of " << (t.storage.empty() ? std::string("the file") : t.storage) << ", stride "
            << shape_text(t.stride) << ": crc of the " << t.span_bytes << " stored bytes it spans)";
      }
      if (t.stored_crc32 && t.crc32) {
        if (*t.stored_crc32 == *t.crc32) {
          ++verified;
        } else {
          out << "  CHECKSUM MISMATCH (the file says " << hex32(*t.stored_crc32) << ")";
          bad.push_back(t.name);
        }
      }
      out << "\n";
    }
    out << "total:    " << total << " bytes\n";
    if (verified > 0 || !bad.empty()) {
      out << "checksums: " << verified << " of " << ck.tensors.size() << " tensors verified";
      if (!bad.empty()) out << ", " << bad.size() << " MISMATCHED";
      out << "\n";
    }
    if (!bad.empty()) {
      err << "kiln inspect: " << path << ": tensor '" << bad.front() << "'"
          << (bad.size() > 1 ? " and " + std::to_string(bad.size() - 1) + " more fail their checksums"
                             : std::string(" fails its checksum"))
          << ": the data changed after the file was written\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    err << "kiln inspect: " << e.what() << "\n";
    return 1;
  }
}

uint64_t convert_output_limit(uint64_t input_bytes) {
  return saturating_add(input_bytes > UINT64_MAX / 4 ? UINT64_MAX : 4 * input_bytes, uint64_t{64} << 20);
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
    // What a safetensors output will take, from the header alone: every element of every tensor.
    // (A torch zip stores each storage once, so it never outgrows the input.)
    const io::CheckpointInfo info = io::inspect(in);
    uint64_t bytes = 0;
    const io::TensorInfo* biggest = nullptr;
    for (const auto& t : info.tensors) {
      if (to_st) bytes = saturating_add(bytes, t.nbytes);
      if (biggest == nullptr || t.nbytes > biggest->nbytes) biggest = &t;
    }
    const uint64_t limit = convert_output_limit(info.file_size);
    if (bytes > limit) {
      err << "kiln convert: " << in << " (" << info.file_size << " bytes) would become " << bytes
          << " bytes, more than the limit of 4x the input + 64 MiB (" << limit << " bytes)";
      if (biggest != nullptr) {
        err << ": tensor '" << biggest->name << "' " << shape_text(biggest->shape) << " is " << biggest->nbytes
            << " bytes" << (biggest->dense ? std::string() : " stored as a view of " + std::to_string(biggest->span_bytes) + " bytes (stride " + shape_text(biggest->stride) + ")");
      }
      err << "; convert to .pt to keep views as views\n";
      return 1;
    }
    const io::Checkpoint ck = io::load(in);
    if (to_st) {
      io::save(out_path, ck.tensors, ck.metadata);
    } else {
      io::save_torch(out_path, ck.tensors);
    }
    out << "converted " << ck.tensors.size() << " tensors: " << io::format_name(ck.format) << " -> "
        << (to_st ? "safetensors" : "torch-zip") << " (" << out_path << ")";
    if (to_st && !ck.metadata.empty()) out << ", " << ck.metadata.size() << " metadata entries kept";
    out << "\n";
    if (!to_st && !ck.metadata.empty()) {
      // A torch state dict has no field for them; say so rather than drop them unseen.
      err << "kiln convert: note: " << ck.metadata.size() << " metadata entries (";
      size_t shown = 0;
      for (const auto& kv : ck.metadata) {
        if (shown == 3) {
          err << ", ...";
          break;
        }
        err << (shown++ ? ", " : "") << kv.first;
      }
      err << ") are not in " << out_path << ": a PyTorch checkpoint has no metadata field; "
          << "convert to .safetensors to keep them\n";
    }
    return 0;
  } catch (const std::exception& e) {
    err << "kiln convert: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace kiln::apps
