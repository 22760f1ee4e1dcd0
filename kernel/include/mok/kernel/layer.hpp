// Host API of the fused MoE kernel: a workspace for one layer config, forward and backward on device pointers.
#pragma once

#include "mok/kernel/block_counts.hpp"  // kDefaultBulkGatherBlocks, the block-count rules
#include "mok/kernel/params.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mok::kernel {

// The forward's gate/up epilogue (SwiGLU, silu' and the stores; the same bits either way):
// kFragments: each thread on its accumulator fragments; kStaged: the tile goes to shared memory
// and a warp per row works on it with 16-byte stores; kAuto: staged where the hidden size (the
// main loop's length) is at most kStagedSwigluMaxHidden, where it measured faster. Measured on
// the H200 (kernel/README.md, "Forward phase 1"): staged took the qwen3 forward (H = 2048) 2-6%
// down, and left the dsv3 forward (H = 7168) within 1-2% either way while the dsv3 backward after
// it ran ~1% slower in most pairings.
enum class SwigluEpilogue { kAuto, kFragments, kStaged };
inline constexpr int64_t kStagedSwigluMaxHidden = 4096;
// The form a request runs for a layer of this hidden size (kFragments or kStaged; the staged form
// needs the fast engine besides, else fragments run).
constexpr SwigluEpilogue resolve_swiglu(SwigluEpilogue requested, int64_t hidden) {
  if (requested != SwigluEpilogue::kAuto) return requested;
  return hidden <= kStagedSwigluMaxHidden ? SwigluEpilogue::kStaged : SwigluEpilogue::kFragments;
}

// Where the forward's expert GEMMs read routed x rows (the same bits either way): kGathered: the
// communication blocks first copy them into one tensor per rank, which phase 1 loads by TMA;
// kDirect: every block copies its tiles' rows from each token's x (cp.async by every thread,
// mma_tile.cuh's RowsOperand), so the forward's gather is gone, and the first column tile of each
// row tile writes the rows it copied to that tensor for the backward's weight gradients; kAuto:
// direct where the hidden size is at most kDirectRowsMaxHidden. Measured on the H100 (BENCHMARKS.md,
// thirty-sixth session): direct took the qwen3 forward (H = 2048) 3.1-3.5% down and its backward
// 1.6-1.9% up (forward + backward even), and the dsv3 forward (H = 7168) 7-9% up (measured before
// the write-back; a build without the per-chunk proxy fence lost most of that, and our reading,
// not measured, is that the fence waits for the copies still in flight from DRAM). Direct needs the fast
// engine and the ranks on one GPU; elsewhere the gathered form runs.
enum class XRows { kAuto, kGathered, kDirect };
inline constexpr int64_t kDirectRowsMaxHidden = 2048;
constexpr XRows resolve_x_rows(XRows requested, int64_t hidden) {
  if (requested != XRows::kAuto) return requested;
  return hidden <= kDirectRowsMaxHidden ? XRows::kDirect : XRows::kGathered;
}

struct KernelOptions {
  int blocks_per_rank = 0;       // 0: as many as fit co-resident on the GPU, divided among ranks as evenly
                                 // as they go (the first ranks take one more: Layer::wide_ranks); N > 0: N each
  int comm_blocks_per_rank = 0;  // communication blocks of each rank (0: blocks_per_rank - 1, at least 1;
                                 // they gather rows, then join the GEMM work items)
  double wait_timeout_s = 10.0;  // bound on every wait for a flag; a timeout ends the pass with a diagnostic
  int silent_rank = -1;          // testing only: this rank never runs (its peers must time out)
  bool disable_tma = false;      // sm_90a: fill every tile with threads instead of TMA (same bits)
  int forward_comm_blocks_per_rank = 0;  // the forward's own count (0: min(kDefaultBulkGatherBlocks,
                                        // comm_blocks_per_rank) when the bulk gather runs, else
                                        // comm_blocks_per_rank): with it few blocks move the rows as fast as many
  bool bulk_gather = true;       // fast engine, virtual rack: the forward's communication blocks move x rows
                                 // with TMA bulk copies through shared memory instead of thread loads and
                                 // stores (the same bytes; kernel/README.md, "How a pass runs")
  int bulk_gather_stores = 1;    // bulk gather: stores a warp's pipeline leaves reading their slot before it reuses
                                 // the oldest (1..4; the rest of its slots hold loads)
  int bulk_gather_batch = 4;     // bulk gather: rows whose ready flags go up after one fence (1..16)
  XRows x_rows = XRows::kAuto;   // fast engine, virtual rack: where the forward's expert GEMMs read routed x rows
                                 // (above)
  SwigluEpilogue swiglu = SwigluEpilogue::kAuto;  // fast engine: how the forward's gate/up epilogue runs
  int64_t row_capacity = 0;      // routed rows each rank's workspace holds (0: the worst case G * min(K, E/R));
                                 // rows_per_rank() gives the exact need of a routing
  int group_rows = 8;            // GEMM items go in groups of this many row tiles, column-major inside a group
                                 // (grouped_tile; 1..64): blocks running together share A and weight tiles in L2
  bool shared_items = true;      // a launch of several ranks (the virtual rack): every block works every rank's
                                 // GEMM items, one rank after another, instead of its own rank's only, so the
                                 // GPU's L2 holds one rank's operands at a time (the same bits; kernel/README.md,
                                 // "How a pass runs"). Off with silent_rank. No effect with one rank per launch.
  bool trace = false;            // profile every pass per block (Layer::trace(); TraceSlot in params.hpp);
                                 // Layer::trace and NcclLayer::trace read it
};

// The most routed rows any rank receives under this routing (topk_experts [G, K] on the host):
// the smallest KernelOptions::row_capacity that runs it, except that it is 0 for a routing of
// empty slots only, where 0 would ask for the worst case: pass max(1, rows_per_rank(...)).
int64_t rows_per_rank(const spec::LayerConfig& cfg, const int32_t* topk_experts);

// Global arrays on the device, in global token order (rank r's tokens are rows r*T .. r*T+T-1,
// its experts are experts r*E/R .. (r+1)*E/R-1). Shapes as in the golden schema.
struct DeviceInputs {
  const uint16_t* x = nullptr;               // [G, H] bf16
  const int32_t* topk_experts = nullptr;     // [G, K]
  const float* router_weights = nullptr;     // [G, K]
  const uint16_t* w_shared_gate = nullptr;   // [Is, H] (replicated: every rank uses the same)
  const uint16_t* w_shared_up = nullptr;     // [Is, H]
  const uint16_t* w_shared_down = nullptr;   // [H, Is]
  const uint16_t* w_routed_gate = nullptr;   // [E, I, H]
  const uint16_t* w_routed_up = nullptr;     // [E, I, H]
  const uint16_t* w_routed_down = nullptr;   // [E, H, I]
  const uint16_t* d_output = nullptr;        // [G, H] (backward)
};

struct DeviceOutputs {
  uint16_t* output = nullptr;            // [G, H] bf16
  uint16_t* d_x = nullptr;               // [G, H] bf16
  float* d_router_weights = nullptr;     // [G, K]
  float* d_w_routed_gate = nullptr;      // [E, I, H]
  float* d_w_routed_up = nullptr;        // [E, I, H]
  float* d_w_routed_down = nullptr;      // [E, H, I]
  float* d_w_shared_gate = nullptr;      // [R, Is, H] (per rank)
  float* d_w_shared_up = nullptr;        // [R, Is, H]
  float* d_w_shared_down = nullptr;      // [R, H, Is]
};

// One layer's workspace on the current CUDA device, for R virtual ranks on that GPU (the
// virtual rack transport: every rank's buffers are plain device pointers in one table).
// forward() and backward() each enqueue one persistent cooperative launch on `stream` (a
// cudaStream_t, or null for the default stream) and never synchronise the host; backward()
// must follow forward() of the same inputs on the same workspace (it reuses the routing plan
// and the forward intermediates). Every output bit is a function of the global inputs alone:
// not of R, the block counts, or timing. Errors (bad config, timeout of a wait, bad routing or a non-finite router weight
// found by the kernel) throw mok::Error; device-side errors surface at check_errors(), which
// reports the first since the last check_errors() (a failed forward is not lost to the backward
// launched after it, and that backward stops at entry); after a failed forward was reported, run
// a forward that succeeds before the next backward. The passes of one layer
// share its counters, error record and tensor maps: launch them on one stream, or on streams the
// caller orders one after another.
class Layer {
 public:
  Layer(const spec::LayerConfig& cfg, const KernelOptions& options = {});
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  void forward(const DeviceInputs& in, const DeviceOutputs& out, void* stream = nullptr);
  void backward(const DeviceInputs& in, const DeviceOutputs& out, void* stream = nullptr);
  // Synchronises `stream` and throws mok::Error with the kernel's diagnostic if a pass failed.
  void check_errors(void* stream = nullptr);

  // With KernelOptions::trace: the last pass's profile, kTraceSlots words per block in launch
  // order (block b serves local rank rank_block_of(b, blocks_per_rank(), wide_ranks()).local);
  // synchronises `stream`, which must be the stream the pass ran on (or one ordered after it).
  // Empty when off.
  std::vector<uint64_t> trace(void* stream = nullptr) const;

  int blocks_per_rank() const;  // the fewest blocks a rank has; the first wide_ranks() ranks have one more
  int wide_ranks() const;
  int launch_blocks() const;    // blocks of a launch: local ranks x blocks_per_rank() + wide_ranks()
  int comm_blocks_per_rank() const;
  int forward_comm_blocks_per_rank() const;  // the forward's (KernelOptions::forward_comm_blocks_per_rank, resolved)
  bool uses_tma() const;  // true when the fast engine runs (sm_90a, TMA, H, I, Is multiples of 64)
  // Device pointers of the slot buffers [G, K, H] (intermediates y and dx_slot, for checking).
  const uint16_t* y_slots() const;
  const uint16_t* dx_slots() const;
  // Copies the per-row and per-token intermediates the workspace holds after the last pass into
  // `result` under their golden paths and layouts (schema v1, [G,K,.] per slot, [G,.] per token;
  // every one a fresh zeroed tensor, so a slot without a row is zero, as in the emulator's): gate,
  // up, act and, with a shared expert, shared_gate, shared_up, shared_act, shared_out; after a
  // backward (backward = true) also dy, d_gate, d_up and shared_d_gate, shared_d_up, dx_shared.
  // d_act and shared_d_act never exist in memory (the epilogues use them in registers).
  // Synchronises the device. With these the stage bisector names the first wrong stage inside an
  // expert, not only at y or dx_slot.
  void copy_intermediates(ref::TensorMap& result, bool backward) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience for tools and tests: copies host inputs (schema paths "inputs/...") to the
// GPU, runs forward (and backward), and returns "outputs/output", "grads/..." and the
// intermediates the kernel materialises ("intermediates/y", "intermediates/dx_slot", and, unless
// workspace_intermediates is false, the workspace's: Layer::copy_intermediates, about as many
// host bytes again as the golden's intermediates).
// Inputs are validated on the host first (the same checks and messages as the emulator).
ref::TensorMap run_layer(const spec::LayerConfig& cfg, const ref::TensorMap& inputs, bool backward,
                         const KernelOptions& options = {}, bool workspace_intermediates = true);

// True when a CUDA device is usable; otherwise `why` says why not.
bool gpu_available(std::string* why);

}  // namespace mok::kernel
