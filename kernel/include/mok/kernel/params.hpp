// Plain-data launch parameters shared by the host launcher and the device code (no CUDA types).
#pragma once

#include "mok/spec/config.hpp"
#include "mok/spec/routing_plan.hpp"

#include <cstddef>
#include <cstdint>

namespace mok::kernel {

// The most ranks one launch (or one communicator) holds.
inline constexpr int kMaxRanks = 72;

// What one rank exposes to its peers: the transport interface of DESIGN section 5. For the
// virtual rack these are plain device pointers into one GPU's memory; for NCCL they will be
// LSA pointers into symmetric windows. Everything a peer reads or writes goes through here.
struct PeerBuffers {
  const uint16_t* x;          // [T, H] bf16 (dispatch pulls rows from it)
  const int32_t* topk;        // [T, K]
  const float* router_weights;// [T, K]
  const uint16_t* d_output;   // [T, H] bf16 (backward dispatch pulls rows from it)
  uint16_t* y_slots;          // [T, K, H] bf16: combine pushes each (token, slot) row here once
  uint16_t* dx_slots;         // [T, K, H] bf16: backward pushes each slot's dx row here once
  uint32_t* arrivals;         // [2]: rows pushed into y_slots / dx_slots so far this pass
  float* acc;                 // [T, H] fp32: only the atomics variant (MOK_ATOMICS_VARIANT, a benchmark
                              // build) adds combine and d_x contributions here; null otherwise
  uint32_t* pass_word;        // windowed transports (NCCL, the split rack): the last pass this rank has
                              // entered (LaunchParams::pass_seq), written by the rank and read by its
                              // peers before they touch its window; null on the virtual rack
};

// Signal words a rank waits on (ids used in diagnostics; see flag_name()).
enum FlagId : int32_t {
  kFlagDispatchRow = 1,
  kFlagForwardArrivals = 2,
  kFlagSharedForward = 3,
  kFlagRankBarrier = 4,
  kFlagBackwardDispatchRow = 5,
  kFlagBackwardArrivals = 6,
  kFlagSharedBackward = 7,
  kFlagBadRouting = 8,
  kFlagTileDone = 9,
  kFlagPassEntry = 10,
};

// First error since the layer's last check_errors() (it is not cleared between launches): which
// rank waited for which flag, for what value, and what it saw.
struct ErrorRecord {
  uint32_t code;          // 0 = none, 1 = timeout, 2 = bad routing, 3 = backward without a valid forward plan,
                          // 4 = a non-finite router weight (observed: its bits)
  int32_t rank;
  int32_t flag;
  int32_t block;
  uint64_t expected;
  uint64_t observed;
  int64_t index;          // flag index (row, token) or the bad (token * K + slot)
  uint64_t weight_key;    // code 4: weight_error_key of the first non-finite router weight in token order
                          // (the largest key any thread found; 0: none)
};

// A bad router weight's entry (g * K + k, below 2^31: LayerConfig::validate) and its float's bits
// as one integer whose largest value over the entries is the first entry's (so an integer
// atomicMax over them keeps the first, whatever the order the threads ran in).
inline constexpr uint64_t weight_error_key(int64_t entry, uint32_t bits) {
  return (static_cast<uint64_t>(0x7fffffff - entry) << 32) | bits;
}
inline constexpr int64_t weight_error_entry(uint64_t key) { return 0x7fffffff - static_cast<int64_t>(key >> 32); }
inline constexpr uint32_t weight_error_bits(uint64_t key) { return static_cast<uint32_t>(key); }

// A CUDA tensor map (CUtensorMap, 128 bytes, 64-byte aligned) kept opaque so that this header
// needs no CUDA types. The host encodes them (src/layer.cu); sm_90a code loads tiles with TMA.
struct alignas(64) TensorMapBytes {
  uint64_t bytes[16];
};

// Tensor maps of every operand the fast engine loads, all 2D bf16 [rows, cols] row-major with
// 128-byte swizzle. A rank has two sets (LaunchParams::maps): 64 x 64 boxes for MN-major
// (transposed) use, whose boxes are 64 columns wide at most, and 64-column x kKMajorBoxRows-row
// boxes for K-major use, where one copy fills a whole 128-row operand tile (the same
// shared-memory image as two 64-row boxes, since the swizzle repeats every 8 rows).
inline constexpr int kKMajorBoxRows = 128;
struct RankTensorMaps {
  TensorMapBytes xd;             // [capacity, H] gathered x rows
  TensorMapBytes act;            // [capacity, I]
  TensorMapBytes dy;             // [capacity, H]
  TensorMapBytes d_gate;         // [capacity, I]
  TensorMapBytes d_up;           // [capacity, I]
  TensorMapBytes w_routed_gate;  // [E_local * I, H]
  TensorMapBytes w_routed_up;    // [E_local * I, H]
  TensorMapBytes w_routed_down;  // [E_local * H, I]
  TensorMapBytes x;              // [T, H] this rank's tokens
  TensorMapBytes d_output;       // [T, H]
  TensorMapBytes shared_act;     // [T, Is]
  TensorMapBytes shared_d_gate;  // [T, Is]
  TensorMapBytes shared_d_up;    // [T, Is]
  TensorMapBytes w_shared_gate;  // [Is, H]
  TensorMapBytes w_shared_up;    // [Is, H]
  TensorMapBytes w_shared_down;  // [H, Is]
};

// Row length of RankState::block_counts: room for the blocks of a rank with the most of them
// (blocks_per_rank + 1: rank_block_of below), rounded up to whole 16-byte vectors.
constexpr int64_t block_counts_stride(int64_t blocks_per_rank) { return (blocks_per_rank + 1 + 3) / 4 * 4; }

// Which local rank a block of a launch serves. The launch's blocks go to its local ranks in order:
// the first `wide` ranks take per + 1 blocks each, the others per, so L ranks run L * per + wide
// blocks (wide < L). `wide` is 0 unless the GPU's co-resident blocks do not divide evenly among
// the ranks (KernelOptions::blocks_per_rank = 0: 132 SMs and 8 ranks give four ranks 17 and four
// 16, instead of leaving four SMs idle).
struct RankBlock {
  int local;  // local rank: the rank is first_rank + local
  int block;  // the block's index within its rank
  int count;  // the blocks its rank has
};
constexpr int rank_block_count(int local, int per, int wide) { return per + (local < wide ? 1 : 0); }
constexpr RankBlock rank_block_of(int b, int per, int wide) {
  const int wide_blocks = wide * (per + 1);
  if (b < wide_blocks) return RankBlock{b / (per + 1), b % (per + 1), per + 1};
  return RankBlock{wide + (b - wide_blocks) / per, (b - wide_blocks) % per, per};
}

// One rank's private state (workspace), written only by blocks of the launch that holds the rank
// (its own blocks, and with shared_items the other local ranks' blocks working its GEMM items).
struct RankState {
  int64_t* expert_offsets;    // [E_local + 1]
  spec::RowRef* rows;         // [capacity]: canonical rows of the local experts, concatenated
  uint32_t* row_ready;        // [capacity]: dispatch epoch of each gathered x row
  uint32_t* row_ready_bwd;    // [capacity]: same for d_output rows
  uint32_t* counters;         // [8]: barrier count, barrier generation, shared done (fwd, bwd), expected arrivals,
                              // GEMM items claimed, weight-gradient items claimed, pass entered (enter_pass)
  uint32_t* expert_counts;    // [E_local]: routed rows per local expert, counted by every block of the rank
                              // (zeroed before every pass; expert_offsets follow from them)
  uint32_t* block_counts;     // [E_local, block_counts_stride(blocks_per_rank)]: the same counts per block of the
                              // rank, each over its token slice (written whole by every forward's count)
  uint32_t* tiles_done;       // [row tiles + shared tiles]: column tiles of a row tile's first GEMM finished
                              // (zeroed before every pass; the second GEMM of the row tile waits on it)
  uint16_t* xd;               // [capacity, H] gathered x rows
  float* gate;                // [capacity, I] the forward's gate g (fp32): the backward derives silu(g) and
                              // silu'(g) from it with the forward's code (spec::silu_and_grad_f32, same bits)
  float* up;                  // [capacity, I]
  uint16_t* act;              // [capacity, I]
  uint16_t* dy;               // [capacity, H] gathered d_output rows scaled by their router weight
  uint16_t* d_gate;           // [capacity, I]
  uint16_t* d_up;             // [capacity, I]
  float* shared_gate;         // [T, Is]
  float* shared_up;           // [T, Is]
  uint16_t* shared_act;       // [T, Is]
  float* shared_out;          // [T, H]
  uint16_t* shared_d_gate;    // [T, Is]
  uint16_t* shared_d_up;      // [T, Is]
  float* dx_shared;           // [T, H]
};

// Per-rank weights and results (the caller's device memory, rank slices of global arrays).
struct RankTensors {
  const uint16_t* w_routed_gate;  // [E_local, I, H]
  const uint16_t* w_routed_up;    // [E_local, I, H]
  const uint16_t* w_routed_down;  // [E_local, H, I]
  const uint16_t* w_shared_gate;  // [Is, H]
  const uint16_t* w_shared_up;    // [Is, H]
  const uint16_t* w_shared_down;  // [H, Is]
  uint16_t* output;               // [T, H]
  uint16_t* d_x;                  // [T, H]
  float* d_router_weights;        // [T, K]
  float* d_w_routed_gate;         // [E_local, I, H]
  float* d_w_routed_up;           // [E_local, I, H]
  float* d_w_routed_down;         // [E_local, H, I]
  float* d_w_shared_gate;         // [Is, H]
  float* d_w_shared_up;           // [Is, H]
  float* d_w_shared_down;         // [H, Is]
};

// Per-block profile of one pass (KernelOptions::trace; off by default): thread 0 of every block
// writes kTraceSlots words. Marks are %globaltimer readings (ns); sums are ns spent in a kind of
// work over all of the block's work items; kTrItems counts items. Reading it never changes a
// result bit (it only times what the block does). %globaltimer may advance in steps of up to
// about a microsecond, so a sum of many short intervals (publishing) is coarse; marks and the
// GEMM sums (tens of microseconds per item) are not affected much.
enum TraceSlot : int {
  kTrStart = 0,       // mark: the block starts
  kTrPlanned,         // mark: the routing plan is built (forward) / the pass is set up (backward)
  kTrGathered,        // mark: this block's gathering is done (communication blocks; else = planned)
  kTrItemsDone,       // mark: the block's last GEMM item is done
  kTrReduceStart,     // mark: every arrival is in: the per-token reduction (combine / d_x) starts
  kTrReduceDone,      // mark: the block's share of the reduction (and backward: router grads) is done
  kTrEnd,             // mark: the block ends (backward: after its weight-gradient tiles)
  kTrWaitRows,        // sum: waiting for gathered rows before a phase-1 item
  kTrPhase1,          // sum: phase-1 GEMMs with their epilogues
  kTrWaitTile,        // sum: waiting for a row tile's phase-1 items before a phase-2 item
  kTrPhase2,          // sum: phase-2 GEMMs with their epilogues (the pushes to owners)
  kTrPublish,         // sum: publishing tiles and rows (fences, counters; the once-per-rank row counts)
  kTrItems,           // count: GEMM items (phases 1 and 2)
  kTrWgradItems,      // count: weight-gradient tiles
  kTrDxDone,          // mark (backward only): the block's share of d_x is done; router grads follow
  kTrItems2,          // count: phase-2 items (of kTrItems)
  // inside the fast engine's calls (GemmLaps, builds with MOK_GEMM_LAPS only; zero otherwise),
  // for phase-1 items, phase-2 items and weight-gradient tiles, kLapWords each: sums of the time
  // from entry past the entry barrier, from there until thread 0 has issued the first chunks'
  // loads, then until the first chunk's stage is full, the main loop, the epilogue
  kTrLaps1,
  kTrLaps2 = kTrLaps1 + 5,
  kTrLapsW = kTrLaps2 + 5,
  kTrBetween = kTrLapsW + 5,  // sum: between GEMM items (claims, mapping an item to its tile, the row-tile
                              // table's load), from run_phases' entry or an item's end to the next item's wait;
                              // with shared items also the wait for another rank's plan (for_item_ranks)
  kTraceSlots = 32
};
inline constexpr int kLapWords = 5;
static_assert(kTrLaps2 - kTrLaps1 == kLapWords && kTrBetween == kTrLapsW + kLapWords && kTrBetween < kTraceSlots,
              "the trace slots fit in a block's words");

struct LaunchParams {
  spec::LayerConfig cfg;
  int32_t num_ranks;
  int32_t first_rank;             // the launch holds ranks first_rank .. first_rank + local_ranks - 1
                                  // (0 and all of them for the virtual rack; its own rank for NCCL)
  int32_t local_ranks;
  int32_t blocks_per_rank;        // the fewest blocks a local rank has (rank_block_of)
  int32_t wide_ranks;             // the first wide_ranks local ranks have blocks_per_rank + 1 blocks
  int32_t comm_blocks_per_rank;   // the backward's communication blocks per rank
  int32_t comm_blocks_forward;    // the forward's
  int32_t silent_rank;            // testing: this rank does nothing (-1: none)
  int64_t row_capacity;           // rows each rank's workspace holds
  uint32_t epoch;                 // increases every launch; row-ready flags compare against it
  uint32_t pass_seq;              // windowed transports: this pass's number, the same on every rank (1, 2, ...)
  int32_t pass_entry;             // 1: before touching any window, every block waits until every rank has
                                  // entered pass pass_seq (enter_pass in device/sync.cuh); 0 on the virtual
                                  // rack; 2 (tests only): the rank says it entered but does not wait
  uint64_t stall_ns;              // tests only (split rack): every block waits this long after entering (0: none)
  uint64_t timeout_ns;            // bound on every wait
  PeerBuffers peers[kMaxRanks];
  RankState state[kMaxRanks];
  RankTensors tensors[kMaxRanks];
  const RankTensorMaps* maps;     // [2 * kMaxRanks] in device memory (only the launch's ranks written): rank
                                  // r's MN-major set at r, its K-major set at kMaxRanks + r; the one array too
                                  // large for the kernel parameter (295 KB at 72 ranks); one of the layer's
                                  // four device slots of them (LayerCore::launch)
  int32_t fast;                   // 1: the fast engine (sm_90a, TMA maps valid, H, I, Is multiples of 64)
  int32_t system_scope;           // 1: peers are other GPUs: cross-rank signals use system-scope fences
  int32_t bulk_gather;            // 1: the forward gathers x rows by TMA bulk copies (fast engine only; same bytes)
  int32_t bulk_gather_stores;     // KernelOptions::bulk_gather_stores
  int32_t bulk_gather_batch;      // KernelOptions::bulk_gather_batch
  int32_t direct_rows;            // 1: forward phase 1 reads routed x rows where they lie (RowsOperand, fast engine,
                                  // one GPU); its first column tiles write them to S.xd for the backward's weight
                                  // gradients
  int32_t staged_swiglu;          // 1: the forward's gate/up epilogue goes through shared memory by rows (fast engine; same bits)
  int32_t group_rows;             // row tiles per item group (grouped_tile; KernelOptions::group_rows)
  int32_t shared_items;           // 1: every block works every local rank's GEMM items, rank by rank
                                  // (for_item_ranks in moe.cuh; KernelOptions::shared_items)
  ErrorRecord* error;
  uint32_t* abort;
  uint64_t* trace;                // kTraceSlots words per block, or nullptr (no profile)
};

// The kernels take LaunchParams by value, as a __grid_constant__ parameter: its fields are read
// through the constant cache, and the compiler may reload them at will because kernel parameters
// are read-only (it cannot assume that of a struct in global memory behind a pointer, which the
// item loop's stores through generic pointers could alias). CUDA 12.1+ allows 32,764 bytes of
// parameters on sm_70 and later.
inline constexpr std::size_t kMaxKernelParamBytes = 32764;
static_assert(sizeof(LaunchParams) <= kMaxKernelParamBytes, "LaunchParams must fit in one kernel parameter");

inline const char* flag_name(int32_t flag) {
  switch (flag) {
    case kFlagDispatchRow: return "dispatch row ready (x row gathered by a communication block)";
    case kFlagForwardArrivals: return "forward arrivals (expert outputs y pushed into this rank's slots)";
    case kFlagSharedForward: return "shared expert forward done";
    case kFlagRankBarrier: return "rank barrier";
    case kFlagBackwardDispatchRow: return "backward dispatch row ready (d_output row gathered)";
    case kFlagBackwardArrivals: return "backward arrivals (dx rows pushed into this rank's slots)";
    case kFlagSharedBackward: return "shared expert backward done";
    case kFlagBadRouting: return "routing validation";
    case kFlagPassEntry: return "pass entry (a rank has not entered the pass waited for, so its window is not ready)";
    case kFlagTileDone: return "row tile's first GEMM done (all its column tiles)";
    default: return "unknown flag";
  }
}

}  // namespace mok::kernel
