// The `kiln` command. Subcommands arrive with their issues (train, bench, inspect, convert).
#include <iostream>

#include "kiln/kiln.h"

int main(int argc, char** argv) {
  std::cout << "kiln " << (argc > 1 ? argv[1] : "") << "\n";
  return 0;
}
