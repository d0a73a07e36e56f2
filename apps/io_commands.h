#pragma once
// Bodies of `kiln inspect FILE` and `kiln convert IN OUT` as plain functions (apps/main.cpp wires
// them to the command line). Both return a process exit code and never throw.
#include <cstdint>
#include <iostream>
#include <ostream>
#include <string>

namespace kiln::apps {

// Prints the format, the metadata, and per tensor: name, dtype, shape, bytes and CRC-32. Reads only
// the header / pickle and each tensor's bytes once, in 1 MiB pieces: nothing is materialised, so a
// view that claims gigabytes (zero strides) costs what its stored bytes cost. A strided view's CRC
// covers the stored bytes it spans, marked as such. Returns 1 when a checksum the file carries
// does not match.
int run_inspect(const std::string& path, std::ostream& out, std::ostream& err = std::cerr);

// The most bytes `convert` writes for an input of `input_bytes`: 4x the input plus 64 MiB. Only
// views that repeat their storage's elements (zero or overlapping strides) grow past the input;
// converting to .pt keeps them as views.
uint64_t convert_output_limit(uint64_t input_bytes);

// Converts between safetensors and PyTorch zip. The input format is detected from its bytes; the
// output format comes from OUT's extension (.safetensors, or .pt/.pth/.bin/.ckpt for torch). The
// input is read with copying loads (not mmap: a file truncated meanwhile would raise SIGBUS), its
// checksums verified; a safetensors output's size is checked against convert_output_limit before
// anything is loaded.
int run_convert(const std::string& in, const std::string& out_path, std::ostream& out, std::ostream& err = std::cerr);

}  // namespace kiln::apps
