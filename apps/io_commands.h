#pragma once
// Bodies of `kiln inspect FILE` and `kiln convert IN OUT` as plain functions (apps/main.cpp wires
// them to the command line). Both return a process exit code and never throw.
#include <iostream>
#include <ostream>
#include <string>

namespace kiln::apps {

// Prints the format, the metadata, and per tensor: name, dtype, shape, bytes and CRC-32.
int run_inspect(const std::string& path, std::ostream& out, std::ostream& err = std::cerr);

// Converts between safetensors and PyTorch zip. The input format is detected from its bytes; the
// output format comes from OUT's extension (.safetensors, or .pt/.pth/.bin/.ckpt for torch).
int run_convert(const std::string& in, const std::string& out_path, std::ostream& out, std::ostream& err = std::cerr);

}  // namespace kiln::apps
