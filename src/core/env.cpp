#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "kiln/error.h"

namespace kiln::detail {

const char* env_switch(const char* op, const char* var, const char* a, const char* b) {
  const char* v = std::getenv(var);
  KILN_CHECK(!v || !std::strcmp(v, a) || !std::strcmp(v, b), op, var, " must be ", a, " or ", b, ", got '",
             v ? v : "", "'");
  return v;
}

bool env_flag(const char* op, const char* var, bool dflt) {
  const char* v = env_switch(op, var, "0", "1");
  return v ? v[0] == '1' : dflt;
}

}  // namespace kiln::detail
