#pragma once
// The process environment, read here and nowhere else in kiln (src/core/env.cpp): the tuning
// values (kiln/tuning.h) and the few paths kiln takes from the environment.
#include <string>

namespace kiln::detail {

// The folder of kiln's disk caches (compiled kernels): $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
// else $HOME/.cache/kiln; empty when none is set.
std::string cache_dir();

}  // namespace kiln::detail

namespace kiln::detail {
// Old per-op switches, still read by flex and LCE until their plans take Tuning values.
const char* env_switch(const char* op, const char* var, const char* a, const char* b);
bool env_flag(const char* op, const char* var, bool dflt);
}  // namespace kiln::detail
