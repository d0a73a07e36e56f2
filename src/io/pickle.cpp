// Restricted unpickler and a minimal pickler (see pickle.h). The unpickler is a plain stack
// machine over an arena of values: it builds data, resolves an allow-list of globals to tags,
// and "calls" only the handful of torch rebuild functions, which it interprets itself.
#include "io/pickle.h"

#include <array>
#include <cstring>
#include <unordered_map>

#include "io/file_util.h"

namespace kiln::io::detail {
namespace {

constexpr const char* kOp = "torch-zip";
constexpr int kMaxRebuildDepth = 8;

struct TorchType {
  const char* storage;  // torch.<X>Storage, or nullptr (UntypedStorage only)
  const char* dtype;    // torch.<dtype>
  std::optional<FileDType> file;
};
// Every storage class and dtype torch pickles for a state dict; the ones without a file dtype
// are recognised (so the error says what they are) but cannot be loaded.
const std::array<TorchType, 25> kTorchTypes{{
    {"DoubleStorage", "float64", FileDType::F64},      {"FloatStorage", "float32", FileDType::F32},
    {"HalfStorage", "float16", FileDType::F16},        {"BFloat16Storage", "bfloat16", FileDType::BF16},
    {"LongStorage", "int64", FileDType::I64},          {"IntStorage", "int32", FileDType::I32},
    {"ShortStorage", "int16", FileDType::I16},         {"CharStorage", "int8", FileDType::I8},
    {"ByteStorage", "uint8", FileDType::U8},           {"BoolStorage", "bool", FileDType::BOOL},
    {"ComplexFloatStorage", "complex64", FileDType::C64},
    {nullptr, "uint16", FileDType::U16},               {nullptr, "uint32", FileDType::U32},
    {nullptr, "uint64", FileDType::U64},               {nullptr, "float8_e4m3fn", FileDType::F8_E4M3},
    {nullptr, "float8_e5m2", FileDType::F8_E5M2},      {nullptr, "float8_e4m3fnuz", FileDType::F8_E4M3FNUZ},
    {nullptr, "float8_e5m2fnuz", FileDType::F8_E5M2FNUZ}, {nullptr, "float8_e8m0fnu", FileDType::F8_E8M0},
    {"ComplexDoubleStorage", "complex128", std::nullopt}, {"QInt8Storage", "qint8", std::nullopt},
    {"QUInt8Storage", "quint8", std::nullopt},         {"QInt32Storage", "qint32", std::nullopt},
    {"QUInt4x2Storage", "quint4x2", std::nullopt},     {nullptr, "float4_e2m1fn_x2", std::nullopt},
}};

const TorchType* find_storage(const std::string& global) {
  for (const auto& t : kTorchTypes)
    if (t.storage != nullptr && global == std::string("torch.") + t.storage) return &t;
  return nullptr;
}
const TorchType* find_dtype(const std::string& global) {
  for (const auto& t : kTorchTypes)
    if (global == std::string("torch.") + t.dtype) return &t;
  return nullptr;
}

const char* const kCallables[] = {
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch._tensor._rebuild_from_type_v2",
    "collections.OrderedDict", "torch.Size", "torch.Tensor", "torch.nn.parameter.Parameter",
    "torch.storage.UntypedStorage",
};

bool allowed_global(const std::string& g) {
  for (const char* c : kCallables)
    if (g == c) return true;
  return find_storage(g) != nullptr || find_dtype(g) != nullptr;
}

std::string opcode_name(uint8_t op) {
  static const std::unordered_map<uint8_t, const char*> names = {
      {'i', "INST"}, {'o', "OBJ"}, {'P', "PERSID"}, {'I', "INT"}, {'L', "LONG"}, {'S', "STRING"},
      {'V', "UNICODE"}, {'F', "FLOAT"}, {'p', "PUT"}, {'g', "GET"}, {0x82, "EXT1"}, {0x83, "EXT2"},
      {0x84, "EXT4"}, {0x92, "NEWOBJ_EX"}, {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"},
      {0x96, "BYTEARRAY8"}, {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}, {'2', "DUP"}, {0x8b, "LONG4"}};
  auto it = names.find(op);
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", op);
  return std::string(it != names.end() ? it->second : "unknown") + " (" + hex + ")";
}

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  PickleResult run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;                       // PROTO
        case 0x95: take(8); break;                      // FRAME: framing is only a hint
        case '.': {                                      // STOP
          KILN_CHECK(!stack_.empty(), kOp, "pickle: STOP with an empty stack");
          PickleResult r;
          r.root = stack_.back();
          r.values = std::move(vals_);
          return r;
        }
        case '(': marks_.push_back(stack_.size()); break;
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case 'N': push(PyValue{}); break;
        case 0x88: push_int(PyKind::Bool, 1); break;
        case 0x89: push_int(PyKind::Bool, 0); break;
        case 'J': { const uint8_t* b = take(4); push_int(PyKind::Int, static_cast<int32_t>(le32(b))); break; }
        case 'K': push_int(PyKind::Int, byte()); break;
        case 'M': push_int(PyKind::Int, le16(take(2))); break;
        case 0x8a: long1(); break;
        case 'G': binfloat(); break;
        case 'X': push_str(PyKind::Str, le32(take(4))); break;
        case 0x8c: push_str(PyKind::Str, byte()); break;
        case 0x8d: push_str(PyKind::Str, le64(take(8))); break;
        case 'T': push_str(PyKind::Bytes, le32(take(4))); break;
        case 'U': push_str(PyKind::Bytes, byte()); break;
        case 'B': push_str(PyKind::Bytes, le32(take(4))); break;
        case 'C': push_str(PyKind::Bytes, byte()); break;
        case 0x8e: push_str(PyKind::Bytes, le64(take(8))); break;
        case ')': push_seq(PyKind::Tuple, {}); break;
        case 't': push_seq(PyKind::Tuple, pop_mark()); break;
        case 0x85: case 0x86: case 0x87: {
          const size_t k = op - 0x84u;
          KILN_CHECK(stack_.size() >= k, kOp, "pickle: TUPLE", k, " needs ", k, " items on the stack");
          std::vector<uint32_t> items(stack_.end() - static_cast<std::ptrdiff_t>(k), stack_.end());
          stack_.resize(stack_.size() - k);
          push_seq(PyKind::Tuple, std::move(items));
          break;
        }
        case ']': push_seq(PyKind::List, {}); break;
        case 'l': push_seq(PyKind::List, pop_mark()); break;
        case 'a': { const uint32_t x = pop(); append(top(), {x}); break; }
        case 'e': { auto items = pop_mark(); append(top(), items); break; }
        case '}': push(PyValue{PyKind::Dict}); break;
        case 'd': { PyValue d{PyKind::Dict}; push(std::move(d)); setitems(stack_.back(), pop_mark_below()); break; }
        case 's': { const uint32_t x = pop(), k = pop(); setitems(top(), {k, x}); break; }
        case 'u': { auto items = pop_mark(); setitems(top(), items); break; }
        case 'c': {
          std::string module = line();  // two statements: argument order is unspecified
          global(module, line());
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const uint32_t name = pop(), module = pop();
          KILN_CHECK(v(module).kind == PyKind::Str && v(name).kind == PyKind::Str, kOp,
                     "pickle: STACK_GLOBAL needs two strings");
          global(v(module).s, v(name).s);
          break;
        }
        case 'R': { const uint32_t args = pop(), fn = pop(); push_id(call(fn, args)); break; }
        case 0x81: { const uint32_t args = pop(), cls = pop(); push_id(newobj(cls, args)); break; }
        case 'b': { const uint32_t state = pop(); build(top(), state); break; }
        case 'Q': { const uint32_t pid = pop(); push_id(persistent(pid)); break; }
        case 'h': push_id(get(byte())); break;
        case 'j': push_id(get(le32(take(4)))); break;
        case 'q': memo_[byte()] = top(); break;
        case 'r': memo_[le32(take(4))] = top(); break;
        case 0x94: memo_[static_cast<uint32_t>(memo_.size())] = top(); break;
        default:
          KILN_FAIL(kOp, "pickle opcode ", opcode_name(op), " is not allowed (weights-only unpickler)");
      }
    }
  }

 private:
  PyValue& v(uint32_t id) { return vals_[id]; }
  uint8_t byte() { return *take(1); }
  const uint8_t* take(uint64_t k) {
    KILN_CHECK(k <= n_ - pos_, kOp, "pickle truncated: ", k, " bytes wanted at offset ", pos_, " of ", n_);
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  std::string line() {
    const uint8_t* start = p_ + pos_;
    const void* nl = std::memchr(start, '\n', n_ - pos_);
    KILN_CHECK(nl != nullptr, kOp, "pickle truncated: GLOBAL without a newline");
    const size_t len = static_cast<const uint8_t*>(nl) - start;
    pos_ += len + 1;
    return std::string(reinterpret_cast<const char*>(start), len);
  }
  uint32_t push(PyValue val) {
    vals_.push_back(std::move(val));
    const auto id = static_cast<uint32_t>(vals_.size() - 1);
    stack_.push_back(id);
    return id;
  }
  void push_id(uint32_t id) { stack_.push_back(id); }
  void push_int(PyKind k, int64_t i) {
    PyValue x{k};
    x.i = i;
    push(std::move(x));
  }
  void push_str(PyKind k, uint64_t len) {
    const uint8_t* b = take(len);
    PyValue x{k};
    x.s.assign(reinterpret_cast<const char*>(b), len);
    push(std::move(x));
  }
  void push_seq(PyKind k, std::vector<uint32_t> items) {
    PyValue x{k};
    x.items = std::move(items);
    push(std::move(x));
  }
  void long1() {
    const uint8_t len = byte();
    const uint8_t* b = take(len);
    KILN_CHECK(len <= 8, kOp, "pickle: integer of ", int(len), " bytes does not fit in int64");
    uint64_t u = 0;
    for (int k = 0; k < len; ++k) u |= static_cast<uint64_t>(b[k]) << (8 * k);
    if (len > 0 && len < 8 && (b[len - 1] & 0x80)) u |= ~uint64_t{0} << (8 * len);  // sign-extend
    push_int(PyKind::Int, static_cast<int64_t>(u));
  }
  void binfloat() {
    const uint8_t* b = take(8);
    uint64_t u = 0;
    for (int k = 0; k < 8; ++k) u = (u << 8) | b[k];  // big-endian
    PyValue x{PyKind::Float};
    std::memcpy(&x.f, &u, 8);
    push(std::move(x));
  }
  uint32_t top() {
    KILN_CHECK(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()), kOp,
               "pickle: stack underflow");
    return stack_.back();
  }
  uint32_t pop() {
    const uint32_t id = top();
    stack_.pop_back();
    return id;
  }
  std::vector<uint32_t> pop_mark() {
    KILN_CHECK(!marks_.empty(), kOp, "pickle: no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  // DICT: the new dict was pushed above the marked items; take them out from below it.
  std::vector<uint32_t> pop_mark_below() {
    const uint32_t d = stack_.back();
    stack_.pop_back();
    auto items = pop_mark();
    stack_.push_back(d);
    return items;
  }
  uint32_t get(uint32_t key) {
    auto it = memo_.find(key);
    KILN_CHECK(it != memo_.end(), kOp, "pickle: memo key ", key, " was never stored");
    return it->second;
  }
  void append(uint32_t list, const std::vector<uint32_t>& items) {
    KILN_CHECK(v(list).kind == PyKind::List, kOp, "pickle: APPEND to a non-list");
    auto& dst = v(list).items;
    dst.insert(dst.end(), items.begin(), items.end());
  }
  void setitems(uint32_t dict, const std::vector<uint32_t>& kv) {
    KILN_CHECK(v(dict).kind == PyKind::Dict, kOp, "pickle: SETITEM on a non-dict");
    KILN_CHECK(kv.size() % 2 == 0, kOp, "pickle: SETITEMS with an odd number of items");
    for (size_t k = 0; k < kv.size(); k += 2) v(dict).entries.emplace_back(kv[k], kv[k + 1]);
  }
  void global(const std::string& module, const std::string& name) {
    const std::string g = module + "." + name;
    KILN_CHECK(allowed_global(g), kOp, "pickle global '", g,
               "' is not allowed (weights-only unpickler: only tensors, storages, dtypes, OrderedDict, "
               "torch.Size, Parameter and primitive containers)");
    PyValue x{PyKind::Global};
    x.s = g;
    push(std::move(x));
  }
  const std::vector<uint32_t>& tuple_args(uint32_t args, const std::string& fn, size_t lo, size_t hi) {
    KILN_CHECK(v(args).kind == PyKind::Tuple, kOp, "pickle: arguments of ", fn, " are not a tuple");
    const auto& a = v(args).items;
    KILN_CHECK(a.size() >= lo && a.size() <= hi, kOp, "pickle: ", fn, " called with ", a.size(), " arguments");
    return a;
  }
  int64_t as_int(uint32_t id, const char* what) {
    KILN_CHECK(v(id).kind == PyKind::Int || v(id).kind == PyKind::Bool, kOp, "pickle: ", what, " must be an integer");
    return v(id).i;
  }
  Shape int_tuple(uint32_t id, const char* what) {
    KILN_CHECK(v(id).kind == PyKind::Tuple || v(id).kind == PyKind::List, kOp, "pickle: ", what, " must be a tuple");
    Shape s;
    for (uint32_t e : v(id).items) s.push_back(as_int(e, what));
    return s;
  }
  uint32_t rebuild_tensor(uint32_t args, bool v3) {
    const std::string fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
    const auto a = tuple_args(args, fn, v3 ? 7 : 6, v3 ? 8 : 7);
    KILN_CHECK(v(a[0]).kind == PyKind::Storage, kOp, "pickle: ", fn, " needs a storage as its first argument");
    PyValue t{PyKind::Tensor};
    t.storage = a[0];
    t.offset = as_int(a[1], "storage_offset");
    t.size = int_tuple(a[2], "size");
    t.stride = int_tuple(a[3], "stride");
    t.requires_grad = as_int(a[4], "requires_grad") != 0;
    const PyValue& st = v(a[0]);
    if (v3) {
      KILN_CHECK(v(a[6]).kind == PyKind::Global, kOp, "pickle: _rebuild_tensor_v3's dtype is not a torch dtype");
      const TorchType* tt = find_dtype(v(a[6]).s);
      KILN_CHECK(tt != nullptr, kOp, "pickle: '", v(a[6]).s, "' is not a torch dtype");
      KILN_CHECK(tt->file.has_value(), kOp, "dtype ", v(a[6]).s, " has no kiln or safetensors equivalent");
      KILN_CHECK(st.untyped || st.dtype == tt->file, kOp, "pickle: tensor dtype ", v(a[6]).s,
                 " differs from its typed storage's");
      t.dtype = tt->file;
    } else {
      KILN_CHECK(!st.untyped, kOp, "pickle: _rebuild_tensor_v2 over an UntypedStorage has no dtype");
      t.dtype = st.dtype;
    }
    KILN_CHECK(t.size.size() == t.stride.size(), kOp, "pickle: tensor size ", shape_str(t.size), " and stride ",
               shape_str(t.stride), " differ in length");
    vals_.push_back(std::move(t));
    return static_cast<uint32_t>(vals_.size() - 1);
  }
  uint32_t call(uint32_t fn, uint32_t args) {
    KILN_CHECK(v(fn).kind == PyKind::Global, kOp, "pickle: REDUCE on something that is not an allowed global");
    const std::string g = v(fn).s;
    if (g == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(args, false);
    if (g == "torch._utils._rebuild_tensor_v3") return rebuild_tensor(args, true);
    if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
      const auto a = tuple_args(args, g, g.back() == 'e' ? 4 : 3, g.back() == 'e' ? 4 : 3);
      KILN_CHECK(v(a[0]).kind == PyKind::Tensor, kOp, "pickle: ", g, " needs a tensor");
      PyValue t = v(a[0]);
      t.requires_grad = as_int(a[1], "requires_grad") != 0;
      vals_.push_back(std::move(t));
      return static_cast<uint32_t>(vals_.size() - 1);
    }
    if (g == "torch._tensor._rebuild_from_type_v2") {
      // (func, type, args, state): unwrapped in a loop, to a fixed depth (torch nests it once),
      // so a pickle that nests it thousands of times cannot exhaust the stack.
      uint32_t f = fn, a_id = args;
      for (int depth = 0; v(f).kind == PyKind::Global && v(f).s == g; ++depth) {
        KILN_CHECK(depth < kMaxRebuildDepth, kOp, "pickle: _rebuild_from_type_v2 nests more than ", kMaxRebuildDepth,
                   " levels deep");
        const auto a = tuple_args(a_id, g, 4, 4);
        KILN_CHECK(v(a[1]).kind == PyKind::Global &&
                       (v(a[1]).s == "torch.Tensor" || v(a[1]).s == "torch.nn.parameter.Parameter"),
                   kOp, "pickle: _rebuild_from_type_v2 may only rebuild torch.Tensor or Parameter");
        f = a[0];
        a_id = a[2];  // the tensor's __dict__ state (a[3]) is not kept
      }
      return call(f, a_id);
    }
    if (g == "collections.OrderedDict") {
      tuple_args(args, g, 0, 0);
      vals_.push_back(PyValue{PyKind::Dict});
      return static_cast<uint32_t>(vals_.size() - 1);
    }
    if (g == "torch.Size") {
      const auto a = tuple_args(args, g, 1, 1);
      PyValue t{PyKind::Tuple};
      int_tuple(a[0], "torch.Size");  // validates: integers only
      t.items = v(a[0]).items;
      vals_.push_back(std::move(t));
      return static_cast<uint32_t>(vals_.size() - 1);
    }
    KILN_FAIL(kOp, "pickle global '", g, "' cannot be called");
  }
  uint32_t newobj(uint32_t cls, uint32_t args) {
    KILN_CHECK(v(cls).kind == PyKind::Global && v(cls).s == "collections.OrderedDict", kOp,
               "pickle: NEWOBJ is allowed only for collections.OrderedDict");
    return call(cls, args);
  }
  void build(uint32_t target, uint32_t) {
    // OrderedDict state (the state dict's _metadata) and tensor __dict__ state are dropped.
    KILN_CHECK(v(target).kind == PyKind::Dict || v(target).kind == PyKind::Tensor, kOp,
               "pickle: BUILD is allowed only on dicts and tensors");
  }
  uint32_t persistent(uint32_t pid) {
    const PyValue& t = v(pid);
    KILN_CHECK(t.kind == PyKind::Tuple && t.items.size() == 5 && v(t.items[0]).kind == PyKind::Str &&
                   v(t.items[0]).s == "storage",
               kOp, "pickle: persistent id is not ('storage', type, key, location, numel)");
    const PyValue& type = v(t.items[1]);
    const PyValue& keyv = v(t.items[2]);
    KILN_CHECK(type.kind == PyKind::Global, kOp, "pickle: storage type is not a global");
    KILN_CHECK(keyv.kind == PyKind::Str, kOp, "pickle: storage key is not a string");
    const std::string key = keyv.s;
    KILN_CHECK(v(t.items[3]).kind == PyKind::Str, kOp, "pickle: storage location is not a string");
    const int64_t numel = as_int(t.items[4], "storage numel");
    KILN_CHECK(numel >= 0, kOp, "pickle: storage '", key, "' has negative numel ", numel);
    PyValue s{PyKind::Storage};
    s.s = key;
    s.i = numel;
    if (type.s == "torch.storage.UntypedStorage") {
      s.untyped = true;
      s.dtype = FileDType::U8;
    } else {
      const TorchType* tt = find_storage(type.s);
      KILN_CHECK(tt != nullptr, kOp, "pickle: '", type.s, "' is not a storage type");
      KILN_CHECK(tt->file.has_value(), kOp, "dtype torch.", tt->dtype, " has no kiln or safetensors equivalent");
      s.dtype = tt->file;
    }
    auto it = storages_.find(key);
    if (it != storages_.end()) {
      const PyValue& o = v(it->second);
      KILN_CHECK(o.i == s.i && o.dtype == s.dtype && o.untyped == s.untyped, kOp, "pickle: storage '", key,
                 "' is declared twice with different types or sizes");
      return it->second;
    }
    vals_.push_back(std::move(s));
    const auto id = static_cast<uint32_t>(vals_.size() - 1);
    storages_.emplace(key, id);
    return id;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  std::vector<PyValue> vals_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, uint32_t> memo_;
  std::unordered_map<std::string, uint32_t> storages_;
};

}  // namespace

PickleResult unpickle(const uint8_t* data, size_t size) { return Unpickler(data, size).run(); }

const char* torch_storage_class(FileDType dtype) {
  for (const auto& t : kTorchTypes)
    if (t.file == dtype) return t.storage;
  return nullptr;
}
const char* torch_dtype_name(FileDType dtype) {
  for (const auto& t : kTorchTypes)
    if (t.file == dtype) return t.dtype;
  return nullptr;
}

Pickler::Pickler() {
  op(0x80);
  op(2);
}

void Pickler::global(const std::string& module, const std::string& name) {
  op('c');
  out_.insert(out_.end(), module.begin(), module.end());
  op('\n');
  out_.insert(out_.end(), name.begin(), name.end());
  op('\n');
}

void Pickler::str(const std::string& s) {
  op('X');
  put_le(out_, s.size(), 4);
  out_.insert(out_.end(), s.begin(), s.end());
}

void Pickler::integer(int64_t val) {
  if (val >= 0 && val < 256) {
    op('K');
    op(static_cast<uint8_t>(val));
  } else if (val >= INT32_MIN && val <= INT32_MAX) {
    op('J');
    put_le(out_, static_cast<uint32_t>(static_cast<int32_t>(val)), 4);
  } else {
    op(0x8a);  // LONG1, 8 bytes two's complement
    op(8);
    put_le(out_, static_cast<uint64_t>(val), 8);
  }
}

void Pickler::int_tuple(const Shape& vals) {
  if (vals.empty()) {
    op(')');
    return;
  }
  op('(');
  for (int64_t x : vals) integer(x);
  op('t');
}

std::vector<uint8_t> Pickler::finish() {
  op('.');
  return std::move(out_);
}

}  // namespace kiln::io::detail
