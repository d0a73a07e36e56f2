// PyTorch zip checkpoints: a stored (uncompressed) ZIP/ZIP64 archive reader, storage loading
// (views of one storage stay views of one storage; big-endian files are byte-swapped), the
// flattening of the unpickled object into name -> tensor, and the writer (64-byte aligned
// records, protocol-2 data.pkl) whose files torch.load(weights_only=True) reads.
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "core/size_check.h"
#include "core/tensor_impl.h"
#include "io/file_util.h"
#include "io/pickle.h"

namespace kiln::io::detail {
namespace {

constexpr const char* kOp = "torch-zip";
constexpr uint64_t kU32Max = 0xFFFFFFFFu;

struct Record {
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
  uint32_t crc = 0;     // the central directory's CRC-32 of the data
};

// The records of a stored zip: name -> data range. Everything is bounds-checked.
std::map<std::string, Record> read_zip(const Source& src) {
  const uint64_t n = src.size();
  KILN_CHECK(n >= 22, kOp, "zip too small for an end-of-central-directory record");
  const uint64_t tail_len = std::min<uint64_t>(n, 22 + 65535);
  const std::vector<uint8_t> tail = src.read_vec(tail_len, n - tail_len, kOp);
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i) {
    if (le32(&tail[i]) == 0x06054b50u) {
      eocd = i;
      break;
    }
  }
  KILN_CHECK(eocd >= 0, kOp, "zip: no end-of-central-directory record");
  const uint8_t* e = &tail[eocd];
  uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_off = le32(e + 16);
  const uint64_t eocd_pos = n - tail_len + static_cast<uint64_t>(eocd);
  if (entries == 0xFFFF || cd_size == kU32Max || cd_off == kU32Max) {
    KILN_CHECK(eocd_pos >= 20, kOp, "zip: ZIP64 locator missing");
    const std::vector<uint8_t> loc = src.read_vec(20, eocd_pos - 20, kOp);
    KILN_CHECK(le32(loc.data()) == 0x07064b50u, kOp, "zip: ZIP64 end-of-central-directory locator missing");
    const std::vector<uint8_t> z = src.read_vec(56, le64(&loc[8]), kOp);
    KILN_CHECK(le32(z.data()) == 0x06064b50u, kOp, "zip: bad ZIP64 end-of-central-directory record");
    entries = le64(&z[32]);
    cd_size = le64(&z[40]);
    cd_off = le64(&z[48]);
  }
  KILN_CHECK(cd_off <= n && cd_size <= n - cd_off, kOp, "zip: central directory runs past the end of the file");
  KILN_CHECK(entries <= cd_size / 46, kOp, "zip: ", entries, " entries cannot fit a ", cd_size,
             "-byte central directory");
  const std::vector<uint8_t> cd = src.read_vec(cd_size, cd_off, kOp);
  std::map<std::string, Record> out;
  size_t p = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    KILN_CHECK(p + 46 <= cd.size() && le32(&cd[p]) == 0x02014b50u, kOp, "zip: bad central directory entry ", k);
    const uint8_t* c = &cd[p];
    const uint16_t flags = le16(c + 8), method = le16(c + 10);
    const uint32_t crc = le32(c + 16);
    uint64_t csize = le32(c + 20), usize = le32(c + 24), local = le32(c + 42);
    const size_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    KILN_CHECK(p + 46 + name_len + extra_len + comment_len <= cd.size(), kOp, "zip: central directory entry ", k,
               " runs past the directory");
    const std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    // ZIP64 extra: the 0xFFFFFFFF fields, in order usize, csize, offset.
    for (size_t x = 0; x + 4 <= extra_len;) {
      const uint8_t* f = c + 46 + name_len + x;
      const size_t len = le16(f + 2);
      KILN_CHECK(x + 4 + len <= extra_len, kOp, "zip: bad extra field in record '", name, "'");
      if (le16(f) == 1) {
        size_t q = 4;
        auto next = [&](uint64_t& v) {
          if (v != kU32Max) return;
          KILN_CHECK(q + 8 <= 4 + len, kOp, "zip: short ZIP64 extra field in record '", name, "'");
          v = le64(f + q);
          q += 8;
        };
        next(usize);
        next(csize);
        next(local);
      }
      x += 4 + len;
    }
    KILN_CHECK((flags & 1) == 0, kOp, "zip: record '", name, "' is encrypted");
    KILN_CHECK(method == 0, kOp, "zip: record '", name, "' is compressed (method ", method,
               "); torch checkpoints store records uncompressed");
    KILN_CHECK(csize == usize, kOp, "zip: stored record '", name, "' has different compressed and plain sizes");
    KILN_CHECK(local <= n && n - local >= 30, kOp, "zip: local header of '", name, "' is outside the file");
    const std::vector<uint8_t> lh = src.read_vec(30, local, kOp);
    KILN_CHECK(le32(lh.data()) == 0x04034b50u, kOp, "zip: bad local header for record '", name, "'");
    const uint64_t data = local + 30 + le16(&lh[26]) + le16(&lh[28]);
    KILN_CHECK(le16(&lh[26]) == name_len && src.read_vec(name_len, local + 30, kOp) ==
                   std::vector<uint8_t>(name.begin(), name.end()),
               kOp, "zip: local header name differs from the central directory for '", name, "'");
    KILN_CHECK(data <= n && usize <= n - data, kOp, "zip: record '", name, "' runs past the end of the file");
    KILN_CHECK(out.emplace(name, Record{data, usize, crc}).second, kOp, "zip: duplicate record '", name, "'");
    p += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// Flattens the unpickled object: nested dicts/lists join names with '.', tensors become
// entries, primitive leaves become metadata.
// A value reached through several paths (the pickle memo shares it) is flattened once per path, as
// torch's names for tied weights need; the walk is bounded by a budget proportional to the
// pickle's size, so a chain of lists each holding the next twice cannot make it exponential.
class Flattener {
 public:
  explicit Flattener(const PickleResult& r) : r_(r), budget_(4 * r.values.size() + 100'000) {}
  std::vector<std::pair<std::string, uint32_t>> tensors;
  Metadata metadata;

  void walk(uint32_t id, const std::string& name, int depth) {
    KILN_CHECK(depth <= 64, kOp, "pickle: object nests deeper than 64 levels");
    KILN_CHECK(++visits_ <= budget_, kOp, "pickle: flattening the object visits more than ", budget_,
               " entries for ", r_.values.size(), " pickled values: containers are shared through the memo "
               "so often that the tree they unfold to is far larger than the file");
    const PyValue& v = r_.values[id];
    auto child = [&](const std::string& k) { return name.empty() ? k : name + "." + k; };
    switch (v.kind) {
      case PyKind::Tensor: tensors.emplace_back(name.empty() ? "tensor" : name, id); break;
      case PyKind::Dict:
      case PyKind::List:
      case PyKind::Tuple: {
        KILN_CHECK(on_path_.insert(id).second, kOp, "pickle: object contains itself");
        if (v.kind == PyKind::Dict) {
          for (const auto& [k, x] : v.entries) {
            const PyValue& key = r_.values[k];
            KILN_CHECK(key.kind == PyKind::Str || key.kind == PyKind::Int, kOp, "pickle: dict key is not a string");
            walk(x, child(key.kind == PyKind::Str ? key.s : std::to_string(key.i)), depth + 1);
          }
        } else {
          for (size_t i = 0; i < v.items.size(); ++i) walk(v.items[i], child(std::to_string(i)), depth + 1);
        }
        on_path_.erase(id);
        break;
      }
      case PyKind::None: metadata[name] = "None"; break;
      case PyKind::Bool: metadata[name] = v.i ? "True" : "False"; break;
      case PyKind::Int: metadata[name] = std::to_string(v.i); break;
      case PyKind::Float: metadata[name] = std::to_string(v.f); break;
      case PyKind::Str: metadata[name] = v.s; break;
      default: break;  // bytes, bare globals and storages carry no tensor
    }
  }

 private:
  const PickleResult& r_;
  std::set<uint32_t> on_path_;
  size_t budget_;
  size_t visits_ = 0;
};

Tensor view_of(const std::shared_ptr<Storage>& storage, DType dtype, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void byteswap(uint8_t* p, size_t nbytes, size_t es) {
  if (es <= 1) return;
  for (size_t i = 0; i + es <= nbytes; i += es) std::reverse(p + i, p + i + es);
}

// The archive read up to the tensors: records, the unpickled object and its flattening.
struct TorchFile {
  std::map<std::string, Record> recs;
  std::string prefix;  // the archive folder, "archive/"
  bool big_endian = false;
  PickleResult pickle;
  std::vector<std::pair<std::string, uint32_t>> tensors;  // name -> tensor value
  Metadata metadata;
};

TorchFile read_torch(const Source& src) {
  TorchFile f;
  f.recs = read_zip(src);
  for (const auto& [name, r] : f.recs) {
    const size_t slash = name.find('/');
    KILN_CHECK(slash != std::string::npos && slash > 0, kOp, "zip: record '", name, "' is not inside an archive folder");
    if (f.prefix.empty()) f.prefix = name.substr(0, slash + 1);
    KILN_CHECK(name.compare(0, f.prefix.size(), f.prefix) == 0, kOp, "zip: records lie in more than one folder ('",
               f.prefix, "' and '", name, "')");
  }
  auto pkl = f.recs.find(f.prefix + "data.pkl");
  KILN_CHECK(pkl != f.recs.end(), kOp, "zip: no data.pkl record");
  if (auto bo = f.recs.find(f.prefix + "byteorder"); bo != f.recs.end()) {
    KILN_CHECK(bo->second.size <= 16, kOp, "byteorder record must be 'little' or 'big' (", bo->second.size, " bytes)");
    const std::vector<uint8_t> b = src.read_vec(bo->second.size, bo->second.offset, kOp);
    const std::string s(b.begin(), b.end());
    KILN_CHECK(s == "little" || s == "big", kOp, "byteorder record must be 'little' or 'big', found '", s, "'");
    f.big_endian = s == "big";
  }
  const std::vector<uint8_t> pickle = src.read_vec(pkl->second.size, pkl->second.offset, kOp);
  f.pickle = unpickle(pickle.data(), pickle.size());
  Flattener fl(f.pickle);
  fl.walk(f.pickle.root, "", 0);
  f.tensors = std::move(fl.tensors);
  f.metadata = std::move(fl.metadata);
  return f;
}

bool row_major(const Shape& size, const Shape& stride) {
  int64_t expect = 1;
  for (size_t d = size.size(); d-- > 0;) {
    if (size[d] == 1) continue;
    if (stride[d] != expect) return false;
    expect *= size[d];
  }
  return true;
}

// One tensor of the archive with its geometry checked against its storage record: every reachable
// element inside the storage, numel x element size representable. Nothing is read.
struct TorchTensor {
  const PyValue* value = nullptr;
  const PyValue* storage = nullptr;
  const Record* rec = nullptr;
  FileDType dtype = FileDType::F32;
  size_t es = 1;            // bytes per element of `dtype`
  int64_t base_numel = 0;   // the storage's elements of `dtype`
  int64_t numel = 0;
  TensorInfo info;
};

TorchTensor check_tensor(const TorchFile& f, const std::string& name, uint32_t id) {
  TorchTensor r;
  const PyValue& t = f.pickle.values[id];
  const PyValue& st = f.pickle.values[t.storage];
  r.value = &t;
  r.storage = &st;
  r.dtype = *t.dtype;
  r.es = static_cast<size_t>(file_dtype_bits(r.dtype) / 8);
  const size_t st_es = st.untyped ? 1 : static_cast<size_t>(file_dtype_bits(*st.dtype) / 8);
  auto rec = f.recs.find(f.prefix + "data/" + st.s);
  KILN_CHECK(rec != f.recs.end(), kOp, "zip: storage record 'data/", st.s, "' is missing");
  r.rec = &rec->second;
  const uint64_t want_bytes = checked_nbytes({st.i}, st_es * 8, st.untyped ? "U8" : file_dtype_name(*st.dtype), kOp,
                                             "storage 'data/" + st.s + "': ");
  KILN_CHECK(want_bytes == r.rec->size, kOp, "storage 'data/", st.s, "': record size ", r.rec->size,
             " differs from numel x element size = ", want_bytes);
  const uint64_t nbytes = r.rec->size;
  KILN_CHECK(nbytes % r.es == 0, kOp, "storage 'data/", st.s, "' (", nbytes, " bytes) is not a whole number of ",
             file_dtype_name(r.dtype), " elements");
  r.base_numel = static_cast<int64_t>(nbytes / r.es);
  // Geometry: non-negative, and every reachable element inside the storage.
  KILN_CHECK(t.offset >= 0, kOp, "tensor '", name, "': negative storage offset");
  u128 last = static_cast<uint64_t>(t.offset);
  for (size_t d = 0; d < t.size.size(); ++d) {
    KILN_CHECK(t.size[d] >= 0 && t.stride[d] >= 0, kOp, "tensor '", name, "': negative size or stride");
    if (t.size[d] > 0) last += static_cast<u128>(t.size[d] - 1) * static_cast<uint64_t>(t.stride[d]);
    KILN_CHECK(last <= static_cast<u128>(INT64_MAX), kOp, "tensor '", name, "': size overflows (stride ",
               shape_str(t.stride), ")");
  }
  const uint64_t logical = checked_nbytes(t.size, r.es * 8, file_dtype_name(r.dtype), kOp, "tensor '" + name + "': ");
  r.numel = static_cast<int64_t>(logical / r.es);
  KILN_CHECK(r.numel == 0 || last < static_cast<u128>(r.base_numel), kOp, "tensor '", name, "' (size ",
             shape_str(t.size), ", stride ", shape_str(t.stride), ", offset ", t.offset,
             ") reaches past the end of its storage of ", r.base_numel, " elements");
  TensorInfo& ti = r.info;
  ti.name = name;
  ti.dtype = r.dtype;
  ti.shape = t.size;
  ti.stride = t.stride;
  ti.storage_offset = t.offset;
  ti.storage = "data/" + st.s;
  ti.nbytes = logical;
  ti.span_offset = r.rec->offset + static_cast<uint64_t>(t.offset) * r.es;
  ti.span_bytes = r.numel == 0 ? 0 : (static_cast<uint64_t>(last) - static_cast<uint64_t>(t.offset) + 1) * r.es;
  ti.dense = ti.span_bytes == ti.nbytes && row_major(t.size, t.stride);
  if (ti.span_offset == r.rec->offset && ti.span_bytes == r.rec->size) ti.stored_crc32 = r.rec->crc;
  return r;
}

void check_record_crc(const Record& rec, const std::string& key, const void* bytes) {
  const uint32_t got = crc32(bytes, rec.size);
  if (got == rec.crc) return;
  char g[16], w[16];
  std::snprintf(g, sizeof(g), "%08x", got);
  std::snprintf(w, sizeof(w), "%08x", rec.crc);
  KILN_FAIL(kOp, "storage record '", key, "' fails its checksum: its bytes have CRC-32 ", g,
            " but the zip directory says ", w, " (the data changed after the file was written)");
}

}  // namespace

CheckpointInfo torch_zip_info(const Source& src, bool checksums) {
  const TorchFile f = read_torch(src);
  CheckpointInfo info;
  info.format = Format::TorchZip;
  info.file_size = src.size();
  info.metadata = f.metadata;
  for (const auto& [name, id] : f.tensors) {
    TensorInfo ti = check_tensor(f, name, id).info;
    if (checksums) ti.crc32 = src.crc32_range(ti.span_offset, ti.span_bytes, kOp);
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

Checkpoint load_torch_zip(const Source& src, const LoadOptions& options) {
  const TorchFile f = read_torch(src);
  Checkpoint ck;
  ck.format = Format::TorchZip;
  ck.metadata = f.metadata;
  std::vector<std::pair<std::string, uint32_t>> chosen;
  if (options.names.empty()) {
    chosen = f.tensors;
  } else {
    std::set<std::string> want(options.names.begin(), options.names.end());
    for (const auto& t : f.tensors)
      if (want.erase(t.first)) chosen.push_back(t);
    KILN_CHECK(want.empty(), kOp, "tensor '", *want.begin(), "' not found in ", src.path());
  }
  struct Loaded {
    Tensor cpu;     // the storage's bytes (as its kiln dtype when it has one)
    Tensor device;  // the same on options.device
  };
  std::unordered_map<uint32_t, Loaded> storages;
  for (const auto& [name, id] : chosen) {
    const TorchTensor tt = check_tensor(f, name, id);
    const PyValue& t = *tt.value;
    const PyValue& st = *tt.storage;
    const FileDType fd = tt.dtype;
    const size_t es = tt.es;
    const uint64_t nbytes = tt.rec->size;
    const int64_t base_numel = tt.base_numel;
    const auto kd = to_kiln_dtype(fd);
    auto it = storages.find(t.storage);
    if (it == storages.end()) {
      const uint64_t off = tt.rec->offset;
      const DType read_dtype = kd ? *kd : kUInt8;
      const int64_t read_numel = kd ? base_numel : static_cast<int64_t>(nbytes);
      Tensor bytes;
      if (f.big_endian) {
        bytes = empty({read_numel}, read_dtype);
        src.read(bytes.data_ptr(), nbytes, off, kOp);
        if (options.verify_checksums) check_record_crc(*tt.rec, "data/" + st.s, bytes.data_ptr());
        byteswap(static_cast<uint8_t*>(bytes.data_ptr()), nbytes, es);
      } else {
        bytes = read_tensor(src, off, {read_numel}, read_dtype, kOp);
        if (options.verify_checksums && !src.zero_copy()) check_record_crc(*tt.rec, "data/" + st.s, bytes.data_ptr());
      }
      Loaded l{bytes, bytes};
      if (!options.device.is_cpu() && kd) l.device = bytes.to(options.device);
      it = storages.emplace(t.storage, std::move(l)).first;
    }
    const Loaded& l = it->second;
    Tensor out;
    if (kd) {
      KILN_CHECK(l.cpu.dtype() == *kd, kOp, "tensor '", name, "' views storage 'data/", st.s, "' as ", dtype_name(*kd),
                 " but another tensor views it as ", dtype_name(l.cpu.dtype()));
      out = view_of(l.device.storage(), *kd, t.size, t.stride, t.offset);
      if (t.requires_grad) out.requires_grad_(true);
      ck.tensors.insert(TensorEntry{name, out, fd, t.size});
      continue;
    }
    // Raw dtypes: the view's bytes, gathered contiguously (a zero-copy slice when contiguous).
    // A view with more elements than its storage (zero strides) would be expanded here: refused.
    KILN_CHECK(tt.numel <= base_numel, kOp, "tensor '", name, "': a ", file_dtype_name(fd),
               " view with more elements than its storage (zero or overlapping strides) cannot be loaded as raw bytes");
    const int64_t n = tt.numel;
    const bool contig = t.size.empty() || t.stride == contiguous_strides(t.size) || n <= 1;
    if (contig) {
      out = view_of(l.cpu.storage(), kUInt8, {n * static_cast<int64_t>(es)}, {1}, t.offset * static_cast<int64_t>(es));
      if (l.cpu.dtype() != kUInt8) out = out.clone();  // keep the raw tensor's storage byte-typed
    } else {
      out = empty({n * static_cast<int64_t>(es)}, kUInt8);
      const auto* base = static_cast<const uint8_t*>(l.cpu.data_ptr());
      auto* dst = static_cast<uint8_t*>(out.data_ptr());
      std::vector<int64_t> idx(t.size.size(), 0);
      for (int64_t k = 0; k < n; ++k) {
        int64_t e = t.offset;
        for (size_t d = 0; d < idx.size(); ++d) e += idx[d] * t.stride[d];
        std::memcpy(dst + k * static_cast<int64_t>(es), base + e * static_cast<int64_t>(es), es);
        for (int64_t d = static_cast<int64_t>(idx.size()) - 1; d >= 0; --d) {
          if (++idx[d] < t.size[d]) break;
          idx[d] = 0;
        }
      }
    }
    if (!options.device.is_cpu()) out = out.to(options.device);
    ck.tensors.insert(TensorEntry{name, out, fd, t.size});
  }
  return ck;
}

namespace {

class ZipWriter {
 public:
  explicit ZipWriter(Sink& sink) : sink_(sink) {}

  void add(const std::string& name, const void* data, uint64_t size) {
    const uint32_t crc = crc32(data, size);
    const uint64_t local = sink_.position();
    const bool z64 = size >= kU32Max;
    std::vector<uint8_t> h;
    put_le(h, 0x04034b50u, 4);
    put_le(h, z64 ? 45 : 20, 2);
    put_le(h, 0, 2);  // flags
    put_le(h, 0, 2);  // method: stored
    put_le(h, 0, 4);  // time, date
    put_le(h, crc, 4);
    put_le(h, z64 ? kU32Max : size, 4);
    put_le(h, z64 ? kU32Max : size, 4);
    put_le(h, name.size(), 2);
    // Extra: ZIP64 sizes when needed, then an 'FB' padding field so the data starts 64-aligned.
    std::vector<uint8_t> extra;
    if (z64) {
      put_le(extra, 1, 2);
      put_le(extra, 16, 2);
      put_le(extra, size, 8);
      put_le(extra, size, 8);
    }
    const uint64_t base = local + 30 + name.size() + extra.size() + 4;
    const uint64_t pad = (64 - base % 64) % 64;
    put_le(extra, 0x4246, 2);
    put_le(extra, pad, 2);
    extra.resize(extra.size() + pad, 0);
    put_le(h, extra.size(), 2);
    h.insert(h.end(), name.begin(), name.end());
    h.insert(h.end(), extra.begin(), extra.end());
    sink_.write(h.data(), h.size());
    sink_.write(data, size);
    entries_.push_back({name, crc, size, local});
  }

  void finish() {
    const uint64_t cd_off = sink_.position();
    for (const Entry& e : entries_) {
      const bool z64 = e.size >= kU32Max || e.local >= kU32Max;
      std::vector<uint8_t> extra;
      if (z64) {
        put_le(extra, 1, 2);
        put_le(extra, 24, 2);
        put_le(extra, e.size, 8);
        put_le(extra, e.size, 8);
        put_le(extra, e.local, 8);
      }
      std::vector<uint8_t> c;
      put_le(c, 0x02014b50u, 4);
      put_le(c, z64 ? 45 : 20, 2);  // made by
      put_le(c, z64 ? 45 : 20, 2);  // needed
      put_le(c, 0, 2);
      put_le(c, 0, 2);
      put_le(c, 0, 4);
      put_le(c, e.crc, 4);
      put_le(c, z64 ? kU32Max : e.size, 4);
      put_le(c, z64 ? kU32Max : e.size, 4);
      put_le(c, e.name.size(), 2);
      put_le(c, extra.size(), 2);
      put_le(c, 0, 2);  // comment
      put_le(c, 0, 2);  // disk
      put_le(c, 0, 2);  // internal attributes
      put_le(c, 0, 4);  // external attributes
      put_le(c, z64 ? kU32Max : e.local, 4);
      c.insert(c.end(), e.name.begin(), e.name.end());
      c.insert(c.end(), extra.begin(), extra.end());
      sink_.write(c.data(), c.size());
    }
    const uint64_t cd_end = sink_.position(), cd_size = cd_end - cd_off;
    std::vector<uint8_t> t;
    const bool z64 = entries_.size() >= 0xFFFF || cd_off >= kU32Max || cd_size >= kU32Max;
    if (z64) {
      put_le(t, 0x06064b50u, 4);
      put_le(t, 44, 8);
      put_le(t, 45, 2);
      put_le(t, 45, 2);
      put_le(t, 0, 4);
      put_le(t, 0, 4);
      put_le(t, entries_.size(), 8);
      put_le(t, entries_.size(), 8);
      put_le(t, cd_size, 8);
      put_le(t, cd_off, 8);
      put_le(t, 0x07064b50u, 4);
      put_le(t, 0, 4);
      put_le(t, cd_end, 8);
      put_le(t, 1, 4);
    }
    put_le(t, 0x06054b50u, 4);
    put_le(t, 0, 4);
    put_le(t, z64 ? 0xFFFF : entries_.size(), 2);
    put_le(t, z64 ? 0xFFFF : entries_.size(), 2);
    put_le(t, z64 ? kU32Max : cd_size, 4);
    put_le(t, z64 ? kU32Max : cd_off, 4);
    put_le(t, 0, 2);
    sink_.write(t.data(), t.size());
  }

 private:
  struct Entry {
    std::string name;
    uint32_t crc;
    uint64_t size, local;
  };
  Sink& sink_;
  std::vector<Entry> entries_;
};

}  // namespace

void write_torch_zip(Sink& sink, const TensorDict& tensors) {
  struct StorageOut {
    std::string key;
    Tensor bytes;  // contiguous CPU uint8 of the whole storage
    FileDType dtype;
  };
  std::vector<StorageOut> stores;
  std::map<std::pair<const Storage*, FileDType>, size_t> by_storage;
  Pickler pk;
  pk.op('}');
  if (!tensors.empty()) pk.op('(');
  for (const TensorEntry& e : tensors) {
    const char* dtype_name_torch = torch_dtype_name(e.dtype);
    KILN_CHECK(dtype_name_torch != nullptr, kOp, "tensor '", e.name, "': dtype ", file_dtype_name(e.dtype),
               " has no PyTorch equivalent");
    const int64_t es = file_dtype_bits(e.dtype) / 8;
    Shape size = e.shape, stride;
    int64_t offset = 0;
    size_t sid;
    if (!e.raw()) {
      stride = e.tensor.strides();
      offset = e.tensor.storage_offset();
      for (int64_t s : stride) KILN_CHECK(s >= 0, kOp, "tensor '", e.name, "': negative strides cannot be saved");
      const auto key = std::make_pair(e.tensor.storage().get(), e.dtype);
      auto it = by_storage.find(key);
      if (it == by_storage.end()) {
        // The whole storage, so every view of it keeps its offsets.
        const Storage& s = *e.tensor.storage();
        const int64_t nb = static_cast<int64_t>(s.nbytes()) / es * es;
        Tensor all = view_of(e.tensor.storage(), kUInt8, {nb}, {1}, 0);
        stores.push_back({std::to_string(stores.size()), contiguous_cpu(all), e.dtype});
        it = by_storage.emplace(key, stores.size() - 1).first;
      }
      sid = it->second;
    } else {
      stride = contiguous_strides(size);
      stores.push_back({std::to_string(stores.size()), contiguous_cpu(e.tensor), e.dtype});
      sid = stores.size() - 1;
    }
    const StorageOut& so = stores[sid];
    const char* cls = torch_storage_class(e.dtype);
    const int64_t numel = so.bytes.numel() / (cls != nullptr ? es : 1);
    pk.str(e.name);
    pk.global("torch._utils", cls != nullptr ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    pk.op('(');
    pk.op('(');  // persistent id ('storage', type, key, location, numel)
    pk.str("storage");
    if (cls != nullptr) pk.global("torch", cls);
    else pk.global("torch.storage", "UntypedStorage");
    pk.str(so.key);
    pk.str("cpu");
    pk.integer(numel);
    pk.op('t');
    pk.op('Q');
    pk.integer(offset);
    pk.int_tuple(size);
    pk.int_tuple(stride);
    pk.boolean(!e.raw() && e.tensor.requires_grad());
    pk.global("collections", "OrderedDict");
    pk.op(')');
    pk.op('R');
    if (cls == nullptr) pk.global("torch", dtype_name_torch);
    pk.op('t');
    pk.op('R');
  }
  if (!tensors.empty()) pk.op('u');
  const std::vector<uint8_t> pickle = pk.finish();

  ZipWriter zip(sink);
  zip.add("archive/data.pkl", pickle.data(), pickle.size());
  zip.add("archive/byteorder", "little", 6);
  for (const StorageOut& s : stores) zip.add("archive/data/" + s.key, s.bytes.data_ptr(), s.bytes.nbytes());
  zip.add("archive/version", "3\n", 2);
  zip.finish();
}

std::vector<uint8_t> make_stored_zip(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& records) {
  std::vector<uint8_t> out;
  Sink sink(&out);
  ZipWriter zip(sink);
  for (const auto& [name, data] : records) zip.add(name, data.data(), data.size());
  zip.finish();
  return out;
}

}  // namespace kiln::io::detail
