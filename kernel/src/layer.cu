// Host side of the fused MoE kernel: workspace, virtual-rack peer table, cooperative launches.
#include "mok/kernel/layer.hpp"

#include "../device/moe.cuh"
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace mok::kernel {
namespace {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    std::ostringstream s;
    s << "CUDA error in " << what << " (" << file << ":" << line << "): " << cudaGetErrorString(e);
    throw Error(s.str(), ErrorKind::kInternal);
  }
}
#define MOK_CUDA(expr) check((expr), #expr, __FILE__, __LINE__)

template <class T>
T* device_alloc(std::vector<void*>& owned, int64_t count) {
  void* p = nullptr;
  MOK_CUDA(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
  owned.push_back(p);
  return static_cast<T*>(p);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2D bf16 [rows, cols] row-major tensor as a TMA map with 8 x 64 boxes (16 bytes of K x 64 rows).
bool encode_map(TensorMapBytes* out, const void* base, int64_t rows, int64_t cols) {
  static_assert(sizeof(TensorMapBytes) == sizeof(CUtensorMap), "opaque tensor map must match CUtensorMap");
  auto encode = tensor_map_encoder();
  if (!encode || !base || rows <= 0 || cols <= 0) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {8, 64};
  const cuuint32_t elem[2] = {1, 1};
  return encode(reinterpret_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base),
                dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

struct Layer::Impl {
  spec::LayerConfig cfg;
  KernelOptions options;
  int blocks_per_rank = 0;
  bool hopper = false;  // compute capability 9.x: the sm_90a code path (wgmma, TMA) runs
  size_t smem_bytes = 0;  // dynamic shared memory per block (the TMA pipeline's stages on sm_90a)
  uint32_t epoch = 0;
  std::vector<void*> owned;
  LaunchParams host{};
  LaunchParams* device_params = nullptr;
  uint32_t* control = nullptr;      // per rank: counters[8] + arrivals[2]; then abort
  int64_t control_words = 0;
  ErrorRecord* error = nullptr;
  uint16_t* y_slots = nullptr;
  uint16_t* dx_slots = nullptr;

  ~Impl() {
    for (void* p : owned) cudaFree(p);
  }

  void launch(const void* kernel, const DeviceInputs& in, const DeviceOutputs& out, cudaStream_t stream) {
    const spec::LayerConfig& c = cfg;
    const int R = static_cast<int>(c.num_ranks);
    const int64_t T = c.tokens_per_rank, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate,
                  K = c.top_k, El = c.experts_per_rank();
    host.epoch = ++epoch;
    for (int r = 0; r < R; ++r) {
      PeerBuffers& p = host.peers[r];
      p.x = in.x + r * T * H;
      p.topk = in.topk_experts + r * T * K;
      p.router_weights = in.router_weights + r * T * K;
      p.d_output = in.d_output ? in.d_output + r * T * H : nullptr;
      RankTensors& t = host.tensors[r];
      t.w_routed_gate = in.w_routed_gate + r * El * I * H;
      t.w_routed_up = in.w_routed_up + r * El * I * H;
      t.w_routed_down = in.w_routed_down + r * El * H * I;
      t.w_shared_gate = in.w_shared_gate;
      t.w_shared_up = in.w_shared_up;
      t.w_shared_down = in.w_shared_down;
      t.output = out.output ? out.output + r * T * H : nullptr;
      t.d_x = out.d_x ? out.d_x + r * T * H : nullptr;
      t.d_router_weights = out.d_router_weights ? out.d_router_weights + r * T * K : nullptr;
      t.d_w_routed_gate = out.d_w_routed_gate ? out.d_w_routed_gate + r * El * I * H : nullptr;
      t.d_w_routed_up = out.d_w_routed_up ? out.d_w_routed_up + r * El * I * H : nullptr;
      t.d_w_routed_down = out.d_w_routed_down ? out.d_w_routed_down + r * El * H * I : nullptr;
      t.d_w_shared_gate = out.d_w_shared_gate ? out.d_w_shared_gate + r * Is * H : nullptr;
      t.d_w_shared_up = out.d_w_shared_up ? out.d_w_shared_up + r * Is * H : nullptr;
      t.d_w_shared_down = out.d_w_shared_down ? out.d_w_shared_down + r * H * Is : nullptr;
    }
    // TMA maps of every K-major operand (sm_90a); any failure falls back to thread-filled tiles.
    bool maps_ok = hopper && tensor_map_encoder() != nullptr;
    for (int r = 0; r < R && maps_ok; ++r) {
      RankTensorMaps& m = host.maps[r];
      const RankState& s = host.state[r];
      const RankTensors& t = host.tensors[r];
      const int64_t cap = host.row_capacity;
      maps_ok = encode_map(&m.xd, s.xd, cap, H) && encode_map(&m.act, s.act, cap, I) &&
                encode_map(&m.dy, s.dy, cap, H) && encode_map(&m.w_routed_gate, t.w_routed_gate, El * I, H) &&
                encode_map(&m.w_routed_up, t.w_routed_up, El * I, H) &&
                encode_map(&m.w_routed_down, t.w_routed_down, El * H, I) && encode_map(&m.x, host.peers[r].x, T, H);
      if (maps_ok && Is > 0)
        maps_ok = encode_map(&m.shared_act, s.shared_act, T, Is) && encode_map(&m.w_shared_gate, t.w_shared_gate, Is, H) &&
                  encode_map(&m.w_shared_up, t.w_shared_up, Is, H) && encode_map(&m.w_shared_down, t.w_shared_down, H, Is);
    }
    host.use_tma = maps_ok && !options.disable_tma ? 1 : 0;
    MOK_CUDA(cudaMemcpyAsync(device_params, &host, sizeof(LaunchParams), cudaMemcpyHostToDevice, stream));
    MOK_CUDA(cudaMemsetAsync(control, 0, control_words * sizeof(uint32_t), stream));
    MOK_CUDA(cudaMemsetAsync(error, 0, sizeof(ErrorRecord), stream));
    const LaunchParams* arg = device_params;
    void* args[] = {&arg};
    MOK_CUDA(cudaLaunchCooperativeKernel(kernel, dim3(R * blocks_per_rank), dim3(device::kThreads), args, smem_bytes,
                                         stream));
  }
};

Layer::Layer(const spec::LayerConfig& cfg, const KernelOptions& options) : impl_(std::make_unique<Impl>()) {
  const spec::Status st = cfg.validate();
  if (!st.ok) throw Error(st.message);
  if (cfg.num_ranks > kMaxRanks) throw Error("kernel: at most 72 ranks per launch");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.options = options;
  const int R = static_cast<int>(cfg.num_ranks);
  int device = 0, sms = 0, per_sm_fwd = 0, per_sm_bwd = 0, coop = 0;
  MOK_CUDA(cudaGetDevice(&device));
  MOK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  int major = 0;
  MOK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  m.hopper = major == 9;
  if (!coop) throw Error("kernel: this GPU does not support cooperative launches", ErrorKind::kUnsupported);
  m.smem_bytes = device::smem_bytes_for(major);
  for (const void* k : {reinterpret_cast<const void*>(device::moe_forward_kernel),
                        reinterpret_cast<const void*>(device::moe_backward_kernel)})
    MOK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(m.smem_bytes)));
  MOK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_fwd, device::moe_forward_kernel, device::kThreads,
                                                         m.smem_bytes));
  MOK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_bwd, device::moe_backward_kernel, device::kThreads,
                                                         m.smem_bytes));
  const int resident = sms * std::min(per_sm_fwd, per_sm_bwd);
  m.blocks_per_rank = options.blocks_per_rank > 0 ? options.blocks_per_rank : std::min(resident / R, 64);
  if (m.blocks_per_rank * R > resident)
    throw Error("kernel: " + std::to_string(m.blocks_per_rank) + " blocks per rank x " + std::to_string(R) +
                " ranks exceed the " + std::to_string(resident) + " blocks that fit on this GPU at once");
  if (m.options.comm_blocks_per_rank == 0) m.options.comm_blocks_per_rank = std::max(1, m.blocks_per_rank / 8);
  if (m.options.comm_blocks_per_rank < 1 || m.options.comm_blocks_per_rank >= m.blocks_per_rank)
    throw Error("kernel: comm_blocks_per_rank must be at least 1 and less than blocks_per_rank (" +
                std::to_string(m.blocks_per_rank) + "); 0 picks blocks_per_rank / 8");

  const int64_t T = cfg.tokens_per_rank, H = cfg.hidden, I = cfg.intermediate, Is = cfg.shared_intermediate,
                K = cfg.top_k, G = cfg.num_tokens(), El = cfg.experts_per_rank();
  const int64_t cap = G * std::min<int64_t>(K, El);  // rows a rank can receive, worst case
  LaunchParams& P = m.host;
  P.cfg = cfg;
  P.num_ranks = R;
  P.blocks_per_rank = m.blocks_per_rank;
  P.comm_blocks_per_rank = m.options.comm_blocks_per_rank;
  P.silent_rank = options.silent_rank;
  P.row_capacity = cap;
  P.timeout_ns = static_cast<uint64_t>(options.wait_timeout_s * 1e9);
  m.control_words = R * 10 + 1;
  m.control = device_alloc<uint32_t>(m.owned, m.control_words);
  m.error = device_alloc<ErrorRecord>(m.owned, 1);
  m.device_params = device_alloc<LaunchParams>(m.owned, 1);
  m.y_slots = device_alloc<uint16_t>(m.owned, G * K * H);
  m.dx_slots = device_alloc<uint16_t>(m.owned, G * K * H);
  MOK_CUDA(cudaMemset(m.y_slots, 0, G * K * H * sizeof(uint16_t)));
  MOK_CUDA(cudaMemset(m.dx_slots, 0, G * K * H * sizeof(uint16_t)));
  P.error = m.error;
  P.abort = m.control + R * 10;
  for (int r = 0; r < R; ++r) {
    RankState& s = P.state[r];
    s.expert_offsets = device_alloc<int64_t>(m.owned, El + 1);
    s.rows = device_alloc<spec::RowRef>(m.owned, cap);
    s.row_ready = device_alloc<uint32_t>(m.owned, cap);
    s.row_ready_bwd = device_alloc<uint32_t>(m.owned, cap);
    MOK_CUDA(cudaMemset(s.row_ready, 0, cap * sizeof(uint32_t)));
    MOK_CUDA(cudaMemset(s.row_ready_bwd, 0, cap * sizeof(uint32_t)));
    s.counters = m.control + r * 10;
    s.xd = device_alloc<uint16_t>(m.owned, cap * H);
    s.dod = device_alloc<uint16_t>(m.owned, cap * H);
    s.gate = device_alloc<float>(m.owned, cap * I);
    s.up = device_alloc<float>(m.owned, cap * I);
    s.act = device_alloc<uint16_t>(m.owned, cap * I);
    s.dy = device_alloc<uint16_t>(m.owned, cap * H);
    s.d_gate = device_alloc<uint16_t>(m.owned, cap * I);
    s.d_up = device_alloc<uint16_t>(m.owned, cap * I);
    s.shared_gate = device_alloc<float>(m.owned, T * Is);
    s.shared_up = device_alloc<float>(m.owned, T * Is);
    s.shared_act = device_alloc<uint16_t>(m.owned, T * Is);
    s.shared_out = device_alloc<float>(m.owned, T * H);
    s.shared_d_gate = device_alloc<uint16_t>(m.owned, T * Is);
    s.shared_d_up = device_alloc<uint16_t>(m.owned, T * Is);
    s.dx_shared = device_alloc<float>(m.owned, T * H);
    PeerBuffers& p = P.peers[r];
    p.y_slots = m.y_slots + r * T * K * H;
    p.dx_slots = m.dx_slots + r * T * K * H;
    p.arrivals = m.control + r * 10 + 8;
  }
}

Layer::~Layer() = default;

void Layer::forward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  if (!in.x || !in.topk_experts || !in.router_weights || !in.w_routed_gate || !in.w_routed_up || !in.w_routed_down ||
      !out.output || (impl_->cfg.has_shared() && (!in.w_shared_gate || !in.w_shared_up || !in.w_shared_down)))
    throw Error("kernel forward: a required device pointer is null (x, topk_experts, router_weights, routed and "
                "shared weights, output)");
  impl_->launch(reinterpret_cast<const void*>(device::moe_forward_kernel), in, out, static_cast<cudaStream_t>(stream));
}

void Layer::backward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  if (!in.d_output || !out.d_x || !out.d_router_weights || !out.d_w_routed_gate || !out.d_w_routed_up ||
      !out.d_w_routed_down ||
      (impl_->cfg.has_shared() && (!out.d_w_shared_gate || !out.d_w_shared_up || !out.d_w_shared_down)))
    throw Error("kernel backward: a required device pointer is null (d_output, d_x, d_router_weights, weight gradients)");
  impl_->launch(reinterpret_cast<const void*>(device::moe_backward_kernel), in, out, static_cast<cudaStream_t>(stream));
}

void Layer::check_errors(void* stream) {
  MOK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  ErrorRecord e{};
  MOK_CUDA(cudaMemcpy(&e, impl_->error, sizeof e, cudaMemcpyDeviceToHost));
  if (e.code == 0) return;
  std::ostringstream s;
  if (e.code == 2) {
    const int64_t K = impl_->cfg.top_k;
    if (e.index < 0)
      s << "kernel: rank " << e.rank << " received " << e.observed << " rows, more than its workspace's "
        << e.expected << ": topk_experts repeats an expert within a row; ids must be distinct in a row";
    else
      s << "kernel: rank " << e.rank << " found invalid routing at token " << e.index / K << " slot " << e.index % K
        << " (expert id " << static_cast<int64_t>(static_cast<int32_t>(e.observed)) << ", E="
        << impl_->cfg.num_experts << "); ids must be -1 or in [0, E) and distinct in a row";
    throw Error(s.str(), ErrorKind::kBadInput);
  }
  s << "kernel: rank " << e.rank << " (block " << e.block << ") timed out after " << impl_->options.wait_timeout_s
    << " s waiting for flag '" << flag_name(e.flag) << "'";
  if (e.index >= 0) s << " [index " << e.index << "]";
  s << " to reach " << e.expected << "; it saw " << e.observed
    << ". A peer rank stopped signalling (crashed, hung, or never launched).";
  throw Error(s.str(), ErrorKind::kInternal);
}

int Layer::blocks_per_rank() const { return impl_->blocks_per_rank; }
int Layer::comm_blocks_per_rank() const { return impl_->options.comm_blocks_per_rank; }
bool Layer::uses_tma() const { return impl_->host.use_tma != 0; }
const uint16_t* Layer::y_slots() const { return impl_->y_slots; }
const uint16_t* Layer::dx_slots() const { return impl_->dx_slots; }

bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e) : "no CUDA device";
    return false;
  }
  return true;
}

ref::TensorMap run_layer(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                         const KernelOptions& options) {
  ref::validate_inputs(cfg, inputs, backward);
  std::vector<void*> owned;
  struct Free {
    std::vector<void*>& v;
    ~Free() {
      for (void* p : v) cudaFree(p);
    }
  } free_all{owned};
  auto upload = [&](const char* path) -> const void* {
    auto it = inputs.find(path);
    if (it == inputs.end()) return nullptr;
    void* d = device_alloc<uint8_t>(owned, static_cast<int64_t>(it->second.size_bytes()));
    MOK_CUDA(cudaMemcpy(d, it->second.raw(), it->second.size_bytes(), cudaMemcpyHostToDevice));
    return d;
  };
  DeviceInputs in;
  in.x = static_cast<const uint16_t*>(upload("inputs/x"));
  in.topk_experts = static_cast<const int32_t*>(upload("inputs/topk_experts"));
  in.router_weights = static_cast<const float*>(upload("inputs/router_weights"));
  in.w_shared_gate = static_cast<const uint16_t*>(upload("inputs/w_shared_gate"));
  in.w_shared_up = static_cast<const uint16_t*>(upload("inputs/w_shared_up"));
  in.w_shared_down = static_cast<const uint16_t*>(upload("inputs/w_shared_down"));
  in.w_routed_gate = static_cast<const uint16_t*>(upload("inputs/w_routed_gate"));
  in.w_routed_up = static_cast<const uint16_t*>(upload("inputs/w_routed_up"));
  in.w_routed_down = static_cast<const uint16_t*>(upload("inputs/w_routed_down"));
  if (backward) in.d_output = static_cast<const uint16_t*>(upload("inputs/d_output"));

  ref::TensorMap result;
  auto make = [&](const char* path) -> void* {
    const ref::TensorSpec* s = ref::find_spec(path);
    ref::Tensor t(s->dtype, ref::spec_shape(*s, cfg));
    void* d = device_alloc<uint8_t>(owned, static_cast<int64_t>(t.size_bytes()));
    MOK_CUDA(cudaMemset(d, 0, t.size_bytes()));
    result[path] = std::move(t);
    return d;
  };
  DeviceOutputs out;
  std::vector<std::pair<std::string, void*>> fetch;
  auto add = [&](const char* path) {
    void* d = make(path);
    fetch.push_back({path, d});
    return d;
  };
  out.output = static_cast<uint16_t*>(add("outputs/output"));
  if (backward) {
    out.d_x = static_cast<uint16_t*>(add("grads/d_x"));
    out.d_router_weights = static_cast<float*>(add("grads/d_router_weights"));
    out.d_w_routed_gate = static_cast<float*>(add("grads/d_w_routed_gate"));
    out.d_w_routed_up = static_cast<float*>(add("grads/d_w_routed_up"));
    out.d_w_routed_down = static_cast<float*>(add("grads/d_w_routed_down"));
    if (cfg.has_shared()) {
      out.d_w_shared_gate = static_cast<float*>(add("grads/d_w_shared_gate"));
      out.d_w_shared_up = static_cast<float*>(add("grads/d_w_shared_up"));
      out.d_w_shared_down = static_cast<float*>(add("grads/d_w_shared_down"));
    }
  }
  Layer layer(cfg, options);
  layer.forward(in, out);
  layer.check_errors();
  if (backward) {
    layer.backward(in, out);
    layer.check_errors();
  }
  for (auto& [path, d] : fetch)
    MOK_CUDA(cudaMemcpy(result[path].raw(), d, result[path].size_bytes(), cudaMemcpyDeviceToHost));
  // The slot buffers hold the kernel's per-slot intermediates (zeros for empty slots).
  auto slots = [&](const char* path, const uint16_t* src) {
    const ref::TensorSpec* s = ref::find_spec(path);
    ref::Tensor t(s->dtype, ref::spec_shape(*s, cfg));
    MOK_CUDA(cudaMemcpy(t.raw(), src, t.size_bytes(), cudaMemcpyDeviceToHost));
    result[path] = std::move(t);
  };
  slots("intermediates/y", layer.y_slots());
  if (backward) slots("intermediates/dx_slot", layer.dx_slots());
  return result;
}

}  // namespace mok::kernel
