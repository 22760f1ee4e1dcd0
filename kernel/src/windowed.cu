// The windowed transports' host side (windowed.cuh) and the split rack (split_rack.hpp).
#include "windowed.cuh"

#include "../device/sync.cuh"

#include "mok/kernel/split_rack.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"
#include "mok/reference/validate.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace mok::kernel::detail {

namespace {
size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

WindowLayout WindowLayout::of(const spec::LayerConfig& c, size_t alignment, int copies) {
  const size_t T = c.tokens_per_rank, H = c.hidden, K = c.top_k;
  WindowLayout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at = align_up(at + bytes, 256);
    return off;
  };
  for (int b = 0; b < 2; ++b) {
    if (b == 1 && copies == 1) {
      l.x[1] = l.x[0], l.topk[1] = l.topk[0], l.rw[1] = l.rw[0], l.d_output[1] = l.d_output[0];
      break;
    }
    l.x[b] = take(T * H * 2);
    l.topk[b] = take(T * K * 4);
    l.rw[b] = take(T * K * 4);
    l.d_output[b] = take(T * H * 2);
  }
  l.y_slots = take(T * K * H * 2);
  l.dx_slots = take(T * K * H * 2);
  l.arrivals = take(2 * 4);
  l.pass_word = take(4);
  l.total = align_up(at, std::max<size_t>(alignment, 1));
  return l;
}

namespace {

// What the staging kernel of one pass does (WindowPasses::pass).
struct StageParams {
  const uint32_t* words[kMaxRanks];  // every rank's pass word
  int32_t ranks;
  uint32_t previous;                 // wait until every word >= this (the pass before this one; 0: none)
  int32_t copies;
  const uint8_t* src[3];
  uint8_t* dst[3];
  uint64_t bytes[3];
  uint32_t* arrivals;                // [2], reset once the wait is over
  ErrorRecord* error;
  uint64_t timeout_ns;
  int32_t system_scope;
};


// One thread waits, bounded, until every rank has entered the previous pass (so every rank has
// finished the one before it, the last to read the copy stage_copy writes). On a timeout the
// error record names the missing rank (flag "pass entry"); a rank with an error pending does not
// wait. One block: while it polls it holds a few registers of one SM, never the SMs that another
// rank's launch on the same GPU (the split rack) needs to start.
__global__ void stage_wait(const __grid_constant__ StageParams p) {
  if (threadIdx.x != 0) return;
  if (device::load_volatile(&p.error->code) != 0u) return;
  const uint64_t start = device::global_time_ns();
  // ORDER: ranks ascending, so that a missing rank is reported the same way every time.
  for (int q = 0; q < p.ranks; ++q) {
    for (;;) {
      const uint32_t seen = device::load_volatile(p.words[q]);
      if (seen >= p.previous) break;
      if (device::global_time_ns() - start > p.timeout_ns) {
        if (atomicCAS(&p.error->code, 0u, 1u) == 0u) {
          p.error->rank = q;
          p.error->flag = kFlagPassEntry;
          p.error->block = -1;  // the staging kernel, not a block of the layer's
          p.error->expected = p.previous;
          p.error->observed = seen;
          p.error->index = q;
          __threadfence();
        }
        return;
      }
      __nanosleep(256);
    }
  }
}

// After stage_wait on the same stream: unless an error is pending (the wait timed out, or an
// earlier pass failed), the blocks copy this pass's inputs into the window and block 0 resets the
// arrival counters; then the layer's kernel, finding any error, does not enter the pass.
__global__ void stage_copy(const __grid_constant__ StageParams p) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = device::load_volatile(&p.error->code) == 0u ? 1 : 0;
    // What stage_wait saw of the peers' words orders what follows (its writes are visible here:
    // kernel boundary); the peers' reads of the old copy ended before they entered the pass.
    if (p.system_scope)
      __threadfence_system();
    else
      __threadfence();
  }
  __syncthreads();
  if (!ok) return;
  const uint64_t threads = uint64_t{gridDim.x} * blockDim.x, me = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int c = 0; c < p.copies; ++c) {
    const uint8_t* src = p.src[c];
    uint8_t* dst = p.dst[c];
    const uint64_t n = p.bytes[c];
    // 16-byte pieces where both ends are 16-byte aligned (the window's offsets are; inputs must be,
    // check_pass_pointers), single bytes for the rest.
    const bool vec = (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0;
    const uint64_t n16 = vec ? n / 16 : 0;
    for (uint64_t i = me; i < n16; i += threads)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    for (uint64_t i = n16 * 16 + me; i < n; i += threads) dst[i] = src[i];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.arrivals[0] = 0;
    p.arrivals[1] = 0;
  }
}

}  // namespace

WindowPasses::WindowPasses(LayerCore& core, const WindowLayout& layout, int rank, std::vector<char*> bases)
    : core_(core), lay_(layout), rank_(rank), bases_(std::move(bases)) {
  int device = 0;
  MOK_CUDA(cudaGetDevice(&device));
  MOK_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  if (core.cfg().num_ranks != static_cast<int64_t>(bases_.size()) || rank < 0 || rank >= core.cfg().num_ranks)
    throw Error("windowed transport: rank " + std::to_string(rank) + " of " + std::to_string(bases_.size()) +
                    " windows for R = " + std::to_string(core.cfg().num_ranks),
                ErrorKind::kInternal);
  for (size_t p = 0; p < bases_.size(); ++p) {
    char* b = bases_[p];
    PeerBuffers& pb = core_.peer(static_cast<int>(p));
    pb.x = reinterpret_cast<const uint16_t*>(b + lay_.x[0]);
    pb.topk = reinterpret_cast<const int32_t*>(b + lay_.topk[0]);
    pb.router_weights = reinterpret_cast<const float*>(b + lay_.rw[0]);
    pb.d_output = nullptr;  // set by the first backward
    pb.y_slots = reinterpret_cast<uint16_t*>(b + lay_.y_slots);
    pb.dx_slots = reinterpret_cast<uint16_t*>(b + lay_.dx_slots);
    pb.arrivals = reinterpret_cast<uint32_t*>(b + lay_.arrivals);
    pb.pass_word = reinterpret_cast<uint32_t*>(b + lay_.pass_word);
  }
}

void WindowPasses::pass(const void* kernel, const DeviceInputs& in, const DeviceOutputs& out, bool backward,
                        cudaStream_t s) {
  const spec::LayerConfig& c = core_.cfg();
  const size_t T = c.tokens_per_rank, H = c.hidden, K = c.top_k, R = bases_.size();
  char* own = bases_[rank_];
  StageParams sp{};
  sp.ranks = static_cast<int32_t>(R);
  for (size_t p = 0; p < R; ++p) sp.words[p] = reinterpret_cast<const uint32_t*>(bases_[p] + lay_.pass_word);
  sp.previous = passes_;
  auto copy = [&](const void* src, size_t offset, size_t bytes) {
    sp.src[sp.copies] = static_cast<const uint8_t*>(src);
    sp.dst[sp.copies] = reinterpret_cast<uint8_t*>(own + offset);
    sp.bytes[sp.copies] = bytes;
    ++sp.copies;
  };
  // This pass's copy of the inputs (a peer may still be in the last pass, reading the other copy).
  if (!backward) {
    const int b = static_cast<int>(forwards_++ & 1);
    copy(in.x, lay_.x[b], T * H * 2);
    copy(in.topk_experts, lay_.topk[b], T * K * 4);
    copy(in.router_weights, lay_.rw[b], T * K * 4);
    for (size_t p = 0; p < R; ++p) {
      PeerBuffers& pb = core_.peer(static_cast<int>(p));
      pb.x = reinterpret_cast<const uint16_t*>(bases_[p] + lay_.x[b]);
      pb.topk = reinterpret_cast<const int32_t*>(bases_[p] + lay_.topk[b]);
      pb.router_weights = reinterpret_cast<const float*>(bases_[p] + lay_.rw[b]);
    }
  } else {  // the backward reads the last forward's copies of x, topk and router weights
    const int b = static_cast<int>(backwards_++ & 1);
    copy(in.d_output, lay_.d_output[b], T * H * 2);
    for (size_t p = 0; p < R; ++p)
      core_.peer(static_cast<int>(p)).d_output = reinterpret_cast<const uint16_t*>(bases_[p] + lay_.d_output[b]);
  }
  sp.arrivals = reinterpret_cast<uint32_t*>(own + lay_.arrivals);
  sp.error = core_.error_record();
  sp.timeout_ns = core_.timeout_ns();
  sp.system_scope = R > 1 ? 1 : 0;
  stage_wait<<<1, 32, 0, s>>>(sp);
  MOK_CUDA(cudaGetLastError());
  stage_copy<<<sms_, 256, 0, s>>>(sp);
  MOK_CUDA(cudaGetLastError());
  core_.set_pass(++passes_, entry_wait);
  core_.set_stall(stall_ns);
  core_.set_tensors(rank_, in, out, false);
  core_.launch(kernel, s);
}

void load_window_kernels() {
  cudaFuncAttributes a{};
  MOK_CUDA(cudaFuncGetAttributes(&a, stage_wait));
  MOK_CUDA(cudaFuncGetAttributes(&a, stage_copy));
}

OwnedDevice::~OwnedDevice() {
  for (void* p : ptrs) cudaFree(p);
}

ref::TensorMap empty_results(const spec::LayerConfig& cfg, bool backward) {
  ref::TensorMap result;
  auto make = [&](const char* path) {
    const ref::TensorSpec* s = ref::find_spec(path);
    result[path] = ref::Tensor(s->dtype, ref::spec_shape(*s, cfg));
  };
  for (const char* p : result_paths(cfg, backward)) make(p);
  make("intermediates/y");
  if (backward) make("intermediates/dx_slot");
  for (const char* p : workspace_intermediate_paths(cfg, backward)) make(p);
  return result;
}

RankBuffers::RankBuffers(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, int r) {
  const int R = static_cast<int>(cfg.num_ranks);
  auto upload = [&](const char* path, bool sliced) -> const void* {
    auto it = inputs.find(path);
    if (it == inputs.end()) return nullptr;
    const size_t bytes = sliced ? it->second.size_bytes() / R : it->second.size_bytes();
    void* d = device_alloc<uint8_t>(owned.ptrs, static_cast<int64_t>(bytes));
    MOK_CUDA(cudaMemcpy(d, static_cast<const char*>(it->second.raw()) + (sliced ? r * bytes : 0), bytes,
                        cudaMemcpyHostToDevice));
    return d;
  };
  in.x = static_cast<const uint16_t*>(upload("inputs/x", true));
  in.topk_experts = static_cast<const int32_t*>(upload("inputs/topk_experts", true));
  in.router_weights = static_cast<const float*>(upload("inputs/router_weights", true));
  in.w_routed_gate = static_cast<const uint16_t*>(upload("inputs/w_routed_gate", true));
  in.w_routed_up = static_cast<const uint16_t*>(upload("inputs/w_routed_up", true));
  in.w_routed_down = static_cast<const uint16_t*>(upload("inputs/w_routed_down", true));
  in.w_shared_gate = static_cast<const uint16_t*>(upload("inputs/w_shared_gate", false));
  in.w_shared_up = static_cast<const uint16_t*>(upload("inputs/w_shared_up", false));
  in.w_shared_down = static_cast<const uint16_t*>(upload("inputs/w_shared_down", false));
  if (backward) in.d_output = static_cast<const uint16_t*>(upload("inputs/d_output", true));
  for (const char* p : result_paths(cfg, backward)) {
    const size_t bytes = slice_bytes(cfg, p);
    void* d = device_alloc<uint8_t>(owned.ptrs, static_cast<int64_t>(bytes));
    MOK_CUDA(cudaMemset(d, 0, bytes));
    dev[p] = d;
  }
  out = outputs_from(dev);
}

size_t RankBuffers::slice_bytes(const spec::LayerConfig& cfg, const std::string& path) {
  const ref::TensorSpec* s = ref::find_spec(path);
  size_t n = ref::dtype_size(s->dtype);
  for (int64_t d : ref::spec_shape(*s, cfg)) n *= static_cast<size_t>(d);
  return n / static_cast<size_t>(cfg.num_ranks);
}

void fetch_rank_slice(ref::TensorMap& result, const std::string& path, int r, int num_ranks, const void* src) {
  ref::Tensor& t = result.at(path);
  const size_t bytes = t.size_bytes() / static_cast<size_t>(num_ranks);
  MOK_CUDA(cudaMemcpy(static_cast<char*>(t.raw()) + r * bytes, src, bytes, cudaMemcpyDeviceToHost));
}

void RankBuffers::fetch_results(const spec::LayerConfig& cfg, int r, ref::TensorMap& result) const {
  for (const auto& [path, d] : dev) fetch_rank_slice(result, path, r, static_cast<int>(cfg.num_ranks), d);
}

KernelOptions sized_options(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, const KernelOptions& options) {
  KernelOptions sized = options;
  if (sized.row_capacity == 0)  // what this routing needs (every rank sees the whole routing here)
    sized.row_capacity = std::max<int64_t>(
        1, rows_per_rank(cfg, reinterpret_cast<const int32_t*>(inputs.at("inputs/topk_experts").raw())));
  return sized;
}

namespace {

// One thread waits `ns` nanoseconds of %globaltimer (the split rack's per-rank delays).
__global__ void wait_ns(uint64_t ns) {
  const uint64_t start = device::global_time_ns();
  while (device::global_time_ns() - start < ns) __nanosleep(1000);
}

struct Streams {
  std::vector<cudaStream_t> s;
  ~Streams() {
    for (cudaStream_t x : s) cudaStreamDestroy(x);
  }
};

}  // namespace

}  // namespace mok::kernel::detail

namespace mok::kernel {

std::vector<ref::TensorMap> run_layer_split(const spec::LayerConfig& cfg, const std::vector<ref::TensorMap>& input_sets,
                                            bool backward, const KernelOptions& options,
                                            const SplitRackOptions& split) {
  using namespace detail;
  const spec::Status st = cfg.validate();
  if (!st.ok) throw Error(st.message);
  if (input_sets.empty()) throw Error("run_layer_split: no input sets");
  const int R = static_cast<int>(cfg.num_ranks);
  if (!split.delay_us.empty() && static_cast<int>(split.delay_us.size()) != R)
    throw Error("run_layer_split: delay_us has " + std::to_string(split.delay_us.size()) + " entries for R = " +
                std::to_string(R));
  if (!split.stall_us.empty() && static_cast<int>(split.stall_us.size()) != R)
    throw Error("run_layer_split: stall_us has " + std::to_string(split.stall_us.size()) + " entries for R = " +
                std::to_string(R));
  for (const std::vector<double>* v : {&split.delay_us, &split.stall_us})
    for (double d : *v)
      if (!(d >= 0 && d <= 1e7)) throw Error("run_layer_split: a delay or stall must be in [0, 1e7] microseconds");
  if (const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING"); blocking && std::string(blocking) == "1")
    throw Error("run_layer_split: the ranks' launches must run at the same time, and CUDA_LAUNCH_BLOCKING=1 runs "
                "them one after another (each would wait for the others until the timeout); unset it",
                ErrorKind::kUnsupported);
  for (const ref::TensorMap& in : input_sets) ref::validate_inputs(cfg, in, backward);
  // Every rank's workspace holds the most rows any set routes to a rank.
  KernelOptions sized = options;
  if (sized.row_capacity == 0) {
    int64_t most = 1;
    for (const ref::TensorMap& in : input_sets) most = std::max(most, sized_options(cfg, in, options).row_capacity);
    sized.row_capacity = most;
  }
  const WindowLayout lay = WindowLayout::of(cfg, 256, split.single_copy ? 1 : 2);
  OwnedDevice windows;
  std::vector<char*> bases(R);
  for (int r = 0; r < R; ++r) {
    bases[r] = device_alloc<char>(windows.ptrs, static_cast<int64_t>(lay.total));
    MOK_CUDA(cudaMemset(bases[r], 0, lay.total));
  }
  // Ranks share the GPU's blocks, one rank's worth left free for what each stream queues between
  // passes (the copies' and resets' work, the delays), which must run while other ranks' passes wait.
  std::vector<std::unique_ptr<LayerCore>> cores;
  std::vector<std::unique_ptr<WindowPasses>> passes;
  for (int r = 0; r < R; ++r) {
    cores.push_back(std::make_unique<LayerCore>(cfg, sized, r, 1, /*system_scope=*/true, R + 1));
    cores.back()->set_cooperative(false);
    passes.push_back(std::make_unique<WindowPasses>(*cores.back(), lay, r, bases));
    passes.back()->entry_wait = !split.skip_entry_wait;
    if (!split.stall_us.empty()) passes.back()->stall_ns = static_cast<uint64_t>(split.stall_us[r] * 1e3);
  }
  Streams streams;
  for (int r = 0; r < R; ++r) {
    cudaStream_t s = nullptr;
    MOK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams.s.push_back(s);
  }
  std::vector<std::vector<std::unique_ptr<RankBuffers>>> bufs(input_sets.size());
  for (size_t i = 0; i < input_sets.size(); ++i)
    for (int r = 0; r < R; ++r) bufs[i].push_back(std::make_unique<RankBuffers>(cfg, input_sets[i], backward, r));
  // However this function ends (an exception while passes are queued included), the device is idle
  // before the buffers, workspaces and windows above are freed: queued passes end, at the latest,
  // in their bounded waits.
  struct IdleBeforeFree {
    ~IdleBeforeFree() { cudaDeviceSynchronize(); }
  } idle_before_free;
  // Every kernel a stream below launches is loaded now: with lazy module loading (CUDA's default)
  // a kernel's first launch may wait for the device's running kernels, and a rank's pass waits for
  // the other ranks' launches, so loading the delay kernel behind one would deadlock until the
  // timeout. (The layer's kernels were loaded by LayerCore's occupancy queries.)
  cudaFuncAttributes loaded{};
  MOK_CUDA(cudaFuncGetAttributes(&loaded, wait_ns));
  load_window_kernels();
  MOK_CUDA(cudaDeviceSynchronize());  // the uploads and zeroed results (legacy stream) before any pass
  auto one_pass = [&](int r, size_t i, bool bwd) {
    if (!split.delay_us.empty() && split.delay_us[r] > 0) {
      wait_ns<<<1, 1, 0, streams.s[r]>>>(static_cast<uint64_t>(split.delay_us[r] * 1e3));
      MOK_CUDA(cudaGetLastError());
    }
    const RankBuffers& b = *bufs[i][r];
    check_pass_pointers(cfg, b.in, b.out, bwd, "split rack");
    passes[r]->pass(bwd ? backward_kernel() : forward_kernel(), b.in, b.out, bwd, streams.s[r]);
  };
  for (size_t i = 0; i < input_sets.size(); ++i) {
    for (int r = 0; r < R; ++r) one_pass(r, i, false);
    if (backward)
      for (int r = 0; r < R; ++r) one_pass(r, i, true);
  }
  // Every rank's diagnostic, in rank order, after every stream has ended (the first is often a
  // timeout caused by another rank's own error).
  std::string errors;
  for (int r = 0; r < R; ++r) {
    try {
      cores[r]->check_errors(streams.s[r]);
    } catch (const Error& e) {
      errors += (errors.empty() ? "" : "\n") + std::string("split rack rank ") + std::to_string(r) + ": " + e.what();
    }
  }
  if (!errors.empty()) throw Error(errors);
  std::vector<ref::TensorMap> results;
  for (size_t i = 0; i < input_sets.size(); ++i) {
    ref::TensorMap result = empty_results(cfg, backward);
    const bool last = i + 1 == input_sets.size();
    for (int r = 0; r < R; ++r) {
      bufs[i][r]->fetch_results(cfg, r, result);
      if (!last) continue;
      fetch_rank_slice(result, "intermediates/y", r, R, passes[r]->y_slots());
      if (backward) fetch_rank_slice(result, "intermediates/dx_slot", r, R, passes[r]->dx_slots());
      copy_rank_intermediates(*cores[r], r, backward, result);
    }
    if (!last)
      for (auto it = result.begin(); it != result.end();)
        it = it->first.rfind("intermediates/", 0) == 0 ? result.erase(it) : std::next(it);
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace mok::kernel
