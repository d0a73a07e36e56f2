// The kernel sources compiled into the library (cmake/KilnEmbed.cmake): each listed file is there
// whole, under its path below src/, NUL-terminated for NVRTC; an unknown name is a kiln::Error.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/embedded.h"
#include "kiln/error.h"

namespace kiln::detail {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

TEST(Embedded, FilesAreWholeAndNamedByTheirPath) {
  std::set<std::string> names;
  for (const EmbeddedFile* f : embedded_files()) {
    SCOPED_TRACE(f->name);
    EXPECT_TRUE(names.insert(f->name).second) << "embedded twice";
    EXPECT_TRUE(starts_with(f->text, "#pragma once\n"));
    EXPECT_TRUE(ends_with(f->text, "\n"));
    EXPECT_EQ(f->text.data()[f->text.size()], '\0');
    EXPECT_EQ(embedded_source(f->name).data(), f->text.data());
  }
  for (const char* name : {"core/cuda/hopper.cuh", "flex/cuda/flex_params.cuh", "flex/cuda/wgmma.cuh"})
    EXPECT_EQ(names.count(name), 1u) << name;
  // First and last lines of a file: the bytes arrive in order and none is lost at either end.
  const std::string_view hopper = embedded_source("core/cuda/hopper.cuh");
  EXPECT_TRUE(starts_with(hopper, "#pragma once\n// Hopper (sm_90a) building blocks as inline PTX"));
  EXPECT_TRUE(ends_with(hopper, "}  // namespace kiln::hopper\n"));
}

TEST(Embedded, UnknownNameIsAnError) {
  try {
    embedded_source("flex/cuda/no_such_file.cuh", "flex_attention");
    ADD_FAILURE() << "an unknown embedded source was found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[flex_attention] no embedded source named flex/cuda/no_such_file.cuh"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::detail
