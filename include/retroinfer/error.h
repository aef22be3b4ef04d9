// Errors and checks. User and I/O errors throw retroinfer::Error with what was wrong, where, and what to
// do. Device code never throws; a library never exits or aborts on bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace retroinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(const char* file, int line, Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  os << " [" << file << ":" << line << "]";
  throw Error(os.str());
}
}  // namespace detail

}  // namespace retroinfer

// Always-on check for user-facing preconditions: throws retroinfer::Error with the streamed message.
#define RETROINFER_CHECK(cond, ...)                                                  \
  do {                                                                               \
    if (!(cond)) ::retroinfer::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define RETROINFER_FAIL(...) ::retroinfer::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__)
