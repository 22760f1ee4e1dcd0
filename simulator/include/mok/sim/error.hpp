// The simulator's errors are the project's mok::Error: what went wrong, where (file and field),
// and how to fix it; the kind maps to the CLI exit code (kBadInput -> 2).
#pragma once

#include "mok/reference/error.hpp"  // header-only; on the include path of mok::spec

namespace mok::sim {

using Error = mok::Error;
using ErrorKind = mok::ErrorKind;

}  // namespace mok::sim
