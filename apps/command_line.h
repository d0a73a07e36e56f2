#pragma once
// What the `kiln` command adds to CLI11: unknown commands named with the closest known one, and
// the spellings of a precision people type (fp32, float32, bf16, bfloat16).
#include <CLI/CLI.hpp>

#include <ostream>
#include <string>
#include <vector>

namespace kiln::apps {

// The name in `names` closest to `word` (at most a third of its length in edits, at least 1, a swap
// of neighbours counting as one; or `word` a prefix of it); empty when none is close.
std::string closest_name(const std::string& word, const std::vector<std::string>& names);

// Checks the command words of argv (argv[1], and argv[2] under a command that takes one) against
// `app`'s subcommands before CLI11 parses. On an unknown word prints
//   kiln: unknown command "trian"; did you mean "train"? (commands: info, train, ...)
// to `err` and returns 2; otherwise returns -1.
int check_command_words(const CLI::App& app, int argc, const char* const* argv, std::ostream& err);

// A CLI11 validator for --autocast: bf16 / bfloat16 -> "bf16", none / fp32 / float32 / f32 / off ->
// "none", auto (any case).
CLI::Validator autocast_spelling();

}  // namespace kiln::apps
