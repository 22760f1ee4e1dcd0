// mok::Error, the one exception type of the host libraries: what failed, where, and what to do.
#pragma once

#include <stdexcept>
#include <string>

namespace mok {

// Kinds map onto the CLI exit codes (STYLE.md): kBadInput -> 2, kUnsupported -> 3.
enum class ErrorKind { kBadInput, kUnsupported, kInternal };

class Error : public std::runtime_error {
 public:
  explicit Error(std::string what, ErrorKind kind = ErrorKind::kBadInput)
      : std::runtime_error(std::move(what)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace mok
