// Error type and checks shared by every layer: a failed check throws tessera::Error with a
// message that names what was wrong, never aborts, so the app can report it once and exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
[[noreturn]] void fail(const char* file, int line, Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  os << " [" << file << ":" << line << "]";
  throw Error(os.str());
}
}  // namespace detail

}  // namespace tessera

// TESSERA_CHECK(cond, "message parts", value, ...) throws tessera::Error when cond is false.
#define TESSERA_CHECK(cond, ...)                                   \
  do {                                                             \
    if (!(cond)) ::tessera::detail::fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
