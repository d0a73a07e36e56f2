#pragma once
// Files compiled into the library at build time (cmake/KilnEmbed.cmake): the kernel sources that
// NVRTC compiles at run time, each named by its path under src/ ("core/cuda/hopper.cuh", the name
// the sources #include each other by).
#include <span>
#include <string_view>

namespace kiln::detail {

struct EmbeddedFile {
  const char* name;
  std::string_view text;  // NUL-terminated in the library
};

// Every embedded file, in the order of the CMake list (generated: <build>/embedded/embedded_table.cpp).
std::span<const EmbeddedFile* const> embedded_files();

// The text of the embedded file `name`; throws kiln::Error naming `op` when there is none.
std::string_view embedded_source(std::string_view name, const char* op = "embedded_source");

}  // namespace kiln::detail
