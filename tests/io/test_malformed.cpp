// Malformed checkpoints: every rule of the formats broken on purpose, each giving a kiln::Error
// that names the rule. Nothing here may crash, hang or allocate the claimed sizes.
#include <gtest/gtest.h>

#include <cstring>

#include "io/file_util.h"
#include "io/pickle.h"
#include "hostile_files.h"
#include "io_test_util.h"

namespace kiln::io {
namespace {

using testing::expect_error;

// A safetensors file: 8-byte length, the header text as given, then `data` bytes.
std::vector<uint8_t> st_file(const std::string& header, size_t data = 0, int64_t len = -1) {
  std::vector<uint8_t> out;
  detail::put_le(out, len < 0 ? header.size() : static_cast<uint64_t>(len), 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data, 0x11);
  return out;
}

void expect_st_error(const std::string& header, size_t data, const std::string& rule, int64_t len = -1) {
  const std::vector<uint8_t> f = st_file(header, data, len);
  expect_error([&] { load_bytes(f.data(), f.size()); }, rule);
}

const std::string kT = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST(IoMalformedSafetensors, Baseline) {
  const std::vector<uint8_t> f = st_file("{" + kT + "}", 8);
  EXPECT_EQ(load_bytes(f.data(), f.size()).tensors.size(), 1u);
  const std::vector<uint8_t> ws = st_file("  \n{" + kT + "}  \t", 8);  // whitespace around is allowed
  EXPECT_EQ(load_bytes(ws.data(), ws.size()).tensors.size(), 1u);
  const std::vector<uint8_t> nullmeta = st_file(R"({"__metadata__":null,)" + kT + "}", 8);
  EXPECT_EQ(load_bytes(nullmeta.data(), nullmeta.size()).tensors.size(), 1u);
}

TEST(IoMalformedSafetensors, HeaderLengthAndFraming) {
  expect_st_error("{" + kT + "}", 8, "exceeds the 100 MB limit", 100'000'001);
  expect_st_error("{" + kT + "}", 8, "runs past the end of the file", 4096);
  expect_st_error("\xEF\xBB\xBF{" + kT + "}", 8, "byte-order mark");
  expect_st_error("{" + kT + "}" + std::string(4, '\0'), 8, "NUL byte");
  expect_st_error("{\"t\xff\":{}}", 0, "not valid UTF-8");
  expect_st_error("{\"t\xc0\x80\":{}}", 0, "not valid UTF-8");  // overlong
  expect_st_error("{" + kT + "} x", 8, "trailing data");
  expect_st_error("{" + kT + "}{}", 8, "trailing data");
  expect_st_error("[1, 2]", 0, "must be a JSON object");
  expect_st_error("\"text\"", 0, "must be a JSON object");
  expect_st_error("{" + kT, 8, "not valid JSON");
  expect_st_error("{'t': 1}", 0, "not valid JSON");
  const std::string tiny = "1234567";
  expect_error([&] { load_bytes(tiny.data(), tiny.size()); }, "unrecognised checkpoint format");
}

TEST(IoMalformedSafetensors, DuplicateKeysAtEveryLevel) {
  expect_st_error("{" + kT + "," + kT + "}", 8, "duplicate key: tensor name 't'");
  expect_st_error(R"({"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
                  "duplicate key: field 'dtype'");
  expect_st_error(R"({"__metadata__":{},"__metadata__":{},)" + kT + "}", 8, "duplicate key '__metadata__'");
  expect_st_error(R"({"__metadata__":{"a":"1","a":"2"},)" + kT + "}", 8, "duplicate key 'a' in __metadata__");
}

TEST(IoMalformedSafetensors, MetadataRules) {
  expect_st_error(R"({"__metadata__":{"a":1},)" + kT + "}", 8, "__metadata__ value 'a' must be a string");
  expect_st_error(R"({"__metadata__":{"a":null},)" + kT + "}", 8, "must be a string");
  expect_st_error(R"({"__metadata__":["a"],)" + kT + "}", 8, "__metadata__ must be an object");
  expect_st_error(R"({"__metadata__":"x",)" + kT + "}", 8, "__metadata__ must be an object");
  expect_st_error(R"({"__metadata__":{"a":{"b":"c"}},)" + kT + "}", 8, "must be a string");
}

TEST(IoMalformedSafetensors, TensorEntryRules) {
  expect_st_error(R"({"t":[1]})", 0, "tensor 't' must be an object");
  expect_st_error(R"({"t":3})", 0, "tensor 't' must be an object");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2]}})", 8, "missing field 'data_offsets'");
  expect_st_error(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, "missing field 'dtype'");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, "unknown field 'x'");
  expect_st_error(R"({"t":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'F7'");
  expect_st_error(R"({"t":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'f32'");
  expect_st_error(R"({"t":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype must be a string");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "must hold integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[1e3],"data_offsets":[0,8]}})", 8, "must hold integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8, "must be an array");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, "non-negative integers");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})", 8,
                  "must hold integers");
}

TEST(IoMalformedSafetensors, ShapeAndSizeRules) {
  expect_st_error(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "overflows");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8, "overflows");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", 16, "exactly [begin, end]");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "exactly [begin, end]");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "begin > end");
  expect_st_error(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "differs from numel x element size");
  expect_st_error(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2, "whole number of bytes");
  expect_st_error(R"({"t":{"dtype":"F6_E2M3","shape":[3],"data_offsets":[0,3]}})", 3, "whole number of bytes");
}

TEST(IoMalformedSafetensors, OffsetRules) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_st_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "gap");
  expect_st_error("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20, "gap");
  expect_st_error("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap");
  expect_st_error("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "alias");
  expect_st_error("{" + a + "}", 12, "end exactly at the end of the file");
  expect_st_error("{" + a + "}", 4, "end exactly at the end of the file");
  // Zero-size tensors may sit anywhere in the tiling, several at one offset.
  const std::vector<uint8_t> ok = st_file("{" + a + R"(,"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)" +
                                          R"("f":{"dtype":"I64","shape":[0,3],"data_offsets":[8,8]}})", 8);
  EXPECT_EQ(load_bytes(ok.data(), ok.size()).tensors.size(), 3u);
}

TEST(IoMalformedSafetensors, WriterRefusesMetadataName) {
  expect_error([] { save_bytes(TensorDict{{"__metadata__", ones({1})}}); }, "'__metadata__'");
}

// ---- torch zip ----

using hostile::bytes_of;

// A zip holding data.pkl = `pickle` plus a 16-byte storage record data/0.
std::vector<uint8_t> torch_file(const std::vector<uint8_t>& pickle, size_t record = 16,
                                const std::string& byteorder = "little") {
  return hostile::torch_zip(pickle, record, byteorder);
}

// {"w": _rebuild_tensor_v2(FloatStorage '0' numel, offset, size, stride)} as protocol 2.
std::vector<uint8_t> tensor_pickle(int64_t numel, int64_t offset, const Shape& size, const Shape& stride,
                                   const char* storage = "FloatStorage") {
  detail::Pickler p;
  p.op('}');
  p.op('(');
  p.str("w");
  p.global("torch._utils", "_rebuild_tensor_v2");
  hostile::rebuild_args(p, numel, size, stride, storage, offset);
  p.op('R');
  p.op('u');
  return p.finish();
}

void expect_pt_error(const std::vector<uint8_t>& file, const std::string& rule) {
  expect_error([&] { load_bytes(file.data(), file.size()); }, rule);
}

TEST(IoMalformedTorch, Baseline) {
  const std::vector<uint8_t> f = torch_file(tensor_pickle(4, 0, {2, 2}, {2, 1}));
  const Checkpoint ck = load_bytes(f.data(), f.size());
  EXPECT_EQ(ck.tensors.at("w").sizes(), (Shape{2, 2}));
}

TEST(IoMalformedTorch, GlobalsOutsideTheAllowListAreRejectedByName) {
  for (const auto& [module, name] : std::vector<std::pair<std::string, std::string>>{
           {"os", "system"}, {"builtins", "eval"}, {"subprocess", "Popen"}, {"torch", "load"},
           {"torch._utils", "_rebuild_qtensor"}, {"numpy.core.multiarray", "_reconstruct"}}) {
    detail::Pickler p;
    p.global(module, name);
    p.str("echo pwned");
    p.op(0x85);
    p.op('R');
    expect_pt_error(torch_file(p.finish()), "pickle global '" + module + "." + name + "' is not allowed");
  }
  // STACK_GLOBAL (protocol 4) goes through the same allow-list.
  std::vector<uint8_t> pk = {0x80, 4, 0x8c, 2, 'o', 's', 0x8c, 6, 's', 'y', 's', 't', 'e', 'm', 0x93, '.'};
  expect_pt_error(torch_file(pk), "pickle global 'os.system' is not allowed");
  // An allowed global that is not a function kiln interprets cannot be called.
  detail::Pickler q;
  q.global("torch", "FloatStorage");
  q.op(')');
  q.op('R');
  expect_pt_error(torch_file(q.finish()), "cannot be called");
}

TEST(IoMalformedTorch, OpcodesOutsideTheAllowListAreRejectedByName) {
  expect_pt_error(torch_file({0x80, 2, '(', 'i', 'o', 's', '\n', 's', 'y', 's', '\n', '.'}), "opcode INST");
  expect_pt_error(torch_file({0x80, 2, '(', 'o', '.'}), "opcode OBJ");
  expect_pt_error(torch_file({0x80, 2, 'P', '1', '\n', '.'}), "opcode PERSID");
  expect_pt_error(torch_file({0x80, 2, 0x82, 1, '.'}), "opcode EXT1");
  expect_pt_error(torch_file({0x80, 2, 0xff, '.'}), "opcode unknown (0xff)");
}

TEST(IoMalformedTorch, PickleStructure) {
  expect_pt_error(torch_file({0x80, 2, 'X', 100, 0, 0, 0, 'a'}), "pickle truncated");
  expect_pt_error(torch_file({0x80, 2}), "pickle truncated");
  expect_pt_error(torch_file({0x80, 2, 'a', '.'}), "stack underflow");
  expect_pt_error(torch_file({0x80, 2, 'h', 7, '.'}), "memo key 7");
  expect_pt_error(torch_file({0x80, 2, 't', '.'}), "no MARK");
  // A list that contains itself: ] q0 h0 a .
  expect_pt_error(torch_file({0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'}), "contains itself");
  // 100 nested lists.
  std::vector<uint8_t> deep = {0x80, 2};
  for (int i = 0; i < 100; ++i) deep.push_back(']');
  for (int i = 0; i < 99; ++i) deep.push_back('a');
  deep.push_back('.');
  expect_pt_error(torch_file(deep), "deeper than 64");
}

TEST(IoMalformedTorch, StorageAndGeometryRules) {
  expect_pt_error(torch_file(tensor_pickle(5, 0, {5}, {1})), "differs from numel x element size");
  expect_pt_error(torch_file(tensor_pickle(4, 1, {2, 2}, {2, 1})), "reaches past the end of its storage");
  expect_pt_error(torch_file(tensor_pickle(4, 0, {2, 3}, {3, 1})), "reaches past the end of its storage");
  expect_pt_error(torch_file(tensor_pickle(4, -1, {2}, {1})), "negative storage offset");
  expect_pt_error(torch_file(tensor_pickle(4, 0, {2}, {-1})), "negative size or stride");
  expect_pt_error(torch_file(tensor_pickle(4, 0, {2, 2}, {1})), "differ in length");
  expect_pt_error(torch_file(tensor_pickle(2, 0, {2}, {1}, "ComplexDoubleStorage")), "complex128");
  expect_pt_error(torch_file(tensor_pickle(4, 0, {4}, {1}), 16, "middle"), "byteorder");
}

TEST(IoMalformedTorch, ZipRules) {
  const std::vector<uint8_t> pk = tensor_pickle(4, 0, {4}, {1});
  expect_pt_error(detail::make_stored_zip({{"archive/byteorder", bytes_of("little")}}), "no data.pkl");
  expect_pt_error(detail::make_stored_zip({{"archive/data.pkl", pk}}), "storage record 'data/0' is missing");
  expect_pt_error(detail::make_stored_zip({{"archive/data.pkl", pk}, {"other/data/0", std::vector<uint8_t>(16)}}),
                  "more than one folder");
  expect_pt_error(detail::make_stored_zip({{"data.pkl", pk}}), "not inside an archive folder");
  expect_pt_error(detail::make_stored_zip({{"archive/data.pkl", pk}, {"archive/data.pkl", pk}}), "duplicate record");
  // A compressed record: flip the method field of data/0 in the central directory.
  std::vector<uint8_t> f = torch_file(pk);
  for (size_t i = 0; i + 46 < f.size(); ++i) {
    if (detail::le32(&f[i]) == 0x02014b50u && std::memcmp(&f[i + 46], "archive/data/0", 14) == 0) f[i + 10] = 8;
  }
  expect_pt_error(f, "is compressed (method 8)");
  // Truncation anywhere is an error, never a crash.
  const std::vector<uint8_t> good = torch_file(pk);
  for (size_t cut = 4; cut < good.size(); cut += 7) {
    const std::vector<uint8_t> t(good.begin(), good.begin() + static_cast<int64_t>(cut));
    EXPECT_THROW(load_bytes(t.data(), t.size()), kiln::Error) << cut;
  }
  std::vector<uint8_t> no_eocd = good;
  no_eocd.resize(no_eocd.size() - 22);
  expect_pt_error(no_eocd, "end-of-central-directory");
}

}  // namespace
}  // namespace kiln::io
