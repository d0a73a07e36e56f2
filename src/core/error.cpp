#include "kiln/error.h"

namespace kiln::detail {

void throw_error(const char* op, const std::string& message) {
  throw Error(std::string("[") + op + "] " + message);
}

}  // namespace kiln::detail
