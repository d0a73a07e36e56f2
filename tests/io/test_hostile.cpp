// Hostile checkpoints: each case ends in a clear kiln::Error within 2 s and 512 MiB (run in a child
// process, so a crash or a hang would fail the test instead of ending it), from the library and
// from the `kiln inspect` / `kiln convert` bodies. Cases: (1) a pickle nesting
// _rebuild_from_type_v2 20,000 deep; (2) lists shared through the memo, unfolding to 2^40 leaves;
// (3) a zero-stride view [2^31, 2^31] of one float and shapes whose byte size overflows; (4) a
// 487-byte file claiming a 4 GiB view; (9) a FIFO and a character device in place of a file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <sstream>

#include "../../apps/io_commands.h"
#include "core/storage.h"
#include "hostile_files.h"
#include "io_test_util.h"

namespace kiln::io {
namespace {

using hostile::expect_bounded_error;
using testing::temp_path;
using testing::write_file;

std::string saved(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = temp_path(name);
  write_file(path, bytes);
  return path;
}

// `kiln inspect` / `kiln convert` bodies as child-process functions: an exit code other than 0
// becomes a kiln::Error carrying their stderr.
std::function<void()> inspect_cmd(const std::string& path) {
  return [path] {
    std::ostringstream out, err;
    if (apps::run_inspect(path, out, err) != 0) throw Error(err.str());
  };
}
std::function<void()> convert_cmd(const std::string& in, const std::string& out_path) {
  return [in, out_path] {
    std::ostringstream out, err;
    if (apps::run_convert(in, out_path, out, err) != 0) throw Error(err.str());
  };
}

TEST(IoHostile, DeepRebuildFromTypeNestingIsRefused) {
  const std::vector<uint8_t> f = hostile::nested_rebuild(20000);
  EXPECT_LT(f.size(), 200u * 1024);
  const std::string path = saved("deep.pt", f);
  const std::string rule = "_rebuild_from_type_v2 nests more than 8 levels";
  expect_bounded_error([&] { load_bytes(f.data(), f.size()); }, rule);
  expect_bounded_error([&] { inspect_bytes(f.data(), f.size()); }, rule);
  expect_bounded_error(inspect_cmd(path), rule);
  expect_bounded_error(convert_cmd(path, temp_path("deep_out.safetensors")), rule);
  // torch wraps a tensor once (a Parameter's subclass state): that still loads.
  const std::vector<uint8_t> once = hostile::nested_rebuild(1);
  EXPECT_EQ(load_bytes(once.data(), once.size()).tensors.at("w").sizes(), Shape{1});
}

TEST(IoHostile, ListsSharedThroughTheMemoCannotUnfoldExponentially) {
  const std::vector<uint8_t> f = hostile::memo_dag(40);
  EXPECT_LT(f.size(), 2048u);
  const std::string path = saved("dag.pt", f);
  const std::string rule = "containers are shared through the memo";
  expect_bounded_error([&] { load_bytes(f.data(), f.size()); }, rule);
  expect_bounded_error(inspect_cmd(path), rule);
  expect_bounded_error(convert_cmd(path, temp_path("dag_out.pt")), rule);
  // A little sharing (tied weights, a tuple used twice) is flattened once per path, as before.
  const std::vector<uint8_t> small = hostile::memo_dag(4);
  const Checkpoint ck = load_bytes(small.data(), small.size());
  EXPECT_EQ(ck.metadata.size(), 16u);
  EXPECT_EQ(ck.metadata.at("x.0.1.0.1.0"), "1");
}

TEST(IoHostile, ZeroStrideViewWhoseBytesOverflowIsRefused) {
  const std::vector<uint8_t> f = hostile::zero_stride_view({int64_t{1} << 31, int64_t{1} << 31});
  const std::string path = saved("overflow.pt", f);
  const std::string rule = "overflows the 2^63 - 1 bytes a tensor may span";
  expect_bounded_error([&] { load_bytes(f.data(), f.size()); }, rule);
  expect_bounded_error([&] { load(path); }, rule);
  expect_bounded_error(inspect_cmd(path), rule);
  expect_bounded_error(convert_cmd(path, temp_path("overflow_out.safetensors")), rule);
  expect_bounded_error(convert_cmd(path, temp_path("overflow_out.pt")), rule);
  // The same shape declared by a safetensors header, and a numel past 2^63 ([2^62, 4]).
  const std::vector<uint8_t> st =
      hostile::safetensors(R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,4]}})", 4);
  expect_bounded_error([&] { load_bytes(st.data(), st.size()); }, "tensor 'w': shape [2147483648, 2147483648] of F32");
  const std::vector<uint8_t> st2 =
      hostile::safetensors(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4);
  expect_bounded_error([&] { load_bytes(st2.data(), st2.size()); }, "has about 2^64 elements: overflows");
}

TEST(IoHostile, StorageOfTwoToThe62ElementsNamesTheOverflow) {
  // A storage declaring 2^62 floats: numel x element size wraps to 0 in 64 bits; the message must
  // say so, not "numel x element size = 0".
  const std::vector<uint8_t> f = hostile::torch_zip(hostile::view_pickle(int64_t{1} << 62, {1}, {1}), 4);
  expect_bounded_error([&] { load_bytes(f.data(), f.size()); },
                       "storage 'data/0': shape [4611686018427387904] of F32 is 4611686018427387904 elements x 4 "
                       "bytes = 18446744073709551616 bytes: overflows");
}

TEST(IoHostile, TinyFileClaimingAFourGigabyteViewIsInspectedLazilyAndConvertedWithinALimit) {
  const std::vector<uint8_t> f = hostile::zero_stride_view({int64_t{1} << 30});
  EXPECT_LT(f.size(), 1024u);
  const std::string path = saved("view4g.pt", f);
  // inspect: nothing materialised; the CRC covers the 4 stored bytes the view spans.
  const hostile::Outcome o = hostile::run_isolated([&] {
    std::ostringstream out, err;
    if (apps::run_inspect(path, out, err) != 0) throw Error("inspect failed: " + err.str());
    const std::string s = out.str();
    if (s.find("4294967296") == std::string::npos || s.find("crc of the 4 stored bytes it spans") == std::string::npos)
      throw Error("unexpected output: " + s);
  });
  EXPECT_TRUE(o.exited && !o.threw_error) << o.message;
  EXPECT_LT(o.seconds, 2.0);
  EXPECT_LT(o.max_rss_kb - hostile::self_rss_kb(), 256L * 1024);
  const CheckpointInfo info = inspect(path);
  ASSERT_EQ(info.tensors.size(), 1u);
  EXPECT_EQ(info.tensors[0].nbytes, uint64_t{4} << 30);
  EXPECT_EQ(info.tensors[0].span_bytes, 4u);
  EXPECT_FALSE(info.tensors[0].dense);
  // load: a view over the 4-byte storage, not 4 GiB.
  const Checkpoint ck = load(path);
  EXPECT_EQ(ck.tensors.at("w").storage()->nbytes(), 4u);
  // convert to safetensors must write every element: refused by the stated limit; to .pt it stays a view.
  expect_bounded_error(convert_cmd(path, temp_path("view4g.safetensors")), "more than the limit of 4x the input + 64 MiB");
  std::ostringstream out, err;
  EXPECT_EQ(apps::run_convert(path, temp_path("view4g_copy.pt"), out, err), 0) << err.str();
  EXPECT_EQ(load(temp_path("view4g_copy.pt")).tensors.at("w").storage()->nbytes(), 4u);
}

TEST(IoHostile, FifoAndDevicesAreRefusedWithoutBlocking) {
  const std::string fifo = temp_path("ckpt.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string rule = "it is a FIFO (named pipe); only regular files are read";
  expect_bounded_error([&] { load(fifo); }, rule);
  expect_bounded_error([&] { detect_format(fifo); }, rule);
  expect_bounded_error([&] { inspect(fifo); }, rule);
  expect_bounded_error([&] { read_small_file(fifo, 100); }, rule);
  expect_bounded_error(inspect_cmd(fifo), rule);
  expect_bounded_error(convert_cmd(fifo, temp_path("fifo_out.pt")), rule);
  LoadOptions o;
  o.mmap = true;
  expect_bounded_error([&] { load(fifo, o); }, rule);
  expect_bounded_error([&] { load("/dev/zero"); }, "it is a character device");
  expect_bounded_error([&] { load(temp_path("")); }, "it is a folder");
}

// Shapes and strides that reach past 2^63 elements in a view, and a size that does not fit the
// storage record, are refused by the same checked arithmetic.
TEST(IoHostile, ViewGeometryOverflowIsRefused) {
  const int64_t big = int64_t{1} << 62;
  const std::vector<uint8_t> f = hostile::torch_zip(hostile::view_pickle(1, {3, 3}, {big, big}), 4);
  expect_bounded_error([&] { load_bytes(f.data(), f.size()); }, "size overflows");
  expect_bounded_error([&] { inspect_bytes(f.data(), f.size()); }, "size overflows");
}

}  // namespace
}  // namespace kiln::io
