// The transport-independent host side of a layer: device limits, the ranks a launch holds, their
// workspaces and tensor maps, the cooperative launch and its diagnostics. A transport (virtual
// rack, NCCL) fills each rank's PeerBuffers and RankTensors and calls launch().
#pragma once

#include "../device/mma_tile.cuh"
#include "mok/kernel/layer.hpp"
#include "mok/kernel/params.hpp"
#include "mok/reference/error.hpp"

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace mok::kernel::detail {

void cuda_check(cudaError_t e, const char* what, const char* file, int line);
#define MOK_CUDA(expr) ::mok::kernel::detail::cuda_check((expr), #expr, __FILE__, __LINE__)

template <class T>
T* device_alloc(std::vector<void*>& owned, int64_t count) {
  void* p = nullptr;
  MOK_CUDA(cudaMalloc(&p, static_cast<size_t>(count > 1 ? count : 1) * sizeof(T)));
  owned.push_back(p);
  return static_cast<T*>(p);
}

// The outputs and gradients a pass produces for cfg, as schema paths.
std::vector<const char*> result_paths(const spec::LayerConfig& cfg, bool backward);
// DeviceOutputs pointing at the device buffers of those paths (null where absent).
DeviceOutputs outputs_from(const std::map<std::string, void*>& dev);

// The intermediates a rank's workspace holds after a pass, as schema paths (Layer::copy_intermediates).
std::vector<const char*> workspace_intermediate_paths(const spec::LayerConfig& cfg, bool backward);

// Throws mok::Error naming the first pointer a pass needs that is null or not 16-byte aligned
// (`who` starts the message: "kernel", "NcclLayer").
void check_pass_pointers(const spec::LayerConfig& cfg, const DeviceInputs& in, const DeviceOutputs& out,
                         bool backward, const char* who);

class LayerCore;
// Copies rank r's workspace intermediates into `result`, whose tensors for those paths must exist
// with their global shapes: the rows of r's experts go to their (token, slot) places, r's tokens'
// shared-expert values to their rows; nothing else is written (ranks may fill one map from
// several threads). Synchronises the device.
void copy_rank_intermediates(const LayerCore& core, int r, bool backward, ref::TensorMap& result);

// The two kernels, defined once (src/layer.cu includes the device code).
const void* forward_kernel();
const void* backward_kernel();

class LayerCore {
 public:
  // Validates the config and options, sizes the launch for `local_ranks` ranks starting at
  // `first_rank` on the current device, and allocates their workspaces. system_scope: the peers
  // are other GPUs (NCCL with several), so cross-rank signals use system-scope fences and the
  // forward gathers with threads. gpu_ranks: the ranks that share this GPU's blocks (0: this
  // launch's own; the split rack runs several one-rank launches side by side on one GPU).
  LayerCore(const spec::LayerConfig& cfg, const KernelOptions& options, int first_rank, int local_ranks,
            bool system_scope = false, int gpu_ranks = 0);
  ~LayerCore();
  LayerCore(const LayerCore&) = delete;
  LayerCore& operator=(const LayerCore&) = delete;

  // Sets rank r's weights and results from the caller's global arrays (rank slices).
  void set_tensors(int r, const DeviceInputs& in, const DeviceOutputs& out, bool global_layout);
  // Encodes and copies the tensor maps, resets counters and the error record, and
  // launches `kernel` for the local ranks on `stream`.
  void launch(const void* kernel, cudaStream_t stream);
  // Windowed transports (one rank per launch): the next launches wait, before touching any window,
  // until every rank has entered pass `seq` (enter_pass in device/sync.cuh); wait false: they
  // only say they have entered (a test's way to show the wait is needed).
  void set_pass(uint32_t seq, bool wait = true) {
    host_.pass_entry = wait ? 1 : 2;
    host_.pass_seq = seq;
  }
  // false: a plain launch instead of a cooperative one (the split rack: several launches must be
  // resident together, which a cooperative launch does not promise either; the host checks the
  // blocks fit).
  void set_cooperative(bool on) { cooperative_ = on; }
  // Tests only (the split rack): every block of the next launches waits `ns` after entering a pass.
  void set_stall(uint64_t ns) { host_.stall_ns = ns; }
  // The error record the launches write (device memory; cleared by check_errors()), the bound on
  // every wait, and the code of the last error check_errors() reported (0: none yet).
  ErrorRecord* error_record() const { return error_; }
  uint64_t timeout_ns() const { return host_.timeout_ns; }
  uint32_t last_error_code() const { return last_error_code_; }
  // Throws mok::Error (bad input) unless a forward was launched on this layer before.
  void require_forward() const;
  // Synchronises `stream` and throws mok::Error with the kernel's diagnostic if a pass failed.
  void check_errors(cudaStream_t stream);
  // The last pass's per-block profile (KernelOptions::trace), empty when off; synchronises.
  std::vector<uint64_t> read_trace(cudaStream_t stream) const;

  const spec::LayerConfig& cfg() const { return host_.cfg; }
  const KernelOptions& options() const { return options_; }
  int blocks_per_rank() const { return blocks_per_rank_; }
  int wide_ranks() const { return wide_ranks_; }
  int launch_blocks() const { return local_ranks_ * blocks_per_rank_ + wide_ranks_; }
  bool uses_tma() const { return fast_; }
  PeerBuffers& peer(int r) { return host_.peers[r]; }
  const RankState& state(int r) const { return host_.state[r]; }  // rank r's workspace (device pointers)
  std::vector<void*>& owned() { return owned_; }

 private:
  KernelOptions options_;
  int first_rank_ = 0, local_ranks_ = 0, blocks_per_rank_ = 0, wide_ranks_ = 0;
  bool hopper_ = false, fast_ = false;
  size_t smem_bytes_ = 0;
  uint32_t epoch_ = 0;
  bool forward_launched_ = false;  // a backward needs a forward's plan (launch())
  bool cooperative_ = true;
  uint32_t last_error_code_ = 0;
  static constexpr int kMapSlots = 4;  // device sets of tensor maps (launch(): the windows' parity copies)
  int next_map_slot_ = 0;
  std::vector<void*> owned_;
  LaunchParams host_{};  // passed by value to every launch (a __grid_constant__ kernel parameter)
  std::vector<RankTensorMaps> host_maps_;   // [2 * kMaxRanks] (params.hpp): the launch's ranks' entries encoded every launch
  std::vector<RankTensorMaps> sent_maps_;   // [kMapSlots * 2 * kMaxRanks]: what device_maps_ holds where maps_sent_
  std::vector<char> maps_sent_;             // [kMapSlots]: 1 once the slot was copied
  RankTensorMaps* device_maps_ = nullptr;   // [kMapSlots * 2 * kMaxRanks] in device memory: host_.maps is one slot
  uint32_t* control_ = nullptr;  // zeroed every launch: 8 counters per local rank, the abort word, each
                                 // local rank's tile counters, then each local rank's expert counts
  int64_t control_words_ = 0;
  ErrorRecord* error_ = nullptr;
  uint64_t* trace_ = nullptr;  // kTraceSlots words per block when options_.trace
};

}  // namespace mok::kernel::detail
