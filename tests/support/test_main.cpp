// The main of every test binary: GoogleTest takes its own flags (--gtest_*), and what is left after
// them is kept for program_args(), so a test that re-executes its binary (test_train's kill test)
// or a script that drives one (scripts/make_io_fixtures.py --check) passes paths as arguments
// rather than through the environment.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/testing.h"

namespace kiln::testing {
namespace {
std::vector<std::string>& stored_args() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

const std::vector<std::string>& program_args() { return stored_args(); }

}  // namespace kiln::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // removes the flags it knows from argv
  for (int i = 1; i < argc; ++i) kiln::testing::stored_args().emplace_back(argv[i]);
  return RUN_ALL_TESTS();
}
