// base/error.h
//
// dsv41::Error and the DSV41_CHECK macro: every library error in dsv41 is thrown as an Error.
// Its what() is the user-facing text (the thing and the reason); a failed DSV41_CHECK also
// carries where it failed (file:line and the condition) as origin(), which the CLI prints only
// with --debug (docs/errors.md), so that no message a user sees names a source file.
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
  explicit Error(const std::string& what, std::string origin = {})
      : std::runtime_error(what), origin_(std::move(origin)) {
    if (!origin_.empty()) last_origin() = origin_;
  }
  // "file:line: check `cond` failed" for a failed DSV41_CHECK; empty for DSV41_FAIL.
  const std::string& origin() const { return origin_; }
  // The origin of the last failed DSV41_CHECK on this thread, kept when an Error is caught and
  // rethrown with more context (DSV41_FAIL(..., e.what())); for --debug only.
  static std::string& last_origin() {
    thread_local std::string origin;
    return origin;
  }

 private:
  std::string origin_;
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

// Throws dsv41::Error(<message>) with origin "file:line: check `cond` failed" when cond is false.
#define DSV41_CHECK(cond, ...)                                                               \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::dsv41::Error(::dsv41::detail::concat(__VA_ARGS__),                             \
                           ::dsv41::detail::concat(__FILE__, ":", __LINE__, ": check `",     \
                                                   #cond, "` failed"));                      \
    }                                                                                        \
  } while (0)

// Throws a dsv41::Error whose message is only the user-facing text.
#define DSV41_FAIL(...) throw ::dsv41::Error(::dsv41::detail::concat(__VA_ARGS__))
