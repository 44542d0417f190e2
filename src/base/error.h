// Errors: user-facing problems (bad file, bad config, bad flag value) are thrown as hybridlm::Error
// with a one-line message that names the thing at fault. The CLI maps them to exit code 1.
#pragma once

#include <stdexcept>
#include <string>

namespace hybridlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error(message) when cond is false. For checks on input, not for programming errors.
inline void check(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}

}  // namespace hybridlm
