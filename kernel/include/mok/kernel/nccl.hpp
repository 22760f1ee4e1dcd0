// The NCCL transport: a layer spread over GPUs, one rank per GPU, peer buffers in NCCL 2.28
// symmetric memory windows reached through LSA pointers (one NVLink domain).
#pragma once

#include "mok/kernel/layer.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace mok::kernel {

// True when this build has the NCCL transport; `why` says why not.
bool nccl_available(std::string* why);

// One rank of the layer on the current CUDA device. Construct it on every rank of the
// communicator together (window registration is collective); cfg.num_ranks must equal the
// communicator's size and every rank must be in one LSA (NVLink) team. The rank's tensors are
// its own: x, topk_experts, router_weights, d_output [T, ...], its experts' weights
// [E/R, ...], the shared weights; results for its tokens and experts (DeviceOutputs without
// rank offsets; shared-expert gradients [Is, H] of this rank). Each pass launches on `stream` a
// staging kernel, which waits until every rank has entered the previous pass and copies the
// exposed inputs into the rank's window (one of two copies, by parity), and then the layer's
// kernel, which waits on entry until every rank has entered the same pass (no host barrier, no
// host synchronisation; kernel/README.md, "Transports"). Every rank must run the same sequence of
// passes, each rank's passes ordered on its streams. Once check_errors() has reported a timeout,
// the layer refuses further passes (a late rank may since have pushed into this rank's window):
// build a new one on every rank. Bits equal the virtual rack's for the same global inputs and R.
class NcclLayer {
 public:
  NcclLayer(const spec::LayerConfig& cfg, void* nccl_comm, const KernelOptions& options = {});
  ~NcclLayer();
  NcclLayer(const NcclLayer&) = delete;
  NcclLayer& operator=(const NcclLayer&) = delete;

  void forward(const DeviceInputs& in, const DeviceOutputs& out, void* stream = nullptr);
  void backward(const DeviceInputs& in, const DeviceOutputs& out, void* stream = nullptr);
  void check_errors(void* stream = nullptr);
  int rank() const;
  const uint16_t* y_slots() const;   // this rank's [T, K, H] slot buffer
  const uint16_t* dx_slots() const;
  int blocks_per_rank() const;
  int comm_blocks_per_rank() const;
  int forward_comm_blocks_per_rank() const;  // the forward's (as Layer::forward_comm_blocks_per_rank)
  bool uses_tma() const;  // true when the fast engine runs (as Layer::uses_tma)
  // With KernelOptions::trace: this rank's profile of its last pass, kTraceSlots words per block
  // (TraceSlot in params.hpp; marks are this GPU's %globaltimer); empty when off. Synchronises.
  std::vector<uint64_t> trace(void* stream = nullptr) const;
  // Copies this rank's workspace intermediates (Layer::copy_intermediates' list) into `result`,
  // whose tensors for them must exist with their global shapes: the slots of this rank's experts
  // and this rank's tokens' rows are written, nothing else. Synchronises the device.
  void copy_intermediates(ref::TensorMap& result, bool backward) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs the layer on the first cfg.num_ranks GPUs of this process, one thread per GPU and one
// NCCL communicator (ncclCommInitAll), and returns global tensors like run_layer. Throws
// mok::Error of kind kUnsupported when NCCL is missing or there are too few GPUs.
ref::TensorMap run_layer_nccl(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                              const KernelOptions& options = {});

// True when this process was started by mok-launch (MOK_RANK, MOK_WORLD_SIZE, MOK_NCCL_ID set).
bool launched_by_mok_launch();

// For one process of a mok-launch job (one process per GPU): joins the job's communicator
// (ncclCommInitRank from the environment mok-launch sets, on the process's first visible GPU),
// runs this process's rank, and all-gathers every rank's results so that each process returns
// the global tensors, like run_layer. Inputs are the global tensors (each process slices its own).
ref::TensorMap run_layer_nccl_process(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                                      const KernelOptions& options = {});

// Pass times of the NCCL transport, for benchmarks (mok-bench --transport nccl). Every rank runs
// `warmup` untimed and then `reps` timed forward passes (each followed by a backward pass when
// `backward`) on its own GPU, timing each pass on its stream with CUDA events: the ranks first
// meet at an untimed stream-ordered barrier (a one-element all-reduce), so every rank's time
// runs from a common start to the end of its own kernel and includes the copy of the rank's inputs
// into its window and the kernel's wait for every rank to enter the pass. The slowest rank of a repetition is the
// layer's time for that repetition.
struct NcclTimes {
  int num_ranks = 0, reps = 0;
  std::vector<float> forward_ms;   // rank-major: forward_ms[rank * reps + rep], milliseconds
  std::vector<float> backward_ms;  // the same for the backward passes; empty without backward
  int blocks_per_rank = 0, comm_blocks_per_rank = 0;  // rank 0's launch shape
  int forward_comm_blocks_per_rank = 0;
  bool uses_tma = false;
  ref::Tensor output;  // outputs/output [G, H] of the last forward pass, global token order
  // With KernelOptions::trace: each rank's per-block profile (NcclLayer::trace) of passes run
  // after the timed ones by a second layer built with the trace on (a warm forward, then the
  // profiled forward and, with the backward, the profiled backward), so the timed passes carry no
  // trace stores; trace_forward[r] is rank r's. Empty otherwise.
  std::vector<std::vector<uint64_t>> trace_forward, trace_backward;
};

// The layer's time per repetition (the slowest rank's), then the median over repetitions (the
// upper median for an even count). `ms` is rank-major as in NcclTimes; 0 when empty.
inline float median_of_slowest_rank(const std::vector<float>& ms, int num_ranks, int reps) {
  if (num_ranks < 1 || reps < 1 || ms.size() < static_cast<size_t>(num_ranks) * reps) return 0.0f;
  std::vector<float> slowest(reps, 0.0f);
  for (int r = 0; r < num_ranks; ++r)
    for (int i = 0; i < reps; ++i) slowest[i] = std::max(slowest[i], ms[static_cast<size_t>(r) * reps + i]);
  std::sort(slowest.begin(), slowest.end());
  return slowest[slowest.size() / 2];
}

// Times the layer on the first cfg.num_ranks GPUs of this process, one thread per GPU and one
// NCCL communicator (ncclCommInitAll); inputs are the global tensors, as for run_layer_nccl.
// Throws mok::Error of kind kUnsupported when NCCL is missing or there are too few GPUs, and
// kBadInput when reps < 1 or warmup < 0.
NcclTimes time_layer_nccl(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, int warmup,
                          int reps, const KernelOptions& options = {});

// The same for one process of a mok-launch job (one process per GPU, as run_layer_nccl_process):
// every process returns every rank's times and the global output (all-gathered).
NcclTimes time_layer_nccl_process(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                                  int warmup, int reps, const KernelOptions& options = {});

}  // namespace mok::kernel
