// The NCCL transport: a layer spread over GPUs, one rank per GPU, peer buffers in NCCL 2.28
// symmetric memory windows reached through LSA pointers (one NVLink domain).
#pragma once

#include "mok/kernel/layer.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <memory>
#include <string>

namespace mok::kernel {

// True when this build has the NCCL transport; `why` says why not.
bool nccl_available(std::string* why);

// One rank of the layer on the current CUDA device. Construct it on every rank of the
// communicator together (window registration is collective); cfg.num_ranks must equal the
// communicator's size and every rank must be in one LSA (NVLink) team. The rank's tensors are
// its own: x, topk_experts, router_weights, d_output [T, ...], its experts' weights
// [E/R, ...], the shared weights; results for its tokens and experts (DeviceOutputs without
// rank offsets; shared-expert gradients [Is, H] of this rank). Each pass copies the exposed
// inputs into the rank's window and fences the ranks with two stream-ordered barriers (one
// before the copy, one before the launch); no host synchronisation. Bits equal the virtual
// rack's for the same global inputs and R.
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

}  // namespace mok::kernel
