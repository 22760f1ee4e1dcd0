// The windowed transports' host side, shared by NCCL (one rank per GPU, windows in NCCL symmetric
// memory) and the split rack (several one-rank launches on one GPU, windows in plain device
// memory): the window layout, each pass's publication of the rank's inputs, and the per-rank
// buffers of the run_layer-like drivers.
#pragma once

#include "layer_core.cuh"
#include "mok/reference/tensor.hpp"

#include <map>
#include <string>
#include <vector>

namespace mok::kernel::detail {

// What a rank exposes in its window, at the same offsets on every rank. The inputs peers read are
// kept twice, by parity (forwards for x, topk and router weights; backwards for d_output): a rank
// copies pass n's inputs while a peer may still be in pass n - 1 (enter_pass in device/sync.cuh
// says why never in pass n - 2).
struct WindowLayout {
  size_t x[2], topk[2], rw[2], d_output[2];
  size_t y_slots, dx_slots, arrivals, pass_word, total;
  // `alignment`: the window's size is rounded up to it (NCCL's NCCL_WIN_REQUIRED_ALIGNMENT).
  // copies 1 (tests only: SplitRackOptions::single_copy) makes both parities one copy.
  static WindowLayout of(const spec::LayerConfig& cfg, size_t alignment, int copies = 2);
};

// One rank's passes over its window. bases[p] is rank p's window as this GPU addresses it (an LSA
// pointer for NCCL; bases[rank] is the rank's own). Sets the peers' PeerBuffers in `core` at
// construction; pass() launches on `stream` a staging kernel, which waits until every rank has
// entered the previous pass (bounded; a timeout is the pass's error), then copies this rank's
// inputs into this pass's copy in its window and resets its arrival counters, and then the
// layer's kernel with the pass number, which every rank counts alike (every rank runs the same
// sequence of passes, each pass of a rank stream-ordered after the one before).
class WindowPasses {
 public:
  WindowPasses(LayerCore& core, const WindowLayout& layout, int rank, std::vector<char*> bases);
  void pass(const void* kernel, const DeviceInputs& in, const DeviceOutputs& out, bool backward, cudaStream_t stream);
  const uint16_t* y_slots() const { return reinterpret_cast<const uint16_t*>(bases_[rank_] + lay_.y_slots); }
  const uint16_t* dx_slots() const { return reinterpret_cast<const uint16_t*>(bases_[rank_] + lay_.dx_slots); }
  // Passes launched so far, and this rank's pass word (device memory: the last pass it entered).
  uint32_t passes_launched() const { return passes_; }
  const uint32_t* own_pass_word() const { return reinterpret_cast<const uint32_t*>(bases_[rank_] + lay_.pass_word); }
  bool entry_wait = true;  // false: launches without the pass-entry wait (SplitRackOptions::skip_entry_wait)
  uint64_t stall_ns = 0;   // tests only: LaunchParams::stall_ns of this rank's launches

 private:
  LayerCore& core_;
  WindowLayout lay_;
  int rank_;
  std::vector<char*> bases_;
  uint32_t forwards_ = 0, backwards_ = 0, passes_ = 0;
  int sms_ = 0;  // the device's SMs: the staging copy's grid
};

// Loads the staging kernel now. With lazy module loading (CUDA's default) a kernel's first launch
// may wait for the kernels running on the device; on one GPU holding several ranks (the split
// rack) those wait for the very stream that launches it.
void load_window_kernels();

// The result tensors of a pass (global shapes, zeros): outputs, gradients and slot intermediates.
ref::TensorMap empty_results(const spec::LayerConfig& cfg, bool backward);

// Device allocations freed together (also when a constructor that fills them throws).
struct OwnedDevice {
  std::vector<void*> ptrs;
  OwnedDevice() = default;
  OwnedDevice(const OwnedDevice&) = delete;
  OwnedDevice& operator=(const OwnedDevice&) = delete;
  ~OwnedDevice();
};

// Rank r's device buffers on the current device: its slices of the global inputs (tokens and
// experts; the shared weights whole) and zeroed slices of every result. Freed with it.
struct RankBuffers {
  OwnedDevice owned;
  DeviceInputs in;
  std::map<std::string, void*> dev;  // result path -> this rank's slice
  DeviceOutputs out;
  RankBuffers(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, int r);
  // Bytes of one rank's slice of a result (its rows of the first axis: tokens, experts or ranks).
  static size_t slice_bytes(const spec::LayerConfig& cfg, const std::string& path);
  // Copies this rank's result slices into the global tensors of `result` (synchronous).
  void fetch_results(const spec::LayerConfig& cfg, int r, ref::TensorMap& result) const;
};

// Copies rank r's slice (its rows of the first axis) of the global tensor `path` in `result` from
// device memory at `src` (synchronous).
void fetch_rank_slice(ref::TensorMap& result, const std::string& path, int r, int num_ranks, const void* src);

// The options a rank gets: the workspace this routing needs unless the caller chose.
KernelOptions sized_options(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, const KernelOptions& options);

}  // namespace mok::kernel::detail
