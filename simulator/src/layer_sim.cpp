// The event engine for one MoE layer: comm-SM programs issue transfers (flows), chunk arrivals
// become signals, signals release expert GEMM tiles, finished experts release the combine.
// Events are per flow (start, rate change, completion), not per chunk: a flow's chunk arrivals
// inside a constant-rate segment follow from its rate, so they are evaluated in one batch.
#include "mok/sim/layer_sim.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <chrono>
#include <atomic>
#include <cmath>
#include <exception>
#include <iterator>
#include <memory>
#include <queue>
#include <sstream>
#include <thread>
#include <utility>

#include "mok/sim/error.hpp"
#include "mok/sim/flow_network.hpp"
#include "checkpoint_heap.hpp"
#include "result_checks.hpp"
#include "tile_ready.hpp"

namespace mok::sim {

namespace {

constexpr int kDispatch = 0;
constexpr int kCombine = 1;
const char* kPhaseName[2] = {"dispatch", "combine"};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t ceil_ns(double x) { return static_cast<int64_t>(std::ceil(x)); }

// The owner's final weighted sum: read K + 1 rows and write one per token, at HBM speed.
double weighted_sum_time_ns(const Topology& topo, const spec::LayerConfig& cfg) {
  return static_cast<double>(cfg.tokens_per_rank) * static_cast<double>(cfg.top_k + 1) *
         static_cast<double>(cfg.hidden) * 2.0 / topo.hbm_gbps;
}

// The compute model's times (ns, before rounding up): one GEMM tile, the shared expert, the final
// weighted sum. Times are int64 nanoseconds: a GPU runs at most all R*T*K slots' tiles (plus a
// partial one per expert), and a layer whose compute could take longer than 1e17 ns (~3 years)
// is refused rather than left to overflow.
struct ComputeTimes {
  double tile = 0, shared = 0, reduce = 0;
};
ComputeTimes compute_times(const Topology& topo, const spec::LayerConfig& cfg, const ProtocolConfig& proto) {
  // The compute SMs run one tile at a time at their share of the GEMM rate.
  const double flops_per_ns = topo.bf16_dense_tflops * 1e3 * topo.gemm_efficiency *
                              static_cast<double>(topo.num_sms - proto.comm_sms) / topo.num_sms;
  const double H = static_cast<double>(cfg.hidden), I = static_cast<double>(cfg.intermediate);
  const double T = static_cast<double>(cfg.tokens_per_rank);
  ComputeTimes t;
  t.tile = 2.0 * 3.0 * H * I * static_cast<double>(proto.gemm_tile_rows) / flops_per_ns;
  t.shared = cfg.has_shared() ? 2.0 * 3.0 * H * static_cast<double>(cfg.shared_intermediate) * T / flops_per_ns : 0.0;
  t.reduce = weighted_sum_time_ns(topo, cfg);
  const double max_tiles = std::ceil(static_cast<double>(cfg.num_slots()) / static_cast<double>(proto.gemm_tile_rows)) +
                           static_cast<double>(cfg.experts_per_rank());
  if (!(t.tile * max_tiles + t.shared + t.reduce < 1e17))
    throw Error("layer: the expert GEMMs could take over 1e17 ns (about 3 years) on one GPU (H=" + std::to_string(cfg.hidden) +
                ", I=" + std::to_string(cfg.intermediate) + ", T=" + std::to_string(cfg.tokens_per_rank) +
                "), past what int64 nanoseconds hold; check the layer sizes and the topology's "
                "gpu.bf16_dense_tflops and gpu.gemm_efficiency");
  return t;
}

// The final weighted sum alone (a combine-only run), refused past 1e17 ns as above.
double combine_reduce_time_ns(const Topology& topo, const spec::LayerConfig& cfg) {
  const double reduce = weighted_sum_time_ns(topo, cfg);
  if (!(reduce < 1e17))
    throw Error("layer: the final weighted sum could take over 1e17 ns (about 3 years) on one GPU (H=" +
                std::to_string(cfg.hidden) + ", T=" + std::to_string(cfg.tokens_per_rank) +
                "), past what int64 nanoseconds hold; check the layer sizes and the topology's hbm_gbps");
  return reduce;
}

// Appends one owner o's (peer, item) pairs, found chunk-major, to `table` grouped by peer, each
// peer's items in their found order (a stable counting sort; `per_peer` is scratch of R + 1),
// sets pair (o, p)'s end in offsets[o * R + p + 1], and calls placed(index, peer) per item.
template <class T, class F>
void append_grouped_by_peer(const std::vector<std::pair<int32_t, T>>& found, int R, int o,
                            std::vector<int64_t>& per_peer, std::vector<T>& table, std::vector<int64_t>& offsets,
                            F&& placed) {
  std::fill(per_peer.begin(), per_peer.end(), 0);
  for (const auto& [p, item] : found) ++per_peer[p + 1];
  for (int p = 0; p < R; ++p) per_peer[p + 1] += per_peer[p];
  const int64_t base = static_cast<int64_t>(table.size());
  for (int p = 0; p < R; ++p) offsets[static_cast<size_t>(o) * R + p + 1] = base + per_peer[p + 1];
  table.resize(base + found.size());
  for (const auto& [p, item] : found) {
    const int64_t idx = base + per_peer[p]++;
    table[idx] = item;
    placed(idx, p);
  }
}

[[noreturn]] void internal_error(const std::string& what) {
  throw Error("internal: layer engine: " + what + "; please report", ErrorKind::kInternal);
}

// What to check when a layer's times run past what int64 nanoseconds hold.
constexpr const char* kTooLongAdvice =
    "check the layer sizes (hidden, tokens_per_rank), protocol.chunk_tokens and the topology's SM issue rates, "
    "in-flight windows (gpu.sm_*_inflight_bytes) and latencies (scale_up.nvlink_latency_ns, "
    "scale_out.nic_latency_ns)";
// No simulated time beyond this (about 32 years): every sum of a time and a delay below 1e17 ns
// (delivery_ns) stays far inside int64.
constexpr int64_t kHorizonNs = 1'000'000'000'000'000'000;
[[noreturn]] void past_horizon(int64_t t_ns) {
  throw Error("layer: simulated time reached " + std::to_string(t_ns) +
              " ns, past the 1e18 ns (about 32 years) the engine allows; " + kTooLongAdvice);
}

// Time for a flow at `rate_gbps` to deliver `need_bytes` more: at least 1 ns when anything is
// left, 0 when nothing is; kNeverNs when the rate is so small that it would overflow.
constexpr int64_t kNeverNs = int64_t{1} << 60;
int64_t delivery_ns(double need_bytes, double rate_gbps) {
  if (need_bytes <= 0) return 0;
  const double dt = need_bytes / rate_gbps;
  if (!(dt < 1e17)) return kNeverNs;
  return std::max<int64_t>(1, detail::ceil_below_1e17(dt));
}

// One chunk of one (token owner o, peer p) pair: the rows of owner o's chunk `chunk_idx` whose
// experts live on p. Dispatch moves it o -> p, combine p -> o, so both phases share one table,
// grouped by owner pair (o * R + p), chunks ascending. 12 bytes: 576 GPUs have ~18 M of them.
struct Piece {
  int32_t chunk_idx;
  int32_t tokens;  // distinct tokens (x rows when dispatch deduplicates per GPU)
  int32_t slots;   // routed slots (y rows unless combine reduces per rank)
};

// The rows of one piece that go to one expert of the peer: `rows` consecutive rows of that
// expert's canonical list (they are one token chunk's). A piece's runs add up to its slots.
struct PieceRun {
  int32_t expert;  // local to the peer GPU
  int32_t rows;
};

struct Traffic {
  std::vector<int64_t> pair_offsets;  // [R*R + 1], owner pair o * R + p
  std::vector<Piece> pieces;
  std::vector<int64_t> pair_run_offsets;  // [R*R + 1]: each pair's runs, piece by piece
  std::vector<PieceRun> runs;
  std::vector<int64_t> recv_pieces[2];         // per destination GPU and phase
  std::vector<int64_t> recv_remote_pieces[2];  // the same without the GPU's own chunks
  std::vector<int64_t> recv_payload[2];        // payload bytes per destination GPU and phase
};

// A transfer: one comm SM moves pieces first, first + stride, ... (count of them) of one
// owner pair between itself and one peer.
struct Transfer {
  int32_t phase;
  int32_t initiator, sm;
  int32_t src, dst;        // data moves src -> dst
  bool is_read;            // pull: the destination reads
  int64_t first, stride, count;
  int64_t bytes;
  double demand_gbps;
  double window_bytes;     // bytes the initiating SM keeps in flight (0: not window-limited)
  int64_t latency_ns;      // one-way
  int64_t start_ns = -1;
  bool in_group = false;   // one of a row-order chunk's transfers, started together (push_order)
  // The per-chunk fence stall folded into demand_gbps (fenced push over NVLink: 2L + fence), 0
  // when none was: a chunk's fluid milestone then already holds the stall that follows it.
  int64_t fence_stall_ns = 0;
};

enum class OpKind : int8_t { kTransfer, kTransferGroup, kWaitLocalReady, kWaitRemoteReady, kBarrierArrive };
struct Op {
  OpKind kind;
  int32_t arg;  // transfer id, transfer group id, peer GPU or phase
};

enum EventKind : int32_t {
  kAgentStep,       // a: agent
  kDstComplete,     // a: phase, b: destination GPU knows all its data
  kAllKnown,        // a: phase, b: destination GPU (barrier)
  kComputeDone,     // b: GPU
  kReadyVisible,    // b: GPU whose expert outputs are ready
  kGpuBarrierArrive,// a: phase, b: GPU
  kReduceDone,      // b: GPU
  kRecompute,       // the rate quantum elapsed
};

struct Event {
  int64_t time_ns;
  uint64_t seq;
  int32_t kind;
  int32_t a;
  int64_t b;
};
struct EventLater {
  bool operator()(const Event& x, const Event& y) const {
    return x.time_ns != y.time_ns ? x.time_ns > y.time_ns : x.seq > y.seq;
  }
};
void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class LayerSim {
 public:
  LayerSim(const Topology& topo, const Workload& work, const ProtocolConfig& proto, const SimOptions& opt)
      : topo_(topo), work_(work), proto_(proto), opt_(opt), cfg_(work.cfg) {}
  ~LayerSim() { stop_helper(); }
  LayerSim(const LayerSim&) = delete;
  LayerSim& operator=(const LayerSim&) = delete;

  LayerResult run();

 private:
  // --- setup
  void check_inputs() const;
  void build_resources();
  void build_traffic();
  void build_compute_model();
  // The final weighted sum on a token owner (ns, unrounded): it reads K slot rows and writes one
  // output row per token. Whole layers and combine-only runs charge it alike.
  double weighted_sum_ns() const { return weighted_sum_time_ns(topo_, cfg_); }
  void build_programs();
  void choose_hbm_paths();
  void add_transfers(int phase, int initiator, Direction dir, std::vector<std::vector<Op>>& programs);
  int path_for(int src, int dst, int* path) const;
  int64_t latency(int src, int dst) const;
  Direction direction(int phase) const { return phase == kDispatch ? proto_.dispatch : proto_.combine; }
  bool phase_on(int phase) const {
    return proto_.phases == Phases::kLayer || (phase == kDispatch ? proto_.phases == Phases::kDispatch
                                                                  : proto_.phases == Phases::kCombine);
  }
  // Bytes a piece puts on the wire in a phase (payload, plus flag lines for flag_in_data).
  int64_t piece_wire_bytes(int phase, int64_t piece, bool remote) const {
    const Piece& p = traffic_.pieces[piece];
    int64_t wire = static_cast<int64_t>(per_token_[phase] ? p.tokens : p.slots) * row_bytes_[phase];
    if (remote && direction(phase) == Direction::kPush && proto_.signaling == Signaling::kFlagInData)
      wire = ceil_div(wire * 128, 120);  // 8 flag bytes in every 128-byte line
    return wire;
  }
  int64_t transfer_piece(const Transfer& tr, int64_t j) const { return tr.first + j * tr.stride; }

  // --- engine
  void schedule(int64_t t, int32_t kind, int32_t a = 0, int64_t b = 0) {
    if (t > kHorizonNs) past_horizon(t);
    events_.push(Event{t, seq_++, kind, a, b});
  }
  void step_agent(int agent, int64_t now);
  void start_transfer(int agent, int tid, int64_t now);
  void replay_milestones(int flow, int64_t now);
  void set_rate_segment(int flow, double rate_gbps, int64_t now);
  // set_rate_segment() for changed flows [begin, end) of a rate assignment; entries up to
  // `known` exist (the prefetches look no further).
  void apply_rates(const int* flows, const int64_t* rates, size_t begin, size_t end, size_t known, int64_t now);
  // A full recompute whose changes the helper thread applies as they are published.
  void recompute_with_helper(int64_t now);
  void helper_loop();
  void stop_helper();
  void on_flow_complete(int flow, int64_t now);
  void on_piece_data(const Transfer& tr, int64_t piece, int64_t t_fluid);
  // t_fence: the last store the fence waits for was issued then (t_issue, or for a row-order
  // chunk's NVLink member the last such store of the whole chunk).
  void signal_after_fence(const Transfer& tr, int64_t piece, int64_t t_issue, int64_t t_fence);
  void resolve_pending_signals();
  void mark_known(int phase, int64_t piece, int src, int dst, int64_t data_ns, int64_t known_ns);
  void on_counter_complete(int phase, int dst);
  void on_all_known(int phase, int gpu, int64_t now);
  // Schedules the GPU's completion of the phase once every piece into it is known and, under
  // barrier signaling, the barrier has released it.
  void complete_if_released(int phase, int gpu);
  bool barrier_push(int phase) const {
    return direction(phase) == Direction::kPush && proto_.signaling == Signaling::kBarrier;
  }
  void on_dst_complete(int phase, int gpu, int64_t now);
  void run_compute_queue(int gpu, int64_t now);
  void check_tiles(int gpu);
  void on_compute_done(int gpu, int64_t now);
  void on_gpu_barrier(int phase, int gpu, int64_t now);
  void run_peer_flags(int phase, int gpu, int64_t now);
  // Calls fn(piece, src) for every piece the phase moves into `dst` (owner pairs differ by phase).
  template <typename Fn>
  void for_each_piece_into(int phase, int dst, bool remote_only, Fn&& fn) const {
    for (int s = 0; s < R_; ++s) {
      if (remote_only && s == dst) continue;
      const size_t pair = phase == kDispatch ? static_cast<size_t>(s) * R_ + dst : static_cast<size_t>(dst) * R_ + s;
      for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i) fn(i, s);
    }
  }
  // A pushing SM fences after each chunk (fence_flag, counter).
  bool fenced_signaling() const {
    return proto_.signaling == Signaling::kFenceFlag || proto_.signaling == Signaling::kCounter;
  }
  int64_t local_poll_period() const {
    return std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns));
  }
  int64_t observe_local(int64_t visible_ns, int64_t period_ns) const {
    return ceil_div(visible_ns, period_ns) * period_ns + static_cast<int64_t>(topo_.local_poll_ns);
  }
  int64_t observe_remote(int64_t visible_ns, int64_t wait_start_ns, int64_t one_way_ns) const;
  // When an SM that began waiting at wait_start_ns sees GPU `peer`'s expert outputs ready:
  // a local flag for its own GPU, a remote poll loop otherwise.
  int64_t observe_ready(int agent, int peer, int64_t wait_start_ns) const {
    const int me = agent / S_;
    const int64_t vis = ready_visible_ns_[peer];
    if (me == peer)
      return observe_local(std::max(vis, wait_start_ns),
                           std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns)));
    return observe_remote(vis, wait_start_ns, latency(me, peer));
  }
  int64_t flag_poll_period(int num_sources) const {
    // A polling warp reads 32 flags per round trip to local memory.
    return std::max<int64_t>(proto_.poll_interval_ns,
                             ceil_div(num_sources, 32) * static_cast<int64_t>(topo_.local_poll_ns));
  }
  void finish(LayerResult& res);

  const Topology& topo_;
  const Workload& work_;
  const ProtocolConfig& proto_;
  const SimOptions& opt_;
  const spec::LayerConfig& cfg_;
  int R_ = 0;
  int S_ = 0;
  int64_t num_chunks_ = 0;
  int64_t row_bytes_[2] = {0, 0};
  bool per_token_[2] = {false, false};

  FlowNetwork net_;
  std::vector<int> res_nvl_out_, res_nvl_in_, res_nic_out_, res_nic_in_, res_hbm_, res_up_out_, res_up_in_;
  std::vector<int> res_kind_;  // resource -> index into kResourceKinds
  std::vector<int64_t> res_bytes_phase_[2];
  // Per GPU: whether remote flows list its HBM on their path (choose_hbm_paths), and the bytes
  // that remote flows moved through each HBM left off their paths (the network credits only the
  // resources on a path).
  std::vector<char> hbm_on_path_;
  std::vector<int64_t> hbm_off_path_bytes_;
  int64_t resource_bytes(int r) const { return net_.resource_bytes()[r] + hbm_off_path_bytes_[r]; }

  Traffic traffic_;
  // Known pieces per destination and phase, and the latest time one of them became known.
  std::vector<int64_t> known_count_[2], max_known_ns_[2];
  std::vector<int64_t> last_data_ns_[2];
  std::vector<int64_t> piece_data_ns_[2];  // only for counter and barrier signaling
  // Counter with signal queueing or row order: what the atomic waits beyond its own 2L + f after
  // the data lands (its port waits; a row-order chunk's fence on its farthest member's acks and
  // on its slowest member's last store).
  std::vector<int64_t> counter_wait_ns_[2];
  std::vector<int64_t> counter_arrivals_[2];
  detail::NsHistogram chunk_signal_[2];
  std::vector<int64_t> completion_signal_[2];
  int64_t signal_writes_[2] = {0, 0};

  // Compute: expert GEMM M-tiles; a tile is ready when every piece holding one of its rows is
  // known. Tiles only feed the GPU's own compute queue, so the queue runs once all of the GPU's
  // dispatch pieces are known (then every tile's ready time is fixed).
  std::vector<int64_t> dispatch_known_ns_;  // per piece: when its destination knows it is there (layer runs only)
  // Per GPU: the dispatch piece into it with the largest (known time, piece index), the one
  // that released its last tile, with its last byte's arrival.
  struct LastPiece {
    int64_t piece = -1, known_ns = INT64_MIN, data_ns = 0;  // known_ns: below every known time
  };
  std::vector<LastPiece> last_dispatch_piece_;
  std::vector<int64_t> compute_busy_ns_;
  int64_t tile_ns_ = 0, shared_ns_ = 0, reduce_ns_ = 0;
  std::vector<int64_t> last_tile_piece_data_ns_, last_tile_piece_known_ns_, last_tile_source_;
  detail::TileReady tiles_;                               // scratch
  std::vector<std::pair<int64_t, int32_t>> tile_ready_;  // scratch: (ready ns, tile)
  std::vector<int64_t> tile_expert_rows_;                 // scratch: rows per local expert

  // Programs
  std::vector<Transfer> transfers_;
  std::vector<std::pair<int32_t, int32_t>> groups_;  // row-order chunk: (first transfer, count)
  std::vector<int32_t> group_pending_;               // per agent: its group's unfinished transfers
  std::vector<int32_t> group_fenced_;                // per group: its fenced NVLink members
  std::vector<std::vector<Op>> programs_;  // agent = gpu * S + sm
  std::vector<int32_t> pc_;
  std::vector<int64_t> ready_visible_ns_;  // per GPU, -1 until expert outputs are ready
  std::vector<std::vector<int32_t>> ready_waiters_;  // per GPU: agents waiting for it
  std::vector<int64_t> wait_start_ns_;
  std::vector<int32_t> barrier_arrivals_[2];
  std::vector<int64_t> barrier_gpu_ns_[2];
  std::vector<int64_t> barrier_done_ns_[2];  // per GPU: when the barrier released it, -1 before
  int32_t barrier_gpus_[2] = {0, 0};

  // Per flow: its current constant-rate segment (start, bytes delivered then, rate). Chunk
  // milestones follow from the segments: piece j's milestone lies in the first segment whose
  // rate carries the flow past the bytes through piece j before the next
  // segment starts. Each segment is examined when it closes (a rate change), so no segment log
  // is kept; the milestones found are handed on in one batch when the flow completes, never as
  // one event each.
  struct alignas(64) FlowState {  // one cache line: what a rate change reads and writes
    int64_t seg_t0;      // current segment's start
    double seg_d0;       // bytes delivered at seg_t0
    double seg_rate;     // bytes per ns in this segment; -1 before the first assignment
    int64_t next_cum;    // bytes through piece next_piece (the first without a milestone yet);
                         // kNoPiece when every piece has its milestone
    // The flow's piece table is flow_piece_ns_[f]: entry j is the milestone time of piece j for
    // the pieces before the next one without a milestone, the bytes through piece j for the
    // others. This points at the next one's entry, so that closing a segment touches no other
    // line of the engine's (and needs no index).
    int64_t* next_piece;
    int64_t key_bound;   // at least the flow's key in checkpoints_ (INT64_MAX when absent)
    int64_t due_ns;      // completion time at the current rate; INT64_MAX: none (not in checkpoints_)
    double total;        // the flow's bytes (here rather than read from the network's flow line)
  };
  // The piece table's entry after the last piece, and next_cum once every piece has its milestone.
  static constexpr int64_t kNoPiece = INT64_MIN;
  static_assert(sizeof(FlowState) == 64, "a FlowState fills one cache line");
  std::vector<FlowState> flow_state_;               // by flow index
  std::vector<std::vector<int64_t>> flow_piece_ns_;  // by flow index: the piece tables
  std::vector<int32_t> flow_transfer_;               // by flow index: its transfer (the issuing SM
                                                     // is the transfer's initiator * S + sm)
  // Milestones inside the current segment of flow f, for a segment that ends at end_ns.
  static void close_segment(FlowState& fs, int64_t end_ns);
  std::vector<int64_t> combine_last_source_;  // per destination: producer of its latest combine data
  std::vector<int64_t> combine_last_data_ns_;

  std::vector<GpuTimeline> gpu_;
  // Per GPU: its own GEMMs (shared expert and tiles) have ended; all its combine data is known.
  // The final weighted sum starts when both hold.
  std::vector<char> compute_finished_, combine_completed_;
  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  detail::CheckpointHeap checkpoints_;
  uint64_t seq_ = 0;
  int64_t num_events_ = 0, num_flows_ = 0, num_milestones_ = 0, num_flows_done_ = 0;
  bool dirty_ = false;
  bool recompute_scheduled_ = false;
  std::vector<int> new_flows_;  // started since the last rate assignment
  // Signal queueing: per resource, (from ns, queueing delay ns) whenever it changes.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> port_delay_history_;
  std::vector<double> port_queue_bytes_;
  // Signals whose port wait is looked up once the instant's queues are known (signal queueing):
  // a fenced chunk (transfer, piece, when its last byte was issued), or a GPU's per-peer flags.
  struct PendingSignal {
    int32_t transfer;
    int64_t piece;
    int64_t t_issue;
    int64_t t_fence;  // see signal_after_fence
  };
  std::vector<PendingSignal> pending_signals_;
  // A fenced row-order chunk: one fence after all of its NVLink stores, so each member's signal
  // waits for the chunk's last store. Per agent (an SM runs one chunk at a time): its NVLink
  // members whose data has not ended, the latest last-store issue among those that have, and
  // their signals, raised when the last one ends. The chunk's local member writes its local
  // flag after the same fence: the group's NVLink member count, the fence's end once known, and
  // the local pieces (transfer, piece, arrival) that wait for it.
  std::vector<int32_t> group_fence_pending_;
  std::vector<int64_t> group_fence_issue_;
  std::vector<std::vector<PendingSignal>> group_signals_;
  std::vector<int32_t> group_fenced_count_;
  std::vector<int64_t> group_fence_done_;
  std::vector<std::vector<std::array<int64_t, 3>>> group_local_signals_;
  void mark_local_known(const Transfer& tr, int64_t piece, int64_t arrive, int64_t fence_done);
  void raise_signal(const PendingSignal& s);
  std::vector<std::array<int64_t, 3>> pending_peer_flags_;  // (phase, gpu, time)
  void update_port_queues(int64_t now);
  int64_t port_delay(int resource, int64_t t) const {
    const auto& h = port_delay_history_[resource];
    auto it = std::upper_bound(h.begin(), h.end(), std::make_pair(t, INT64_MAX));
    return it == h.begin() ? 0 : std::prev(it)->second;
  }
  int64_t last_recompute_ns_ = INT64_MIN / 2;
  std::vector<TraceSpan> trace_;
  // The helper thread (SimOptions::threads): one job per full recompute. The main thread writes
  // the job's fields, then bumps `job` (release); the network publishes the changed entries'
  // count in `published` as the filling goes, the main thread the final count in `total`; the
  // helper sets `done` to the job's number when it has applied them all. While a job runs only
  // the helper touches the engine's per-flow state and the completion heap, and only the main
  // thread the network.
  struct Helper {
    std::thread thread;
    std::atomic<uint64_t> job{0}, done{0};
    std::atomic<int64_t> published{0}, total{-1};
    std::atomic<bool> stop{false};
    int64_t now = 0;
    const int* flows = nullptr;
    const int64_t* rates = nullptr;
    std::exception_ptr error;
  };
  std::unique_ptr<Helper> helper_;
};

const char* kResourceKinds[] = {"nvlink_out", "nvlink_in", "nic_out", "nic_in", "hbm", "uplink_out", "uplink_in"};

void LayerSim::check_inputs() const {
  if (cfg_.num_ranks > topo_.num_gpus()) {
    std::ostringstream os;
    os << "layer.num_ranks = " << cfg_.num_ranks << " but topology '" << topo_.name << "' has only "
       << topo_.num_gpus() << " GPUs; lower num_ranks or pick a larger topology";
    throw Error(os.str());
  }
  if (proto_.comm_sms >= topo_.num_sms) {
    std::ostringstream os;
    os << "protocol.comm_sms = " << proto_.comm_sms << " leaves no SM for the expert GEMMs on a "
       << topo_.num_sms << "-SM GPU; use fewer comm SMs";
    throw Error(os.str());
  }
}

int LayerSim::path_for(int src, int dst, int* path) const {
  if (src == dst) {  // local copy: HBM read and write
    path[0] = res_hbm_[src];
    path[1] = res_hbm_[src];
    return 2;
  }
  int n = 0;
  if (hbm_on_path_[src]) path[n++] = res_hbm_[src];
  if (topo_.domain_of(src) == topo_.domain_of(dst)) {
    path[n++] = res_nvl_out_[src];
    path[n++] = res_nvl_in_[dst];
  } else {
    path[n++] = res_nic_out_[src];
    if (!res_up_out_.empty()) {
      path[n++] = res_up_out_[topo_.domain_of(src)];
      path[n++] = res_up_in_[topo_.domain_of(dst)];
    }
    path[n++] = res_nic_in_[dst];
  }
  if (hbm_on_path_[dst]) path[n++] = res_hbm_[dst];
  return n;
}

int64_t LayerSim::latency(int src, int dst) const {
  if (src == dst) return 0;
  return topo_.domain_of(src) == topo_.domain_of(dst) ? static_cast<int64_t>(topo_.nvlink_latency_ns)
                                                      : static_cast<int64_t>(topo_.nic_latency_ns);
}

int64_t LayerSim::observe_remote(int64_t visible_ns, int64_t wait_start_ns, int64_t one_way_ns) const {
  // Poll k is issued at wait_start + k*P, reads the remote flag one way later, and returns one
  // more way later; P is at least one round trip (a warp polls one remote flag at a time).
  const int64_t period = std::max<int64_t>(proto_.poll_interval_ns, 2 * one_way_ns);
  const int64_t need = visible_ns - one_way_ns - wait_start_ns;
  const int64_t k = need <= 0 ? 0 : ceil_div(need, period);
  return wait_start_ns + k * period + 2 * one_way_ns;
}

void LayerSim::build_resources() {
  const int G = R_;
  const double nvl = topo_.nvlink_effective_gbps();
  const double nic = topo_.nic_effective_gbps();
  auto add = [&](int kind, double cap, const std::string& name) {
    res_kind_.push_back(kind);
    return net_.add_resource(cap, name);
  };
  for (int g = 0; g < G; ++g) {
    const std::string id = std::to_string(g);
    res_hbm_.push_back(add(4, topo_.hbm_gbps, "gpu" + id + ".hbm"));
    res_nvl_out_.push_back(add(0, nvl, "gpu" + id + ".nvlink_out"));
    res_nvl_in_.push_back(add(1, nvl, "gpu" + id + ".nvlink_in"));
    res_nic_out_.push_back(add(2, nic, "gpu" + id + ".nic_out"));
    res_nic_in_.push_back(add(3, nic, "gpu" + id + ".nic_in"));
  }
  const int domains = topo_.domain_of(G - 1) + 1;
  if (topo_.uplink_oversubscription > 1.0 && domains > 1) {
    const double up = topo_.gpus_per_domain * nic / topo_.uplink_oversubscription;
    for (int d = 0; d < domains; ++d) {
      res_up_out_.push_back(add(5, up, "domain" + std::to_string(d) + ".uplink_out"));
      res_up_in_.push_back(add(6, up, "domain" + std::to_string(d) + ".uplink_in"));
    }
  }
  for (auto& v : res_bytes_phase_) v.assign(net_.num_resources(), 0);
}

// Pieces from the routing: for each token owner o and chunk c, rows per peer GPU p.
// Dispatch moves o -> p (x rows, once per token and GPU when deduplicated); combine moves p -> o
// (y rows, once per slot unless reduced per rank). With each piece, its runs: its slots per
// expert of p, which is all the compute queue needs of the routing (run_compute_queue()); only
// a whole layer runs the queue, so only then are they kept.
void LayerSim::build_traffic() {
  const int64_t T = cfg_.tokens_per_rank, K = cfg_.top_k, C = proto_.chunk_tokens;
  num_chunks_ = ceil_div(T, C);
  const int64_t H = cfg_.hidden;
  row_bytes_[kDispatch] = H * proto_.dispatch_bytes_per_element +
                          (proto_.dispatch_bytes_per_element == 1 ? ceil_div(H, 128) * 4 : 0);
  row_bytes_[kCombine] = H * proto_.combine_bytes_per_element;
  per_token_[kDispatch] = proto_.dispatch_dedup;
  per_token_[kCombine] = proto_.combine_reduce_per_rank;
  auto& off = traffic_.pair_offsets;
  off.assign(static_cast<size_t>(R_) * R_ + 1, 0);
  auto& run_off = traffic_.pair_run_offsets;
  run_off.assign(static_cast<size_t>(R_) * R_ + 1, 0);
  for (int ph = 0; ph < 2; ++ph) {
    traffic_.recv_pieces[ph].assign(R_, 0);
    traffic_.recv_remote_pieces[ph].assign(R_, 0);
    traffic_.recv_payload[ph].assign(R_, 0);
  }
  const int64_t E = cfg_.num_experts;
  std::vector<int32_t> rank_of(E), local_of(E);
  for (int64_t e = 0; e < E; ++e) {
    rank_of[e] = static_cast<int32_t>(cfg_.owner_rank(e));
    local_of[e] = static_cast<int32_t>(e - cfg_.first_expert(rank_of[e]));
  }
  std::vector<int32_t> slots(R_, 0), tokens(R_, 0), last_token(R_, -1);
  std::vector<int32_t> expert_slots(E, 0), touched(E + 1);  // the chunk's slots per expert, experts met
  std::vector<std::pair<int32_t, Piece>> found;  // one owner's pieces, chunk-major
  std::vector<std::pair<int32_t, PieceRun>> found_runs;  // one owner's runs, chunk-major
  std::vector<int64_t> per_peer(R_ + 1);
  traffic_.pieces.clear();
  traffic_.pieces.reserve(static_cast<size_t>(std::min<int64_t>(cfg_.num_slots(), int64_t{R_} * R_ * num_chunks_)));
  const bool keep_runs = proto_.phases == Phases::kLayer;
  traffic_.runs.clear();
  if (keep_runs)
    traffic_.runs.reserve(static_cast<size_t>(std::min<int64_t>(cfg_.num_slots(), int64_t{R_} * num_chunks_ * E)));
  for (int o = 0; o < R_; ++o) {
    found.clear();
    found_runs.clear();
    for (int64_t c = 0; c < num_chunks_; ++c) {
      const int64_t t_end = std::min(T, (c + 1) * C);
      int64_t num_touched = 0;
      for (int64_t t = c * C; t < t_end; ++t) {
        const int32_t* row = &work_.topk_experts[(o * T + t) * K];
        for (int64_t k = 0; k < K; ++k) {
          const int32_t e = row[k];
          if (e < 0) continue;
          // No branch on whether the token or the expert is new: with popular experts on one GPU
          // both go either way unpredictably.
          const int p = rank_of[e];
          tokens[p] += last_token[p] != static_cast<int32_t>(t);
          last_token[p] = static_cast<int32_t>(t);
          touched[num_touched] = e;  // kept when e is new to the chunk
          num_touched += expert_slots[e]++ == 0;
        }
      }
      // ORDER: experts in the order the chunk met them; any order would do, for a piece's runs
      // go to distinct experts.
      for (int64_t i = 0; i < num_touched; ++i) {
        const int32_t e = touched[i];
        if (keep_runs) found_runs.emplace_back(rank_of[e], PieceRun{local_of[e], expert_slots[e]});
        slots[rank_of[e]] += expert_slots[e];
        expert_slots[e] = 0;
      }
      for (int p = 0; p < R_; ++p) {
        if (slots[p] == 0) continue;
        found.emplace_back(p, Piece{static_cast<int32_t>(c), tokens[p], slots[p]});
        slots[p] = 0;
        tokens[p] = 0;
        last_token[p] = -1;
      }
    }
    // Regrouped by peer (stable, so chunks stay ascending): pair (o, p) is one contiguous run of
    // pieces, and its runs follow its pieces' order.
    append_grouped_by_peer(found, R_, o, per_peer, traffic_.pieces, off, [&](int64_t idx, int p) {
      for (int ph = 0; ph < 2; ++ph) {
        const int dst = ph == kDispatch ? p : o;
        traffic_.recv_payload[ph][dst] += piece_wire_bytes(ph, idx, false);
        ++traffic_.recv_pieces[ph][dst];
        if (o != p) ++traffic_.recv_remote_pieces[ph][dst];
      }
    });
    append_grouped_by_peer(found_runs, R_, o, per_peer, traffic_.runs, run_off, [](int64_t, int) {});
  }
}

void LayerSim::build_compute_model() {
  const ComputeTimes t = compute_times(topo_, cfg_, proto_);
  const double tile = t.tile, shared = t.shared, reduce = t.reduce;
  tile_ns_ = ceil_ns(tile);
  shared_ns_ = cfg_.has_shared() ? ceil_ns(shared) : 0;
  reduce_ns_ = ceil_ns(reduce);
  dispatch_known_ns_.assign(traffic_.pieces.size(), 0);
  last_dispatch_piece_.assign(R_, LastPiece{});
}

// Gives the initiator's comm SMs their transfers for one phase. Peers are visited in an order
// rotated by the initiator's index, so that GPUs do not all start on the same peer.
void LayerSim::add_transfers(int phase, int initiator, Direction dir, std::vector<std::vector<Op>>& programs) {
  const bool is_read = dir == Direction::kPull;
  // `fenced`: the SM fences after each of the transfer's num_pieces chunks (fence_stall_ns > 0).
  auto demand_for = [&](int src, int dst, int64_t bytes, int64_t num_pieces, bool fenced) {
    const double L = static_cast<double>(latency(src, dst));
    const bool tma = proto_.copy_engine == CopyEngine::kTma;
    // Issue rates: a push's SM stores, a pull's SM loads; a local copy does both.
    const double store = tma ? topo_.sm_tma_store_gbps : topo_.sm_store_gbps;
    const double load = tma ? topo_.sm_tma_load_gbps : topo_.sm_load_gbps;
    const double issue = is_read ? load : store;
    if (src == dst) return std::min(load, store);  // local copy, either direction: issue-bound
    if (topo_.domain_of(src) != topo_.domain_of(dst)) return 1e6;  // NIC DMA engines move it
    // Little's law: one SM moves at most (bytes it may keep in flight) / (round trip).
    const double inflight = is_read ? (tma ? topo_.sm_tma_load_inflight_bytes : topo_.sm_load_inflight_bytes)
                                    : topo_.sm_store_inflight_bytes;
    double d = std::min(issue, inflight / (2.0 * L));
    if (fenced) {
      // After each chunk the SM fences: it issues nothing until the acks of its writes return
      // (one round trip after the last byte lands) and the fence itself retires, and the drained
      // pipe then refills: about 2L + fence overhead of lost issue time per chunk.
      const double stall = 2.0 * L + topo_.fence_overhead_ns;
      const double b = static_cast<double>(bytes);
      d = b / (b / d + static_cast<double>(num_pieces) * stall);
    }
    return d;
  };
  auto folded_stall = [&](int src, int dst, int64_t L) -> int64_t {
    if (is_read || !fenced_signaling() || src == dst || topo_.domain_of(src) != topo_.domain_of(dst)) return 0;
    return 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns);
  };
  auto make_transfer = [&](int sm, int peer, int64_t first, int64_t stride, int64_t count) {
    if (count <= 0) return;
    Transfer t{};
    t.phase = phase;
    t.initiator = initiator;
    t.sm = sm;
    t.src = dir == Direction::kPush ? initiator : peer;
    t.dst = dir == Direction::kPush ? peer : initiator;
    t.is_read = is_read;
    t.first = first;
    t.stride = stride;
    t.count = count;
    t.bytes = 0;
    for (int64_t j = 0; j < count; ++j) t.bytes += piece_wire_bytes(phase, first + j * stride, t.src != t.dst);
    t.latency_ns = latency(t.src, t.dst);
    t.fence_stall_ns = folded_stall(t.src, t.dst, t.latency_ns);
    t.demand_gbps = demand_for(t.src, t.dst, t.bytes, count, t.fence_stall_ns > 0);
    const bool tma = proto_.copy_engine == CopyEngine::kTma;
    t.window_bytes = t.src == t.dst || topo_.domain_of(t.src) != topo_.domain_of(t.dst)
                         ? 0.0
                         : (is_read ? (tma ? topo_.sm_tma_load_inflight_bytes : topo_.sm_load_inflight_bytes)
                                    : topo_.sm_store_inflight_bytes);
    programs[sm].push_back(Op{OpKind::kTransfer, static_cast<int32_t>(transfers_.size())});
    transfers_.push_back(t);
  };
  if (phase == kDispatch && dir == Direction::kPush && proto_.push_row_order) {
    // Row order: chunk c of the initiator's tokens goes to SM c % S, which writes its rows to
    // every destination at once (one transfer per destination, started together) with one
    // shared window: destination p gets the share b_p / B of the SM's rate cap, B the chunk's
    // bytes; a fence per chunk (fence_flag, counter) stalls the SM once per chunk.
    std::vector<std::vector<std::pair<int, int64_t>>> by_chunk(num_chunks_);  // (peer, piece)
    for (int k = 0; k < R_; ++k) {
      const int peer = (initiator + k) % R_;
      const size_t pair = static_cast<size_t>(initiator) * R_ + peer;
      for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i)
        by_chunk[traffic_.pieces[i].chunk_idx].emplace_back(peer, i);
    }
    const bool fenced = fenced_signaling();
    for (int64_t c = 0; c < num_chunks_; ++c) {
      const auto& members = by_chunk[c];
      if (members.empty()) continue;
      const int sm = static_cast<int>(c % S_);
      const int32_t first = static_cast<int32_t>(transfers_.size());
      int64_t chunk_bytes = 0;  // the bytes the SM itself moves (NVLink and local members): its window's
      for (const auto& [peer, piece] : members) {
        make_transfer(sm, peer, piece, 1, 1);
        programs[sm].pop_back();  // the group op below starts them
        const Transfer& t = transfers_.back();
        if (!(t.src != t.dst && topo_.domain_of(t.src) != topo_.domain_of(t.dst))) chunk_bytes += t.bytes;
      }
      const double B = static_cast<double>(std::max<int64_t>(chunk_bytes, 1));
      // The chunk's fence waits for the acks of the SM's own remote stores, the NVLink members'
      // (NIC members are moved by the NIC's DMA engines, local ones need no ack).
      int64_t L = 0;
      for (size_t m = first; m < transfers_.size(); ++m) {
        const Transfer& t = transfers_[m];
        if (t.src != t.dst && topo_.domain_of(t.src) == topo_.domain_of(t.dst)) L = std::max(L, t.latency_ns);
      }
      for (size_t m = first; m < transfers_.size(); ++m) {
        Transfer& t = transfers_[m];
        t.in_group = true;
        const double share = static_cast<double>(t.bytes) / B;
        const bool nic = t.src != t.dst && topo_.domain_of(t.src) != topo_.domain_of(t.dst);
        if (nic) continue;  // NIC DMA engines move it, not the SM
        const bool tma = proto_.copy_engine == CopyEngine::kTma;
        const double issue = tma ? topo_.sm_tma_store_gbps : topo_.sm_store_gbps;
        const double load = tma ? topo_.sm_tma_load_gbps : topo_.sm_load_gbps;
        double d = t.src == t.dst ? std::min(issue, load)  // local copy: loads and stores
                                  : std::min(issue, topo_.sm_store_inflight_bytes / (2.0 * static_cast<double>(t.latency_ns)));
        d *= share;
        if (fenced && t.src != t.dst) {
          const double b = static_cast<double>(t.bytes);
          d = b / (b / d + 2.0 * static_cast<double>(L) + topo_.fence_overhead_ns);
          t.fence_stall_ns = 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns);
        }
        t.demand_gbps = d;
        t.window_bytes *= share;
      }
      groups_.emplace_back(first, static_cast<int32_t>(transfers_.size()) - first);
      int32_t fenced_members = 0;
      for (size_t m = first; m < transfers_.size(); ++m) fenced_members += transfers_[m].fence_stall_ns > 0;
      group_fenced_.push_back(fenced_members);
      programs[sm].push_back(Op{OpKind::kTransferGroup, static_cast<int32_t>(groups_.size() - 1)});
    }
    return;
  }
  for (int k = 0; k < R_; ++k) {
    const int peer = (initiator + k) % R_;
    const int src = dir == Direction::kPush ? initiator : peer;
    const int dst = dir == Direction::kPush ? peer : initiator;
    const int owner = phase == kDispatch ? src : dst, other = phase == kDispatch ? dst : src;
    const size_t pair = static_cast<size_t>(owner) * R_ + other;
    const int64_t b = traffic_.pair_offsets[pair], e = traffic_.pair_offsets[pair + 1];
    if (S_ >= R_) {
      // Peer k is served by SMs k, k+R, k+2R, ...; they deal its chunks round-robin.
      const int lanes = (S_ - 1 - k) / R_ + 1;
      for (int lane = 0; lane < lanes; ++lane) {
        const int64_t count = e - b > lane ? ceil_div(e - b - lane, lanes) : 0;
        if (phase == kCombine && dir == Direction::kPull && count > 0)
          programs[k + lane * R_].push_back(Op{OpKind::kWaitRemoteReady, peer});
        make_transfer(k + lane * R_, peer, b + lane, lanes, count);
      }
    } else {
      // SM j serves peers j, j+S, j+2S, ... one after the other.
      if (phase == kCombine && dir == Direction::kPull && e > b)
        programs[k % S_].push_back(Op{OpKind::kWaitRemoteReady, peer});
      make_transfer(k % S_, peer, b, 1, e - b);
    }
  }
}

// A GPU's HBM is left off the paths of remote flows when it provably never saturates, for then
// it changes no rate. Every remote flow through it also crosses one of the GPU's four ports,
// whose rates never exceed their capacities, and local copies (which keep it, twice, and are the
// only flows the network then sees on it) never exceed their demands: it carries at most
// `bound`. A resource that saturates carries more than its capacity minus its number of flow
// entries (at that step floor(rem / n) is the level for all n unfrozen entries), so capacity -
// bound > the flows that can pass it rules saturation out. Under a rate quantum, admit() takes the
// smallest residual on a path, first in path order: capacity - bound above every port capacity
// keeps an HBM's residual above every port's (no tie either), and above twice a local copy's
// demand keeps local copies at their demand.
void LayerSim::choose_hbm_paths() {
  hbm_on_path_.assign(R_, 1);
  hbm_off_path_bytes_.assign(net_.num_resources(), 0);
  if (opt_.hbm_on_every_path) return;
  using Wide = __int128;  // sums of up to 2^61 per term
  std::vector<Wide> local_demand(R_, 0), max_local(R_, 0), num_entries(R_, 0);
  for (const Transfer& t : transfers_) {
    if (t.src == t.dst) {
      const int64_t d = rate_units(t.demand_gbps);
      local_demand[t.src] += 2 * Wide{d};
      max_local[t.src] = std::max(max_local[t.src], Wide{d});
      num_entries[t.src] += 2;
    } else {
      ++num_entries[t.src];
      ++num_entries[t.dst];
    }
  }
  const Wide nvl = rate_units(topo_.nvlink_effective_gbps()), nic = rate_units(topo_.nic_effective_gbps());
  const Wide ports = 2 * nvl + 2 * nic;
  const Wide hbm = rate_units(topo_.hbm_gbps);
  for (int g = 0; g < R_; ++g) {
    const Wide room = hbm - ports - local_demand[g];
    hbm_on_path_[g] = !(room > num_entries[g] && room > std::max(nvl, nic) && room > 2 * max_local[g]);
  }
}

void LayerSim::build_programs() {
  programs_.assign(static_cast<size_t>(R_) * S_, {});
  for (int g = 0; g < R_; ++g) {
    std::vector<std::vector<Op>> programs(S_);
    for (int phase = 0; phase < 2; ++phase) {
      if (!phase_on(phase)) continue;
      const Direction dir = direction(phase);
      if (phase == kCombine && dir == Direction::kPush && proto_.phases == Phases::kLayer)
        for (auto& prog : programs) prog.push_back(Op{OpKind::kWaitLocalReady, g});
      add_transfers(phase, g, dir, programs);
      if (dir == Direction::kPush &&
          (proto_.signaling == Signaling::kBarrier || proto_.signaling == Signaling::kPeerFenceFlag))
        for (auto& prog : programs) prog.push_back(Op{OpKind::kBarrierArrive, phase});
    }
    for (int sm = 0; sm < S_; ++sm) programs_[static_cast<size_t>(g) * S_ + sm] = std::move(programs[sm]);
  }
  pc_.assign(programs_.size(), 0);
  group_pending_.assign(programs_.size(), 0);
  if (!groups_.empty()) {
    group_fence_pending_.assign(programs_.size(), 0);
    group_fence_issue_.assign(programs_.size(), INT64_MIN);
    group_signals_.assign(programs_.size(), {});
    group_fenced_count_.assign(programs_.size(), 0);
    group_fence_done_.assign(programs_.size(), INT64_MIN);
    group_local_signals_.assign(programs_.size(), {});
  }
  wait_start_ns_.assign(programs_.size(), 0);
  std::vector<double> demands;
  demands.reserve(transfers_.size());
  for (const Transfer& t : transfers_) demands.push_back(t.demand_gbps);
  net_.declare_demands(std::move(demands));
  // An SM runs one transfer at a time (outside row-order groups), so its flow can take the SM's
  // own slot: the flows of a GPU's SMs then lie together in the per-flow arrays, which is where
  // a rate update's scans of a port's flows read.
  net_.reserve_slots(static_cast<int>(programs_.size()));
}

void LayerSim::start_transfer(int agent, int tid, int64_t now) {
  Transfer& tr = transfers_[tid];
  tr.start_ns = now;
  int path[kMaxPathLen];
  const int n = path_for(tr.src, tr.dst, path);
  const int f = net_.start_flow(path, n, tr.demand_gbps, tr.bytes, tr.in_group ? -1 : agent);
  ++num_flows_;
  if (static_cast<size_t>(f) >= flow_state_.size()) {
    flow_state_.resize(f + 1);
    flow_piece_ns_.resize(f + 1);
    flow_transfer_.resize(f + 1);
  }
  // The bytes through each piece, read once here in piece order (a transfer's pieces lie
  // together in the piece table) rather than one at a time as segments close.
  std::vector<int64_t>& table = flow_piece_ns_[f];
  table.resize(static_cast<size_t>(tr.count) + 1);
  int64_t cum = 0;
  for (int64_t j = 0; j < tr.count; ++j) {
    cum += piece_wire_bytes(tr.phase, transfer_piece(tr, j), tr.src != tr.dst);
    table[j] = cum;
  }
  table[tr.count] = kNoPiece;
  flow_state_[f] = FlowState{now,       0.0,       -1.0,      table[0], table.data(), INT64_MAX, INT64_MAX,
                             static_cast<double>(net_.flow(f).total_bytes)};
  flow_transfer_[f] = tid;
  checkpoints_.erase(f);
  new_flows_.push_back(f);
  dirty_ = true;
}

// Milestones of flow f inside its current segment, which ends at end_ns: piece j's last byte
// passes the bottleneck at t0 + ceil((bytes through j - d0) / rate); when that is after end_ns,
// the piece and every later one are left to later segments.
void LayerSim::close_segment(FlowState& fs, int64_t end_ns) {
  while (fs.next_cum != kNoPiece) {
    const int64_t dt =
        fs.seg_rate > 0 ? delivery_ns(static_cast<double>(fs.next_cum) - fs.seg_d0, fs.seg_rate) : kNeverNs;
    const int64_t t = dt >= kNeverNs ? kNeverNs : fs.seg_t0 + dt;
    if (t > end_ns) return;
    *fs.next_piece = t;
    fs.next_cum = *++fs.next_piece;
  }
}

// A new constant-rate segment from `now`: the old one's milestones are found (a segment of zero
// length carries none), then the completion is rescheduled.
void LayerSim::set_rate_segment(int f, double rate, int64_t now) {
  FlowState& fs = flow_state_[f];
  const double total = fs.total;
  double d = 0;
  if (fs.seg_rate >= 0) {
    d = fs.seg_d0;
    if (fs.seg_rate > 0) d = std::min(d + fs.seg_rate * static_cast<double>(now - fs.seg_t0), total);
    // A segment can carry a milestone only at a positive rate, and only when the flow got near
    // the next piece's end: if those bytes exceed what it delivered by 2^-40 of them, the exact
    // test in close_segment() would find the milestone after `now` (the rounding of d and of
    // the division there is below 2^-50 relative), so it is skipped.
    if (now > fs.seg_t0 && fs.seg_rate > 0 && fs.next_cum != kNoPiece) {
      const double next = static_cast<double>(fs.next_cum);
      if (!(next > d + 0x1p-40 * next)) close_segment(fs, now);
    }
  }
  fs.seg_t0 = now;
  fs.seg_d0 = d;
  fs.seg_rate = rate;
  const int64_t dt = rate > 0 ? delivery_ns(total - d, rate) : kNeverNs;
  if (dt >= kNeverNs) {
    checkpoints_.erase(f);
    fs.key_bound = INT64_MAX;
    fs.due_ns = INT64_MAX;
    return;
  }
  // At or after the entry's key (later than before, always): the key stays a lower bound of the
  // due time and the heap is not touched. key_bound >= the key, and due < the key implies due <
  // the old due (key <= due), so this lowers exactly the keys that lower() would change.
  const int64_t due = now + dt;
  if (due > kHorizonNs) past_horizon(due);
  if (due < fs.key_bound) {
    checkpoints_.lower(f, due);
    fs.key_bound = due;  // the key is now at most due
  }
  fs.due_ns = due;
}

// Only flows whose rate changed (and new ones) start a new segment; any order will do (ties in
// the completion heap go by flow index). The flows' segment lines are scattered: each is
// requested 8 flows ahead. Four flows ahead (by then the segment line has arrived), the line of
// its piece table that closing the segment reads is requested too, but only when the flow may
// have reached its next piece's end (the test of set_rate_segment() with a wide margin): most
// rate changes carry no milestone, and a request for every one of them fetched a line of a 9 MB
// table (racks8) in vain six times out of seven. A prefetch changes no result.
void LayerSim::apply_rates(const int* flows, const int64_t* rates, size_t begin, size_t end, size_t known,
                           int64_t now) {
  const double now_d = static_cast<double>(now);
  for (size_t i = begin; i < end; ++i) {
    if (i + 8 < known) __builtin_prefetch(&flow_state_[flows[i + 8]], 1);
    if (i + 4 < known) {
      const FlowState& a = flow_state_[flows[i + 4]];
      if (a.next_cum != kNoPiece && a.seg_rate > 0 &&
          a.seg_d0 + a.seg_rate * (now_d - static_cast<double>(a.seg_t0)) >=
              static_cast<double>(a.next_cum) * (1.0 - 0x1p-20))
        __builtin_prefetch(a.next_piece, 1);
    }
    set_rate_segment(flows[i], units_to_gbps(rates[i]), now);
  }
}

void LayerSim::recompute_with_helper(int64_t now) {
  Helper& h = *helper_;
  net_.reserve_changes();  // the lists stay where they are through the recompute
  h.now = now;
  h.flows = net_.changed_flows().data();
  h.rates = net_.changed_rates().data();
  h.published.store(0, std::memory_order_relaxed);
  h.total.store(-1, std::memory_order_relaxed);
  const uint64_t job = h.job.load(std::memory_order_relaxed) + 1;
  h.job.store(job, std::memory_order_release);
  std::exception_ptr failed;
  try {
    net_.recompute_rates();  // publishes its changed entries to h.published as it goes
  } catch (...) {
    failed = std::current_exception();
  }
  // Even after a failure the job ends (the helper applies what was published), so that the
  // helper is idle again and the destructor can join it.
  const bool moved = net_.changed_flows().data() != h.flows;
  h.total.store(failed || moved ? h.published.load(std::memory_order_relaxed)
                                : static_cast<int64_t>(net_.changed_flows().size()),
                std::memory_order_release);
  while (h.done.load(std::memory_order_acquire) != job) cpu_relax();
  if (failed) std::rethrow_exception(failed);
  if (h.error) std::rethrow_exception(h.error);
  if (moved) throw Error("internal: the changed-flow list moved during a filling; please report", ErrorKind::kInternal);
}

void LayerSim::helper_loop() {
  Helper& h = *helper_;
  uint64_t seen = 0;
  for (;;) {
    // Between jobs the main thread runs events (tens of microseconds at racks scale): spin a
    // while, then give the core away.
    for (int spins = 0; h.job.load(std::memory_order_acquire) == seen;) {
      if (h.stop.load(std::memory_order_relaxed)) return;
      if (spins < 4096) {
        ++spins;
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    ++seen;
    try {
      size_t applied = 0;
      for (;;) {
        // total first: once it is set, every entry is visible; before, `published` entries are.
        const int64_t total = h.total.load(std::memory_order_acquire);
        const size_t known = static_cast<size_t>(total >= 0 ? total : h.published.load(std::memory_order_acquire));
        if (applied < known) {
          apply_rates(h.flows, h.rates, applied, known, known, h.now);
          applied = known;
        } else if (total >= 0) {
          break;
        } else {
          cpu_relax();
        }
      }
    } catch (...) {
      h.error = std::current_exception();
    }
    h.done.store(seen, std::memory_order_release);
  }
}

void LayerSim::stop_helper() {
  if (!helper_) return;
  helper_->stop.store(true, std::memory_order_relaxed);
  if (helper_->thread.joinable()) helper_->thread.join();
  net_.publish_changes_to(nullptr);
  helper_.reset();
}

// Every chunk milestone of a completed flow, in piece order: those of its closed segments were
// found as they closed; the last segment carries the rest. Handing them on here rather than as
// they happen is exact: their consumers only count and take maxima (see mark_known).
void LayerSim::replay_milestones(int f, int64_t now) {
  FlowState& fs = flow_state_[f];
  close_segment(fs, INT64_MAX);
  const Transfer& tr = transfers_[flow_transfer_[f]];
  const int64_t* times = flow_piece_ns_[f].data();
  for (int64_t j = 0; j < tr.count; ++j) {
    ++num_milestones_;
    on_piece_data(tr, transfer_piece(tr, j), std::min(times[j], now));
  }
}

// Bytes queued at each NVLink port: every window-limited flow whose rate that port fixed keeps
// window - rate x round trip of its in-flight bytes waiting there (Little's law).
void LayerSim::update_port_queues(int64_t now) {
  port_queue_bytes_.assign(net_.num_resources(), 0.0);
  for (int f : net_.active_flows()) {
    const Flow& fl = net_.flow(f);
    const int bottleneck = net_.bottleneck(f);
    if (bottleneck < 0 || res_kind_[bottleneck] > 1) continue;  // demand, or not an NVLink port
    const Transfer& tr = transfers_[flow_transfer_[f]];
    const double excess = tr.window_bytes - fl.rate_gbps() * 2.0 * static_cast<double>(tr.latency_ns);
    if (excess > 0) port_queue_bytes_[bottleneck] += excess;
  }
  for (int r = 0; r < net_.num_resources(); ++r) {
    if (res_kind_[r] > 1) continue;
    const int64_t delay = ceil_ns(port_queue_bytes_[r] / net_.capacity(r));
    auto& h = port_delay_history_[r];
    if (h.empty() ? delay != 0 : h.back().second != delay) {
      if (!h.empty() && h.back().first == now) h.back().second = delay;
      else h.emplace_back(now, delay);
    }
  }
}

void LayerSim::on_flow_complete(int f, int64_t now) {
  ++num_flows_done_;
  replay_milestones(f, now);
  const int tid = flow_transfer_[f];
  const Transfer& tr = transfers_[tid];
  // Transfer complete: credit bytes per phase, free the SM.
  const Flow& fl = net_.flow(f);
  for (int i = 0; i < fl.path_len; ++i) res_bytes_phase_[tr.phase][fl.path[i]] += fl.total_bytes;
  if (tr.src != tr.dst)
    for (int g : {tr.src, tr.dst}) {
      if (hbm_on_path_[g]) continue;
      res_bytes_phase_[tr.phase][res_hbm_[g]] += fl.total_bytes;
      hbm_off_path_bytes_[res_hbm_[g]] += fl.total_bytes;
    }
  const int agent = tr.initiator * S_ + tr.sm;
  checkpoints_.erase(f);
  flow_state_[f].key_bound = INT64_MAX;
  flow_state_[f].due_ns = INT64_MAX;
  dirty_ = true;
  net_.finish_flow(f);
  if (opt_.record_trace && tr.initiator < opt_.trace_max_gpus)
    trace_.push_back(TraceSpan{tr.initiator, tr.sm, tr.start_ns, now,
                               std::string(kPhaseName[tr.phase]) + (tr.is_read ? " pull " : " push ") +
                                   std::to_string(tr.src) + "->" + std::to_string(tr.dst),
                               tr.bytes});
  if (tr.in_group && --group_pending_[agent] > 0) return;  // the SM waits for its whole chunk
  ++pc_[agent];
  step_agent(agent, now);
}

// The last byte of a piece left the bottleneck at t_fluid. When does its consumer know?
void LayerSim::on_piece_data(const Transfer& tr, int64_t piece, int64_t t_fluid) {
  const int ph = tr.phase;
  const int64_t L = tr.latency_ns;
  const int src = tr.src, dst = tr.dst;
  if (tr.is_read) {
    // Pull: the loads return one round trip after the request stream; the reading SM tells
    // the compute warps through a local flag after a local release fence.
    const int64_t arrive = t_fluid + 2 * L;
    mark_known(ph, piece, src, dst, arrive,
               observe_local(arrive + static_cast<int64_t>(topo_.local_fence_ns), local_poll_period()));
    return;
  }
  // A fenced push's rate holds the fence stall after each chunk (demand_for), so the fluid
  // milestone of a chunk's last byte comes one stall after the byte was really issued: the
  // fence that follows it then ends at the milestone.
  const int64_t t_issue = tr.fence_stall_ns > 0 ? std::max(tr.start_ns, t_fluid - tr.fence_stall_ns) : t_fluid;
  const int64_t arrive = t_issue + L;
  if (src == dst) {  // local copy: the same SM's own stores, then a local flag
    if (tr.in_group) {
      // A fenced row-order chunk with NVLink members: the SM writes the local flag after the
      // chunk's one fence (which follows its last NVLink store), as it does the others.
      const int agent = tr.initiator * S_ + tr.sm;
      if (group_fenced_count_.empty() || group_fenced_count_[agent] == 0) {
        mark_local_known(tr, piece, arrive, INT64_MIN);
      } else if (group_fence_pending_[agent] > 0) {
        group_local_signals_[agent].push_back({static_cast<int64_t>(&tr - transfers_.data()), piece, arrive});
      } else {
        mark_local_known(tr, piece, arrive, group_fence_done_[agent]);
      }
      return;
    }
    mark_local_known(tr, piece, arrive, INT64_MIN);
    return;
  }
  const PendingSignal sig{static_cast<int32_t>(&tr - transfers_.data()), piece, t_issue, t_issue};
  if (tr.in_group && tr.fence_stall_ns > 0) {
    // A fenced row-order chunk's NVLink member: the SM fences once, after the last of the
    // chunk's NVLink stores (whichever destination it went to), so no member's signal goes out
    // before that fence. The signals wait for the last member's data; the fence is timed from
    // the latest last-store issue (every member has the same start and stall, so the last to
    // end). ORDER: raised in the order the members' data ended.
    const int agent = tr.initiator * S_ + tr.sm;
    group_fence_issue_[agent] = std::max(group_fence_issue_[agent], t_issue);
    auto& held = group_signals_[agent];
    held.push_back(sig);
    if (--group_fence_pending_[agent] > 0) return;
    for (PendingSignal& h : held) {
      h.t_fence = group_fence_issue_[agent];
      raise_signal(h);
    }
    held.clear();
    // Every member has the same stall (the chunk's 2L + f), so the fence ends here for all.
    group_fence_done_[agent] = group_fence_issue_[agent] + tr.fence_stall_ns;
    for (const auto& [t, p, a] : group_local_signals_[agent])
      mark_local_known(transfers_[t], p, a, group_fence_done_[agent]);
    group_local_signals_[agent].clear();
    return;
  }
  raise_signal(sig);
}

// A local copy's piece that arrived at `arrive`: a local release fence, then a local flag; in a
// fenced row-order chunk with NVLink members the flag is written after the chunk's fence, which
// ends at fence_done (INT64_MIN: no such fence).
void LayerSim::mark_local_known(const Transfer& tr, int64_t piece, int64_t arrive, int64_t fence_done) {
  const int64_t visible = std::max(arrive + static_cast<int64_t>(topo_.local_fence_ns), fence_done);
  mark_known(tr.phase, piece, tr.src, tr.dst, arrive, observe_local(visible, local_poll_period()));
}

void LayerSim::raise_signal(const PendingSignal& s) {
  const Transfer& tr = transfers_[s.transfer];
  if (fenced_signaling() && opt_.signal_queueing && topo_.domain_of(tr.src) == topo_.domain_of(tr.dst)) {
    // The flag's wait depends on the port queues, and this instant's completions change them:
    // it is looked up after the instant's rates and queues are settled.
    pending_signals_.push_back(s);
    return;
  }
  signal_after_fence(tr, s.piece, s.t_issue, s.t_fence);
}

// A remote pushed chunk whose last byte was issued at t_issue: the signaling scheme's write,
// after a fence that follows the store issued at t_fence (>= t_issue).
void LayerSim::signal_after_fence(const Transfer& tr, int64_t piece, int64_t t_issue, int64_t t_fence) {
  const int ph = tr.phase;
  const int64_t L = tr.latency_ns;
  const int src = tr.src, dst = tr.dst;
  const int64_t arrive = t_issue + L;
  // The fence waits for the acks of all the SM's stores since the last one: 2L + f for a
  // transfer of its own; for a row-order chunk, the group's largest 2L + f (fence_stall_ns)
  // after the chunk's last NVLink store (t_fence).
  const int64_t fence_done =
      t_fence + (tr.fence_stall_ns > 0 ? tr.fence_stall_ns : 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns));
  // With signal queueing, the flag or atomic waits behind the bytes queued at both ports, as the
  // queues stand at the latest instant simulated (the queue at fence_done is not known yet).
  const bool queued = opt_.signal_queueing && topo_.domain_of(src) == topo_.domain_of(dst);
  const int64_t wait = queued ? port_delay(res_nvl_out_[src], fence_done) + port_delay(res_nvl_in_[dst], fence_done) : 0;
  switch (proto_.signaling) {
    case Signaling::kFenceFlag:
      // fence (acks back at +2L) then a flag write that lands one way later; the receiver
      // sweeps one flag per source.
      ++signal_writes_[ph];
      mark_known(ph, piece, src, dst, arrive, observe_local(fence_done + wait + L, flag_poll_period(R_)));
      break;
    case Signaling::kCounter:
      // fence, then one atomic on the destination's counter (served in on_counter_complete)
      ++signal_writes_[ph];
      if (!counter_wait_ns_[ph].empty())
        counter_wait_ns_[ph][piece] = wait + (fence_done - (t_issue + 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns)));
      piece_data_ns_[ph][piece] = arrive;
      last_data_ns_[ph][dst] = std::max(last_data_ns_[ph][dst], arrive);
      if (++counter_arrivals_[ph][dst] == traffic_.recv_remote_pieces[ph][dst]) on_counter_complete(ph, dst);
      break;
    case Signaling::kFlagInData:
      mark_known(ph, piece, src, dst, arrive, observe_local(arrive, flag_poll_period(R_)));
      break;
    case Signaling::kBarrier:
    case Signaling::kPeerFenceFlag:
      // Known when the phase barrier completes (on_gpu_barrier) or the source's per-peer flag
      // lands (run_peer_flags); only the arrival is recorded here.
      last_data_ns_[ph][dst] = std::max(last_data_ns_[ph][dst], arrive);
      piece_data_ns_[ph][piece] = arrive;
      break;
  }
}

// Pieces may be marked out of time order (each flow's milestones come in a batch), so every
// consumer here is order-free: counts, maxima, a histogram and per-piece times. The last piece
// into a GPU is always the final milestone of some flow, marked at its completion time, so the
// completion event is never in the past.
void LayerSim::mark_known(int ph, int64_t piece, int src, int dst, int64_t data_ns, int64_t known_ns) {
  if (known_ns < data_ns)
    internal_error(std::string("negative signal latency: a ") + kPhaseName[ph] + " chunk gpu" + std::to_string(src) +
                   " -> gpu" + std::to_string(dst) + " (piece " + std::to_string(piece) + ") known at " +
                   std::to_string(known_ns) + " ns, before its data landed at " + std::to_string(data_ns) + " ns");
  chunk_signal_[ph].add(known_ns - data_ns);
  last_data_ns_[ph][dst] = std::max(last_data_ns_[ph][dst], data_ns);
  if (ph == kDispatch && proto_.phases == Phases::kLayer) {
    dispatch_known_ns_[piece] = known_ns;
    // Pieces come in no particular order, so the test is a coin flip: selects, not a branch.
    LastPiece& last = last_dispatch_piece_[dst];
    const bool later = known_ns > last.known_ns || (known_ns == last.known_ns && piece > last.piece);
    last.piece = later ? piece : last.piece;
    last.known_ns = later ? known_ns : last.known_ns;
    last.data_ns = later ? data_ns : last.data_ns;
  }
  if (ph == kCombine && (data_ns > combine_last_data_ns_[dst] ||
                         (data_ns == combine_last_data_ns_[dst] && src > combine_last_source_[dst]))) {
    combine_last_data_ns_[dst] = data_ns;
    combine_last_source_[dst] = src;
  }
  max_known_ns_[ph][dst] = std::max(max_known_ns_[ph][dst], known_ns);
  if (++known_count_[ph][dst] == traffic_.recv_pieces[ph][dst]) complete_if_released(ph, dst);
}

// A barrier is collective: every GPU leaves it only when every GPU has arrived, so under barrier
// signaling a GPU completes the phase at the barrier's release or later, whatever it receives:
// remote chunks, only its own (locally signaled) chunks, or nothing.
void LayerSim::complete_if_released(int ph, int gpu) {
  if (known_count_[ph][gpu] != traffic_.recv_pieces[ph][gpu]) return;
  int64_t t = max_known_ns_[ph][gpu];
  if (barrier_push(ph)) {
    if (barrier_done_ns_[ph][gpu] < 0) return;  // on_all_known calls again
    t = std::max(t, barrier_done_ns_[ph][gpu]);
  }
  schedule(t, kDstComplete, ph, gpu);
}

// Counter: one atomic per remote chunk, served one at a time in arrival order (a FIFO server
// with a fixed service time: its last departure depends only on the set of arrivals). The
// receiver knows every remote chunk once the count is complete.
void LayerSim::on_counter_complete(int ph, int dst) {
  std::vector<int64_t> arrivals;
  arrivals.reserve(traffic_.recv_remote_pieces[ph][dst]);
  for_each_piece_into(ph, dst, true, [&](int64_t piece, int s) {
    arrivals.push_back(piece_data_ns_[ph][piece] + 2 * latency(s, dst) + static_cast<int64_t>(topo_.fence_overhead_ns) +
                       (counter_wait_ns_[ph].empty() ? 0 : counter_wait_ns_[ph][piece]));
  });
  std::sort(arrivals.begin(), arrivals.end());
  int64_t free_ns = 0;
  for (int64_t a : arrivals) free_ns = std::max(free_ns, a) + static_cast<int64_t>(topo_.atomic_service_ns);
  const int64_t known = observe_local(free_ns, local_poll_period());
  for_each_piece_into(ph, dst, true,
                      [&](int64_t piece, int s) { mark_known(ph, piece, s, dst, piece_data_ns_[ph][piece], known); });
}

void LayerSim::on_all_known(int ph, int gpu, int64_t now) {
  // Barrier: every remote piece into `gpu` becomes known at once; chunks a GPU copies to itself
  // were signaled locally as they landed (they release their GEMM tiles then), but the GPU
  // completes the phase only now (complete_if_released), as one that receives nothing does.
  barrier_done_ns_[ph][gpu] = now;
  for_each_piece_into(ph, gpu, true,
                      [&](int64_t piece, int s) { mark_known(ph, piece, s, gpu, piece_data_ns_[ph][piece], now); });
  if (traffic_.recv_remote_pieces[ph][gpu] == 0) complete_if_released(ph, gpu);
}

void LayerSim::on_dst_complete(int ph, int gpu, int64_t now) {
  // The completion signal is a receiver's: last byte in -> it knows. A GPU that receives nothing
  // in this phase has no such interval (it would count its absolute completion time).
  if (traffic_.recv_pieces[ph][gpu] > 0) completion_signal_[ph].push_back(now - last_data_ns_[ph][gpu]);
  if (ph == kDispatch) {
    gpu_[gpu].dispatch_known_ns = now;
    if (proto_.phases == Phases::kDispatch) gpu_[gpu].done_ns = now;
    if (proto_.phases == Phases::kLayer) run_compute_queue(gpu, now);
  } else {
    gpu_[gpu].combine_known_ns = now;
    combine_completed_[gpu] = 1;
    // The final weighted sum adds the GPU's own shared-expert output to its tokens' routed
    // results, so in a whole layer it also waits for the GPU's own GEMMs (on_compute_done).
    if (proto_.phases != Phases::kLayer || compute_finished_[gpu]) schedule(now + reduce_ns_, kReduceDone, 0, gpu);
  }
}

// The GPU's compute SMs: the shared expert first, then routed tiles in ready order (FIFO, ties
// by tile index), one at a time. Called when all dispatch data into `gpu` is known, so every
// tile's ready time is final; the queue's only effect on the rest is its finish time.
void LayerSim::run_compute_queue(int gpu, int64_t now) {
  // ORDER: sources ascending, then each pair's pieces (chunks ascending): the GPU's rows in
  // ascending global token order, so each expert's runs arrive in its canonical row order
  // (spec::build_routing_plan), which TileReady cuts into tiles as the kernel's GEMM does.
  const int64_t first_expert = cfg_.first_expert(gpu), num_local = cfg_.experts_per_rank();
  tile_expert_rows_.resize(static_cast<size_t>(num_local));
  for (int64_t e = 0; e < num_local; ++e) tile_expert_rows_[e] = work_.expert_rows(first_expert + e);
  tile_ready_.clear();
  tiles_.begin(tile_expert_rows_.data(), static_cast<int>(num_local), proto_.gemm_tile_rows, &tile_ready_);
  for (int s = 0; s < R_; ++s) {
    const size_t pair = static_cast<size_t>(s) * R_ + gpu;
    int64_t run = traffic_.pair_run_offsets[pair];
    const int64_t run_end = traffic_.pair_run_offsets[pair + 1];
    for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i) {
      const int64_t known = dispatch_known_ns_[i];
      int64_t left = traffic_.pieces[i].slots;
      for (; left > 0 && run < run_end; ++run) {
        const PieceRun& r = traffic_.runs[run];
        tiles_.add(r.expert, r.rows, known);
        left -= r.rows;
      }
      if (left != 0) internal_error("a piece's runs do not add up to its slots");
    }
    if (run != run_end) internal_error("a pair's runs outnumber its pieces' slots");
  }
  if (!tiles_.finish()) internal_error("the routing's rows per expert disagree with its pieces' runs");
  if (opt_.check_tiles) check_tiles(gpu);
  // The pieces into `gpu` are exactly the (source, chunk) pairs that hold a row of one of its
  // experts (build_traffic() made one per pair with a routed slot), so the last piece, the
  // largest (known time, piece index) over the rows, is the largest over these pieces, which
  // mark_known() kept.
  const LastPiece& last = last_dispatch_piece_[gpu];
  if (last.piece >= 0) {
    last_tile_piece_known_ns_[gpu] = last.known_ns;
    last_tile_piece_data_ns_[gpu] = last.data_ns;
    const auto& off = traffic_.pair_offsets;
    const size_t pair = static_cast<size_t>(std::upper_bound(off.begin(), off.end(), last.piece) - off.begin()) - 1;
    last_tile_source_[gpu] = static_cast<int64_t>(pair / R_);
  }
  std::sort(tile_ready_.begin(), tile_ready_.end());
  const bool trace = opt_.record_trace && gpu < opt_.trace_max_gpus;
  if (trace && shared_ns_ > 0) trace_.push_back(TraceSpan{gpu, -1, 0, shared_ns_, "shared expert", 0});
  int64_t free_ns = shared_ns_;
  for (const auto& [ready, tile] : tile_ready_) {
    const int64_t start = std::max(free_ns, ready);
    if (trace)
      trace_.push_back(TraceSpan{gpu, -1, start, start + tile_ns_,
                                 "tile " + std::to_string(tile) + " (experts of gpu" + std::to_string(gpu) + ")", 0});
    free_ns = start + tile_ns_;
  }
  compute_busy_ns_[gpu] = shared_ns_ + static_cast<int64_t>(tile_ready_.size()) * tile_ns_;
  schedule(std::max(free_ns, now), kComputeDone, 0, gpu);
}

// SimOptions::check_tiles: the GPU's tiles as the canonical row lists give them, each row's known
// time looked up through its (token owner, chunk) piece, against tile_ready_ (before sorting).
void LayerSim::check_tiles(int gpu) {
  const int64_t T = cfg_.tokens_per_rank, C = proto_.chunk_tokens, NC = num_chunks_, TR = proto_.gemm_tile_rows;
  std::vector<int64_t> offsets(cfg_.num_experts + 1);
  std::vector<spec::RowRef> rows(cfg_.num_slots());
  spec::build_routing_plan(cfg_, work_.topk_experts.data(),
                           spec::RoutingPlanView{offsets.data(), rows.data(), nullptr});
  std::vector<int64_t> chunk_known(static_cast<size_t>(R_) * NC, INT64_MIN);
  for (int s = 0; s < R_; ++s) {
    const size_t pair = static_cast<size_t>(s) * R_ + gpu;
    for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i)
      chunk_known[s * NC + traffic_.pieces[i].chunk_idx] = dispatch_known_ns_[i];
  }
  auto known_of = [&](int64_t g) {
    const int64_t known = chunk_known[(g / T) * NC + (g % T) / C];
    if (known == INT64_MIN) internal_error("check_tiles: a routed row has no dispatch piece");
    return known;
  };
  const auto want = detail::tiles_from_plan(offsets.data(), rows.data(), cfg_.first_expert(gpu),
                                            cfg_.experts_per_rank(), TR, known_of);
  std::vector<std::pair<int64_t, int32_t>> got = tile_ready_;
  std::sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  if (got != want)
    internal_error("check_tiles: gpu" + std::to_string(gpu) + "'s tiles differ from the routing plan's (" +
                   std::to_string(got.size()) + " against " + std::to_string(want.size()) + " tiles)");
}

void LayerSim::on_compute_done(int gpu, int64_t now) {
  gpu_[gpu].compute_done_ns = now;
  compute_finished_[gpu] = 1;
  // The combine's data was all known before the GPU's own GEMMs ended (e.g. no routed rows come
  // back to it): the weighted sum waits for its shared expert (on_dst_complete).
  if (combine_completed_[gpu]) schedule(now + reduce_ns_, kReduceDone, 0, gpu);
  // The expert outputs are published: a release fence over local stores, then a local flag
  // that remote pullers poll and local pushers observe.
  ready_visible_ns_[gpu] = now + static_cast<int64_t>(topo_.local_fence_ns);
  schedule(ready_visible_ns_[gpu], kReadyVisible, 0, gpu);
}

// peer_fence_flag: all of `gpu`'s comm SMs have fenced their own writes (acks back) at `now`.
// The signal threads see that through a local flag, then thread i walks peers k = i+1, i+1+n,
// ... (rotated by GPU index, like the data): "fence; flag" per peer. A system-scope fence waits
// for the acks of every earlier write of its thread, so a fence after a remote flag waits for
// that flag's ack: consecutive flags of one thread are 2L + fence overhead (+ the flag's port
// waits with signal queueing) apart, and peer k hears at about ceil(k/n) x (2L + f) + L.
void LayerSim::run_peer_flags(int ph, int gpu, int64_t now) {
  const int n = std::max(1, std::min(proto_.signal_threads, R_ - 1));
  const int64_t t0 = observe_local(now, local_poll_period());
  const int64_t f = static_cast<int64_t>(topo_.fence_overhead_ns);
  std::vector<int64_t> lane_ns(n, t0);  // when each thread may start its next fence
  for (int k = 1; k < R_; ++k) {
    const int peer = (gpu + k) % R_;
    int64_t& t = lane_ns[(k - 1) % n];
    const int64_t L = latency(gpu, peer);
    const int64_t issue = t + f;  // the fence: earlier flag's ack already awaited below
    const bool queued = opt_.signal_queueing && topo_.domain_of(gpu) == topo_.domain_of(peer);
    const int64_t wait = queued ? port_delay(res_nvl_out_[gpu], issue) + port_delay(res_nvl_in_[peer], issue) : 0;
    const int64_t land = issue + wait + L;
    t = land + L;  // the next fence of this thread waits for this flag's ack
    ++signal_writes_[ph];
    const int64_t known = observe_local(land, flag_poll_period(R_));
    const size_t pair = ph == kDispatch ? static_cast<size_t>(gpu) * R_ + peer : static_cast<size_t>(peer) * R_ + gpu;
    for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i)
      mark_known(ph, i, gpu, peer, piece_data_ns_[ph][i], known);
  }
}

// Signal queueing: the signals of this instant, in the order they were raised, once its port
// queues are recorded (update_port_queues): a flag raised as the last flows drain does not wait
// behind the queue they left. Under a rate quantum the queues are those of the last full
// recompute.
void LayerSim::resolve_pending_signals() {
  // ORDER: raise order, so counters and the sweep's ties see the same sequence on every run.
  for (const PendingSignal& p : pending_signals_)
    signal_after_fence(transfers_[p.transfer], p.piece, p.t_issue, p.t_fence);
  pending_signals_.clear();
  for (const auto& [ph, gpu, t] : pending_peer_flags_) run_peer_flags(static_cast<int>(ph), static_cast<int>(gpu), t);
  pending_peer_flags_.clear();
}

void LayerSim::on_gpu_barrier(int ph, int gpu, int64_t now) {
  if (proto_.signaling == Signaling::kPeerFenceFlag) {
    if (opt_.signal_queueing) pending_peer_flags_.push_back({ph, gpu, now});  // after the instant's queues
    else run_peer_flags(ph, gpu, now);
    return;
  }
  barrier_gpu_ns_[ph][gpu] = now;
  if (++barrier_gpus_[ph] < R_) return;
  // Dissemination barrier: in round k GPU i writes a flag at i+2^k and waits for i-2^k's.
  std::vector<int64_t> t = barrier_gpu_ns_[ph], next(R_);
  const int64_t period = local_poll_period();
  for (int dist = 1; dist < R_; dist *= 2) {
    for (int i = 0; i < R_; ++i) {
      const int from = ((i - dist) % R_ + R_) % R_;
      ++signal_writes_[ph];
      next[i] = std::max(t[i], observe_local(t[from] + latency(from, i), period));
    }
    t.swap(next);
  }
  for (int i = 0; i < R_; ++i) schedule(t[i], kAllKnown, ph, i);
}

void LayerSim::step_agent(int agent, int64_t now) {
  const int gpu = agent / S_;
  auto& prog = programs_[agent];
  while (pc_[agent] < static_cast<int32_t>(prog.size())) {
    const Op op = prog[pc_[agent]];
    switch (op.kind) {
      case OpKind::kTransfer:
        start_transfer(agent, op.arg, now);
        return;  // resumes in on_flow_complete
      case OpKind::kTransferGroup: {
        const auto [first, count] = groups_[op.arg];
        group_pending_[agent] = count;
        group_fence_pending_[agent] = group_fenced_[op.arg];
        group_fence_issue_[agent] = INT64_MIN;
        group_fenced_count_[agent] = group_fenced_[op.arg];
        group_fence_done_[agent] = INT64_MIN;
        for (int32_t m = 0; m < count; ++m) start_transfer(agent, first + m, now);
        return;  // resumes in on_flow_complete when the last of them completes
      }
      case OpKind::kWaitLocalReady:
      case OpKind::kWaitRemoteReady: {
        const int peer = op.arg;
        if (ready_visible_ns_[peer] < 0 || ready_visible_ns_[peer] > now) {
          wait_start_ns_[agent] = now;  // resumed by kReadyVisible
          ready_waiters_[peer].push_back(agent);
          return;
        }
        ++pc_[agent];
        schedule(observe_ready(agent, peer, now), kAgentStep, agent);
        return;
      }
      case OpKind::kBarrierArrive: {
        // The SM fences (its writes' acks return) and then arrives at its GPU's barrier.
        int64_t L = 0;
        for (int p = 0; p < R_; ++p) L = std::max(L, latency(gpu, p));
        const int64_t t = now + 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns);
        ++pc_[agent];
        schedule(t, kGpuBarrierArrive, op.arg, gpu);
        schedule(t, kAgentStep, agent);
        return;
      }
    }
  }
}

void LayerSim::finish(LayerResult& res) {
  const double nvl = topo_.nvlink_effective_gbps();
  res.layer_ns = 0;
  for (const auto& g : gpu_) res.layer_ns = std::max(res.layer_ns, g.done_ns);
  for (int ph = 0; ph < 2; ++ph) {
    PhaseResult& pr = ph == kDispatch ? res.dispatch : res.combine;
    pr.simulated = phase_on(ph);
    if (!pr.simulated) continue;
    for (int g = 0; g < R_; ++g) {
      const int64_t known = ph == kDispatch ? gpu_[g].dispatch_known_ns : gpu_[g].combine_known_ns;
      pr.end_ns = std::max(pr.end_ns, known);
      pr.data_end_ns = std::max(pr.data_end_ns, last_data_ns_[ph][g]);
      pr.payload_bytes_max_gpu = std::max(pr.payload_bytes_max_gpu, traffic_.recv_payload[ph][g]);
    }
    int64_t nvl_out_bytes = 0;
    for (int r = 0; r < net_.num_resources(); ++r) {
      const int kind = res_kind_[r];
      const int64_t b = res_bytes_phase_[ph][r];
      if (kind == 0) {
        pr.scaleup_bytes += b;
        nvl_out_bytes += b;
      }
      if (kind == 2) pr.scaleout_bytes += b;
    }
    for (int o = 0; o < R_; ++o)
      for (int p = 0; p < R_; ++p) {
        const size_t pair = static_cast<size_t>(o) * R_ + p;
        for (int64_t i = traffic_.pair_offsets[pair]; i < traffic_.pair_offsets[pair + 1]; ++i)
          pr.wire_bytes += piece_wire_bytes(ph, i, o != p);
      }
    pr.num_chunks = static_cast<int64_t>(traffic_.pieces.size());
    pr.num_signal_writes = signal_writes_[ph];
    // Time base of the phase: dispatch from 0; combine, in a whole layer, from its first byte
    // (the earliest start of a combine transfer). A GPU whose experts got no rows finishes its
    // compute early but sends nothing, so its finish time says nothing about the combine.
    int64_t start = 0;
    if (ph == kCombine && proto_.phases == Phases::kLayer) {
      start = INT64_MAX;
      for (const Transfer& t : transfers_)
        if (t.phase == kCombine && t.start_ns >= 0) start = std::min(start, t.start_ns);
      if (start == INT64_MAX) start = pr.end_ns;  // no combine traffic at all
    }
    pr.start_ns = start;
    // A phase that moves no byte has its data in place at its start (never before it).
    pr.data_end_ns = std::max(pr.data_end_ns, start);
    const double span = static_cast<double>(std::max<int64_t>(1, pr.end_ns - start));
    double recv = 0;
    for (int g = 0; g < R_; ++g) recv += static_cast<double>(traffic_.recv_payload[ph][g]);
    pr.recv_gbps_per_gpu = recv / R_ / span;
    pr.nvlink_utilization = static_cast<double>(nvl_out_bytes) / (nvl * R_ * span);
    pr.chunk_signal = chunk_signal_[ph].summary();
    pr.completion_signal = quantiles_of(completion_signal_[ph]);
  }
  res.gpus = gpu_;
  int64_t cmax = 0;
  for (int g = 0; g < R_; ++g) cmax = std::max(cmax, compute_busy_ns_[g]);
  res.compute_ns_max = cmax;

  std::vector<int64_t> expert_rows(cfg_.num_experts), gpu_rows(R_, 0);
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    expert_rows[e] = work_.expert_rows(e);
    gpu_rows[cfg_.owner_rank(e)] += expert_rows[e];
  }
  for (int g = 0; g < R_; ++g) res.gpus[g].rows = gpu_rows[g];
  res.expert_load = load_stats(expert_rows);
  res.gpu_load = load_stats(gpu_rows);

  // Resource utilisation over the whole layer.
  const int num_kinds = 7;
  for (int kind = 0; kind < num_kinds; ++kind) {
    ResourceSummary s;
    s.kind = kResourceKinds[kind];
    double sum = 0, best = -1;
    for (int r = 0; r < net_.num_resources(); ++r) {
      if (res_kind_[r] != kind) continue;
      ++s.count;
      s.capacity_gbps = net_.capacity(r);
      s.bytes += resource_bytes(r);
      const double u = static_cast<double>(resource_bytes(r)) /
                       (net_.capacity(r) * static_cast<double>(std::max<int64_t>(1, res.layer_ns)));
      sum += u;
      if (u > best) {
        best = u;
        s.busiest = net_.resource_name(r);
      }
    }
    if (s.count == 0) continue;
    s.mean_utilization = sum / s.count;
    s.max_utilization = best;
    res.resources.push_back(s);
  }

  // Critical path: back from the GPU that finished last.
  int last = 0;
  for (int g = 0; g < R_; ++g)
    if (gpu_[g].done_ns > gpu_[last].done_ns) last = g;
  auto seg = [&](std::string what, int64_t a, int64_t b) {
    detail::append_path_segment(res.critical_path, std::move(what), a, b);
  };
  const std::string L = "gpu" + std::to_string(last);
  if (proto_.phases == Phases::kDispatch) {
    seg("dispatch data into " + L + " (last byte lands)", 0, last_data_ns_[kDispatch][last]);
    seg("dispatch completion signal at " + L, last_data_ns_[kDispatch][last], gpu_[last].dispatch_known_ns);
  } else if (proto_.phases == Phases::kLayer && gpu_[last].compute_done_ns > gpu_[last].combine_known_ns) {
    // The weighted sum waited for the GPU's own GEMMs (its shared expert), not for combine data.
    seg("dispatch data into " + L + " (bytes that released its last tile)", 0, last_tile_piece_data_ns_[last]);
    seg("dispatch signal at " + L, last_tile_piece_data_ns_[last], last_tile_piece_known_ns_[last]);
    seg("expert GEMMs on " + L + " (shared expert and queued tiles)", last_tile_piece_known_ns_[last],
        gpu_[last].compute_done_ns);
    seg("final weighted sum on " + L, gpu_[last].compute_done_ns, gpu_[last].done_ns);
  } else {
    const int producer = proto_.phases == Phases::kLayer ? static_cast<int>(combine_last_source_[last]) : -1;
    if (producer >= 0) {
      const std::string P = "gpu" + std::to_string(producer);
      seg("dispatch data into " + P + " (bytes that released its last tile)", 0, last_tile_piece_data_ns_[producer]);
      seg("dispatch signal at " + P, last_tile_piece_data_ns_[producer], last_tile_piece_known_ns_[producer]);
      seg("expert GEMMs on " + P + " (queued tiles after the last one became ready)",
          last_tile_piece_known_ns_[producer], gpu_[producer].compute_done_ns);
      seg("combine " + P + " -> " + L + " (publish, SM queue, transfer)", gpu_[producer].compute_done_ns,
          combine_last_data_ns_[last]);
    } else {
      seg("combine data into " + L, 0, combine_last_data_ns_[last]);
    }
    seg("combine completion signal at " + L, combine_last_data_ns_[last], gpu_[last].combine_known_ns);
    seg("final weighted sum on " + L, gpu_[last].combine_known_ns, gpu_[last].done_ns);
  }
  res.num_events = num_events_;
  res.num_chunk_milestones = num_milestones_;
  res.num_rate_recomputes = net_.num_recomputes();
  res.num_flows = num_flows_;
  res.trace = std::move(trace_);
}

LayerResult LayerSim::run() {
  check_inputs();
  R_ = static_cast<int>(cfg_.num_ranks);
  S_ = proto_.comm_sms;
  build_resources();
  build_traffic();
  if (proto_.phases == Phases::kLayer) build_compute_model();
  if (proto_.phases == Phases::kCombine) {
    // No GEMMs, but the combine's data still ends in the owner's weighted sum (as in a layer).
    reduce_ns_ = ceil_ns(combine_reduce_time_ns(topo_, cfg_));
  }
  build_programs();
  choose_hbm_paths();
  for (int ph = 0; ph < 2; ++ph) {
    known_count_[ph].assign(R_, 0);
    max_known_ns_[ph].assign(R_, 0);
    last_data_ns_[ph].assign(R_, 0);
    counter_arrivals_[ph].assign(R_, 0);
    barrier_arrivals_[ph].assign(R_, 0);
    barrier_gpu_ns_[ph].assign(R_, 0);
    barrier_done_ns_[ph].assign(R_, -1);
    const bool per_piece = phase_on(ph) && direction(ph) == Direction::kPush &&
                           (proto_.signaling == Signaling::kCounter || proto_.signaling == Signaling::kBarrier ||
                            proto_.signaling == Signaling::kPeerFenceFlag);
    if (per_piece) piece_data_ns_[ph].assign(traffic_.pieces.size(), 0);
    const bool row_order_push = ph == kDispatch && proto_.push_row_order;
    if (per_piece && (opt_.signal_queueing || row_order_push) && proto_.signaling == Signaling::kCounter)
      counter_wait_ns_[ph].assign(traffic_.pieces.size(), 0);
  }
  gpu_.assign(R_, GpuTimeline{});
  port_delay_history_.assign(net_.num_resources(), {});
  ready_visible_ns_.assign(R_, -1);
  compute_finished_.assign(R_, 0);
  combine_completed_.assign(R_, 0);
  ready_waiters_.assign(R_, {});
  compute_busy_ns_.assign(R_, 0);
  last_tile_piece_data_ns_.assign(R_, 0);
  last_tile_piece_known_ns_.assign(R_, 0);
  last_tile_source_.assign(R_, -1);
  combine_last_source_.assign(R_, -1);
  combine_last_data_ns_.assign(R_, 0);
  for (int g = 0; g < R_; ++g) {
    gpu_[g].recv_payload_bytes_dispatch = traffic_.recv_payload[kDispatch][g];
    gpu_[g].recv_payload_bytes_combine = traffic_.recv_payload[kCombine][g];
  }

  // t = 0: the routing is published, inputs are in place.
  for (int ph = 0; ph < 2; ++ph) {
    if (!phase_on(ph)) continue;
    for (int g = 0; g < R_; ++g)
      if (traffic_.recv_pieces[ph][g] == 0 &&
          !barrier_push(ph))
        on_dst_complete(ph, g, 0);
  }
  if (proto_.phases == Phases::kCombine)
    for (int g = 0; g < R_; ++g) ready_visible_ns_[g] = 0;
  for (int agent = 0; agent < static_cast<int>(programs_.size()); ++agent) schedule(0, kAgentStep, agent);
  if (opt_.threads >= 2 && opt_.rate_quantum_ns > 0 && !opt_.full_rate_recompute &&
      programs_.size() >= static_cast<size_t>(std::max(1, opt_.helper_min_comm_sms))) {
    helper_ = std::make_unique<Helper>();
    net_.publish_changes_to(&helper_->published);
    helper_->thread = std::thread([this] { helper_loop(); });
  }

  const int64_t kNever = INT64_MAX;
  auto due = [this](int f) { return flow_state_[f].due_ns; };
  auto rekeyed = [this](int f, int64_t key) { flow_state_[f].key_bound = key; };
  // Progress for long runs: the wall clock is read every 4,096 time steps only.
  const auto wall0 = std::chrono::steady_clock::now();
  double next_report_s = opt_.progress_interval_s;
  uint32_t progress_tick = 0;
  while (true) {
    const int64_t t_event = events_.empty() ? kNever : events_.top().time_ns;
    const int64_t t_flow = checkpoints_.empty() ? kNever : checkpoints_.top_time(due, rekeyed);
    const int64_t now = std::min(t_event, t_flow);
    if (now == kNever) break;
    if (opt_.progress && (++progress_tick & 4095u) == 0) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      if (secs >= next_report_s) {
        next_report_s = secs + opt_.progress_interval_s;
        char line[200];
        std::snprintf(line, sizeof line, "simulated %.1f us of the layer: %lld of %zu transfers done, %lld events, %.0f s",
                      static_cast<double>(now) / 1000.0, static_cast<long long>(num_flows_done_), transfers_.size(),
                      static_cast<long long>(num_events_), secs);
        opt_.progress(line);
      }
    }
    // Everything at `now`: flow completions first (in schedule order), then events (FIFO).
    while (true) {
      bool progressed = false;
      while (!checkpoints_.empty() && checkpoints_.top_time(due, rekeyed) == now) {
        ++num_events_;
        on_flow_complete(checkpoints_.top(due, rekeyed), now);
        progressed = true;
      }
      while (!events_.empty() && events_.top().time_ns == now) {
        const Event ev = events_.top();
        events_.pop();
        ++num_events_;
        progressed = true;
        switch (ev.kind) {
          case kAgentStep:
            step_agent(ev.a, now);
            break;
          case kDstComplete:
            on_dst_complete(ev.a, static_cast<int>(ev.b), now);
            break;
          case kAllKnown:
            on_all_known(ev.a, static_cast<int>(ev.b), now);
            break;
          case kComputeDone:
            on_compute_done(static_cast<int>(ev.b), now);
            break;
          case kReadyVisible: {
            const int gpu = static_cast<int>(ev.b);
            std::vector<int32_t> waiters;
            waiters.swap(ready_waiters_[gpu]);
            for (int32_t agent : waiters) {
              ++pc_[agent];
              schedule(observe_ready(agent, gpu, wait_start_ns_[agent]), kAgentStep, agent);
            }
            break;
          }
          case kGpuBarrierArrive: {
            const int gpu = static_cast<int>(ev.b);
            if (++barrier_arrivals_[ev.a][gpu] == S_) on_gpu_barrier(ev.a, gpu, now);
            break;
          }
          case kReduceDone:
            gpu_[ev.b].done_ns = now;
            break;
          case kRecompute:
            recompute_scheduled_ = false;
            dirty_ = true;
            break;
        }
      }
      if (!progressed) break;
    }
    if (dirty_ && opt_.rate_quantum_ns > 0 && now < last_recompute_ns_ + opt_.rate_quantum_ns) {
      // Inside the quantum: new flows take residual capacity; a full recompute follows.
      for (int f : new_flows_) {
        if (!net_.active(f) || flow_state_[f].seg_rate >= 0) continue;
        net_.admit(f);
        set_rate_segment(f, net_.flow(f).rate_gbps(), now);
      }
      if (!recompute_scheduled_) {
        recompute_scheduled_ = true;
        schedule(last_recompute_ns_ + opt_.rate_quantum_ns, kRecompute);
      }
      new_flows_.clear();
      dirty_ = false;
    }
    if (dirty_) {
      last_recompute_ns_ = now;
      new_flows_.clear();
      if (helper_) {
        recompute_with_helper(now);
      } else {
        if (opt_.rate_quantum_ns > 0 || opt_.full_rate_recompute) net_.recompute_rates();
        else net_.update_rates();
        // The new rates from the update's own list: the flows' lines in the network are not read.
        const size_t n = net_.changed_flows().size();
        apply_rates(net_.changed_flows().data(), net_.changed_rates().data(), 0, n, n, now);
      }
      if (opt_.signal_queueing) update_port_queues(now);
      dirty_ = false;
    }
    resolve_pending_signals();
  }
  stop_helper();
  // Consistency: every piece known, every transfer done.
  for (int ph = 0; ph < 2; ++ph) {
    if (!phase_on(ph)) continue;
    for (int g = 0; g < R_; ++g)
      if (known_count_[ph][g] != traffic_.recv_pieces[ph][g]) {
        // A flow that moves but would need 1e17 ns or more at its rate was left without a
        // completion (delivery_ns): the input is too large for int64 nanoseconds, not a bug.
        for (int f = 0; f < static_cast<int>(flow_state_.size()); ++f) {
          const FlowState& fs = flow_state_[f];
          if (!net_.active(f) || fs.due_ns != INT64_MAX) continue;
          std::ostringstream os;
          if (fs.seg_rate > 0)
            os << "layer: a transfer of " << std::llround(fs.total) << " bytes at " << fs.seg_rate
               << " GB/s would take over 1e17 ns (about 3 years), past what int64 nanoseconds hold; " << kTooLongAdvice;
          else
            os << "layer: a transfer of " << std::llround(fs.total) << " bytes got a rate of 0 (its share of a "
               << "resource or of its SM's issue rate is below the engine's 2^-32 GB/s unit) and would never end; "
               << kTooLongAdvice;
          throw Error(os.str());
        }
        throw Error("internal: simulation ended with undelivered " + std::string(kPhaseName[ph]) + " data at gpu" +
                        std::to_string(g) + " (a protocol wait that nothing releases); please report",
                    ErrorKind::kInternal);
      }
  }
  LayerResult res;
  finish(res);
  return res;
}

}  // namespace

Quantiles quantiles_of(std::vector<int64_t> values) {
  Quantiles q;
  q.count = static_cast<int64_t>(values.size());
  if (values.empty()) return q;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (int64_t v : values) sum += static_cast<double>(v);
  q.mean_ns = sum / static_cast<double>(values.size());
  auto nth = [&](double p) {
    size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
    return values[std::max<size_t>(rank, 1) - 1];
  };
  q.p50_ns = nth(0.5);
  q.p90_ns = nth(0.9);
  q.p99_ns = nth(0.99);
  q.max_ns = values.back();
  return q;
}

void check_layer_times(const Topology& topo, const spec::LayerConfig& cfg, const ProtocolConfig& proto) {
  if (proto.phases == Phases::kLayer)
    compute_times(topo, cfg, proto);
  else if (proto.phases == Phases::kCombine)
    combine_reduce_time_ns(topo, cfg);
}

LayerResult simulate_layer(const Topology& topo, const Workload& work, const ProtocolConfig& proto,
                           const SimOptions& options) {
  LayerSim sim(topo, work, proto, options);
  return sim.run();
}

}  // namespace mok::sim
