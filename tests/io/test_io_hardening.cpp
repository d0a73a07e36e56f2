// Checkpoint I/O hardening: every safetensors dtype round-trips as itself, checksums catch changed
// data, a save takes linear time in the number of tensors, killed saves' temporaries are removed,
// names that are not UTF-8 are refused by name.
#include <gtest/gtest.h>
#include <sys/file.h>

#include <chrono>
#include <fcntl.h>
#include <filesystem>
#include <sstream>

#include "../../apps/io_commands.h"
#include "io/file_util.h"
#include "io/pickle.h"
#include "io_test_util.h"

namespace kiln::io {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::temp_path;
using testing::tensor_bytes;
using testing::write_file;

constexpr FileDType kAllDTypes[] = {
    FileDType::BOOL, FileDType::F4, FileDType::F6_E2M3, FileDType::F6_E3M2, FileDType::U8, FileDType::I8,
    FileDType::F8_E5M2, FileDType::F8_E4M3, FileDType::F8_E8M0, FileDType::F8_E4M3FNUZ, FileDType::F8_E5M2FNUZ,
    FileDType::I16, FileDType::U16, FileDType::F16, FileDType::BF16, FileDType::I32, FileDType::U32,
    FileDType::F32, FileDType::C64, FileDType::F64, FileDType::I64, FileDType::U64};

// Every dtype of the format: a kiln tensor where kiln has the type, else raw bytes tagged with the
// dtype and logical shape; either way save -> load gives the same dtype, shape and bytes, in
// safetensors and (where torch has the dtype) in a torch zip.
TEST(IoHardening, EveryDTypeRoundTripsAsItself) {
  for (const FileDType dt : kAllDTypes) {
    const int bits = file_dtype_bits(dt);
    const Shape shape = bits % 8 == 0 ? Shape{2, 3} : Shape{8};  // F4 / F6: whole bytes
    TensorDict d;
    if (auto kd = to_kiln_dtype(dt)) {
      Tensor t = *kd == kBool ? randint(0, 2, shape, kInt64).to(kBool) : randint(0, 100, shape, kInt64).to(*kd);
      d.insert("t", t);
    } else {
      const int64_t n = shape_numel(shape) * bits / 8;
      d.insert_raw("t", randint(0, 256, {n}, kInt64).to(kUInt8), dt, shape);
    }
    const TensorEntry& in = d.entry("t");
    const std::vector<uint8_t> st = save_bytes(d);
    const Checkpoint back = load_bytes(st.data(), st.size());
    const TensorEntry& out = back.tensors.entry("t");
    EXPECT_EQ(out.dtype, dt) << file_dtype_name(dt);
    EXPECT_EQ(out.shape, shape) << file_dtype_name(dt);
    EXPECT_EQ(out.raw(), !to_kiln_dtype(dt).has_value()) << file_dtype_name(dt);
    EXPECT_EQ(tensor_bytes(out.tensor), tensor_bytes(in.tensor)) << file_dtype_name(dt);
    EXPECT_EQ(save_bytes(back.tensors), st) << file_dtype_name(dt) << ": a second save differs";
    if (detail::torch_dtype_name(dt) != nullptr) {
      const std::vector<uint8_t> pt = save_torch_bytes(d);
      const Checkpoint tb = load_bytes(pt.data(), pt.size());
      EXPECT_EQ(tb.tensors.entry("t").dtype, dt) << file_dtype_name(dt);
      EXPECT_EQ(tb.tensors.entry("t").shape, shape) << file_dtype_name(dt);
      EXPECT_EQ(tensor_bytes(tb.tensors.at("t")), tensor_bytes(in.tensor)) << file_dtype_name(dt);
    }
  }
}

TEST(IoHardening, ChecksumsCatchAWeightOverwrittenWith1e30) {
  const std::string path = temp_path("crc.safetensors");
  const Tensor w = randn({4, 8});
  save(path, TensorDict{{"w", w}, {"b", randn({8})}}, {{"step", "3"}}, /*checksums=*/true);
  Checkpoint ck = load(path);
  EXPECT_EQ(ck.metadata, (Metadata{{"step", "3"}}));  // the checksum key is the format's, not the user's
  // Overwrite one float of w with 1e30 in place.
  std::vector<uint8_t> bytes = read_file(path);
  const CheckpointInfo info = inspect(path);
  uint64_t at = 0;
  for (const auto& t : info.tensors)
    if (t.name == "w") at = t.span_offset + 4 * 5;
  const float big = 1e30f;
  std::memcpy(&bytes[at], &big, 4);
  write_file(path, bytes);
  expect_error([&] { load(path); }, "tensor 'w' fails its checksum");
  expect_error([&] { load_bytes(bytes.data(), bytes.size()); }, "tensor 'w' fails its checksum");
  LoadOptions no_check;
  no_check.verify_checksums = false;
  EXPECT_EQ(load(path, no_check).tensors.at("w").to_vector()[5], static_cast<double>(big));
  std::ostringstream out, err;
  EXPECT_EQ(apps::run_inspect(path, out, err), 1);
  EXPECT_NE(out.str().find("CHECKSUM MISMATCH"), std::string::npos) << out.str();
  EXPECT_NE(err.str().find("tensor 'w' fails its checksum"), std::string::npos) << err.str();
  // Without checksums the file is what the safetensors library writes (no extra metadata).
  const std::vector<uint8_t> plain = save_bytes(TensorDict{{"w", w}});
  EXPECT_EQ(std::string(plain.begin(), plain.end()).find(kChecksumKey), std::string::npos);
  expect_error([&] { save_bytes(TensorDict{{"w", w}}, {{kChecksumKey, "{}"}}); }, "is reserved");
  // Damaged checksum metadata is named.
  const std::string bad = R"({"__metadata__":{"kiln.crc32":"{\"w\":\"zz\"}"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::vector<uint8_t> f;
  detail::put_le(f, bad.size(), 8);
  f.insert(f.end(), bad.begin(), bad.end());
  f.resize(f.size() + 4, 0);
  expect_error([&] { load_bytes(f.data(), f.size()); }, "value for 'w' is not 8 lowercase hex digits");
}

TEST(IoHardening, TorchZipRecordChecksumsAreVerified) {
  const Tensor w = randn({16});
  std::vector<uint8_t> pt = save_torch_bytes(TensorDict{{"w", w}});
  EXPECT_EQ(tensor_bytes(load_bytes(pt.data(), pt.size()).tensors.at("w")), tensor_bytes(w));
  // Flip one byte of w's data (found by its value in the file).
  const std::vector<uint8_t> raw = tensor_bytes(w);
  auto it = std::search(pt.begin(), pt.end(), raw.begin(), raw.end());
  ASSERT_NE(it, pt.end());
  *(it + 7) ^= 0x40;
  expect_error([&] { load_bytes(pt.data(), pt.size()); }, "storage record 'data/0' fails its checksum");
}

TEST(IoHardening, SaveTakesLinearTime) {
  // 40k tensors took 8.3 s when the header was built through an ordered JSON object (quadratic).
  const int n = 40000;
  TensorDict d;
  Metadata meta;
  for (int i = 0; i < n; ++i) {
    d.insert("layer." + std::to_string(i) + ".weight", full({2}, static_cast<double>(i)));
    meta["key" + std::to_string(i)] = std::to_string(i);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint8_t> bytes = save_bytes(d, meta, /*checksums=*/true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 2.0) << "saving " << n << " tensors took " << s << " s";
  const Checkpoint back = load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(back.tensors.size(), static_cast<size_t>(n));
  EXPECT_EQ(back.metadata.size(), static_cast<size_t>(n));
  EXPECT_EQ(back.tensors.at("layer.123.weight").to_vector()[1], 123.0);
}

TEST(IoHardening, HeaderEscapesNamesAndRefusesInvalidUtf8ByName) {
  TensorDict d{{"quote\"back\\slash\nnew\x01line", ones({1})}, {"é", ones({1})}};
  const std::vector<uint8_t> bytes = save_bytes(d, {{"tab\tkey", "line\nvalue"}});
  const Checkpoint back = load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(back.tensors.names().size(), 2u);
  EXPECT_TRUE(back.tensors.contains("quote\"back\\slash\nnew\x01line"));
  EXPECT_EQ(back.metadata.at("tab\tkey"), "line\nvalue");
  // A lone surrogate encoded as UTF-8 bytes (what a careless conversion makes) and a stray byte.
  expect_error([] { save_bytes(TensorDict{{"w\xed\xb3\xbf", ones({1})}}); },
               "tensor name 'w\\xed\\xb3\\xbf' is not valid UTF-8");
  expect_error([] { save_bytes(TensorDict{{"w", ones({1})}}, {{"k", "\xff"}}); }, "is not valid UTF-8");
}

TEST(IoHardening, StaleTemporariesAreRemovedOnTheNextSave) {
  namespace fs = std::filesystem;
  const std::string dir = temp_path("stale");
  fs::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  // What a save killed mid-write leaves, and one a live writer still holds (locked).
  write_file(dir + "/.model.safetensors.tmp.Ab12Cd", std::vector<uint8_t>(1000, 7));
  write_file(dir + "/.model.safetensors.tmp.LiVe00", std::vector<uint8_t>(10, 7));
  write_file(dir + "/.other.safetensors.tmp.Ab12Cd", std::vector<uint8_t>(10, 7));
  const int live = open((dir + "/.model.safetensors.tmp.LiVe00").c_str(), O_RDONLY);
  ASSERT_GE(live, 0);
  ASSERT_EQ(flock(live, LOCK_EX), 0);
  save(path, TensorDict{{"w", ones({3})}});
  EXPECT_FALSE(fs::exists(dir + "/.model.safetensors.tmp.Ab12Cd"));
  EXPECT_TRUE(fs::exists(dir + "/.model.safetensors.tmp.LiVe00"));   // a live writer's file stays
  EXPECT_TRUE(fs::exists(dir + "/.other.safetensors.tmp.Ab12Cd"));  // another file's temporaries stay
  close(live);
  save_torch(path, TensorDict{{"w", ones({3})}});
  EXPECT_FALSE(fs::exists(dir + "/.model.safetensors.tmp.LiVe00"));
  int left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.path().filename().string().rfind(".model", 0) == 0;
  EXPECT_EQ(left, 0);
  write_file_atomic(dir + "/state.json", "{}", 2);
  EXPECT_EQ(read_small_file(dir + "/state.json", 16), "{}");
  expect_error([&] { read_small_file(path, 4); }, "more than the 4 expected");
}

}  // namespace
}  // namespace kiln::io
