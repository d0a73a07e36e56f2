#pragma once
// Helpers shared by the checkpoint I/O tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/io.h"

namespace kiln::io::testing {

inline std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  Tensor c = t.cpu().contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

inline std::string temp_path(const std::string& name) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/kiln_io_test_XXXXXX";
    const char* d = mkdtemp(tmpl);
    return std::string(d != nullptr ? d : "/tmp");
  }();
  return dir + "/" + name;
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs f, expecting a kiln::Error whose message contains `rule`.
template <typename F>
void expect_error(F&& f, const std::string& rule) {
  try {
    f();
    ADD_FAILURE() << "expected a kiln::Error naming '" << rule << "', got none";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find(rule), std::string::npos) << "message: " << e.what() << "\nwanted: " << rule;
  }
}

}  // namespace kiln::io::testing
