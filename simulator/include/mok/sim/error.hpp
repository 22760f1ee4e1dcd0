// The simulator's error type: what went wrong, where (file and field), and how to fix it.
#pragma once

#include <stdexcept>
#include <string>

namespace mok::sim {

// Thrown by library code for bad input (never exit()). The CLI maps it to exit code 2.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace mok::sim
