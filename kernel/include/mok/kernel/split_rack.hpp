// The split rack: the NCCL transport's windowed protocol on one GPU, for tests and for checking a
// change to that protocol without several GPUs.
#pragma once

#include "mok/kernel/layer.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <vector>

namespace mok::kernel {

// Knobs of run_layer_split that only tests use.
struct SplitRackOptions {
  // Per rank (empty: none): a wait of this many microseconds on the rank's stream before each of
  // its passes, so that ranks enter passes at different times, as processes on several GPUs do.
  std::vector<double> delay_us;
  // Launch without the pass-entry wait (enter_pass): a rank may then read a window before its
  // owner has published it. Only for the test that shows the wait is needed.
  bool skip_entry_wait = false;
  // Per rank (empty: none): after entering each pass, the rank's blocks wait this many
  // microseconds before they read any window, so that a peer may run ahead into the next pass.
  std::vector<double> stall_us;
  // One copy of each window input instead of two: a peer that runs ahead may then overwrite a copy
  // a stalled rank is about to read. Only for the test that shows the second copy is needed.
  bool single_copy = false;
};

// Runs the layer with every rank as its own launch on its own stream of the current GPU, as the
// NCCL transport runs one rank per GPU: each rank's inputs are copied into its window (plain
// device memory here, an NCCL symmetric window there) before its launch, every rank reads the
// others' windows through pointers and pushes its expert outputs into them, and each pass starts
// with the same device-side entry wait (every rank has entered the pass) instead of any host
// synchronisation. For each input set (global tensors, as run_layer takes) it runs a forward and,
// with `backward`, a backward; all sets' passes are queued before the first result is read.
// Returns each set's results like run_layer, bit for bit the same; the slot intermediates and the
// workspace intermediates only for the last set (later passes overwrite them). The ranks' blocks
// share the GPU: blocks_per_rank 0 gives each rank an equal share of what fits beside one more
// rank's worth left free (for the staging kernels and waits queued between passes). The ranks'
// launches must run at the same time: with CUDA_LAUNCH_BLOCKING=1 (refused, kUnsupported), under a
// tool that serialises kernels (compute-sanitizer, some profilers) or where the blocks counted as
// co-resident are not all available (MPS, MIG limits), a pass waits for a rank that cannot start
// and ends in the timeout's diagnostic. Throws mok::Error with every failed rank's diagnostic, one
// line each in rank order, when a pass fails (a rank that never enters a pass is named in its
// peers' timeouts).
std::vector<ref::TensorMap> run_layer_split(const spec::LayerConfig& cfg, const std::vector<ref::TensorMap>& input_sets,
                                            bool backward, const KernelOptions& options = {},
                                            const SplitRackOptions& split = {});

}  // namespace mok::kernel
