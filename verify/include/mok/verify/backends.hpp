// The backends mok-verify can check: emulate (CPU, bitwise), oracle (CPU, bounds), cuda (GPU).
#pragma once

#include "mok/reference/golden.hpp"
#include "mok/reference/sample.hpp"
#include "mok/verify/compare.hpp"

#include <functional>
#include <string>

namespace mok::verify {

enum class Backend { kEmulate, kOracle, kCuda, kAuto };

// Parses "emulate" | "oracle" | "cuda" | "auto"; mok::Error otherwise.
Backend parse_backend(const std::string& name);
const char* backend_name(Backend b);

// True when this build has the CUDA kernel and a GPU is visible; `why` says why not.
bool cuda_available(std::string* why);

struct RunOptions {
  Backend backend = Backend::kAuto;
  int num_threads = 0;
  const ref::Sample* sample = nullptr;
  bool check_bounds = true;
  // Also judge the backend's outputs/output (and every gradient when the golden has them) against the end-to-end oracle (ref::oracle_end_to_end: true values and
  // radii from the inputs alone), so that the verdict does not rest on the emulator's
  // intermediates. Adds rows "<tensor> (end to end)" to the report. The bounds are read from
  // the golden when it stores them for every tensor judged (mok-golden --end-to-end-bounds),
  // else computed now; recompute_end_to_end computes them even then.
  bool end_to_end = false;
  bool recompute_end_to_end = false;
  std::string transport = "virtual";  // cuda backend: "virtual" (R ranks on one GPU), "nccl" (one GPU per rank) or
                                      // "split" (one GPU, a launch per rank: kernel::run_layer_split)
  std::function<void(const std::string&)> progress;  // one line per phase (stderr in the CLI)
  std::string golden_name = "golden";  // the golden's path, for errors about its content
};

// Runs a backend on the golden's inputs and compares with the golden:
//  emulate: emulator tensors must equal the golden bit for bit (and lie within its bounds);
//  oracle:  recomputes exact values and radii from the inputs and intermediates (emulating
//           the intermediates when the golden lacks them) and checks that the golden's own
//           outputs and grads lie within them;
//  cuda:    the GPU kernel (mok::Error kind kUnsupported when unavailable);
//  auto:    cuda when available, else emulate.
// With end_to_end, the backend's output and gradients (the golden's own, for oracle)
// must also lie within the end-to-end bounds.
Report run_backend(const ref::Golden& golden, const RunOptions& options);

}  // namespace mok::verify
