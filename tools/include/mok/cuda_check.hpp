// Checked CUDA runtime calls for the command-line programs: on failure, print
// "PROGRAM: CALL: ERROR" on stderr and exit 1 (a check failed). The kernel library's MOK_CUDA throws
// mok::Error instead, for code that reports through exceptions (mok-bench's unfused baseline).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace mok::cli {

inline void cuda_or_exit(cudaError_t e, const char* program, const char* call) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s: %s\n", program, call, cudaGetErrorString(e));
  std::exit(1);
}

}  // namespace mok::cli

// Usage, once per program: #define CK(x) MOK_CUDA_OR_EXIT("mok-gpu-probe", x)
#define MOK_CUDA_OR_EXIT(program, call) ::mok::cli::cuda_or_exit((call), (program), #call)
