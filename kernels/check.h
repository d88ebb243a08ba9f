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
// The message is for users: it names what is wrong and where in their input, not in our source.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}
}  // namespace detail

}  // namespace tessera

// TESSERA_CHECK(cond, "message parts", value, ...) throws tessera::Error when cond is false.
#define TESSERA_CHECK(cond, ...)                                   \
  do {                                                             \
    if (!(cond)) ::tessera::detail::fail(__VA_ARGS__);             \
  } while (0)
