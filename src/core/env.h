#pragma once
// Measurement switches from the environment (KILN_*), validated so a typo is an error naming the
// op instead of a silent default.

namespace kiln::detail {

// The variable's value (one of `a`, `b`), or nullptr when unset; any other value throws.
const char* env_switch(const char* op, const char* var, const char* a, const char* b);
// A 0 / 1 switch: `dflt` when the variable is unset.
bool env_flag(const char* op, const char* var, bool dflt);

}  // namespace kiln::detail
