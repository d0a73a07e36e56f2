#pragma once
// A restricted unpickler (the opcodes and globals a PyTorch state dict needs, the set that
// torch.load(weights_only=True) allows; it never calls anything) and a tiny protocol-2 pickler.
// Values live in an arena and refer to each other by index, so hostile pickles (cycles, deep
// nesting) cannot leak or overflow the stack when they are freed.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io.h"

namespace kiln::io::detail {

enum class PyKind : uint8_t { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Storage, Tensor };

struct PyValue {
  PyValue() = default;
  explicit PyValue(PyKind k) : kind(k) {}
  PyKind kind = PyKind::None;
  int64_t i = 0;          // Bool, Int; Storage: numel (elements of its dtype)
  double f = 0;           // Float
  std::string s;          // Str, Bytes, Global ("module.name"); Storage: record key
  std::vector<uint32_t> items;                          // Tuple, List
  std::vector<std::pair<uint32_t, uint32_t>> entries;   // Dict
  // Storage: its element type (nullopt: an UntypedStorage of bytes, or a dtype kiln lacks).
  std::optional<FileDType> dtype;
  bool untyped = false;
  // Tensor (from _rebuild_tensor_v2/_v3): the storage value, geometry in elements of `dtype`.
  uint32_t storage = 0;
  int64_t offset = 0;
  Shape size, stride;
  bool requires_grad = false;
};

struct PickleResult {
  std::vector<PyValue> values;
  uint32_t root = 0;
};

// Parses `data`; persistent ids ('storage', type, key, location, numel) become Storage values.
// Every other global or opcode outside the allowed set throws, naming it.
PickleResult unpickle(const uint8_t* data, size_t size);

// Torch names for a file dtype: storage class ("FloatStorage") and dtype ("float32"); nullptr
// where torch has none (F4/F6) or needs an UntypedStorage (storage_class only).
const char* torch_storage_class(FileDType dtype);
const char* torch_dtype_name(FileDType dtype);

// Minimal protocol-2 pickler for save_torch.
class Pickler {
 public:
  Pickler();
  void op(uint8_t opcode) { out_.push_back(opcode); }
  void global(const std::string& module, const std::string& name);
  void str(const std::string& s);
  void integer(int64_t v);
  void boolean(bool v) { op(v ? 0x88 : 0x89); }
  void int_tuple(const Shape& v);
  std::vector<uint8_t> finish();

 private:
  std::vector<uint8_t> out_;
};

}  // namespace kiln::io::detail
