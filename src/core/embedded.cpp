// Look-up of the files cmake/KilnEmbed.cmake compiled into the library.
#include "core/embedded.h"

#include <string>

#include "kiln/error.h"

namespace kiln::detail {

std::string_view embedded_source(std::string_view name, const char* op) {
  for (const EmbeddedFile* f : embedded_files())
    if (f->name == name) return f->text;
  KILN_FAIL(op, "no embedded source named ", std::string(name));
}

}  // namespace kiln::detail
