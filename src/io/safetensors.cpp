// safetensors: header validation (nlohmann-json SAX, so duplicate keys are seen and rejected at
// every level), loading by pread or mmap, and the writer (sorted, space-padded header).
//
// Layout: u64 little-endian N, N bytes of UTF-8 JSON, then the data section. Every rule of the
// format is checked before a byte of tensor data is touched; each failure names its rule.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/size_check.h"
#include "core/tensor_impl.h"
#include "io/file_util.h"

namespace kiln::io::detail {
namespace {

constexpr const char* kOp = "safetensors";
constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

struct StTensor {
  std::string name;
  FileDType dtype = FileDType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;
  size_t order = 0;  // position in the header
};

struct StHeader {
  std::vector<StTensor> tensors;  // sorted by data offsets
  Metadata metadata;              // without kChecksumKey
  std::optional<std::map<std::string, uint32_t>> checksums;  // from kChecksumKey
  uint64_t data_start = 0;
};

// The checksum metadata: one flat JSON object of name -> 8 hex digits (SAX, so it is bounded and
// duplicate names are seen).
class ChecksumSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::map<std::string, uint32_t> crcs;
  std::string error;
  bool null() override { return fail(); }
  bool boolean(bool) override { return fail(); }
  bool number_integer(number_integer_t) override { return fail(); }
  bool number_unsigned(number_unsigned_t) override { return fail(); }
  bool number_float(number_float_t, const string_t&) override { return fail(); }
  bool binary(binary_t&) override { return fail(); }
  bool start_array(std::size_t) override { return fail(); }
  bool end_array() override { return fail(); }
  bool start_object(std::size_t) override { return depth_++ == 0 || fail(); }
  bool end_object() override { return true; }
  bool key(string_t& k) override {
    key_ = k;
    if (crcs.count(k) != 0) return fail("names tensor '" + k + "' twice");
    return true;
  }
  bool string(string_t& v) override {
    if (depth_ != 1 || v.size() != 8 || v.find_first_not_of("0123456789abcdef") != std::string::npos)
      return fail("value for '" + key_ + "' is not 8 lowercase hex digits");
    crcs[key_] = static_cast<uint32_t>(std::stoul(v, nullptr, 16));
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return fail(); }

 private:
  bool fail(std::string why = "must be a JSON object of tensor name -> 8 hex digits") {
    if (error.empty()) error = std::move(why);
    return false;
  }
  int depth_ = 0;
  std::string key_;
};

std::map<std::string, uint32_t> parse_checksums(const std::string& text) {
  ChecksumSax sax;
  const bool ok = nlohmann::json::sax_parse(text, &sax, nlohmann::json::input_format_t::json, true);
  KILN_CHECK(ok && sax.error.empty(), kOp, "__metadata__ '", kChecksumKey, "' ",
             sax.error.empty() ? std::string("is not valid JSON") : sax.error);
  return std::move(sax.crcs);
}

// SAX handler: the header is at most three levels deep (object -> tensor/metadata -> array), so
// anything deeper or of the wrong kind stops the parse at once with the rule it breaks.
class HeaderSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string error;  // the broken rule; empty while all is well
  bool closed = false;  // the top-level object has ended
  Metadata metadata;
  std::vector<StTensor> tensors;

  bool null() override {
    if (depth_ == 1 && key_ == "__metadata__") return true;
    return fail_value("null");
  }
  bool boolean(bool) override { return fail_value("a boolean"); }
  bool number_integer(number_integer_t v) override {
    if (depth_ == 3) return fail(where() + " must hold non-negative integers, found " + std::to_string(v));
    return fail_value("a number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 3) {
      array_.push_back(v);
      return true;
    }
    return fail_value("a number");
  }
  bool number_float(number_float_t, const string_t& s) override {
    if (depth_ == 3) return fail(where() + " must hold integers (no fractions, exponents or values past 2^64), found " + s);
    return fail_value("a number");
  }
  bool string(string_t& s) override {
    if (depth_ == 2 && in_metadata_) {
      metadata[field_] = s;
      return true;
    }
    if (depth_ == 2 && field_ == "dtype") {
      auto d = parse_file_dtype(s);
      if (!d) return fail("tensor '" + key_ + "': unknown dtype '" + s + "'");
      cur_.dtype = *d;
      return true;
    }
    return fail_value("a string");
  }
  bool binary(binary_t&) override { return fail_value("binary"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      fields_.clear();
      in_metadata_ = key_ == "__metadata__";
      if (!in_metadata_) {
        cur_ = StTensor{};
        cur_.name = key_;
        cur_.order = tensors.size();
      }
      return true;
    }
    return fail_value("an object");
  }
  bool end_object() override {
    if (depth_ == 2) {
      depth_ = 1;
      if (!in_metadata_) {
        for (const char* f : {"dtype", "shape", "data_offsets"})
          if (!fields_.count(f)) return fail("tensor '" + key_ + "': missing field '" + f + "'");
        tensors.push_back(cur_);
      }
      in_metadata_ = false;
      return true;
    }
    depth_ = 0;
    closed = true;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 0) return fail("header must be a JSON object, found an array");
    if (depth_ == 2 && !in_metadata_ && (field_ == "shape" || field_ == "data_offsets")) {
      depth_ = 3;
      array_.clear();
      return true;
    }
    return fail_value("an array");
  }
  bool end_array() override {
    depth_ = 2;
    if (field_ == "shape") {
      for (uint64_t v : array_) {
        if (v > static_cast<uint64_t>(INT64_MAX)) return fail("tensor '" + key_ + "': shape overflows int64");
        cur_.shape.push_back(static_cast<int64_t>(v));
      }
      return true;
    }
    if (array_.size() != 2) return fail("tensor '" + key_ + "': data_offsets must be exactly [begin, end]");
    if (array_[0] > array_[1]) return fail("tensor '" + key_ + "': data_offsets begin > end");
    cur_.begin = array_[0];
    cur_.end = array_[1];
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      if (!top_keys_.insert(k).second) {
        return fail(k == "__metadata__" ? std::string("duplicate key '__metadata__'")
                                        : "duplicate key: tensor name '" + k + "' appears twice");
      }
      key_ = k;
      return true;
    }
    if (in_metadata_) {
      if (!fields_.insert(k).second) return fail("duplicate key '" + k + "' in __metadata__");
      field_ = k;
      return true;
    }
    if (!fields_.insert(k).second) return fail("duplicate key: field '" + k + "' twice in tensor '" + key_ + "'");
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      return fail("tensor '" + key_ + "': unknown field '" + k + "'");
    field_ = k;
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error.empty()) {
      error = closed ? "trailing data after the header's JSON object (byte " + std::to_string(pos) + ")"
                     : std::string("header is not valid JSON: ") + ex.what();
    }
    return false;
  }

 private:
  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  std::string where() const { return "tensor '" + key_ + "': " + field_; }
  bool fail_value(const char* found) {
    if (depth_ == 0) return fail(std::string("header must be a JSON object, found ") + found);
    if (depth_ == 1) {
      if (key_ == "__metadata__") return fail(std::string("__metadata__ must be an object of strings or null, found ") + found);
      return fail("tensor '" + key_ + "' must be an object {dtype, shape, data_offsets}, found " + found);
    }
    if (in_metadata_) return fail("__metadata__ value '" + field_ + "' must be a string, found " + found);
    if (depth_ == 2 && field_ == "dtype") return fail("tensor '" + key_ + "': dtype must be a string, found " + found);
    if (depth_ == 2) return fail(where() + " must be an array of non-negative integers, found " + found);
    return fail(where() + " must hold non-negative integers, found " + found);
  }

  int depth_ = 0;
  bool in_metadata_ = false;
  std::string key_, field_;
  std::set<std::string> top_keys_, fields_;
  StTensor cur_;
  std::vector<uint64_t> array_;
};

bool valid_utf8(const uint8_t* p, size_t n, size_t* bad) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else { *bad = i; return false; }
    if (i + len > n) { *bad = i; return false; }
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) { *bad = i; return false; }
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // overlong forms, surrogates and values past U+10FFFF are not UTF-8
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) { *bad = i; return false; }
    i += len;
  }
  return true;
}

StHeader parse_header(const Source& src) {
  KILN_CHECK(src.size() >= 8, kOp, "header too small: the file has ", src.size(), " bytes, fewer than the 8-byte length");
  uint8_t len_bytes[8];
  src.read(len_bytes, 8, 0, kOp);
  const uint64_t n = le64(len_bytes);
  KILN_CHECK(n <= kMaxHeader, kOp, "header length ", n, " exceeds the 100 MB limit");
  KILN_CHECK(n <= src.size() - 8, kOp, "header length ", n, " runs past the end of the file (", src.size(), " bytes)");
  const std::vector<uint8_t> text = src.read_vec(static_cast<size_t>(n), 8, kOp);
  KILN_CHECK(!(n >= 3 && text[0] == 0xEF && text[1] == 0xBB && text[2] == 0xBF), kOp,
             "header starts with a UTF-8 byte-order mark (BOM), which is not allowed");
  const auto nul = std::find(text.begin(), text.end(), uint8_t{0});
  KILN_CHECK(nul == text.end(), kOp, "header contains a NUL byte at offset ", nul - text.begin(),
             " (NUL padding is not allowed; pad with spaces)");
  size_t bad = 0;
  KILN_CHECK(valid_utf8(text.data(), text.size(), &bad), kOp, "header is not valid UTF-8 (byte ", bad, ")");

  HeaderSax sax;
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json, true);
  if (!ok || !sax.error.empty()) {
    KILN_FAIL(kOp, sax.error.empty() ? std::string("header is not valid JSON") : sax.error);
  }
  KILN_CHECK(sax.closed, kOp, "header must be a JSON object");

  StHeader h;
  h.metadata = std::move(sax.metadata);
  h.tensors = std::move(sax.tensors);
  h.data_start = 8 + n;
  const uint64_t data_size = src.size() - h.data_start;
  if (auto it = h.metadata.find(kChecksumKey); it != h.metadata.end()) {
    h.checksums = parse_checksums(it->second);
    h.metadata.erase(it);
    for (const StTensor& t : h.tensors)
      KILN_CHECK(h.checksums->count(t.name) != 0, kOp, "__metadata__ '", kChecksumKey, "' has no checksum for tensor '",
                 t.name, "'");
  }
  for (const StTensor& t : h.tensors) {
    const uint64_t bytes = checked_nbytes(t.shape, static_cast<uint64_t>(file_dtype_bits(t.dtype)),
                                          file_dtype_name(t.dtype), kOp, "tensor '" + t.name + "': ");
    KILN_CHECK(t.end - t.begin == bytes, kOp, "tensor '", t.name, "': byte length ", t.end - t.begin,
               " (data_offsets [", t.begin, ", ", t.end, "]) differs from numel x element size = ", bytes);
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const StTensor& a, const StTensor& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  // Sorted by offsets, the tensors must tile [0, data_size) exactly: no gap, overlap or aliasing.
  uint64_t pos = 0;
  const StTensor* prev = nullptr;
  for (const StTensor& t : h.tensors) {
    if (t.begin != pos) {
      if (prev != nullptr && t.begin == prev->begin && t.end == prev->end && t.end > t.begin) {
        KILN_FAIL(kOp, "data offsets alias: tensors '", prev->name, "' and '", t.name, "' share bytes [", t.begin, ", ",
                  t.end, ")");
      }
      if (t.begin < pos) {
        KILN_FAIL(kOp, "data offsets overlap: tensor '", t.name, "' begins at ", t.begin, " inside tensor '",
                  prev->name, "' [", prev->begin, ", ", prev->end, ")");
      }
      KILN_FAIL(kOp, "data offsets leave a gap: bytes [", pos, ", ", t.begin, ") belong to no tensor (before '",
                t.name, "')");
    }
    pos = t.end;
    prev = &t;
  }
  KILN_CHECK(pos == data_size, kOp, "data offsets end at ", pos, " but the data section has ", data_size,
             " bytes: the last tensor must end exactly at the end of the file");
  return h;
}

void check_crc(const std::string& name, uint32_t got, uint32_t want) {
  if (got == want) return;
  char g[16], w[16];
  std::snprintf(g, sizeof(g), "%08x", got);
  std::snprintf(w, sizeof(w), "%08x", want);
  KILN_FAIL(kOp, "tensor '", name, "' fails its checksum: its bytes have CRC-32 ", g, " but the file's '",
            kChecksumKey, "' metadata says ", w, " (the data changed after the file was written)");
}

// Text with every byte outside printable ASCII as \xNN (for error messages about invalid text).
std::string escaped(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    }
  }
  return out;
}

// JSON string literal of UTF-8 text (quotes, backslashes and control characters escaped).
// `kind` names the text in the error ("tensor name").
void append_json_string(std::string& out, const std::string& text, const char* kind) {
  size_t bad = 0;
  KILN_CHECK(valid_utf8(reinterpret_cast<const uint8_t*>(text.data()), text.size(), &bad), kOp, kind, " '",
             escaped(text), "' is not valid UTF-8 (byte ", bad,
             "): names and metadata are JSON strings, so lone surrogates and stray bytes cannot be saved");
  out += '"';
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      // serde_json's (the reference writer's) escapes: short forms where JSON has them.
      const char* shortform = c == '\b' ? "\\b" : c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\f' ? "\\f" : c == '\r' ? "\\r" : nullptr;
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += shortform != nullptr ? shortform : esc;
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace

CheckpointInfo safetensors_info(const Source& src, bool checksums) {
  const StHeader h = parse_header(src);
  CheckpointInfo info;
  info.format = Format::Safetensors;
  info.file_size = src.size();
  info.metadata = h.metadata;
  for (const StTensor& t : h.tensors) {
    TensorInfo ti;
    ti.name = t.name;
    ti.dtype = t.dtype;
    ti.shape = t.shape;
    ti.stride = contiguous_strides(t.shape);
    ti.nbytes = t.end - t.begin;
    ti.span_offset = h.data_start + t.begin;
    ti.span_bytes = ti.nbytes;
    if (h.checksums) ti.stored_crc32 = h.checksums->at(t.name);
    if (checksums) ti.crc32 = src.crc32_range(ti.span_offset, ti.span_bytes, kOp);
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

Checkpoint load_safetensors(const Source& src, const LoadOptions& options) {
  StHeader h = parse_header(src);
  Checkpoint ck;
  ck.format = Format::Safetensors;
  ck.metadata = std::move(h.metadata);
  std::vector<const StTensor*> chosen;
  if (options.names.empty()) {
    for (const StTensor& t : h.tensors) chosen.push_back(&t);
  } else {
    std::set<std::string> want(options.names.begin(), options.names.end());
    for (const StTensor& t : h.tensors)
      if (want.erase(t.name)) chosen.push_back(&t);
    KILN_CHECK(want.empty(), kOp, "tensor '", *want.begin(), "' not found in ", src.path());
  }
  const bool verify = options.verify_checksums && h.checksums && !src.zero_copy();
  for (const StTensor* t : chosen) {
    const uint64_t off = h.data_start + t->begin;
    const auto kd = to_kiln_dtype(t->dtype);
    Tensor x = kd ? read_tensor(src, off, t->shape, *kd, kOp)
                  : read_tensor(src, off, {static_cast<int64_t>(t->end - t->begin)}, kUInt8, kOp);
    if (verify) check_crc(t->name, crc32(x.data_ptr(), t->end - t->begin), h.checksums->at(t->name));
    if (!options.device.is_cpu()) x = x.to(options.device);
    ck.tensors.insert(TensorEntry{t->name, x, t->dtype, t->shape});
  }
  return ck;
}

void write_safetensors(Sink& sink, const TensorDict& tensors, const Metadata& metadata, bool checksums) {
  KILN_CHECK(metadata.count(kChecksumKey) == 0, kOp, "metadata key '", kChecksumKey,
             "' is reserved for the checksums save(..., checksums = true) writes");
  std::vector<const TensorEntry*> order;
  order.reserve(tensors.size());
  for (const TensorEntry& e : tensors) {
    KILN_CHECK(e.name != "__metadata__", kOp, "a tensor may not be named '__metadata__' (reserved for metadata)");
    order.push_back(&e);
  }
  // Largest elements first keeps every tensor aligned to its element size; the reference's
  // dtype order breaks ties, then the name.
  std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
    const int ba = file_dtype_bits(a->dtype), bb = file_dtype_bits(b->dtype);
    if (ba != bb) return ba > bb;
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });
  // The header is written by hand, appending only: a JSON library's ordered object looks keys up
  // linearly, which made saving 40k tensors take seconds.
  std::vector<Tensor> data;
  data.reserve(order.size());
  std::string entries, crcs = "{";
  uint64_t offset = 0;
  for (const TensorEntry* e : order) {
    Tensor c = contiguous_cpu(e->tensor);
    const uint64_t n = c.nbytes();
    entries += ',';
    append_json_string(entries, e->name, "tensor name");
    entries += ":{\"dtype\":\"";
    entries += file_dtype_name(e->dtype);
    entries += "\",\"shape\":[";
    for (size_t d = 0; d < e->shape.size(); ++d) {
      if (d != 0) entries += ',';
      entries += std::to_string(e->shape[d]);
    }
    entries += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    if (checksums) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%08x", crc32(c.data_ptr(), n));
      if (crcs.size() > 1) crcs += ',';
      append_json_string(crcs, e->name, "tensor name");
      crcs += ":\"";
      crcs += hex;
      crcs += '"';
    }
    offset += n;
    data.push_back(std::move(c));
  }
  crcs += '}';
  // Metadata keys in sorted order (the checksums among them), as the reference writes a map.
  std::string text = "{";
  if (!metadata.empty() || checksums) {
    text += "\"__metadata__\":{";
    bool first = true, crc_done = !checksums;
    auto put = [&](const std::string& k, const std::string& v) {
      if (!first) text += ',';
      first = false;
      append_json_string(text, k, "metadata key");
      text += ':';
      append_json_string(text, v, ("metadata value of '" + escaped(k) + "':").c_str());
    };
    for (const auto& [k, v] : metadata) {
      if (!crc_done && k > kChecksumKey) {
        put(kChecksumKey, crcs);
        crc_done = true;
      }
      put(k, v);
    }
    if (!crc_done) put(kChecksumKey, crcs);
    text += '}';
  }
  if (!entries.empty() && text.size() == 1) entries.erase(0, 1);  // no leading comma without metadata
  text += entries;
  text += '}';
  KILN_CHECK(text.size() <= kMaxHeader, kOp, "the header of ", order.size(), " tensors takes ", text.size(),
             " bytes, more than the format's 100 MB limit");
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> len;
  put_le(len, text.size(), 8);
  sink.write(len.data(), len.size());
  sink.write(text.data(), text.size());
  for (const Tensor& c : data) sink.write(c.data_ptr(), c.nbytes());
}

}  // namespace kiln::io::detail
