// The main of every test binary: GoogleTest takes its own flags (--gtest_*), and what is left after
// them is kept for program_args(), so a test that re-executes its binary (test_train's kill test)
// or a script that drives one (scripts/make_io_fixtures.py --check) passes paths as arguments
// rather than through the environment.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/testing.h"
#include "test_emulator.h"

namespace kiln::testing {
namespace {
std::vector<std::string>& stored_args() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

const std::vector<std::string>& program_args() { return stored_args(); }

std::vector<std::string> self_command() {
  std::vector<std::string> command = {KILN_TEST_EMULATOR_ARGS};
  // Under an emulator /proc/self/exe names this binary (qemu-user shows the guest's view of it).
  if (command.empty()) return {"/proc/self/exe"};
  command.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  return command;
}

}  // namespace kiln::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // removes the flags it knows from argv
  for (int i = 1; i < argc; ++i) kiln::testing::stored_args().emplace_back(argv[i]);
  return RUN_ALL_TESTS();
}
