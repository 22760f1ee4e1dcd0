// Shared macros and the status type of the header-only spec layer (no dependencies, nvcc-safe).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
#else
#define MOK_HD inline
#endif

namespace mok::spec {

// The spec layer never throws (it must compile as device code): it returns a Status whose
// message points at a static string or at the caller's buffer.
struct Status {
  bool ok = true;
  const char* message = "";
  MOK_HD static Status success() { return Status{true, ""}; }
  MOK_HD static Status fail(const char* m) { return Status{false, m}; }
};

}  // namespace mok::spec
