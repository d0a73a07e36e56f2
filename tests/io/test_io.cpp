// Checkpoint I/O: round trips of every dtype (safetensors and torch zip), zero-size tensors,
// scalars, views sharing storage, metadata, mmap, subsets, atomic and killed saves, and the
// fixtures written by PyTorch / safetensors (tests/io/fixtures, scripts/make_io_fixtures.py).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "io_test_util.h"
#include "core/storage.h"
#include "io/file_util.h"
#include "support/testing.h"

namespace kiln::io {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::temp_path;
using testing::tensor_bytes;

Tensor random_of(DType d, const Shape& shape) {
  if (d == kBool) return randint(0, 2, shape, kInt64).to(kBool);
  if (d == kUInt8) return randint(0, 256, shape, kInt64).to(kUInt8);
  if (d == kInt8) return randint(-128, 128, shape, kInt64).to(kInt8);
  if (d == kUInt16) return randint(0, 65536, shape, kInt64).to(kUInt16);
  if (d == kUInt32) return randint(0, int64_t{1} << 32, shape, kInt64).to(kUInt32);
  if (d == kInt32 || d == kInt64) return randint(-100000, 100000, shape, kInt64).to(d);
  return randn(shape, d);
}

const DType kAllDTypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kInt8, kUInt8, kBool, kUInt16, kUInt32};

TensorDict every_dtype_dict() {
  TensorDict d;
  for (DType t : kAllDTypes) {
    d.insert(std::string("t_") + dtype_name(t), random_of(t, {3, 5}));
    d.insert(std::string("s_") + dtype_name(t), random_of(t, {}));
    d.insert(std::string("z_") + dtype_name(t), random_of(t, {0, 4}));
  }
  d.insert("transposed", randn({4, 6}).t());  // non-contiguous input: written contiguously
  return d;
}

void expect_same(const TensorDict& want, const TensorDict& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const TensorEntry& e : want) {
    ASSERT_TRUE(got.contains(e.name)) << e.name;
    const TensorEntry& g = got.entry(e.name);
    EXPECT_EQ(g.dtype, e.dtype) << e.name;
    EXPECT_EQ(g.shape, e.shape) << e.name;
    if (!e.raw()) {
      EXPECT_EQ(g.tensor.dtype(), e.tensor.dtype()) << e.name;
      EXPECT_EQ(g.tensor.sizes(), e.tensor.sizes()) << e.name;
    }
    EXPECT_EQ(tensor_bytes(g.tensor), tensor_bytes(e.tensor)) << e.name;
  }
}

TEST(IoSafetensors, RoundTripEveryDtypeScalarsZeroSizeAndMetadata) {
  manual_seed(1);
  const TensorDict d = every_dtype_dict();
  const Metadata meta{{"format", "pt"}, {"step", "100"}, {"unicode", "caf\xc3\xa9"}};
  const std::string path = temp_path("all.safetensors");
  save(path, d, meta);
  for (bool mm : {false, true}) {
    LoadOptions o;
    o.mmap = mm;
    Checkpoint ck = load(path, o);
    EXPECT_EQ(ck.format, Format::Safetensors);
    EXPECT_EQ(ck.metadata, meta);
    expect_same(d, ck.tensors);
  }
  // In memory too, and the bytes are the same as the file's.
  const std::vector<uint8_t> bytes = save_bytes(d, meta);
  EXPECT_EQ(bytes, read_file(path));
  expect_same(d, load_bytes(bytes.data(), bytes.size()).tensors);
}

TEST(IoSafetensors, RawDtypesKeepTheirTagAndBytes) {
  TensorDict d;
  d.insert_raw("f8", randint(0, 256, {6}, kInt64).to(kUInt8), FileDType::F8_E4M3, {2, 3});
  d.insert_raw("u64", randint(0, 256, {16}, kInt64).to(kUInt8), FileDType::U64, {2});
  d.insert_raw("c64", randint(0, 256, {16}, kInt64).to(kUInt8), FileDType::C64, {2});
  d.insert_raw("f4", randint(0, 256, {3}, kInt64).to(kUInt8), FileDType::F4, {6});
  d.insert_raw("f6", randint(0, 256, {3}, kInt64).to(kUInt8), FileDType::F6_E3M2, {4});
  d.insert_raw("e8m0", randint(0, 256, {2}, kInt64).to(kUInt8), FileDType::F8_E8M0, {2});
  const std::vector<uint8_t> bytes = save_bytes(d);
  const Checkpoint ck = load_bytes(bytes.data(), bytes.size());
  expect_same(d, ck.tensors);
  EXPECT_TRUE(ck.tensors.entry("f4").raw());
  EXPECT_EQ(ck.tensors.at("f4").dtype(), kUInt8);
}

TEST(IoSafetensors, WriterSortsBySizeThenNameAndPadsWithSpaces) {
  TensorDict d{{"b_small", ones({2}, kInt8)}, {"a_small", ones({2}, kInt8)}, {"z_big", ones({2}, kFloat64)},
               {"m", ones({2}, kFloat32)}};
  const std::vector<uint8_t> bytes = save_bytes(d, {{"k", "v"}});
  const uint64_t n = detail::le64(bytes.data());
  EXPECT_EQ(n % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  EXPECT_LT(header.find("z_big"), header.find("\"m\""));
  EXPECT_LT(header.find("\"m\""), header.find("a_small"));
  EXPECT_LT(header.find("a_small"), header.find("b_small"));
  EXPECT_EQ(header.find("__metadata__"), 2u);  // first key
  EXPECT_EQ(header.find_last_not_of(' ') + 1 + (n - header.size()), header.find_last_not_of(' ') + 1);
  const Checkpoint ck = load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(ck.tensors.names(), (std::vector<std::string>{"z_big", "m", "a_small", "b_small"}));
  expect_error([] { save_bytes(TensorDict{{"__metadata__", ones({1})}}); }, "__metadata__");
}

TEST(IoSafetensors, MmapTensorsOutliveTheCheckpointAndTheFile) {
  const std::string path = temp_path("mmap.safetensors");
  const Tensor w = randn({64, 33});
  save(path, TensorDict{{"w", w}, {"b", randn({7})}});
  LoadOptions o;
  o.mmap = true;
  Tensor keep;
  {
    Checkpoint ck = load(path, o);
    keep = ck.tensors.at("w");
  }
  EXPECT_EQ(keep.storage()->nbytes(), w.nbytes());
  EXPECT_EQ(tensor_bytes(keep), tensor_bytes(w));
  // Writes land in private copy-on-write pages: the file keeps its bytes.
  const std::vector<uint8_t> before = read_file(path);
  keep.fill_(3.0);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(keep.to_vector()[5], 3.0);
  std::filesystem::remove(path);
  EXPECT_EQ(keep.to_vector()[7], 3.0);
}

TEST(IoSafetensors, SubsetOfNamesAndMissingName) {
  const std::string path = temp_path("subset.safetensors");
  save(path, TensorDict{{"a", randn({2})}, {"b", randn({3})}, {"c", randn({4})}});
  LoadOptions o;
  o.names = {"c", "a"};
  const Checkpoint ck = load(path, o);
  EXPECT_EQ(ck.tensors.size(), 2u);
  EXPECT_TRUE(ck.tensors.contains("a") && ck.tensors.contains("c") && !ck.tensors.contains("b"));
  o.names = {"nope"};
  expect_error([&] { load(path, o); }, "tensor 'nope' not found");
}

TEST(IoFormat, DetectedFromBytesNotExtension) {
  const TensorDict d{{"x", randn({3})}};
  const std::string st_as_pt = temp_path("really_safetensors.pt");
  const std::string pt_as_st = temp_path("really_torch.safetensors");
  save(st_as_pt, d);
  save_torch(pt_as_st, d);
  EXPECT_EQ(detect_format(st_as_pt), Format::Safetensors);
  EXPECT_EQ(detect_format(pt_as_st), Format::TorchZip);
  expect_same(d, load(st_as_pt).tensors);
  expect_same(d, load(pt_as_st).tensors);
  const std::string text = "hello, this is not a checkpoint at all";
  expect_error([&] { load_bytes(text.data(), text.size()); }, "unrecognised checkpoint format");
}

TEST(IoTorch, RoundTripEveryDtypeViewsAndRequiresGrad) {
  manual_seed(2);
  TensorDict d = every_dtype_dict();
  const Tensor base = randn({4, 6});
  d.insert("v_base", base);
  d.insert("v_t", base.t());
  d.insert("v_row", base.select(0, 2));
  d.insert("v_cols", base.slice(1, 1, 4));
  d.insert("v_step", base.slice(0, 0, 4, 2).slice(1, 0, 6, 3));
  d.insert("param", randn({3}).requires_grad_(true));
  d.insert_raw("u64", randint(0, 256, {8}, kInt64).to(kUInt8), FileDType::U64, {1});
  d.insert_raw("f8", randint(0, 256, {4}, kInt64).to(kUInt8), FileDType::F8_E5M2, {2, 2});
  d.insert_raw("i16", randint(0, 256, {4}, kInt64).to(kUInt8), FileDType::I16, {2});
  const std::string path = temp_path("all.pt");
  save_torch(path, d);
  for (bool mm : {false, true}) {
    LoadOptions o;
    o.mmap = mm;
    const Checkpoint ck = load(path, o);
    EXPECT_EQ(ck.format, Format::TorchZip);
    expect_same(d, ck.tensors);
    const auto& st = ck.tensors.at("v_base").storage();
    for (const char* v : {"v_t", "v_row", "v_cols", "v_step"}) EXPECT_EQ(ck.tensors.at(v).storage(), st) << v;
    EXPECT_EQ(ck.tensors.at("v_t").strides(), (Shape{1, 6}));
    EXPECT_TRUE(ck.tensors.at("param").requires_grad());
  }
  // Data records are 64-byte aligned, so mmap'd tensors alias the file.
  EXPECT_EQ(save_torch_bytes(d), read_file(path));
}

TEST(IoTorch, RejectsSubByteDtypes) {
  TensorDict d;
  d.insert_raw("f4", zeros({2}, kUInt8), FileDType::F4, {4});
  expect_error([&] { save_torch_bytes(d); }, "no PyTorch equivalent");
}

TEST(IoAtomic, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const std::string dir = temp_path("atomic");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/ck.safetensors";
  const TensorDict old{{"w", randn({5})}};
  save(path, old);
  expect_error([&] { save(path, TensorDict{{"__metadata__", randn({2})}}); }, "__metadata__");
  expect_same(old, load(path).tensors);
  const auto perms = std::filesystem::status(path).permissions();
  EXPECT_NE(perms & std::filesystem::perms::others_read, std::filesystem::perms::none);  // not mkstemp's 0600
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(IoAtomic, ChildKilledDuringSaveLeavesTheOldFileLoadable) {
  const std::string dir = temp_path("kill");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/ck.safetensors";
  const TensorDict old{{"w", randn({1000})}};
  save(path, old);
  const Tensor big = full({int64_t{16} << 20}, 1.5);  // 64 MiB: long enough a save to be killed in
  int torn = 0;  // kills that landed mid-save (they leave a temporary file behind)
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (;;) save(path, TensorDict{{"w", big}});
      } catch (...) {
      }
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + 15 * attempt));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const Checkpoint ck = load(path);  // the old file, or a complete new one: never a torn one
    ASSERT_EQ(ck.tensors.size(), 1u);
    const Tensor w = ck.tensors.at("w");
    EXPECT_TRUE(w.numel() == 1000 || w.numel() == big.numel());
    if (w.numel() == 1000) {
      EXPECT_EQ(tensor_bytes(w), tensor_bytes(old.at("w")));
    }
    for (const auto& e : std::filesystem::directory_iterator(dir)) {  // the killed child's temporary
      if (e.path().filename().string().find(".tmp.") != std::string::npos) {
        std::filesystem::remove(e.path());
        ++torn;
      }
    }
  }
  EXPECT_GT(torn, 0) << "no kill landed in the middle of a save";
}

TEST(IoDevice, LoadStraightToCuda) {
  KILN_REQUIRE_CUDA();
  const TensorDict d{{"w", randn({4, 4})}, {"i", randint(0, 9, {3})}};
  for (bool torch_format : {false, true}) {
    const std::string path = temp_path(torch_format ? "dev.pt" : "dev.safetensors");
    torch_format ? save_torch(path, d) : save(path, d);
    LoadOptions o;
    o.device = Device("cuda:0");
    const Checkpoint ck = load(path, o);
    for (const TensorEntry& e : ck.tensors) EXPECT_TRUE(e.tensor.is_cuda()) << e.name;
    expect_same(d, ck.tensors);
  }
}

TEST(IoCrc, KnownValue) { EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u); }

// ---- fixtures written by PyTorch and safetensors ----

// tests/io/fixtures, named by tests/CMakeLists.txt.
std::string fixture_dir() { return KILN_IO_FIXTURES_DIR; }

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

void check_fixture(const std::string& name, bool mm) {
  const std::string dir = fixture_dir();
  std::ifstream f(dir + "/" + name + ".expect.json");
  ASSERT_TRUE(f.good()) << "missing fixture " << dir << "/" << name << ".expect.json";
  const nlohmann::json want = nlohmann::json::parse(f);
  LoadOptions o;
  o.mmap = mm;
  const Checkpoint ck = load(dir + "/" + name, o);
  ASSERT_EQ(ck.tensors.size(), want["tensors"].size()) << name;
  for (const auto& [k, w] : want["tensors"].items()) {
    ASSERT_TRUE(ck.tensors.contains(k)) << name << ": " << k;
    const TensorEntry& e = ck.tensors.entry(k);
    EXPECT_STREQ(file_dtype_name(e.dtype), w["dtype"].get<std::string>().c_str()) << k;
    EXPECT_EQ(e.shape, w["shape"].get<Shape>()) << k;
    EXPECT_EQ(tensor_bytes(e.tensor), from_hex(w["hex"].get<std::string>())) << name << ": " << k;
  }
  for (const auto& group : want["shares"]) {
    const auto& st = ck.tensors.at(group[0].get<std::string>()).storage();
    for (const auto& n : group) EXPECT_EQ(ck.tensors.at(n.get<std::string>()).storage(), st) << n;
  }
  for (const auto& [k, v] : want["metadata"].items()) {
    ASSERT_TRUE(ck.metadata.count(k)) << k;
    EXPECT_EQ(ck.metadata.at(k), v.get<std::string>());
  }
}

TEST(IoFixtures, SafetensorsWrittenBySafetensorsLoadWithIdenticalBytes) {
  for (bool mm : {false, true}) {
    check_fixture("st_all_dtypes.safetensors", mm);
    check_fixture("st_subbyte.safetensors", mm);
  }
}

TEST(IoFixtures, TorchSaveFilesLoadWithIdenticalBytesAndSharedStorage) {
  for (bool mm : {false, true}) {
    check_fixture("pt_state_dict.pt", mm);
    check_fixture("pt_nested.pt", mm);
    check_fixture("pt_big_endian.pt", mm);
    check_fixture("pt_module.pt", mm);
    check_fixture("pt_protocol4.pt", mm);
  }
}

TEST(IoFixtures, ConvertedFixturesRoundTrip) {
  // torch -> safetensors -> torch keeps every tensor's bytes, dtype tag and shape.
  const Checkpoint pt = load(fixture_dir() + "/pt_state_dict.pt");
  const std::vector<uint8_t> st = save_bytes(pt.tensors);
  const Checkpoint back = load_bytes(st.data(), st.size());
  expect_same(pt.tensors, back.tensors);
  const std::vector<uint8_t> z = save_torch_bytes(back.tensors);
  expect_same(pt.tensors, load_bytes(z.data(), z.size()).tensors);
}

// Writes kiln's files into the folder given after the gtest flags, for
// `scripts/make_io_fixtures.py --check` (which loads them in PyTorch).
TEST(IoExport, ExportForTorch) {
  const std::vector<std::string>& args = kiln::testing::program_args();
  if (args.size() != 1) GTEST_SKIP() << "needs an output folder (run by scripts/make_io_fixtures.py --check)";
  const Checkpoint pt = load(fixture_dir() + "/pt_state_dict.pt");
  save_torch(args[0] + "/kiln_state.pt", pt.tensors);
  save(args[0] + "/kiln_state.safetensors", pt.tensors, {{"written_by", "kiln"}});
}

}  // namespace
}  // namespace kiln::io

namespace kiln::io {
namespace {
// kiln's writer and the safetensors library lay a file out the same way: same order, offsets,
// JSON spelling and padding, so the bytes are identical.
TEST(IoFixtures, WriterMatchesTheSafetensorsLibraryByteForByte) {
  const std::string path = fixture_dir() + "/st_all_dtypes.safetensors";
  const Checkpoint ck = load(path);
  EXPECT_EQ(save_bytes(ck.tensors, ck.metadata), read_file(path));
}
}  // namespace
}  // namespace kiln::io

namespace kiln::io {
namespace {
// Reads of 64 MiB and more are split across threads: the bytes must still be exact.
TEST(IoSafetensors, LargeTensorThroughTheParallelReadPath) {
  const std::string path = temp_path("large.safetensors");
  const Tensor big = randint(0, 1 << 30, {int64_t{21} << 20}, kInt32);  // 84 MiB
  save(path, TensorDict{{"small", randn({3})}, {"big", big}});
  const Checkpoint ck = load(path);
  EXPECT_EQ(tensor_bytes(ck.tensors.at("big")), tensor_bytes(big));
  std::filesystem::remove(path);
}
}  // namespace
}  // namespace kiln::io
