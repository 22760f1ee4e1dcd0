// The event engine for one MoE layer: comm-SM programs issue transfers (flows), chunk arrivals
// become signals, signals release expert GEMM tiles, finished experts release the combine.
#include "mok/sim/layer_sim.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <utility>
#include <sstream>

#include "mok/sim/error.hpp"
#include "mok/sim/flow_network.hpp"

namespace mok::sim {

namespace {

constexpr int kDispatch = 0;
constexpr int kCombine = 1;
const char* kPhaseName[2] = {"dispatch", "combine"};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t ceil_ns(double x) { return static_cast<int64_t>(std::ceil(x)); }

// Exact distribution of non-negative integer nanoseconds with bounded memory.
class NsHistogram {
 public:
  void add(int64_t v) {
    if (v < 0) v = 0;
    ++count_;
    sum_ += static_cast<double>(v);
    if (v < kDense) {
      if (dense_.empty()) dense_.assign(kDense, 0);
      ++dense_[v];
    } else {
      overflow_.push_back(v);
    }
  }
  Quantiles summary() {
    Quantiles q;
    q.count = count_;
    if (count_ == 0) return q;
    q.mean_ns = sum_ / static_cast<double>(count_);
    std::sort(overflow_.begin(), overflow_.end());
    auto nth = [&](double p) {
      int64_t rank = static_cast<int64_t>(std::ceil(p * static_cast<double>(count_)));
      rank = std::max<int64_t>(rank, 1);
      int64_t seen = 0;
      if (!dense_.empty())
        for (int64_t v = 0; v < kDense; ++v) {
          seen += dense_[v];
          if (seen >= rank) return v;
        }
      return overflow_[rank - seen - 1];
    };
    q.p50_ns = nth(0.5);
    q.p90_ns = nth(0.9);
    q.p99_ns = nth(0.99);
    q.max_ns = nth(1.0);
    return q;
  }

 private:
  static constexpr int64_t kDense = int64_t{1} << 18;
  int64_t count_ = 0;
  double sum_ = 0;
  std::vector<uint32_t> dense_;
  std::vector<int64_t> overflow_;
};

// One chunk of one (source, destination) pair in one phase: `rows` rows of the token owner's
// chunk `chunk_idx`. Pieces are stored grouped by pair (src * R + dst), chunks ascending.
struct Piece {
  int32_t chunk_idx;
  int32_t rows;
  int64_t wire_bytes;
};

struct PhaseTraffic {
  std::vector<int64_t> pair_offsets;  // [R*R + 1]
  std::vector<Piece> pieces;
  std::vector<int64_t> recv_pieces;   // per destination GPU
  std::vector<int64_t> recv_payload;  // per destination GPU, payload bytes
};

// A transfer: one comm SM moves a list of pieces between itself and one peer.
struct Transfer {
  int32_t phase;
  int32_t initiator, sm;
  int32_t src, dst;        // data moves src -> dst
  bool is_read;            // pull: the destination reads
  int64_t list_begin, list_end;  // into transfer_pieces
  int64_t bytes;
  double demand_gbps;
  int64_t latency_ns;      // one-way
  int64_t start_ns = -1;
};

enum class OpKind : int8_t { kTransfer, kWaitLocalReady, kWaitRemoteReady, kBarrierArrive };
struct Op {
  OpKind kind;
  int32_t arg;  // transfer id, peer GPU or phase
};

enum EventKind : int32_t {
  kAgentStep,       // a: agent
  kPieceKnown,      // a: phase, b: piece, c: data arrival ns
  kAllKnown,        // a: phase, b: destination GPU
  kCounterArrival,  // a: phase, b: destination GPU
  kTileDone,        // b: GPU
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
  int64_t b, c;
};
struct EventLater {
  bool operator()(const Event& x, const Event& y) const {
    return x.time_ns != y.time_ns ? x.time_ns > y.time_ns : x.seq > y.seq;
  }
};
// Next milestone of every active flow, keyed (time, seq): an indexed binary heap, so a rate
// change moves the flow's entry instead of leaving stale copies behind.
class CheckpointHeap {
 public:
  bool empty() const { return heap_.empty(); }
  int top() const { return heap_[0]; }
  int64_t top_time() const { return time_[heap_[0]]; }
  void set(int flow, int64_t time_ns, uint64_t seq) {
    if (static_cast<size_t>(flow) >= pos_.size()) {
      pos_.resize(flow + 1, -1);
      time_.resize(flow + 1);
      seq_.resize(flow + 1);
    }
    time_[flow] = time_ns;
    seq_[flow] = seq;
    if (pos_[flow] < 0) {
      pos_[flow] = static_cast<int>(heap_.size());
      heap_.push_back(flow);
    }
    sift_up(pos_[flow]);
    sift_down(pos_[flow]);
  }
  void erase(int flow) {
    if (static_cast<size_t>(flow) >= pos_.size() || pos_[flow] < 0) return;
    const int i = pos_[flow];
    const int last = heap_.back();
    heap_.pop_back();
    pos_[flow] = -1;
    if (last == flow) return;
    heap_[i] = last;
    pos_[last] = i;
    sift_up(i);
    sift_down(pos_[last]);
  }

 private:
  bool less(int a, int b) const { return time_[a] != time_[b] ? time_[a] < time_[b] : seq_[a] < seq_[b]; }
  void sift_up(int i) {
    while (i > 0) {
      const int parent = (i - 1) / 2;
      if (!less(heap_[i], heap_[parent])) break;
      swap_at(i, parent);
      i = parent;
    }
  }
  void sift_down(int i) {
    const int n = static_cast<int>(heap_.size());
    for (;;) {
      int best = i;
      const int l = 2 * i + 1, r = l + 1;
      if (l < n && less(heap_[l], heap_[best])) best = l;
      if (r < n && less(heap_[r], heap_[best])) best = r;
      if (best == i) return;
      swap_at(i, best);
      i = best;
    }
  }
  void swap_at(int i, int j) {
    std::swap(heap_[i], heap_[j]);
    pos_[heap_[i]] = i;
    pos_[heap_[j]] = j;
  }
  std::vector<int> heap_, pos_;
  std::vector<int64_t> time_;
  std::vector<uint64_t> seq_;
};

class LayerSim {
 public:
  LayerSim(const Topology& topo, const Workload& work, const ProtocolConfig& proto, const SimOptions& opt)
      : topo_(topo), work_(work), proto_(proto), opt_(opt), cfg_(work.cfg) {}

  LayerResult run();

 private:
  // --- setup
  void check_inputs() const;
  void build_resources();
  void build_traffic();
  void build_tiles();
  void build_programs();
  void add_transfers(int phase, int initiator, Direction dir, std::vector<std::vector<Op>>& programs);
  int path_for(int src, int dst, int* path) const;
  int64_t latency(int src, int dst) const;
  Direction direction(int phase) const { return phase == kDispatch ? proto_.dispatch : proto_.combine; }
  bool phase_on(int phase) const {
    return proto_.phases == Phases::kLayer || (phase == kDispatch ? proto_.phases == Phases::kDispatch
                                                                  : proto_.phases == Phases::kCombine);
  }

  // --- engine
  void schedule(int64_t t, int32_t kind, int32_t a = 0, int64_t b = 0, int64_t c = 0) {
    events_.push(Event{t, seq_++, kind, a, b, c});
  }
  void step_agent(int agent, int64_t now);
  void start_transfer(int agent, int tid, int64_t now);
  void schedule_checkpoint(int flow, int64_t now);
  void on_checkpoint(int flow, int64_t now);
  void on_piece_data(const Transfer& tr, int64_t piece_idx, int64_t t_fluid);
  void on_piece_known(int phase, int64_t piece_idx, int64_t data_ns, int64_t now);
  void on_all_known(int phase, int gpu, int64_t now);
  void on_dst_complete(int phase, int gpu, int64_t now);
  void on_tile_ready(int gpu, int32_t tile, int64_t now);
  void start_compute(int gpu, int64_t now);
  void on_compute_done(int gpu, int64_t now);
  void on_gpu_barrier(int phase, int gpu, int64_t now);
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

  FlowNetwork net_;
  std::vector<int> res_nvl_out_, res_nvl_in_, res_nic_out_, res_nic_in_, res_hbm_, res_up_out_, res_up_in_;
  std::vector<int> res_kind_;  // resource -> index into kResourceKinds
  std::vector<int64_t> res_bytes_phase_[2];

  PhaseTraffic traffic_[2];
  // Pieces known per destination and phase, and totals expected.
  std::vector<int64_t> known_count_[2];
  std::vector<int64_t> last_data_ns_[2];
  std::vector<int64_t> piece_data_ns_[2];  // only for counter and barrier signaling
  std::vector<int64_t> counter_served_[2], counter_free_ns_[2];
  NsHistogram chunk_signal_[2];
  std::vector<int64_t> completion_signal_[2];
  int64_t signal_writes_[2] = {0, 0};

  // Tiles: expert GEMM M-tiles; a tile is ready when every piece holding one of its rows is known.
  std::vector<int64_t> expert_tile_offset_;  // [E+1]
  std::vector<int32_t> tile_pending_;
  std::vector<int64_t> piece_tile_offsets_;  // dispatch piece -> tiles it feeds (CSR)
  std::vector<int32_t> piece_tiles_;
  std::vector<int64_t> gpu_tiles_left_;
  std::vector<std::deque<int32_t>> ready_tiles_;
  std::vector<char> compute_busy_;
  std::vector<int64_t> compute_busy_ns_;
  int64_t tile_ns_ = 0, shared_ns_ = 0, reduce_ns_ = 0;
  std::vector<int64_t> last_tile_ready_ns_;
  std::vector<int64_t> last_tile_piece_data_ns_, last_tile_piece_known_ns_, last_tile_transfer_;

  // Programs
  std::vector<Transfer> transfers_;
  std::vector<int64_t> transfer_pieces_;  // global piece indices (per phase numbering)
  std::vector<std::vector<Op>> programs_;  // agent = gpu * S + sm
  std::vector<int32_t> pc_;
  std::vector<int64_t> ready_visible_ns_;  // per GPU, -1 until expert outputs are ready
  std::vector<std::vector<int32_t>> ready_waiters_;  // per GPU: agents waiting for it
  std::vector<int64_t> wait_start_ns_;
  std::vector<int32_t> barrier_arrivals_[2];
  std::vector<int64_t> barrier_gpu_ns_[2];
  int32_t barrier_gpus_[2] = {0, 0};

  // Flow side data
  std::vector<int32_t> flow_transfer_;
  std::vector<int64_t> flow_next_piece_;
  std::vector<double> flow_cum_next_;
  std::vector<int32_t> flow_agent_;
  std::vector<int64_t> combine_last_transfer_;  // per destination: transfer of its last known piece
  std::vector<int64_t> combine_last_data_ns_;

  std::vector<GpuTimeline> gpu_;
  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  CheckpointHeap checkpoints_;
  std::vector<double> flow_rate_seen_;
  uint64_t seq_ = 0;
  int64_t num_events_ = 0, num_flows_ = 0;
  bool dirty_ = false;
  bool recompute_scheduled_ = false;
  std::vector<int> new_flows_;  // started since the last rate assignment
  int64_t last_recompute_ns_ = INT64_MIN / 2;
  std::vector<TraceSpan> trace_;
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
  path[n++] = res_hbm_[src];
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
  path[n++] = res_hbm_[dst];
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
// (y rows, once per slot unless reduced per rank).
void LayerSim::build_traffic() {
  const int64_t T = cfg_.tokens_per_rank, K = cfg_.top_k, C = proto_.chunk_tokens;
  const int64_t num_chunks = ceil_div(T, C);
  const int64_t H = cfg_.hidden;
  const int64_t x_row_bytes = H * proto_.dispatch_bytes_per_element +
                              (proto_.dispatch_bytes_per_element == 1 ? ceil_div(H, 128) * 4 : 0);
  const int64_t y_row_bytes = H * proto_.combine_bytes_per_element;
  const int64_t row_bytes[2] = {x_row_bytes, y_row_bytes};
  const bool per_token[2] = {proto_.dispatch_dedup, proto_.combine_reduce_per_rank};
  for (int ph = 0; ph < 2; ++ph) {
    traffic_[ph].pair_offsets.assign(static_cast<size_t>(R_) * R_ + 1, 0);
    traffic_[ph].recv_pieces.assign(R_, 0);
    traffic_[ph].recv_payload.assign(R_, 0);
  }
  std::vector<int32_t> slots(R_, 0), tokens(R_, 0), last_token(R_, -1);
  std::vector<int32_t> touched;
  std::vector<int64_t> cursor[2];
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      for (int ph = 0; ph < 2; ++ph) {
        auto& off = traffic_[ph].pair_offsets;
        for (size_t i = 1; i < off.size(); ++i) off[i] += off[i - 1];
        traffic_[ph].pieces.resize(off.back());
        cursor[ph].assign(off.begin(), off.end() - 1);
      }
    }
    for (int o = 0; o < R_; ++o) {
      for (int64_t c = 0; c < num_chunks; ++c) {
        touched.clear();
        const int64_t t_end = std::min(T, (c + 1) * C);
        for (int64_t t = c * C; t < t_end; ++t) {
          const int64_t g = o * T + t;
          for (int64_t k = 0; k < K; ++k) {
            const int32_t e = work_.topk_experts[g * K + k];
            if (e < 0) continue;
            const int p = static_cast<int>(cfg_.owner_rank(e));
            if (slots[p] == 0) touched.push_back(p);
            ++slots[p];
            if (last_token[p] != t) {
              last_token[p] = static_cast<int32_t>(t);
              ++tokens[p];
            }
          }
        }
        std::sort(touched.begin(), touched.end());
        for (int p : touched) {
          for (int ph = 0; ph < 2; ++ph) {
            const int src = ph == kDispatch ? o : p, dst = ph == kDispatch ? p : o;
            const size_t pair = static_cast<size_t>(src) * R_ + dst;
            if (pass == 0) {
              ++traffic_[ph].pair_offsets[pair + 1];
              continue;
            }
            const int32_t rows = per_token[ph] ? tokens[p] : slots[p];
            int64_t wire = rows * row_bytes[ph];
            traffic_[ph].recv_payload[dst] += wire;
            if (direction(ph) == Direction::kPush && proto_.signaling == Signaling::kFlagInData && src != dst)
              wire = ceil_div(wire * 128, 120);  // 8 flag bytes in every 128-byte line
            traffic_[ph].pieces[cursor[ph][pair]++] = Piece{static_cast<int32_t>(c), rows, wire};
            ++traffic_[ph].recv_pieces[dst];
          }
        }
        for (int p : touched) {
          slots[p] = 0;
          tokens[p] = 0;
          last_token[p] = -1;
        }
      }
    }
  }
}

void LayerSim::build_tiles() {
  const int64_t E = cfg_.num_experts, TR = proto_.gemm_tile_rows;
  expert_tile_offset_.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) expert_tile_offset_[e + 1] = expert_tile_offset_[e] + ceil_div(work_.expert_rows(e), TR);
  const int64_t num_tiles = expert_tile_offset_[E];
  tile_pending_.assign(num_tiles, 0);
  gpu_tiles_left_.assign(R_, 0);
  const int64_t T = cfg_.tokens_per_rank, C = proto_.chunk_tokens, NC = ceil_div(T, C);
  const auto& tr = traffic_[kDispatch];
  // (tile, piece) edges, collected destination by destination with a (src, chunk) -> piece table.
  std::vector<std::pair<int32_t, int64_t>> edges;
  std::vector<int64_t> lookup(static_cast<size_t>(R_) * NC, -1);
  for (int d = 0; d < R_; ++d) {
    for (int s = 0; s < R_; ++s) {
      const size_t pair = static_cast<size_t>(s) * R_ + d;
      for (int64_t i = tr.pair_offsets[pair]; i < tr.pair_offsets[pair + 1]; ++i)
        lookup[s * NC + tr.pieces[i].chunk_idx] = i;
    }
    const int64_t e_begin = cfg_.first_expert(d), e_end = e_begin + cfg_.experts_per_rank();
    for (int64_t e = e_begin; e < e_end; ++e) {
      gpu_tiles_left_[d] += expert_tile_offset_[e + 1] - expert_tile_offset_[e];
      // ORDER: canonical rows (ascending global token, then slot) from spec::build_routing_plan;
      // tile i holds rows [i*TR, (i+1)*TR) of that list, as in the kernel's GEMM.
      for (int64_t r = work_.expert_offsets[e]; r < work_.expert_offsets[e + 1]; ++r) {
        const int64_t g = work_.rows[r].token_idx;
        const int64_t piece = lookup[(g / T) * NC + (g % T) / C];
        const int32_t tile = static_cast<int32_t>(expert_tile_offset_[e] + (r - work_.expert_offsets[e]) / TR);
        if (edges.empty() || edges.back().first != tile || edges.back().second != piece) {
          // rows are sorted by token, so repeats of a (tile, piece) pair are adjacent
          edges.emplace_back(tile, piece);
          ++tile_pending_[tile];
        }
      }
    }
    for (int s = 0; s < R_; ++s) {
      const size_t pair = static_cast<size_t>(s) * R_ + d;
      for (int64_t i = tr.pair_offsets[pair]; i < tr.pair_offsets[pair + 1]; ++i)
        lookup[s * NC + tr.pieces[i].chunk_idx] = -1;
    }
  }
  piece_tile_offsets_.assign(tr.pieces.size() + 1, 0);
  for (const auto& [tile, piece] : edges) ++piece_tile_offsets_[piece + 1];
  for (size_t i = 1; i < piece_tile_offsets_.size(); ++i) piece_tile_offsets_[i] += piece_tile_offsets_[i - 1];
  piece_tiles_.resize(edges.size());
  std::vector<int64_t> cur(piece_tile_offsets_.begin(), piece_tile_offsets_.end() - 1);
  for (const auto& [tile, piece] : edges) piece_tiles_[cur[piece]++] = tile;

  // Compute model: the compute SMs run one tile at a time at their share of the GEMM rate.
  const double flops_per_ns = topo_.bf16_dense_tflops * 1e3 * topo_.gemm_efficiency *
                              static_cast<double>(topo_.num_sms - proto_.comm_sms) / topo_.num_sms;
  const double H = static_cast<double>(cfg_.hidden), I = static_cast<double>(cfg_.intermediate);
  tile_ns_ = ceil_ns(2.0 * 3.0 * H * I * static_cast<double>(TR) / flops_per_ns);
  shared_ns_ = cfg_.has_shared()
                   ? ceil_ns(2.0 * 3.0 * H * static_cast<double>(cfg_.shared_intermediate) *
                             static_cast<double>(T) / flops_per_ns)
                   : 0;
  // Final combine sum on the token owner: read K slot rows and write one output row per token.
  reduce_ns_ = ceil_ns(static_cast<double>(T * (cfg_.top_k + 1) * cfg_.hidden * 2) / topo_.hbm_gbps);
}

// Gives the initiator's comm SMs their transfers for one phase. Peers are visited in an order
// rotated by the initiator's index, so that GPUs do not all start on the same peer.
void LayerSim::add_transfers(int phase, int initiator, Direction dir, std::vector<std::vector<Op>>& programs) {
  const auto& tr = traffic_[phase];
  const bool is_read = dir == Direction::kPull;
  auto demand_for = [&](int src, int dst, int64_t bytes, int64_t num_pieces) {
    const double L = static_cast<double>(latency(src, dst));
    const bool tma = proto_.copy_engine == CopyEngine::kTma;
    const double issue = tma ? topo_.sm_tma_store_gbps : topo_.sm_store_gbps;
    if (src == dst) return issue;  // local copy: issue-bound
    if (topo_.domain_of(src) != topo_.domain_of(dst)) return 1e6;  // NIC DMA engines move it
    // Little's law: one SM moves at most (bytes it may keep in flight) / (round trip).
    const double inflight = is_read ? (tma ? topo_.sm_tma_load_inflight_bytes : topo_.sm_load_inflight_bytes)
                                    : topo_.sm_store_inflight_bytes;
    double d = std::min(issue, inflight / (2.0 * L));
    if (!is_read && (proto_.signaling == Signaling::kFenceFlag || proto_.signaling == Signaling::kCounter)) {
      // After each chunk the SM fences: it issues nothing until the acks of its writes return
      // (one round trip after the last byte lands) and the fence itself retires, and the drained
      // pipe then refills: about 2L + fence overhead of lost issue time per chunk.
      const double stall = 2.0 * L + topo_.fence_overhead_ns;
      const double b = static_cast<double>(bytes);
      d = b / (b / d + static_cast<double>(num_pieces) * stall);
    }
    return d;
  };
  auto make_transfer = [&](int sm, int peer, const std::vector<int64_t>& list) {
    if (list.empty()) return;
    Transfer t{};
    t.phase = phase;
    t.initiator = initiator;
    t.sm = sm;
    t.src = dir == Direction::kPush ? initiator : peer;
    t.dst = dir == Direction::kPush ? peer : initiator;
    t.is_read = is_read;
    t.list_begin = static_cast<int64_t>(transfer_pieces_.size());
    t.bytes = 0;
    for (int64_t p : list) {
      transfer_pieces_.push_back(p);
      t.bytes += tr.pieces[p].wire_bytes;
    }
    t.list_end = static_cast<int64_t>(transfer_pieces_.size());
    t.latency_ns = latency(t.src, t.dst);
    t.demand_gbps = demand_for(t.src, t.dst, t.bytes, static_cast<int64_t>(list.size()));
    programs[sm].push_back(Op{OpKind::kTransfer, static_cast<int32_t>(transfers_.size())});
    transfers_.push_back(t);
  };
  std::vector<int64_t> list;
  for (int k = 0; k < R_; ++k) {
    const int peer = (initiator + k) % R_;
    const int src = dir == Direction::kPush ? initiator : peer;
    const int dst = dir == Direction::kPush ? peer : initiator;
    const size_t pair = static_cast<size_t>(src) * R_ + dst;
    const int64_t b = tr.pair_offsets[pair], e = tr.pair_offsets[pair + 1];
    if (S_ >= R_) {
      // Peer k is served by SMs k, k+R, k+2R, ...; they deal its chunks round-robin.
      const int lanes = (S_ - 1 - k) / R_ + 1;
      for (int lane = 0; lane < lanes; ++lane) {
        list.clear();
        for (int64_t i = b + lane; i < e; i += lanes) list.push_back(i);
        if (phase == kCombine && dir == Direction::kPull && !list.empty())
          programs[k + lane * R_].push_back(Op{OpKind::kWaitRemoteReady, peer});
        make_transfer(k + lane * R_, peer, list);
      }
    } else {
      // SM j serves peers j, j+S, j+2S, ... one after the other.
      list.clear();
      for (int64_t i = b; i < e; ++i) list.push_back(i);
      if (phase == kCombine && dir == Direction::kPull && !list.empty())
        programs[k % S_].push_back(Op{OpKind::kWaitRemoteReady, peer});
      make_transfer(k % S_, peer, list);
    }
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
      if (dir == Direction::kPush && proto_.signaling == Signaling::kBarrier)
        for (auto& prog : programs) prog.push_back(Op{OpKind::kBarrierArrive, phase});
    }
    for (int sm = 0; sm < S_; ++sm) programs_[static_cast<size_t>(g) * S_ + sm] = std::move(programs[sm]);
  }
  pc_.assign(programs_.size(), 0);
  wait_start_ns_.assign(programs_.size(), 0);
}

void LayerSim::start_transfer(int agent, int tid, int64_t now) {
  Transfer& tr = transfers_[tid];
  tr.start_ns = now;
  int path[kMaxPathLen];
  const int n = path_for(tr.src, tr.dst, path);
  const int f = net_.start_flow(now, path, n, tr.demand_gbps, tr.bytes);
  ++num_flows_;
  if (static_cast<size_t>(f) >= flow_transfer_.size()) {
    flow_transfer_.resize(f + 1);
    flow_next_piece_.resize(f + 1);
    flow_cum_next_.resize(f + 1);
    flow_agent_.resize(f + 1);
    flow_rate_seen_.resize(f + 1, -1.0);
  }
  flow_transfer_[f] = tid;
  flow_next_piece_[f] = tr.list_begin;
  flow_cum_next_[f] = static_cast<double>(traffic_[tr.phase].pieces[transfer_pieces_[tr.list_begin]].wire_bytes);
  flow_agent_[f] = agent;
  flow_rate_seen_[f] = -1.0;
  new_flows_.push_back(f);
  checkpoints_.erase(f);
  dirty_ = true;
}

void LayerSim::schedule_checkpoint(int f, int64_t now) {
  const Flow& fl = net_.flow(f);
  if (fl.rate_gbps <= 0) {
    checkpoints_.erase(f);
    return;
  }
  const double delivered = static_cast<double>(fl.total_bytes) - fl.remaining_bytes;
  const double need = flow_cum_next_[f] - delivered;
  const int64_t dt = need <= 0 ? 0 : std::max<int64_t>(1, ceil_ns(need / fl.rate_gbps));
  checkpoints_.set(f, now + dt, seq_++);
}

void LayerSim::on_checkpoint(int f, int64_t now) {
  Flow& fl = net_.flow(f);
  fl.remaining_bytes -= fl.rate_gbps * static_cast<double>(now - fl.updated_ns);
  fl.updated_ns = now;
  // The milestone is reached by construction of its time; pin the fluid state to it exactly.
  fl.remaining_bytes = std::min(fl.remaining_bytes, static_cast<double>(fl.total_bytes) - flow_cum_next_[f]);
  if (fl.remaining_bytes < 0) fl.remaining_bytes = 0;
  const int tid = flow_transfer_[f];
  const Transfer& tr = transfers_[tid];
  on_piece_data(tr, transfer_pieces_[flow_next_piece_[f]], now);
  ++flow_next_piece_[f];
  if (flow_next_piece_[f] < tr.list_end) {
    flow_cum_next_[f] += static_cast<double>(traffic_[tr.phase].pieces[transfer_pieces_[flow_next_piece_[f]]].wire_bytes);
    schedule_checkpoint(f, now);
    return;
  }
  // Transfer complete: credit bytes per phase, free the SM.
  for (int i = 0; i < fl.path_len; ++i) res_bytes_phase_[tr.phase][fl.path[i]] += fl.total_bytes;
  const int agent = flow_agent_[f];
  checkpoints_.erase(f);
  net_.finish_flow(f);
  dirty_ = true;
  if (opt_.record_trace && tr.initiator < opt_.trace_max_gpus)
    trace_.push_back(TraceSpan{tr.initiator, tr.sm, tr.start_ns, now,
                               std::string(kPhaseName[tr.phase]) + (tr.is_read ? " pull " : " push ") +
                                   std::to_string(tr.src) + "->" + std::to_string(tr.dst),
                               tr.bytes});
  ++pc_[agent];
  step_agent(agent, now);
}

// The last byte of a piece left the bottleneck at t_fluid. When does its consumer know?
void LayerSim::on_piece_data(const Transfer& tr, int64_t piece, int64_t t_fluid) {
  const int ph = tr.phase;
  const int64_t L = tr.latency_ns;
  const int dst = tr.dst;
  if (tr.is_read) {
    // Pull: the loads return one round trip after the request stream; the reading SM tells
    // the compute warps through a local flag after a local release fence.
    const int64_t arrive = t_fluid + 2 * L;
    const int64_t known = observe_local(arrive + static_cast<int64_t>(topo_.local_fence_ns),
                                        std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns)));
    schedule(known, kPieceKnown, ph, piece, arrive);
    return;
  }
  const int64_t arrive = t_fluid + L;
  if (tr.src == dst) {  // local copy: the same SM's own stores, then a local flag
    schedule(observe_local(arrive + static_cast<int64_t>(topo_.local_fence_ns),
                           std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns))),
             kPieceKnown, ph, piece, arrive);
    return;
  }
  const int64_t fence_done = t_fluid + 2 * L + static_cast<int64_t>(topo_.fence_overhead_ns);
  switch (proto_.signaling) {
    case Signaling::kFenceFlag:
      // fence (acks back at +2L) then a flag write that lands one way later; the receiver
      // sweeps one flag per source.
      ++signal_writes_[ph];
      schedule(observe_local(fence_done + L, flag_poll_period(R_)), kPieceKnown, ph, piece, arrive);
      break;
    case Signaling::kCounter:
      ++signal_writes_[ph];
      piece_data_ns_[ph][piece] = arrive;
      schedule(fence_done + L, kCounterArrival, ph, dst, arrive);
      break;
    case Signaling::kFlagInData:
      schedule(observe_local(arrive, flag_poll_period(R_)), kPieceKnown, ph, piece, arrive);
      break;
    case Signaling::kBarrier:
      // Known when the phase barrier completes (on_gpu_barrier); only the arrival is recorded.
      last_data_ns_[ph][dst] = std::max(last_data_ns_[ph][dst], arrive);
      piece_data_ns_[ph][piece] = arrive;
      break;
  }
}

void LayerSim::on_piece_known(int ph, int64_t piece, int64_t data_ns, int64_t now) {
  // Find the destination from the piece's pair: binary search over pair offsets.
  const auto& off = traffic_[ph].pair_offsets;
  const size_t pair = static_cast<size_t>(std::upper_bound(off.begin(), off.end(), piece) - off.begin()) - 1;
  const int dst = static_cast<int>(pair % R_);
  chunk_signal_[ph].add(now - data_ns);
  last_data_ns_[ph][dst] = std::max(last_data_ns_[ph][dst], data_ns);
  if (ph == kDispatch && proto_.phases == Phases::kLayer) {
    for (int64_t i = piece_tile_offsets_[piece]; i < piece_tile_offsets_[piece + 1]; ++i) {
      const int32_t tile = piece_tiles_[i];
      if (--tile_pending_[tile] == 0) {
        if (now >= last_tile_ready_ns_[dst]) {
          last_tile_ready_ns_[dst] = now;
          last_tile_piece_data_ns_[dst] = data_ns;
          last_tile_piece_known_ns_[dst] = now;
          last_tile_transfer_[dst] = static_cast<int64_t>(pair / R_);  // source GPU
        }
        on_tile_ready(dst, tile, now);
      }
    }
  }
  if (ph == kCombine && data_ns >= combine_last_data_ns_[dst]) {
    combine_last_data_ns_[dst] = data_ns;
    combine_last_transfer_[dst] = static_cast<int64_t>(pair / R_);  // producer GPU
  }
  if (++known_count_[ph][dst] == traffic_[ph].recv_pieces[dst]) on_dst_complete(ph, dst, now);
}

void LayerSim::on_all_known(int ph, int gpu, int64_t now) {
  // Counter or barrier: every piece into `gpu` becomes known at once.
  // Chunks a GPU copies to itself were signaled locally as they landed.
  const auto& tr = traffic_[ph];
  for (int s = 0; s < R_; ++s) {
    if (s == gpu) continue;
    const size_t pair = static_cast<size_t>(s) * R_ + gpu;
    for (int64_t i = tr.pair_offsets[pair]; i < tr.pair_offsets[pair + 1]; ++i)
      on_piece_known(ph, i, piece_data_ns_[ph][i], now);
  }
  if (tr.recv_pieces[gpu] == 0) on_dst_complete(ph, gpu, now);
}

void LayerSim::on_dst_complete(int ph, int gpu, int64_t now) {
  completion_signal_[ph].push_back(now - last_data_ns_[ph][gpu]);
  if (ph == kDispatch) {
    gpu_[gpu].dispatch_known_ns = now;
    if (proto_.phases == Phases::kDispatch) gpu_[gpu].done_ns = now;
  } else {
    gpu_[gpu].combine_known_ns = now;
    schedule(now + reduce_ns_, kReduceDone, 0, gpu);
  }
}

void LayerSim::on_tile_ready(int gpu, int32_t tile, int64_t now) {
  ready_tiles_[gpu].push_back(tile);
  if (!compute_busy_[gpu]) start_compute(gpu, now);
}

void LayerSim::start_compute(int gpu, int64_t now) {
  if (ready_tiles_[gpu].empty()) return;
  const int32_t tile = ready_tiles_[gpu].front();
  ready_tiles_[gpu].pop_front();
  compute_busy_[gpu] = 1;
  compute_busy_ns_[gpu] += tile_ns_;
  if (opt_.record_trace && gpu < opt_.trace_max_gpus)
    trace_.push_back(TraceSpan{gpu, -1, now, now + tile_ns_, "tile " + std::to_string(tile), 0});
  schedule(now + tile_ns_, kTileDone, 0, gpu);
}

void LayerSim::on_compute_done(int gpu, int64_t now) {
  gpu_[gpu].compute_done_ns = now;
  // The expert outputs are published: a release fence over local stores, then a local flag
  // that remote pullers poll and local pushers observe.
  ready_visible_ns_[gpu] = now + static_cast<int64_t>(topo_.local_fence_ns);
  schedule(ready_visible_ns_[gpu], kReadyVisible, 0, gpu);
}

void LayerSim::on_gpu_barrier(int ph, int gpu, int64_t now) {
  barrier_gpu_ns_[ph][gpu] = now;
  if (++barrier_gpus_[ph] < R_) return;
  // Dissemination barrier: in round k GPU i writes a flag at i+2^k and waits for i-2^k's.
  std::vector<int64_t> t = barrier_gpu_ns_[ph], next(R_);
  const int64_t period = std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns));
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
        return;  // resumes in on_checkpoint when the transfer completes
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
      pr.payload_bytes_max_gpu = std::max(pr.payload_bytes_max_gpu, traffic_[ph].recv_payload[g]);
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
    for (const Piece& p : traffic_[ph].pieces) pr.wire_bytes += p.wire_bytes;
    pr.num_chunks = static_cast<int64_t>(traffic_[ph].pieces.size());
    pr.num_signal_writes = signal_writes_[ph];
    // Time base of the phase: dispatch from 0; combine from the first expert output ready.
    int64_t start = 0;
    if (ph == kCombine && proto_.phases == Phases::kLayer) {
      start = INT64_MAX;
      for (int g = 0; g < R_; ++g) start = std::min(start, gpu_[g].compute_done_ns);
    }
    const double span = static_cast<double>(std::max<int64_t>(1, pr.end_ns - start));
    double recv = 0;
    for (int g = 0; g < R_; ++g) recv += static_cast<double>(traffic_[ph].recv_payload[g]);
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
      s.bytes += net_.resource_bytes()[r];
      const double u = static_cast<double>(net_.resource_bytes()[r]) /
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
  auto seg = [&](const std::string& what, int64_t a, int64_t b) {
    if (b >= a) res.critical_path.push_back(PathSegment{what, a, b});
  };
  const std::string L = "gpu" + std::to_string(last);
  if (proto_.phases == Phases::kDispatch) {
    seg("dispatch data into " + L + " (last byte lands)", 0, last_data_ns_[kDispatch][last]);
    seg("dispatch completion signal at " + L, last_data_ns_[kDispatch][last], gpu_[last].dispatch_known_ns);
  } else {
    const int producer = proto_.phases == Phases::kLayer ? static_cast<int>(combine_last_transfer_[last]) : -1;
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
  if (proto_.phases == Phases::kLayer) build_tiles();
  build_programs();
  for (int ph = 0; ph < 2; ++ph) {
    known_count_[ph].assign(R_, 0);
    last_data_ns_[ph].assign(R_, 0);
    counter_served_[ph].assign(R_, 0);
    counter_free_ns_[ph].assign(R_, 0);
    barrier_arrivals_[ph].assign(R_, 0);
    barrier_gpu_ns_[ph].assign(R_, 0);
    const bool per_piece = phase_on(ph) && direction(ph) == Direction::kPush &&
                           (proto_.signaling == Signaling::kCounter || proto_.signaling == Signaling::kBarrier);
    if (per_piece) piece_data_ns_[ph].assign(traffic_[ph].pieces.size(), 0);
  }
  gpu_.assign(R_, GpuTimeline{});
  ready_visible_ns_.assign(R_, -1);
  ready_waiters_.assign(R_, {});
  ready_tiles_.assign(R_, {});
  compute_busy_.assign(R_, 0);
  compute_busy_ns_.assign(R_, 0);
  last_tile_ready_ns_.assign(R_, 0);
  last_tile_piece_data_ns_.assign(R_, 0);
  last_tile_piece_known_ns_.assign(R_, 0);
  last_tile_transfer_.assign(R_, -1);
  combine_last_transfer_.assign(R_, -1);
  combine_last_data_ns_.assign(R_, 0);
  for (int g = 0; g < R_; ++g) {
    gpu_[g].recv_payload_bytes_dispatch = traffic_[kDispatch].recv_payload[g];
    gpu_[g].recv_payload_bytes_combine = traffic_[kCombine].recv_payload[g];
  }

  // t = 0: the routing is published, inputs are in place.
  for (int ph = 0; ph < 2; ++ph) {
    if (!phase_on(ph)) continue;
    for (int g = 0; g < R_; ++g)
      if (traffic_[ph].recv_pieces[g] == 0 &&
          !(direction(ph) == Direction::kPush && proto_.signaling == Signaling::kBarrier))
        on_dst_complete(ph, g, 0);
  }
  if (proto_.phases == Phases::kLayer) {
    for (int g = 0; g < R_; ++g) {
      compute_busy_ns_[g] = shared_ns_;
      if (shared_ns_ > 0) {
        compute_busy_[g] = 1;
        if (opt_.record_trace && g < opt_.trace_max_gpus)
          trace_.push_back(TraceSpan{g, -1, 0, shared_ns_, "shared expert", 0});
        schedule(shared_ns_, kTileDone, 1, g);  // a = 1: not a routed tile
      } else if (gpu_tiles_left_[g] == 0) {
        on_compute_done(g, 0);
      }
    }
  } else if (proto_.phases == Phases::kCombine) {
    for (int g = 0; g < R_; ++g) ready_visible_ns_[g] = 0;
  }
  for (int agent = 0; agent < static_cast<int>(programs_.size()); ++agent) schedule(0, kAgentStep, agent);

  const int64_t kNever = INT64_MAX;
  while (true) {
    const int64_t t_event = events_.empty() ? kNever : events_.top().time_ns;
    const int64_t t_flow = checkpoints_.empty() ? kNever : checkpoints_.top_time();
    const int64_t now = std::min(t_event, t_flow);
    if (now == kNever) break;
    // Everything at `now`: flow milestones first (in schedule order), then events (FIFO).
    while (true) {
      bool progressed = false;
      while (!checkpoints_.empty() && checkpoints_.top_time() == now) {
        ++num_events_;
        on_checkpoint(checkpoints_.top(), now);
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
          case kPieceKnown:
            on_piece_known(ev.a, ev.b, ev.c, now);
            break;
          case kAllKnown:
            on_all_known(ev.a, static_cast<int>(ev.b), now);
            break;
          case kCounterArrival: {
            // One atomic per chunk on the destination's counter, served one at a time.
            const int dst = static_cast<int>(ev.b);
            last_data_ns_[ev.a][dst] = std::max(last_data_ns_[ev.a][dst], ev.c);
            counter_free_ns_[ev.a][dst] = std::max(counter_free_ns_[ev.a][dst], now) +
                                          static_cast<int64_t>(topo_.atomic_service_ns);
            // Chunks from the GPU itself do not touch the counter.
            int64_t remote = traffic_[ev.a].recv_pieces[dst];
            const size_t self_pair = static_cast<size_t>(dst) * R_ + dst;
            remote -= traffic_[ev.a].pair_offsets[self_pair + 1] - traffic_[ev.a].pair_offsets[self_pair];
            if (++counter_served_[ev.a][dst] == remote) {
              const int64_t period = std::max<int64_t>(proto_.poll_interval_ns, static_cast<int64_t>(topo_.local_poll_ns));
              // Local chunks are known as they land; the rest when the count is complete.
              const int64_t t = observe_local(counter_free_ns_[ev.a][dst], period);
              const auto& tr = traffic_[ev.a];
              for (int s = 0; s < R_; ++s) {
                if (s == dst) continue;
                const size_t pair = static_cast<size_t>(s) * R_ + dst;
                for (int64_t i = tr.pair_offsets[pair]; i < tr.pair_offsets[pair + 1]; ++i)
                  schedule(t, kPieceKnown, ev.a, i, piece_data_ns_[ev.a][i]);
              }
            }
            break;
          }
          case kTileDone: {
            const int gpu = static_cast<int>(ev.b);
            compute_busy_[gpu] = 0;
            if (ev.a == 0) --gpu_tiles_left_[gpu];
            if (gpu_tiles_left_[gpu] == 0 && ready_tiles_[gpu].empty()) {
              on_compute_done(gpu, now);
            } else {
              start_compute(gpu, now);
            }
            break;
          }
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
        if (!net_.flow(f).active || flow_rate_seen_[f] >= 0) continue;
        net_.admit(f);
        flow_rate_seen_[f] = net_.flow(f).rate_gbps;
        schedule_checkpoint(f, now);
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
      net_.advance(now);
      net_.recompute_rates();
      // Only flows whose rate changed need a new milestone time.
      for (int f : net_.active_flows()) {
        if (net_.flow(f).rate_gbps == flow_rate_seen_[f]) continue;
        flow_rate_seen_[f] = net_.flow(f).rate_gbps;
        schedule_checkpoint(f, now);
      }
      dirty_ = false;
    }
  }
  // Consistency: every piece known, every transfer done.
  for (int ph = 0; ph < 2; ++ph) {
    if (!phase_on(ph)) continue;
    for (int g = 0; g < R_; ++g)
      if (known_count_[ph][g] != traffic_[ph].recv_pieces[g])
        throw Error("internal: simulation ended with undelivered " + std::string(kPhaseName[ph]) + " data at gpu" +
                    std::to_string(g) + " (a protocol wait that nothing releases); please report");
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

LayerResult simulate_layer(const Topology& topo, const Workload& work, const ProtocolConfig& proto,
                           const SimOptions& options) {
  LayerSim sim(topo, work, proto, options);
  return sim.run();
}

}  // namespace mok::sim
