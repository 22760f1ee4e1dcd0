// Host side of the fused MoE kernel: workspace, virtual-rack peer table, cooperative launches.
#include "mok/kernel/layer.hpp"

#include "../device/moe.cuh"
#include "layer_core.cuh"
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

namespace mok::kernel {
namespace detail {

void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    std::ostringstream s;
    s << "CUDA error in " << what << " (" << file << ":" << line << "): " << cudaGetErrorString(e);
    throw Error(s.str(), ErrorKind::kInternal);
  }
}

namespace {

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

// A 2D bf16 [rows, cols] row-major tensor as a TMA map with 64-column x box_rows-row boxes and
// 128-byte swizzle.
bool encode_map(TensorMapBytes* out, const void* base, int64_t rows, int64_t cols, int box_rows) {
  static_assert(sizeof(TensorMapBytes) == sizeof(CUtensorMap), "opaque tensor map must match CUtensorMap");
  auto encode = tensor_map_encoder();
  if (!encode || !base || rows <= 0 || cols <= 0) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return encode(reinterpret_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base),
                dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

std::vector<const char*> result_paths(const spec::LayerConfig& cfg, bool backward) {
  std::vector<const char*> paths{"outputs/output"};
  if (!backward) return paths;
  for (const char* p : {"grads/d_x", "grads/d_router_weights", "grads/d_w_routed_gate", "grads/d_w_routed_up",
                        "grads/d_w_routed_down"})
    paths.push_back(p);
  if (cfg.has_shared())
    for (const char* p : {"grads/d_w_shared_gate", "grads/d_w_shared_up", "grads/d_w_shared_down"}) paths.push_back(p);
  return paths;
}

DeviceOutputs outputs_from(const std::map<std::string, void*>& dev) {
  auto get = [&](const char* p) { return dev.count(p) ? dev.at(p) : nullptr; };
  DeviceOutputs out;
  out.output = static_cast<uint16_t*>(get("outputs/output"));
  out.d_x = static_cast<uint16_t*>(get("grads/d_x"));
  out.d_router_weights = static_cast<float*>(get("grads/d_router_weights"));
  out.d_w_routed_gate = static_cast<float*>(get("grads/d_w_routed_gate"));
  out.d_w_routed_up = static_cast<float*>(get("grads/d_w_routed_up"));
  out.d_w_routed_down = static_cast<float*>(get("grads/d_w_routed_down"));
  out.d_w_shared_gate = static_cast<float*>(get("grads/d_w_shared_gate"));
  out.d_w_shared_up = static_cast<float*>(get("grads/d_w_shared_up"));
  out.d_w_shared_down = static_cast<float*>(get("grads/d_w_shared_down"));
  return out;
}

const void* forward_kernel() { return reinterpret_cast<const void*>(device::moe_forward_kernel); }
const void* backward_kernel() { return reinterpret_cast<const void*>(device::moe_backward_kernel); }

LayerCore::LayerCore(const spec::LayerConfig& cfg, const KernelOptions& options, int first_rank, int local_ranks,
                     bool system_scope, int gpu_ranks)
    : options_(options), first_rank_(first_rank), local_ranks_(local_ranks) {
  host_.system_scope = system_scope ? 1 : 0;
  const spec::Status st = cfg.validate();
  if (!st.ok) throw Error(st.message);
  if (cfg.num_ranks > kMaxRanks) throw Error("kernel: at most 72 ranks per layer");
  if (first_rank < 0 || local_ranks < 1 || first_rank + local_ranks > cfg.num_ranks)
    throw Error("kernel: ranks " + std::to_string(first_rank) + ".." + std::to_string(first_rank + local_ranks - 1) +
                " are not ranks of a layer with R = " + std::to_string(cfg.num_ranks));
  // Every wait is bounded (STYLE.md): a finite, positive bound; 0, a negative value or NaN would
  // make every wait fail at once or never.
  if (!(options.wait_timeout_s > 0 && options.wait_timeout_s <= 1e6))
    throw Error("kernel: wait_timeout_s must be in (0, 1e6] seconds (the bound on every wait for a flag; 10 is the "
                "default), got " + std::to_string(options.wait_timeout_s));
  if (options.blocks_per_rank < 0)
    throw Error("kernel: blocks_per_rank must be >= 0 (0: as many as fit, divided among the ranks), got " +
                std::to_string(options.blocks_per_rank));
  int device = 0, sms = 0, per_sm_fwd = 0, per_sm_bwd = 0, coop = 0, major = 0;
  MOK_CUDA(cudaGetDevice(&device));
  MOK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  MOK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  hopper_ = major == 9;
  if (!coop) throw Error("kernel: this GPU does not support cooperative launches", ErrorKind::kUnsupported);
  // The fast engine: sm_90a, the driver's tensor-map encoder, and every GEMM dimension a whole
  // number of 64-wide TMA boxes (K chunks never straddle a tensor or expert boundary).
  // The loaded code must be the sm_90a build (a build for other targets runs its sm_80 code here).
  cudaFuncAttributes fa{};
  MOK_CUDA(cudaFuncGetAttributes(&fa, device::moe_forward_kernel));
  fast_ = hopper_ && fa.binaryVersion == 90 && !options.disable_tma && tensor_map_encoder() != nullptr &&
          cfg.hidden % 64 == 0 && cfg.intermediate % 64 == 0 && cfg.shared_intermediate % 64 == 0;
  smem_bytes_ = device::smem_bytes_for(major, fast_);
  for (const void* k : {reinterpret_cast<const void*>(device::moe_forward_kernel),
                        reinterpret_cast<const void*>(device::moe_backward_kernel)})
    MOK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes_)));
  MOK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_fwd, device::moe_forward_kernel, device::kThreads,
                                                         smem_bytes_));
  MOK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_bwd, device::moe_backward_kernel, device::kThreads,
                                                         smem_bytes_));
  const int resident = sms * std::min(per_sm_fwd, per_sm_bwd);
  const int L = local_ranks;
  // Ranks on this GPU: this launch's, or (the split rack) more, each in its own launch, all resident at once.
  const int on_gpu = gpu_ranks > 0 ? gpu_ranks : L;
  if (on_gpu < L) throw Error("kernel: gpu_ranks below the launch's own ranks", ErrorKind::kInternal);
  // Filling the GPU, the blocks that do not divide evenly go one each to the first ranks (132 SMs,
  // 8 ranks: four ranks of 17 blocks and four of 16; rank_block_of in params.hpp), so no SM idles.
  blocks_per_rank_ = options.blocks_per_rank > 0 ? options.blocks_per_rank : resident / on_gpu;
  wide_ranks_ = options.blocks_per_rank > 0 || on_gpu != L ? 0 : resident % L;
  if (int64_t{blocks_per_rank_} * on_gpu > resident)
    throw Error("kernel: " + std::to_string(blocks_per_rank_) + " blocks per rank x " + std::to_string(on_gpu) +
                " ranks exceed the " + std::to_string(resident) + " blocks that fit on this GPU at once");
  // The three rules live in block_counts.hpp (mok-bench applies them before it has a GPU); the
  // counts as given are checked, and the defaults derived from them always fit.
  switch (check_block_counts(blocks_per_rank_, options_.comm_blocks_per_rank,
                             options_.forward_comm_blocks_per_rank)) {
    case BlockCountProblem::kNone: break;
    case BlockCountProblem::kTooFewBlocks:
      throw Error("kernel: each rank needs at least 2 blocks (1 communication + 1 compute); " +
                  std::to_string(on_gpu) + (on_gpu != L ? " shares (the ranks' launches and one rank's worth left free)" : " ranks") +
                  " leave " + std::to_string(blocks_per_rank_) +
                  " each on this GPU: use fewer ranks per GPU or set blocks_per_rank");
    case BlockCountProblem::kCommNotBelowBlocks:
      throw Error("kernel: comm_blocks_per_rank must be at least 1 and less than blocks_per_rank (" +
                  std::to_string(blocks_per_rank_) + "); 0 picks blocks_per_rank - 1, got " +
                  std::to_string(options_.comm_blocks_per_rank));
    case BlockCountProblem::kForwardCommNotBelowBlocks:
      throw Error("kernel: forward_comm_blocks_per_rank must be at least 1 and less than blocks_per_rank (" +
                  std::to_string(blocks_per_rank_) + "); 0 picks min(" + std::to_string(kDefaultBulkGatherBlocks) +
                  ", comm_blocks_per_rank) with the bulk gather, comm_blocks_per_rank without; got " +
                  std::to_string(options_.forward_comm_blocks_per_rank));
  }
  // Default: every block but one gathers first, then all of them take GEMM items.
  options_.comm_blocks_per_rank = resolve_comm_blocks(blocks_per_rank_, options_.comm_blocks_per_rank);
  // The launch-invariant flags are resolved here, once. Bulk copies of peer rows are checked on
  // one GPU only (the virtual rack); the NCCL transport (system scope) keeps the thread gather
  // until it runs on several GPUs.
  host_.fast = fast_ ? 1 : 0;
  host_.bulk_gather = fast_ && options_.bulk_gather && !system_scope ? 1 : 0;
  if (options_.bulk_gather_stores < 1 || options_.bulk_gather_stores > 4)
    throw Error("kernel: bulk_gather_stores must be 1..4 (stores in flight per gathering warp), got " +
                std::to_string(options_.bulk_gather_stores));
  if (options_.bulk_gather_batch < 1 || options_.bulk_gather_batch > 16)
    throw Error("kernel: bulk_gather_batch must be 1..16 (rows flagged per fence), got " +
                std::to_string(options_.bulk_gather_batch));
  host_.direct_rows =
      fast_ && !system_scope && resolve_x_rows(options_.x_rows, cfg.hidden) == XRows::kDirect ? 1 : 0;
  host_.bulk_gather_stores = options_.bulk_gather_stores;
  host_.bulk_gather_batch = options_.bulk_gather_batch;
  host_.staged_swiglu = fast_ && resolve_swiglu(options_.swiglu, cfg.hidden) == SwigluEpilogue::kStaged ? 1 : 0;
  if (options_.group_rows < 1 || options_.group_rows > 64)
    throw Error("kernel: group_rows must be 1..64 (row tiles per group of GEMM items; 8 is the default), got " +
                std::to_string(options_.group_rows));
  host_.group_rows = options_.group_rows;
  host_.shared_items = options_.shared_items && options_.silent_rank < 0 && local_ranks > 1 ? 1 : 0;
  options_.forward_comm_blocks_per_rank = resolve_forward_comm_blocks(
      options_.comm_blocks_per_rank, options_.forward_comm_blocks_per_rank, host_.bulk_gather != 0);

  const int64_t T = cfg.tokens_per_rank, H = cfg.hidden, I = cfg.intermediate, Is = cfg.shared_intermediate,
                K = cfg.top_k, G = cfg.num_tokens(), El = cfg.experts_per_rank();
  const int64_t worst = G * std::min<int64_t>(K, El);  // rows a rank can receive, worst case
  if (options.row_capacity < 0) throw Error("kernel: row_capacity must be >= 0 (0: the worst case G * min(K, E/R))");
  const int64_t cap = options.row_capacity > 0 ? std::min(options.row_capacity, worst) : worst;
  const int64_t tile_counters = cap / device::kTileM + El + T / device::kTileM + 2;
  LaunchParams& P = host_;
  P.cfg = cfg;
  P.num_ranks = static_cast<int32_t>(cfg.num_ranks);
  P.first_rank = first_rank;
  P.local_ranks = L;
  P.blocks_per_rank = blocks_per_rank_;
  P.wide_ranks = wide_ranks_;
  P.comm_blocks_per_rank = options_.comm_blocks_per_rank;
  P.comm_blocks_forward = options_.forward_comm_blocks_per_rank;
  P.silent_rank = options.silent_rank;
  P.row_capacity = cap;
  P.timeout_ns = static_cast<uint64_t>(options.wait_timeout_s * 1e9);
  control_words_ = int64_t{L} * 8 + 1 + int64_t{L} * tile_counters + int64_t{L} * El;
  control_ = device_alloc<uint32_t>(owned_, control_words_);
  error_ = device_alloc<ErrorRecord>(owned_, 1);
  MOK_CUDA(cudaMemset(error_, 0, sizeof(ErrorRecord)));  // cleared here and by check_errors() only
  host_maps_.assign(2 * kMaxRanks, RankTensorMaps{});
  sent_maps_.assign(kMapSlots * 2 * kMaxRanks, RankTensorMaps{});
  maps_sent_.assign(kMapSlots, 0);
  device_maps_ = device_alloc<RankTensorMaps>(owned_, kMapSlots * 2 * kMaxRanks);
  P.maps = device_maps_;
  P.error = error_;
  P.abort = control_ + int64_t{L} * 8;
  if (options.trace) trace_ = device_alloc<uint64_t>(owned_, int64_t{launch_blocks()} * kTraceSlots);
  P.trace = trace_;
  for (int r = first_rank; r < first_rank + L; ++r) {
    RankState& s = P.state[r];
    s.expert_offsets = device_alloc<int64_t>(owned_, El + 1);
    MOK_CUDA(cudaMemset(s.expert_offsets, 0, (El + 1) * sizeof(int64_t)));  // an empty plan until a forward
    s.block_counts = device_alloc<uint32_t>(owned_, El * block_counts_stride(blocks_per_rank_));
    // Rows are written whole by every forward's count; the padding past blocks_per_rank, which the
    // plan's 16-byte loads read and ignore, is zeroed once so that no read is of uninitialised memory.
    MOK_CUDA(cudaMemset(s.block_counts, 0, El * block_counts_stride(blocks_per_rank_) * sizeof(uint32_t)));
    s.rows = device_alloc<spec::RowRef>(owned_, cap);
    s.row_ready = device_alloc<uint32_t>(owned_, cap);
    s.row_ready_bwd = device_alloc<uint32_t>(owned_, cap);
    MOK_CUDA(cudaMemset(s.row_ready, 0, cap * sizeof(uint32_t)));
    MOK_CUDA(cudaMemset(s.row_ready_bwd, 0, cap * sizeof(uint32_t)));
    s.counters = control_ + int64_t{r - first_rank} * 8;
    s.tiles_done = control_ + int64_t{L} * 8 + 1 + int64_t{r - first_rank} * tile_counters;
    s.expert_counts = control_ + int64_t{L} * 8 + 1 + int64_t{L} * tile_counters + int64_t{r - first_rank} * El;
    s.xd = device_alloc<uint16_t>(owned_, cap * H);
    s.gate = device_alloc<float>(owned_, cap * I);
    s.up = device_alloc<float>(owned_, cap * I);
    s.act = device_alloc<uint16_t>(owned_, cap * I);
    s.dy = device_alloc<uint16_t>(owned_, cap * H);
    s.d_gate = device_alloc<uint16_t>(owned_, cap * I);
    s.d_up = device_alloc<uint16_t>(owned_, cap * I);
    s.shared_gate = device_alloc<float>(owned_, T * Is);
    s.shared_up = device_alloc<float>(owned_, T * Is);
    s.shared_act = device_alloc<uint16_t>(owned_, T * Is);
    s.shared_out = device_alloc<float>(owned_, T * H);
    s.shared_d_gate = device_alloc<uint16_t>(owned_, T * Is);
    s.shared_d_up = device_alloc<uint16_t>(owned_, T * Is);
    s.dx_shared = device_alloc<float>(owned_, T * H);
  }
  (void)K;
  // The cudaMemset calls above run on the legacy default stream: done before a pass is launched
  // on any stream (a non-blocking one included).
  MOK_CUDA(cudaDeviceSynchronize());
}

LayerCore::~LayerCore() {
  for (void* p : owned_) cudaFree(p);
}

void LayerCore::set_tensors(int r, const DeviceInputs& in, const DeviceOutputs& out, bool global_layout) {
  const spec::LayerConfig& c = host_.cfg;
  const int64_t T = c.tokens_per_rank, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, K = c.top_k,
                El = c.experts_per_rank();
  // With the global layout, rank r's slices start r ranks in; otherwise the arrays are rank r's own.
  const int64_t q = global_layout ? r : 0;
  RankTensors& t = host_.tensors[r];
  t.w_routed_gate = in.w_routed_gate + q * El * I * H;
  t.w_routed_up = in.w_routed_up + q * El * I * H;
  t.w_routed_down = in.w_routed_down + q * El * H * I;
  t.w_shared_gate = in.w_shared_gate;
  t.w_shared_up = in.w_shared_up;
  t.w_shared_down = in.w_shared_down;
  t.output = out.output ? out.output + q * T * H : nullptr;
  t.d_x = out.d_x ? out.d_x + q * T * H : nullptr;
  t.d_router_weights = out.d_router_weights ? out.d_router_weights + q * T * K : nullptr;
  t.d_w_routed_gate = out.d_w_routed_gate ? out.d_w_routed_gate + q * El * I * H : nullptr;
  t.d_w_routed_up = out.d_w_routed_up ? out.d_w_routed_up + q * El * I * H : nullptr;
  t.d_w_routed_down = out.d_w_routed_down ? out.d_w_routed_down + q * El * H * I : nullptr;
  t.d_w_shared_gate = out.d_w_shared_gate ? out.d_w_shared_gate + q * Is * H : nullptr;
  t.d_w_shared_up = out.d_w_shared_up ? out.d_w_shared_up + q * Is * H : nullptr;
  t.d_w_shared_down = out.d_w_shared_down ? out.d_w_shared_down + q * H * Is : nullptr;
}

void LayerCore::launch(const void* kernel, cudaStream_t stream) {
  const spec::LayerConfig& c = host_.cfg;
  const int64_t T = c.tokens_per_rank, H = c.hidden, I = c.intermediate, Is = c.shared_intermediate,
                El = c.experts_per_rank();
  host_.epoch = ++epoch_;
  // TMA maps of every operand of the fast engine: the MN-major set (64-row boxes) and the K-major
  // set (kKMajorBoxRows-row boxes) of each rank (params.hpp).
  for (int r = first_rank_; r < first_rank_ + local_ranks_ && fast_; ++r) {
    const RankState& s = host_.state[r];
    const RankTensors& t = host_.tensors[r];
    const int64_t cap = host_.row_capacity;
    for (const int set : {0, 1}) {
      RankTensorMaps& m = host_maps_[set * kMaxRanks + r];
      const int br = set ? kKMajorBoxRows : 64;
      bool ok = encode_map(&m.xd, s.xd, cap, H, br) && encode_map(&m.act, s.act, cap, I, br) &&
                encode_map(&m.dy, s.dy, cap, H, br) && encode_map(&m.d_gate, s.d_gate, cap, I, br) &&
                encode_map(&m.d_up, s.d_up, cap, I, br) &&
                encode_map(&m.w_routed_gate, t.w_routed_gate, El * I, H, br) &&
                encode_map(&m.w_routed_up, t.w_routed_up, El * I, H, br) &&
                encode_map(&m.w_routed_down, t.w_routed_down, El * H, I, br) &&
                encode_map(&m.x, host_.peers[r].x, T, H, br);
      if (ok && host_.peers[r].d_output) ok = encode_map(&m.d_output, host_.peers[r].d_output, T, H, br);
      if (ok && Is > 0)
        ok = encode_map(&m.shared_act, s.shared_act, T, Is, br) &&
             encode_map(&m.shared_d_gate, s.shared_d_gate, T, Is, br) &&
             encode_map(&m.shared_d_up, s.shared_d_up, T, Is, br) &&
             encode_map(&m.w_shared_gate, t.w_shared_gate, Is, H, br) &&
             encode_map(&m.w_shared_up, t.w_shared_up, Is, H, br) &&
             encode_map(&m.w_shared_down, t.w_shared_down, H, Is, br);
      if (!ok)
        throw Error("kernel: the driver refused a TMA tensor map for rank " + std::to_string(r) +
                        " (are the device pointers 16-byte aligned?); KernelOptions::disable_tma runs without them",
                    ErrorKind::kInternal);
    }
  }
  // Only the maps go through device memory (the rest is the kernel parameter, copied by the launch),
  // and a rank's only when they changed: a loop over the same tensors (mok-bench's timed passes)
  // copies them once, so no host-to-device copy sits between its launches. Launches of one layer
  // are ordered on their stream, so the device array holds what sent_maps_ says when the kernel reads it.
  // The windowed transports alternate the window copies of x and d_output (by parity), so the device
  // keeps kMapSlots sets: a launch uses the slot that already holds its maps, else overwrites the
  // next slot in turn (the copy is ordered on the stream after the launches that read the slot).
  if (fast_) {
    auto holds = [&](int slot) {
      if (!maps_sent_[slot]) return false;
      for (int r = first_rank_; r < first_rank_ + local_ranks_; ++r)
        for (const int i : {r, kMaxRanks + r})
          if (std::memcmp(&sent_maps_[slot * 2 * kMaxRanks + i], &host_maps_[i], sizeof(RankTensorMaps)) != 0)
            return false;
      return true;
    };
    int slot = -1;
    for (int k = 0; k < kMapSlots && slot < 0; ++k)
      if (holds(k)) slot = k;
    if (slot < 0) {
      slot = next_map_slot_;
      next_map_slot_ = (next_map_slot_ + 1) % kMapSlots;
      for (int r = first_rank_; r < first_rank_ + local_ranks_; ++r)
        for (const int i : {r, kMaxRanks + r}) {
          RankTensorMaps* dst = device_maps_ + slot * 2 * kMaxRanks + i;
          MOK_CUDA(cudaMemcpyAsync(dst, &host_maps_[i], sizeof(RankTensorMaps), cudaMemcpyHostToDevice, stream));
          sent_maps_[slot * 2 * kMaxRanks + i] = host_maps_[i];
        }
      maps_sent_[slot] = 1;
    }
    host_.maps = device_maps_ + slot * 2 * kMaxRanks;
  }
  MOK_CUDA(cudaMemsetAsync(control_, 0, control_words_ * sizeof(uint32_t), stream));
  // The error record is not cleared here: the first error since the last check_errors() stays,
  // so forward(); backward(); check_errors(); reports a failed forward rather than losing it to
  // the backward's launch (and the backward refuses a plan the forward left incomplete).
  if (trace_)
    MOK_CUDA(cudaMemsetAsync(trace_, 0, int64_t{launch_blocks()} * kTraceSlots * sizeof(uint64_t), stream));
  void* args[] = {&host_};
  if (cooperative_)
    MOK_CUDA(cudaLaunchCooperativeKernel(kernel, dim3(launch_blocks()), dim3(device::kThreads), args,
                                         smem_bytes_, stream));
  else
    MOK_CUDA(cudaLaunchKernel(kernel, dim3(launch_blocks()), dim3(device::kThreads), args, smem_bytes_, stream));
  if (kernel == forward_kernel()) forward_launched_ = true;  // launched (whether it succeeds, check_errors says)
}

void LayerCore::require_forward() const {
  // The backward reuses the forward's routing plan and intermediates in the workspace; checked
  // before a transport does anything for the pass (memsets, barriers, window copies).
  if (!forward_launched_)
    throw Error("kernel: backward before any forward on this layer: the backward reuses the forward's routing plan "
                "and intermediates (the same inputs); run forward() first",
                ErrorKind::kBadInput);
}

std::vector<uint64_t> LayerCore::read_trace(cudaStream_t stream) const {
  if (!trace_) return {};
  std::vector<uint64_t> out(static_cast<size_t>(launch_blocks()) * kTraceSlots);
  MOK_CUDA(cudaStreamSynchronize(stream));
  MOK_CUDA(cudaMemcpy(out.data(), trace_, out.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  return out;
}

void LayerCore::check_errors(cudaStream_t stream) {
  MOK_CUDA(cudaStreamSynchronize(stream));
  ErrorRecord e{};
  MOK_CUDA(cudaMemcpy(&e, error_, sizeof e, cudaMemcpyDeviceToHost));
  if (e.code == 0) return;
  last_error_code_ = e.code;
  // Reported once; the next pass starts clean (ordered on the caller's stream, before its next launch).
  MOK_CUDA(cudaMemsetAsync(error_, 0, sizeof(ErrorRecord), stream));
  std::ostringstream s;
  if (e.code == 3)
    throw Error("kernel: rank " + std::to_string(e.rank) + "'s backward found the routing plan of " +
                    std::to_string(e.observed) + " rows, more than its workspace's " + std::to_string(e.expected) +
                    ": the forward before it failed (an error reported by the forward's check_errors()); run a "
                    "forward that succeeds first",
                ErrorKind::kBadInput);
  if (e.code == 4) {
    const int64_t K = host_.cfg.top_k, T = host_.cfg.tokens_per_rank;
    const int64_t entry = weight_error_entry(e.weight_key), g = entry / K;
    const uint32_t bits = weight_error_bits(e.weight_key);
    float w;
    std::memcpy(&w, &bits, sizeof w);
    s << "kernel: a non-finite router weight at token " << g << " (rank " << g / T << "'s token " << g % T
      << ") slot " << entry % K << ": " << (std::isnan(w) ? "NaN" : w > 0 ? "+Inf" : "-Inf") << " (bits 0x"
      << std::hex << bits << std::dec
      << "; the first in token order); router weights must be finite, empty slots' too. The pass stopped "
         "before any result was written";
    throw Error(s.str(), ErrorKind::kBadInput);
  }
  if (e.code == 2) {
    const int64_t K = host_.cfg.top_k;
    if (e.index < 0)
      s << "kernel: rank " << e.rank << " received " << e.observed << " rows, more than its workspace's "
        << e.expected << ": either topk_experts repeats an expert within a row (ids must be distinct in a row) "
        << "or KernelOptions::row_capacity is below the routing's rows per rank (0 sizes for the worst case)";
    else
      s << "kernel: rank " << e.rank << " found invalid routing at token " << e.index / K << " slot " << e.index % K
        << " (expert id " << static_cast<int64_t>(static_cast<int32_t>(e.observed)) << ", E="
        << host_.cfg.num_experts << "); ids must be -1 or in [0, E) and distinct in a row";
    throw Error(s.str(), ErrorKind::kBadInput);
  }
  if (e.flag == kFlagPassEntry) {  // windowed transports: e.rank is the rank waited for (enter_pass, stage_wait)
    s << "kernel: rank " << first_rank_ << (e.block < 0 ? "'s staging of pass " : "'s entry into pass ")
      << (e.block < 0 ? e.expected + 1 : e.expected) << " timed out after " << options_.wait_timeout_s
      << " s: rank " << e.rank << " had not entered pass " << e.expected << " (its pass word read " << e.observed
      << "; flag '" << flag_name(e.flag) << "'). That rank stopped (crashed, hung, or never launched: look for its "
      << "own error first), or its launch could not start beside the others (the split rack needs every rank's "
      << "launch at once: not under CUDA_LAUNCH_BLOCKING, a serialising tool, MPS or MIG limits); under a profiler "
      << "or sanitizer, which slow the kernel, raise KernelOptions::wait_timeout_s.";
    throw Error(s.str(), ErrorKind::kInternal);
  }
  s << "kernel: rank " << e.rank << " (block " << e.block << ") timed out after " << options_.wait_timeout_s
    << " s waiting for flag '" << flag_name(e.flag) << "'";
  if (e.index >= 0) s << " [index " << e.index << "]";
  s << " to reach " << e.expected << "; it saw " << e.observed
    << ". A peer rank stopped signalling (crashed, hung, or never launched): look for its own error first; "
       "under a profiler or sanitizer, which slow the kernel, raise KernelOptions::wait_timeout_s.";
  throw Error(s.str(), ErrorKind::kInternal);
}

}  // namespace detail

using detail::device_alloc;

// The virtual rack: R ranks on this GPU in one launch; every rank's buffers are plain device
// pointers, the slot buffers and arrival counters live in one allocation each.
struct Layer::Impl {
  detail::LayerCore core;
  uint16_t* y_slots = nullptr;
  uint16_t* dx_slots = nullptr;
  uint32_t* arrivals = nullptr;  // [R][2]
  float* acc = nullptr;          // [G, H]: the atomics variant's accumulators (see moe.cuh)
  Impl(const spec::LayerConfig& cfg, const KernelOptions& options)
      : core(cfg, options, 0, static_cast<int>(cfg.num_ranks)) {
    const int64_t G = cfg.num_tokens(), K = cfg.top_k, H = cfg.hidden, T = cfg.tokens_per_rank;
    y_slots = device_alloc<uint16_t>(core.owned(), G * K * H);
    dx_slots = device_alloc<uint16_t>(core.owned(), G * K * H);
    arrivals = device_alloc<uint32_t>(core.owned(), 2 * cfg.num_ranks);
    MOK_CUDA(cudaMemset(y_slots, 0, G * K * H * sizeof(uint16_t)));
    MOK_CUDA(cudaMemset(dx_slots, 0, G * K * H * sizeof(uint16_t)));
    if (device::kAtomics) acc = device_alloc<float>(core.owned(), G * H);
    for (int r = 0; r < cfg.num_ranks; ++r) {
      PeerBuffers& p = core.peer(r);
      p.y_slots = y_slots + r * T * K * H;
      p.dx_slots = dx_slots + r * T * K * H;
      p.arrivals = arrivals + 2 * r;
      p.acc = acc ? acc + r * T * H : nullptr;
    }
  }
  void launch(const void* kernel, const DeviceInputs& in, const DeviceOutputs& out, cudaStream_t stream) {
    const spec::LayerConfig& c = core.cfg();
    const int64_t T = c.tokens_per_rank, H = c.hidden, K = c.top_k;
    for (int r = 0; r < c.num_ranks; ++r) {
      PeerBuffers& p = core.peer(r);
      p.x = in.x + r * T * H;
      p.topk = in.topk_experts + r * T * K;
      p.router_weights = in.router_weights + r * T * K;
      p.d_output = in.d_output ? in.d_output + r * T * H : nullptr;
      core.set_tensors(r, in, out, true);
    }
    MOK_CUDA(cudaMemsetAsync(arrivals, 0, 2 * c.num_ranks * sizeof(uint32_t), stream));
    if (device::kAtomics) {
      // Atomic sums start from zero: the accumulators, and for the backward the weight gradients.
      MOK_CUDA(cudaMemsetAsync(acc, 0, c.num_tokens() * H * sizeof(float), stream));
      if (kernel == reinterpret_cast<const void*>(device::moe_backward_kernel)) {
        const int64_t EIH = c.num_experts * c.intermediate * H, sIH = c.num_ranks * c.shared_intermediate * H;
        for (float* d : {out.d_w_routed_gate, out.d_w_routed_up, out.d_w_routed_down})
          MOK_CUDA(cudaMemsetAsync(d, 0, EIH * sizeof(float), stream));
        if (c.has_shared())
          for (float* d : {out.d_w_shared_gate, out.d_w_shared_up, out.d_w_shared_down})
            MOK_CUDA(cudaMemsetAsync(d, 0, sIH * sizeof(float), stream));
      }
    }
    core.launch(kernel, stream);
  }
};

Layer::Layer(const spec::LayerConfig& cfg, const KernelOptions& options) : impl_(std::make_unique<Impl>(cfg, options)) {}

Layer::~Layer() = default;

namespace detail {

void check_pass_pointers(const spec::LayerConfig& cfg, const DeviceInputs& in, const DeviceOutputs& out,
                         bool backward, const char* who) {
  const bool shared = cfg.has_shared();
  // What each pass reads or writes (the backward reads the forward's inputs too: x, the routing
  // and the weights, through its tensor maps and its gradients).
  const struct {
    const char* name;
    const void* p;
    bool needed;
  } ptrs[] = {
      {"in.x", in.x, true},
      {"in.topk_experts", in.topk_experts, true},
      {"in.router_weights", in.router_weights, true},
      {"in.w_routed_gate", in.w_routed_gate, true},
      {"in.w_routed_up", in.w_routed_up, true},
      {"in.w_routed_down", in.w_routed_down, true},
      {"in.w_shared_gate", in.w_shared_gate, shared},
      {"in.w_shared_up", in.w_shared_up, shared},
      {"in.w_shared_down", in.w_shared_down, shared},
      {"out.output", out.output, !backward},
      {"in.d_output", in.d_output, backward},
      {"out.d_x", out.d_x, backward},
      {"out.d_router_weights", out.d_router_weights, backward},
      {"out.d_w_routed_gate", out.d_w_routed_gate, backward},
      {"out.d_w_routed_up", out.d_w_routed_up, backward},
      {"out.d_w_routed_down", out.d_w_routed_down, backward},
      {"out.d_w_shared_gate", out.d_w_shared_gate, backward && shared},
      {"out.d_w_shared_up", out.d_w_shared_up, backward && shared},
      {"out.d_w_shared_down", out.d_w_shared_down, backward && shared},
  };
  for (const auto& q : ptrs) {
    if (!q.needed) continue;
    if (!q.p)
      throw Error(std::string(who) + (backward ? " backward" : " forward") + ": " + q.name +
                  " is null; every tensor the pass reads or writes needs a device pointer (layer.hpp)");
    if (reinterpret_cast<uintptr_t>(q.p) % 16 != 0)
      throw Error(std::string(who) + (backward ? " backward" : " forward") + ": " + q.name +
                  " is not 16-byte aligned; the kernel moves rows in 16-byte accesses (cudaMalloc gives 256)");
  }
}

}  // namespace detail

void Layer::forward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  detail::check_pass_pointers(impl_->core.cfg(), in, out, false, "kernel");
  impl_->launch(reinterpret_cast<const void*>(device::moe_forward_kernel), in, out, static_cast<cudaStream_t>(stream));
}

void Layer::backward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  impl_->core.require_forward();
  detail::check_pass_pointers(impl_->core.cfg(), in, out, true, "kernel");
  impl_->launch(reinterpret_cast<const void*>(device::moe_backward_kernel), in, out, static_cast<cudaStream_t>(stream));
}

void Layer::check_errors(void* stream) { impl_->core.check_errors(static_cast<cudaStream_t>(stream)); }
int Layer::blocks_per_rank() const { return impl_->core.blocks_per_rank(); }
int Layer::wide_ranks() const { return impl_->core.wide_ranks(); }
int Layer::launch_blocks() const { return impl_->core.launch_blocks(); }
std::vector<uint64_t> Layer::trace(void* stream) const {
  return impl_->core.read_trace(static_cast<cudaStream_t>(stream));
}
int Layer::comm_blocks_per_rank() const { return impl_->core.options().comm_blocks_per_rank; }
int Layer::forward_comm_blocks_per_rank() const { return impl_->core.options().forward_comm_blocks_per_rank; }
bool Layer::uses_tma() const { return impl_->core.uses_tma(); }
const uint16_t* Layer::y_slots() const { return impl_->y_slots; }
const uint16_t* Layer::dx_slots() const { return impl_->dx_slots; }

namespace detail {

namespace {

// The intermediates a rank's workspace holds, in golden order: routed ones per row of the rank's
// experts ([G,K,.] slots), the shared expert's per token of the rank ([G,.] rows).
struct WorkspaceTensor {
  const char* path;
  bool backward;  // written by the backward pass
  bool shared;    // per token (shared expert) rather than per routed row
  char width;     // 'I', 'H' or 'S' (Is): elements per row
  const void* (*src)(const RankState&);
};
constexpr WorkspaceTensor kWorkspaceTensors[] = {
    {"intermediates/gate", false, false, 'I', [](const RankState& s) -> const void* { return s.gate; }},
    {"intermediates/up", false, false, 'I', [](const RankState& s) -> const void* { return s.up; }},
    {"intermediates/act", false, false, 'I', [](const RankState& s) -> const void* { return s.act; }},
    {"intermediates/dy", true, false, 'H', [](const RankState& s) -> const void* { return s.dy; }},
    {"intermediates/d_gate", true, false, 'I', [](const RankState& s) -> const void* { return s.d_gate; }},
    {"intermediates/d_up", true, false, 'I', [](const RankState& s) -> const void* { return s.d_up; }},
    {"intermediates/shared_gate", false, true, 'S', [](const RankState& s) -> const void* { return s.shared_gate; }},
    {"intermediates/shared_up", false, true, 'S', [](const RankState& s) -> const void* { return s.shared_up; }},
    {"intermediates/shared_act", false, true, 'S', [](const RankState& s) -> const void* { return s.shared_act; }},
    {"intermediates/shared_out", false, true, 'H', [](const RankState& s) -> const void* { return s.shared_out; }},
    {"intermediates/shared_d_gate", true, true, 'S', [](const RankState& s) -> const void* { return s.shared_d_gate; }},
    {"intermediates/shared_d_up", true, true, 'S', [](const RankState& s) -> const void* { return s.shared_d_up; }},
    {"intermediates/dx_shared", true, true, 'H', [](const RankState& s) -> const void* { return s.dx_shared; }},
};

bool held(const WorkspaceTensor& w, const spec::LayerConfig& cfg, bool backward) {
  return (backward || !w.backward) && (cfg.has_shared() || !w.shared);
}

}  // namespace

std::vector<const char*> workspace_intermediate_paths(const spec::LayerConfig& cfg, bool backward) {
  std::vector<const char*> paths;
  for (const WorkspaceTensor& w : kWorkspaceTensors)
    if (held(w, cfg, backward)) paths.push_back(w.path);
  return paths;
}

void copy_rank_intermediates(const LayerCore& core, int r, bool backward, ref::TensorMap& result) {
  const spec::LayerConfig& c = core.cfg();
  const int64_t K = c.top_k, T = c.tokens_per_rank, El = c.experts_per_rank();
  MOK_CUDA(cudaDeviceSynchronize());
  const RankState& st = core.state(r);
  std::vector<int64_t> offsets(static_cast<size_t>(El + 1));
  MOK_CUDA(cudaMemcpy(offsets.data(), st.expert_offsets, offsets.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  const int64_t n = offsets[El] - offsets[0];
  std::vector<spec::RowRef> rows(static_cast<size_t>(n));
  MOK_CUDA(cudaMemcpy(rows.data(), st.rows + offsets[0], rows.size() * sizeof(spec::RowRef), cudaMemcpyDeviceToHost));
  for (const WorkspaceTensor& w : kWorkspaceTensors) {
    if (!held(w, c, backward)) continue;
    ref::Tensor& t = result.at(w.path);
    const int64_t width = w.width == 'I' ? c.intermediate : w.width == 'H' ? c.hidden : c.shared_intermediate;
    const size_t row_bytes = static_cast<size_t>(width) * ref::dtype_size(t.dtype());
    const uint8_t* src = static_cast<const uint8_t*>(w.src(st));
    if (w.shared) {  // rank r's tokens are global tokens r*T .. r*T + T - 1
      MOK_CUDA(cudaMemcpy(static_cast<uint8_t*>(t.raw()) + r * T * row_bytes, src, T * row_bytes,
                          cudaMemcpyDeviceToHost));
      continue;
    }
    // Workspace row i (canonical order of the rank's experts) is slot (token, slot) of the layer.
    std::vector<uint8_t> buf(static_cast<size_t>(n) * row_bytes);
    MOK_CUDA(cudaMemcpy(buf.data(), src + offsets[0] * row_bytes, buf.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = int64_t{rows[i].token_idx} * K + rows[i].slot_idx;
      std::memcpy(static_cast<uint8_t*>(t.raw()) + slot * row_bytes, buf.data() + i * row_bytes, row_bytes);
    }
  }
}

}  // namespace detail

void Layer::copy_intermediates(ref::TensorMap& result, bool backward) const {
  const spec::LayerConfig& c = impl_->core.cfg();
  // Every path gets a fresh zeroed tensor (a slot without a row stays zero, whatever `result`
  // held before); the ranks then fill their rows and tokens.
  for (const char* path : detail::workspace_intermediate_paths(c, backward)) {
    const ref::TensorSpec* s = ref::find_spec(path);
    result[path] = ref::Tensor(s->dtype, ref::spec_shape(*s, c));
  }
  for (int r = 0; r < c.num_ranks; ++r) detail::copy_rank_intermediates(impl_->core, r, backward, result);
}

int64_t rows_per_rank(const spec::LayerConfig& cfg, const int32_t* topk_experts) {
  const int64_t El = cfg.experts_per_rank(), GK = cfg.num_tokens() * cfg.top_k;
  std::vector<int64_t> rows(static_cast<size_t>(cfg.num_ranks), 0);
  for (int64_t i = 0; i < GK; ++i)
    if (topk_experts[i] >= 0 && topk_experts[i] < cfg.num_experts) ++rows[static_cast<size_t>(topk_experts[i] / El)];
  return rows.empty() ? 0 : *std::max_element(rows.begin(), rows.end());
}

bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    // Without an NVIDIA driver (a machine with no GPU) the runtime reports an insufficient driver
    // version; say the likelier cause first, and keep the runtime's words.
    if (why)
      *why = e == cudaErrorInsufficientDriver
                 ? std::string("no usable CUDA device: no NVIDIA driver or GPU found, or a driver older than this "
                               "build's CUDA runtime (CUDA: ") + cudaGetErrorString(e) + ")"
             : e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e)
                                : "no CUDA device";
    return false;
  }
  return true;
}

ref::TensorMap run_layer(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                         const KernelOptions& options, bool workspace_intermediates) {
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
  std::map<std::string, void*> dev;
  for (const char* p : detail::result_paths(cfg, backward)) dev[p] = make(p);
  const DeviceOutputs out = detail::outputs_from(dev);
  KernelOptions sized = options;
  if (sized.row_capacity == 0)  // exactly what this routing needs (at least one row)
    sized.row_capacity = std::max<int64_t>(
        1, rows_per_rank(cfg, reinterpret_cast<const int32_t*>(inputs.at("inputs/topk_experts").raw())));
  Layer layer(cfg, sized);
  layer.forward(in, out);
  layer.check_errors();
  if (backward) {
    layer.backward(in, out);
    layer.check_errors();
  }
  for (auto& [path, d] : dev)
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
  if (workspace_intermediates) layer.copy_intermediates(result, backward);
  return result;
}

}  // namespace mok::kernel
