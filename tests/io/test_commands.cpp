// `kiln inspect` / `kiln convert` bodies. apps/io_commands.cpp is compiled into this test binary
// directly (the kiln executable links it through apps/main.cpp).
#include <gtest/gtest.h>

#include <sstream>

#include "../../apps/io_commands.cpp"
#include "io_test_util.h"

namespace kiln::io {
namespace {

TEST(IoCommands, InspectPrintsFormatMetadataAndChecksums) {
  const std::string path = testing::temp_path("inspect.safetensors");
  const Tensor w = arange(6.0).reshape({2, 3});
  save(path, TensorDict{{"w", w}}, {{"step", "7"}});
  std::ostringstream out, err;
  EXPECT_EQ(apps::run_inspect(path, out, err), 0) << err.str();
  const std::string s = out.str();
  EXPECT_NE(s.find("format:   safetensors"), std::string::npos) << s;
  EXPECT_NE(s.find("step = 7"), std::string::npos) << s;
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32(w.data_ptr(), w.nbytes()));
  EXPECT_NE(s.find(crc), std::string::npos) << s;
  EXPECT_NE(s.find("[2, 3]"), std::string::npos) << s;
  std::ostringstream o2, e2;
  EXPECT_EQ(apps::run_inspect(testing::temp_path("missing.pt"), o2, e2), 1);
  EXPECT_NE(e2.str().find("cannot open"), std::string::npos);
}

TEST(IoCommands, ConvertBothWays) {
  const std::string st = testing::temp_path("conv.safetensors"), pt = testing::temp_path("conv.pt"),
                    st2 = testing::temp_path("conv2.safetensors");
  const TensorDict d{{"a", randn({3, 4})}, {"b", randint(0, 5, {2})}};
  save(st, d);
  std::ostringstream out, err;
  ASSERT_EQ(apps::run_convert(st, pt, out, err), 0) << err.str();
  ASSERT_EQ(apps::run_convert(pt, st2, out, err), 0) << err.str();
  EXPECT_EQ(detect_format(pt), Format::TorchZip);
  const Checkpoint back = load(st2);
  for (const auto& e : d) EXPECT_EQ(testing::tensor_bytes(back.tensors.at(e.name)), testing::tensor_bytes(e.tensor));
  EXPECT_EQ(apps::run_convert(st, testing::temp_path("x.txt"), out, err), 2);
}

}  // namespace
}  // namespace kiln::io
