// Errors: user-facing problems (bad file, bad config, bad flag value) are thrown as hybridlm::Error
// with a one-line message that names the thing at fault. The CLI maps them to exit code 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hybridlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with the message `parts` streamed in order (strings, numbers).
template <class... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

// Throws Error(parts...) when cond is false. For checks on input, not for programming errors.
// The message is written only on failure (check(n > 0, "n = ", n, " must be > 0")): a passing
// check costs one branch and allocates nothing, so it may sit in the decode loop.
template <class... Parts>
inline void check(bool cond, const Parts&... parts) {
  if (!cond) [[unlikely]] throw_error(parts...);
}

}  // namespace hybridlm
