// formats/error.h
//
// dsv41::Error and the DSV41_CHECK macro: every library error in dsv41 is thrown as an Error that
// carries file:line, the failed condition and a message built from the offending values.
// Host-only (std::string); device code never throws.
//
// Example:
//   DSV41_CHECK(dim % 16 == 0, "compressed KV dim must be a multiple of 16, got dim=", dim);
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsv41 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace dsv41

// Throws dsv41::Error("file:line: check `cond` failed: <message>") when cond is false.
#define DSV41_CHECK(cond, ...)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      throw ::dsv41::Error(::dsv41::detail::concat(__FILE__, ":", __LINE__, ": check `",   \
                                                   #cond, "` failed: ", __VA_ARGS__));     \
    }                                                                                      \
  } while (0)

// Throws a dsv41::Error whose message is only the user-facing text (for input errors, where
// the source location would be noise to the user).
#define DSV41_FAIL(...) throw ::dsv41::Error(::dsv41::detail::concat(__VA_ARGS__))
