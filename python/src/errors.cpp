// kiln::Error as Python sees it: kiln.KilnError (a RuntimeError) whose message uses Python's
// spellings where the C++ message names a C++ construct ("wrap the update in kiln::NoGradGuard"
// reads "wrap the update in `with kiln.no_grad():`", "retain_graph=true" reads "retain_graph=True").
// Subclasses (kiln.distributed's CommError, TimeoutError) keep their own translators.
#include <string>
#include <typeinfo>

#include "bind.h"
#include "kiln/error.h"

namespace kiln::py {
namespace {

struct Spelling {
  const char* cpp;
  const char* python;
};
constexpr Spelling kSpellings[] = {
    {"kiln::NoGradGuard", "`with kiln.no_grad():`"},
    {"retain_graph=true", "retain_graph=True"},
    {"create_graph=true", "create_graph=True"},
    {"checksums = true", "checksums=True"},
    {"kiln::", "kiln."},
};

PyObject* g_kiln_error = nullptr;  // kiln.KilnError, kept for the process

}  // namespace

std::string python_wording(std::string message) {
  for (const Spelling& s : kSpellings) {
    const std::string from = s.cpp, to = s.python;
    for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
      message.replace(at, from.size(), to);
  }
  return message;
}

void bind_errors(nb::module_& m) {
  g_kiln_error = m.attr("KilnError").ptr();
  Py_INCREF(g_kiln_error);
  // Registered last, so tried first: only kiln::Error itself is handled here.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      if (typeid(e) != typeid(Error)) throw;
      PyErr_SetString(g_kiln_error, python_wording(e.what()).c_str());
    }
  });
}

}  // namespace kiln::py
