// The NCCL transport: symmetric-memory windows for the exposed buffers, LSA peer pointers, and a
// one-thread-per-GPU driver for single nodes.
#include "mok/kernel/nccl.hpp"

#include "layer_core.cuh"
#include "windowed.cuh"
#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"
#include "mok/reference/validate.hpp"

#include <nccl.h>
#include <nccl_device.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mok::kernel {
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw Error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r), ErrorKind::kInternal);
}
#define MOK_NCCL(expr) nccl_check((expr), #expr)

// Base address of every peer's window, as this GPU sees it (LSA pointers; one NVLink domain).
__global__ void peer_window_bases(ncclWindow_t win, int nranks, void** out) {
  for (int p = threadIdx.x; p < nranks; p += blockDim.x) out[p] = ncclGetPeerPointer(win, 0, p);
}

}  // namespace

// The device API (ncclGetPeerPointer above) is compiled from this build's NCCL headers and reads
// the library's window objects: a libnccl of another version (an older system copy found first
// on the library path) lays them out otherwise and the kernel faults. So the library loaded must
// be the headers' version.
bool nccl_available(std::string* why) {
  int loaded = 0;
  if (ncclGetVersion(&loaded) != ncclSuccess) {
    if (why) *why = "ncclGetVersion failed: the NCCL library cannot be used";
    return false;
  }
  if (loaded != NCCL_VERSION_CODE) {
    auto text = [](int v) {
      // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9
      return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    };
    if (why)
      *why = "the NCCL library loaded (libnccl " + text(loaded) + ") is not the version this build's device code was " +
             "compiled against (NCCL headers " + text(NCCL_VERSION_CODE) + "); the device API needs the same " +
             "version: put the directory of a libnccl.so.2 of version " + text(NCCL_VERSION_CODE) +
             " first on LD_LIBRARY_PATH (e.g. the CUDA toolkit's the build used, or the lib directory of the pip " +
             "package nvidia-nccl of that version)";
    return false;
  }
  if (why) *why = "";
  return true;
}

struct NcclLayer::Impl {
  ncclComm_t comm;
  int rank = 0, nranks = 0;
  detail::WindowLayout lay{};
  void* window_buf = nullptr;
  ncclWindow_t window{};
  detail::LayerCore core;
  std::unique_ptr<detail::WindowPasses> passes;
  std::string broken;  // why no further pass may run (check_errors), or empty

  // The device API's window reads need the library of the headers' version (nccl_available): a
  // caller that constructs an NcclLayer without asking first gets the reason, not a fault.
  static ncclComm_t checked(ncclComm_t c) {
    if (std::string why; !nccl_available(&why)) throw Error("NcclLayer: " + why, ErrorKind::kUnsupported);
    return c;
  }

  static int comm_rank(ncclComm_t c) {
    int r = 0;
    MOK_NCCL(ncclCommUserRank(c, &r));
    return r;
  }

  Impl(const spec::LayerConfig& cfg, ncclComm_t c, const KernelOptions& options)
      : comm(c), rank(comm_rank(checked(c))), core(cfg, options, comm_rank(c), 1, cfg.num_ranks > 1) {  // peers: other GPUs
    MOK_NCCL(ncclCommCount(comm, &nranks));
    if (nranks != cfg.num_ranks)
      throw Error("NcclLayer: the communicator has " + std::to_string(nranks) + " ranks but config.R is " +
                  std::to_string(cfg.num_ranks));
    lay = detail::WindowLayout::of(cfg, NCCL_WIN_REQUIRED_ALIGNMENT);
    MOK_NCCL(ncclMemAlloc(&window_buf, lay.total));
    MOK_CUDA(cudaMemset(window_buf, 0, lay.total));
    // Zeroed (every pass word 0) before the collective registration lets any peer's first pass read it.
    MOK_CUDA(cudaDeviceSynchronize());
    MOK_NCCL(ncclCommWindowRegister(comm, window_buf, lay.total, &window, NCCL_WIN_COLL_SYMMETRIC));
    // NCCL returns success with no window where symmetric memory is unavailable (no CUDA P2P
    // between the ranks, no cuMem, NCCL_WIN_ENABLE=0): say so instead of faulting on its pointers.
    if (!window)
      throw Error("transport nccl: NCCL gave no symmetric memory window (needs every rank's GPU reachable by CUDA "
                  "P2P/NVLink in one node, cuMem, and NCCL_WIN_ENABLE not 0); use --transport virtual",
                  ErrorKind::kUnsupported);
    void** bases_dev = detail::device_alloc<void*>(core.owned(), nranks);
    peer_window_bases<<<1, 128>>>(window, nranks, bases_dev);
    MOK_CUDA(cudaGetLastError());
    std::vector<void*> bases(nranks);
    MOK_CUDA(cudaMemcpy(bases.data(), bases_dev, nranks * sizeof(void*), cudaMemcpyDeviceToHost));
    std::vector<char*> windows(nranks);
    for (int p = 0; p < nranks; ++p) windows[p] = static_cast<char*>(bases[p]);
    passes = std::make_unique<detail::WindowPasses>(core, lay, rank, std::move(windows));
    detail::load_window_kernels();
  }

  ~Impl() {
    if (window) ncclCommWindowDeregister(comm, window);
    if (window_buf) ncclMemFree(window_buf);
  }

  // No host barrier: the kernel's entry wait (enter_pass) orders the ranks, and the window's
  // parity copies keep a copy for this pass clear of a peer still in the last one (windowed.cuh).
  void pass(const void* kernel, const DeviceInputs& in, const DeviceOutputs& out, bool backward, cudaStream_t s) {
    if (!broken.empty()) throw Error("NcclLayer: " + broken + "; build a new NcclLayer on every rank", ErrorKind::kBadInput);
    passes->pass(kernel, in, out, backward, s);
  }
};

NcclLayer::NcclLayer(const spec::LayerConfig& cfg, void* nccl_comm, const KernelOptions& options)
    : impl_(std::make_unique<Impl>(cfg, static_cast<ncclComm_t>(nccl_comm), options)) {}
NcclLayer::~NcclLayer() = default;

void NcclLayer::forward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  detail::check_pass_pointers(impl_->core.cfg(), in, out, false, "NcclLayer");
  impl_->pass(detail::forward_kernel(), in, out, false,
              static_cast<cudaStream_t>(stream));
}

void NcclLayer::backward(const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  impl_->core.require_forward();
  detail::check_pass_pointers(impl_->core.cfg(), in, out, true, "NcclLayer");
  impl_->pass(detail::backward_kernel(), in, out, true,
              static_cast<cudaStream_t>(stream));
}

void NcclLayer::check_errors(void* stream) {
  try {
    impl_->core.check_errors(static_cast<cudaStream_t>(stream));
  } catch (const Error&) {
    // No further pass on this layer (Impl::pass refuses), whatever the caller does with the error:
    // after a timeout (code 1), a late peer's pass may still run against this rank's window; and a
    // pass launched while the error was pending was skipped by this rank (enter_pass), so the
    // ranks' pass counts no longer agree.
    uint32_t entered = 0;
    MOK_CUDA(cudaMemcpy(&entered, impl_->passes->own_pass_word(), sizeof entered, cudaMemcpyDeviceToHost));
    if (impl_->core.last_error_code() == 1)
      impl_->broken = "a wait timed out in an earlier pass (reported by check_errors()), so a late rank may since "
                      "have pushed into this rank's window";
    else if (entered < impl_->passes->passes_launched())
      impl_->broken = "a pass was launched while an earlier pass's error was pending, and this rank skipped it, so "
                      "the ranks' pass counts no longer agree (call check_errors() after every pass to keep a layer "
                      "past a bad input)";
    throw;
  }
}
int NcclLayer::rank() const { return impl_->rank; }
const uint16_t* NcclLayer::y_slots() const { return impl_->passes->y_slots(); }
const uint16_t* NcclLayer::dx_slots() const { return impl_->passes->dx_slots(); }
int NcclLayer::blocks_per_rank() const { return impl_->core.blocks_per_rank(); }
int NcclLayer::comm_blocks_per_rank() const { return impl_->core.options().comm_blocks_per_rank; }
int NcclLayer::forward_comm_blocks_per_rank() const { return impl_->core.options().forward_comm_blocks_per_rank; }
std::vector<uint64_t> NcclLayer::trace(void* stream) const {
  return impl_->core.read_trace(static_cast<cudaStream_t>(stream));
}
bool NcclLayer::uses_tma() const { return impl_->core.uses_tma(); }
void NcclLayer::copy_intermediates(ref::TensorMap& result, bool backward) const {
  detail::copy_rank_intermediates(impl_->core, impl_->rank, backward, result);
}

namespace {

using detail::empty_results;
using detail::RankBuffers;
using detail::sized_options;

// Runs rank r of a communicator on the current device and writes its slices of every result
// (rank r's rows of the first axis: tokens, experts or ranks) into `result`.
void run_rank(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, const KernelOptions& options,
              ncclComm_t comm, int r, ref::TensorMap& result) {
  RankBuffers buf(cfg, inputs, backward, r);
  NcclLayer layer(cfg, comm, sized_options(cfg, inputs, options));
  layer.forward(buf.in, buf.out);
  layer.check_errors();
  if (backward) {
    layer.backward(buf.in, buf.out);
    layer.check_errors();
  }
  buf.fetch_results(cfg, r, result);
  const int R = static_cast<int>(cfg.num_ranks);
  detail::fetch_rank_slice(result, "intermediates/y", r, R, layer.y_slots());
  if (backward) detail::fetch_rank_slice(result, "intermediates/dx_slot", r, R, layer.dx_slots());
  layer.copy_intermediates(result, backward);
}

// Times rank r of a communicator on the current device (see time_layer_nccl): fills its row of
// times.forward_ms / backward_ms, its slice of times.output, and with `set_shape` the launch
// shape (one thread per GPU: rank 0's thread only; one process per GPU: every process its own).
void time_rank(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, int warmup, int reps,
               const KernelOptions& options, ncclComm_t comm, int r, bool set_shape, NcclTimes& times) {
  RankBuffers buf(cfg, inputs, backward, r);
  KernelOptions untraced = options;
  untraced.trace = false;  // the timed passes never profile; a traced layer runs after them
  {
    NcclLayer layer(cfg, comm, sized_options(cfg, inputs, untraced));
    int* start_word = detail::device_alloc<int>(buf.owned.ptrs, 1);
    MOK_CUDA(cudaMemset(start_word, 0, sizeof(int)));
    struct Events {  // destroyed however the function ends, also when the second create fails
      cudaEvent_t a = nullptr, b = nullptr;
      ~Events() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
      }
    } events;
    MOK_CUDA(cudaEventCreate(&events.a));
    MOK_CUDA(cudaEventCreate(&events.b));
    const cudaEvent_t a = events.a, b = events.b;
    // One timed pass: an untimed barrier puts every rank at a common start, then the pass.
    auto timed = [&](auto&& pass) {
      MOK_NCCL(ncclAllReduce(start_word, start_word, 1, ncclInt32, ncclSum, comm, nullptr));
      MOK_CUDA(cudaEventRecord(a, nullptr));
      pass();
      MOK_CUDA(cudaEventRecord(b, nullptr));
      layer.check_errors();  // synchronises the stream
      float ms = 0;
      MOK_CUDA(cudaEventElapsedTime(&ms, a, b));
      return ms;
    };
    for (int i = 0; i < warmup + reps; ++i) {
      const float f = timed([&] { layer.forward(buf.in, buf.out); });
      if (i >= warmup) times.forward_ms[static_cast<size_t>(r) * reps + (i - warmup)] = f;
      if (!backward) continue;
      const float g = timed([&] { layer.backward(buf.in, buf.out); });
      if (i >= warmup) times.backward_ms[static_cast<size_t>(r) * reps + (i - warmup)] = g;
    }
    // The last forward's output (a backward pass does not write it).
    const size_t bytes = times.output.size_bytes() / cfg.num_ranks;
    MOK_CUDA(cudaMemcpy(static_cast<char*>(times.output.raw()) + r * bytes, buf.out.output, bytes,
                        cudaMemcpyDeviceToHost));
    if (set_shape) {
      times.blocks_per_rank = layer.blocks_per_rank();
      times.comm_blocks_per_rank = layer.comm_blocks_per_rank();
      times.forward_comm_blocks_per_rank = layer.forward_comm_blocks_per_rank();
      times.uses_tma = layer.uses_tma();
    }
  }  // the timed layer's workspace and window are released before the traced one is built
  if (!options.trace) return;
  // Every rank builds the traced layer and runs the same passes (window registration is collective,
  // and each pass waits for every rank to enter it): a warm forward, then the profiled forward and
  // backward.
  NcclLayer traced(cfg, comm, sized_options(cfg, inputs, options));
  traced.forward(buf.in, buf.out);
  traced.check_errors();
  traced.forward(buf.in, buf.out);
  traced.check_errors();
  times.trace_forward[r] = traced.trace();
  if (!backward) return;
  traced.backward(buf.in, buf.out);
  traced.check_errors();
  times.trace_backward[r] = traced.trace();
}

// Empty times for R ranks and `reps` repetitions (zeros), with the global output tensor.
NcclTimes empty_times(const spec::LayerConfig& cfg, bool backward, int warmup, int reps) {
  if (reps < 1 || warmup < 0)
    throw Error("transport nccl timing: reps must be at least 1 and warmup at least 0 (got " + std::to_string(reps) +
                ", " + std::to_string(warmup) + ")");
  NcclTimes t;
  t.num_ranks = static_cast<int>(cfg.num_ranks);
  t.reps = reps;
  t.forward_ms.assign(static_cast<size_t>(t.num_ranks) * reps, 0.0f);
  if (backward) t.backward_ms.assign(static_cast<size_t>(t.num_ranks) * reps, 0.0f);
  const ref::TensorSpec* s = ref::find_spec("outputs/output");
  t.output = ref::Tensor(s->dtype, ref::spec_shape(*s, cfg));
  t.trace_forward.resize(t.num_ranks);  // one entry per rank, each written by its rank's thread only
  t.trace_backward.resize(t.num_ranks);
  return t;
}

// Runs fn(comm, r) on the first R GPUs of this process, one thread per GPU, with one
// communicator (ncclCommInitAll); rethrows the first error caught (in time, not by rank), after
// printing each at once.
template <class Fn>
void on_every_gpu(const spec::LayerConfig& cfg, Fn&& fn) {
  const int R = static_cast<int>(cfg.num_ranks);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < R)
    throw Error("transport nccl: R=" + std::to_string(R) + " needs " + std::to_string(R) + " GPUs, this machine has " +
                    std::to_string(devices),
                ErrorKind::kUnsupported);
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast (as mok-launch does for its processes)
  std::vector<ncclComm_t> comms(R);
  std::vector<int> devs(R);
  for (int r = 0; r < R; ++r) devs[r] = r;
  MOK_NCCL(ncclCommInitAll(comms.data(), R, devs.data()));
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        MOK_CUDA(cudaSetDevice(r));
        fn(comms[r], r);
      } catch (const std::exception& e) {
        // Said at once: the other ranks may now wait for this one inside an NCCL collective (a
        // barrier, a window registration), and this thread's join would then never return.
        std::fprintf(stderr, "transport nccl: rank %d failed: %s (the other ranks may wait for it in NCCL; stop the "
                     "process if it does not end)\n", r, e.what());
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  if (error) std::rethrow_exception(error);
}

// This process's rank of a mok-launch job: joins the job's communicator on the process's first
// visible GPU when constructed, and leaves it when destroyed.
struct LaunchComm {
  int rank = 0, world = 0;
  ncclComm_t comm = nullptr;
  explicit LaunchComm(const spec::LayerConfig& cfg) {
    if (!launched_by_mok_launch())
      throw Error("transport nccl: this process was not started by mok-launch (MOK_RANK, MOK_WORLD_SIZE, MOK_NCCL_ID)",
                  ErrorKind::kUnsupported);
    rank = std::atoi(std::getenv("MOK_RANK"));
    world = std::atoi(std::getenv("MOK_WORLD_SIZE"));
    if (world != cfg.num_ranks)
      throw Error("transport nccl: mok-launch started " + std::to_string(world) + " processes but config.R is " +
                  std::to_string(cfg.num_ranks));
    const std::string hex = std::getenv("MOK_NCCL_ID");
    ncclUniqueId id{};
    if (hex.size() != 2 * sizeof id.internal)
      throw Error("MOK_NCCL_ID: expected " + std::to_string(2 * sizeof id.internal) + " hex digits");
    for (size_t i = 0; i < sizeof id.internal; ++i)
      id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    MOK_CUDA(cudaSetDevice(0));  // mok-launch gives each process one visible GPU
    MOK_NCCL(ncclCommInitRank(&comm, world, id, rank));
  }
  ~LaunchComm() { ncclCommDestroy(comm); }
  LaunchComm(const LaunchComm&) = delete;
  LaunchComm& operator=(const LaunchComm&) = delete;
};

// All-gathers `bytes` bytes (a multiple of world) in place: every process holds slice `rank`
// (bytes / world at offset rank * bytes / world) and ends with every slice.
void allgather_host(void* data, size_t bytes, ncclComm_t comm, int rank, int world) {
  if (bytes % static_cast<size_t>(world) != 0)
    throw Error("allgather_host: " + std::to_string(bytes) + " bytes do not split into " + std::to_string(world) +
                " equal slices", ErrorKind::kInternal);
  const size_t slice = bytes / world;
  void* d = nullptr;
  MOK_CUDA(cudaMalloc(&d, bytes));
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_d{d};
  MOK_CUDA(cudaMemcpy(static_cast<char*>(d) + rank * slice, static_cast<const char*>(data) + rank * slice, slice,
                      cudaMemcpyHostToDevice));
  MOK_NCCL(ncclAllGather(static_cast<char*>(d) + rank * slice, d, slice, ncclUint8, comm, nullptr));
  MOK_CUDA(cudaMemcpy(data, d, bytes, cudaMemcpyDeviceToHost));
}

// Every rank's profile to every process: traces[rank] holds this process's own; the lengths
// are gathered first, then each rank's words in a slot of the longest length.
void gather_traces(std::vector<std::vector<uint64_t>>& traces, ncclComm_t comm, int rank, int world) {
  std::vector<uint64_t> lengths(world, 0);
  lengths[rank] = traces[rank].size();
  allgather_host(lengths.data(), lengths.size() * sizeof(uint64_t), comm, rank, world);
  const uint64_t slot = *std::max_element(lengths.begin(), lengths.end());
  if (slot == 0) return;
  std::vector<uint64_t> all(slot * world, 0);
  std::copy(traces[rank].begin(), traces[rank].end(), all.begin() + rank * slot);
  allgather_host(all.data(), all.size() * sizeof(uint64_t), comm, rank, world);
  for (int p = 0; p < world; ++p)
    traces[p].assign(all.begin() + p * slot, all.begin() + p * slot + static_cast<int64_t>(lengths[p]));
}

// Sums host buffers byte-wise over every rank of the communicator, in place.
void allreduce_sum_host(void* data, size_t bytes, ncclComm_t comm) {
  void* d = nullptr;
  MOK_CUDA(cudaMalloc(&d, bytes > 0 ? bytes : 1));
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_d{d};
  MOK_CUDA(cudaMemcpy(d, data, bytes, cudaMemcpyHostToDevice));
  MOK_NCCL(ncclAllReduce(d, d, bytes, ncclUint8, ncclSum, comm, nullptr));
  MOK_CUDA(cudaMemcpy(data, d, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace

ref::TensorMap run_layer_nccl(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                              const KernelOptions& options) {
  ref::validate_inputs(cfg, inputs, backward);
  ref::TensorMap result = empty_results(cfg, backward);
  on_every_gpu(cfg, [&](ncclComm_t comm, int r) { run_rank(cfg, inputs, backward, options, comm, r, result); });
  return result;
}

NcclTimes time_layer_nccl(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward, int warmup,
                          int reps, const KernelOptions& options) {
  ref::validate_inputs(cfg, inputs, backward);
  NcclTimes times = empty_times(cfg, backward, warmup, reps);
  on_every_gpu(cfg, [&](ncclComm_t comm, int r) {
    time_rank(cfg, inputs, backward, warmup, reps, options, comm, r, r == 0, times);
  });
  return times;
}

bool launched_by_mok_launch() {
  return std::getenv("MOK_RANK") && std::getenv("MOK_WORLD_SIZE") && std::getenv("MOK_NCCL_ID");
}

ref::TensorMap run_layer_nccl_process(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                                      const KernelOptions& options) {
  ref::validate_inputs(cfg, inputs, backward);
  const LaunchComm job(cfg);
  ref::TensorMap result = empty_results(cfg, backward);
  run_rank(cfg, inputs, backward, options, job.comm, job.rank, result);
  // Every process ends with the global tensors: all-gather the rank-major slices in place. The
  // workspace intermediates are not rank-major (a rank holds the slots of its experts, from every
  // token): each byte is written by one rank and zero on the others, so a byte-wise sum joins them.
  const std::vector<const char*> ws = detail::workspace_intermediate_paths(cfg, backward);
  for (auto& [path, t] : result) {
    if (std::find_if(ws.begin(), ws.end(), [&](const char* p) { return path == p; }) != ws.end())
      allreduce_sum_host(t.raw(), t.size_bytes(), job.comm);
    else
      allgather_host(t.raw(), t.size_bytes(), job.comm, job.rank, job.world);
  }
  return result;
}

NcclTimes time_layer_nccl_process(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                                  int warmup, int reps, const KernelOptions& options) {
  ref::validate_inputs(cfg, inputs, backward);
  NcclTimes times = empty_times(cfg, backward, warmup, reps);
  const LaunchComm job(cfg);
  time_rank(cfg, inputs, backward, warmup, reps, options, job.comm, job.rank, true, times);
  // Every process ends with every rank's times and the global output.
  auto gather = [&](void* p, size_t bytes) { allgather_host(p, bytes, job.comm, job.rank, job.world); };
  gather(times.forward_ms.data(), times.forward_ms.size() * sizeof(float));
  if (backward) gather(times.backward_ms.data(), times.backward_ms.size() * sizeof(float));
  gather(times.output.raw(), times.output.size_bytes());
  if (options.trace) {
    gather_traces(times.trace_forward, job.comm, job.rank, job.world);
    if (backward) gather_traces(times.trace_backward, job.comm, job.rank, job.world);
  }
  return times;
}

}  // namespace mok::kernel
