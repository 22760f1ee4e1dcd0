// The NCCL transport's entry points in builds without NCCL: they say so (exit code 3 in CLIs).
#include "mok/kernel/nccl.hpp"

#include "mok/reference/error.hpp"

namespace mok::kernel {

bool nccl_available(std::string* why) {
  if (why) *why = "this build has no NCCL (install NCCL 2.28 and reconfigure)";
  return false;
}

struct NcclLayer::Impl {};

NcclLayer::NcclLayer(const spec::LayerConfig&, void*, const KernelOptions&) {
  throw Error("transport nccl is not supported here: this build has no NCCL", ErrorKind::kUnsupported);
}
NcclLayer::~NcclLayer() = default;
void NcclLayer::forward(const DeviceInputs&, const DeviceOutputs&, void*) {}
void NcclLayer::backward(const DeviceInputs&, const DeviceOutputs&, void*) {}
void NcclLayer::check_errors(void*) {}
int NcclLayer::rank() const { return 0; }
const uint16_t* NcclLayer::y_slots() const { return nullptr; }
const uint16_t* NcclLayer::dx_slots() const { return nullptr; }
int NcclLayer::blocks_per_rank() const { return 0; }
int NcclLayer::comm_blocks_per_rank() const { return 0; }
int NcclLayer::forward_comm_blocks_per_rank() const { return 0; }
std::vector<uint64_t> NcclLayer::trace(void*) const { return {}; }
bool NcclLayer::uses_tma() const { return false; }
void NcclLayer::copy_intermediates(ref::TensorMap&, bool) const {}

ref::TensorMap run_layer_nccl(const spec::LayerConfig&, const ref::TensorMap&, bool, const KernelOptions&) {
  throw Error("transport nccl is not supported here: this build has no NCCL", ErrorKind::kUnsupported);
}

bool launched_by_mok_launch() { return false; }

ref::TensorMap run_layer_nccl_process(const spec::LayerConfig&, const ref::TensorMap&, bool, const KernelOptions&) {
  throw Error("transport nccl is not supported here: this build has no NCCL", ErrorKind::kUnsupported);
}

NcclTimes time_layer_nccl(const spec::LayerConfig&, const ref::TensorMap&, bool, int, int, const KernelOptions&) {
  throw Error("transport nccl is not supported here: this build has no NCCL", ErrorKind::kUnsupported);
}

NcclTimes time_layer_nccl_process(const spec::LayerConfig&, const ref::TensorMap&, bool, int, int,
                                  const KernelOptions&) {
  throw Error("transport nccl is not supported here: this build has no NCCL", ErrorKind::kUnsupported);
}

}  // namespace mok::kernel
