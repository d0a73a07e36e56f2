#pragma once
// kiln::Error and the checks that raise it. Library code never exits or aborts: every failure
// becomes a kiln::Error whose message starts with the op's name, e.g. "[matmul] ...".
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* op, const std::string& message);
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, "op", "message parts", ...) throws kiln::Error("[op] message parts").
#define KILN_CHECK(cond, op, ...)                                                 \
  do {                                                                            \
    if (!(cond)) ::kiln::detail::throw_error(op, ::kiln::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define KILN_FAIL(op, ...) ::kiln::detail::throw_error(op, ::kiln::detail::str_cat(__VA_ARGS__))
