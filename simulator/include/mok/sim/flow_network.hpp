// Flow-level network: shared resources (ports, HBM) with capacities, flows over paths of
// resources, and max-min fair rates by progressive filling in fixed-point integers, recomputed
// in full or updated incrementally with the same result bit for bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mok::sim {

// The longest path: HBM, NIC out, rack uplink out, rack uplink in, NIC in, HBM.
inline constexpr int kMaxPathLen = 6;

// Rates, demands and capacities are integers in units of 2^-kRateFracBits bytes per ns (GB/s),
// so that every sum of rates is exact and independent of the order it is taken in.
inline constexpr int kRateFracBits = 32;
// Demands above this (~5e8 GB/s, far above any capacity) count as this: no int64 overflow.
inline constexpr int64_t kMaxRateUnits = int64_t{1} << 61;
int64_t rate_units(double gbps);  // nearest unit, clamped to [1, kMaxRateUnits]; 0 for gbps <= 0 or NaN
inline double units_to_gbps(int64_t units) { return static_cast<double>(units) * (1.0 / 4294967296.0); }
static_assert(kRateFracBits == 32, "units_to_gbps multiplies by 2^-32");

// One flow: `total_bytes` over `path` (a resource may appear more than once, e.g. HBM read and write
// of a local copy, and then counts once per appearance), never faster than its demand. The caller tracks
// progress; the network only assigns rates.
struct alignas(64) Flow {  // one cache line: what a rate assignment reads and writes
  int path[kMaxPathLen];
  int path_len = 0;
  int demand_class = 0;     // index of the demand among the network's sorted demand values
  int64_t demand_units = 0; // the initiator's own limit (SM issue rate, in-flight window)
  int64_t rate_units = 0;   // current rate
  int64_t total_bytes = 0;
  double rate_gbps() const { return units_to_gbps(rate_units); }
  double demand_gbps() const { return units_to_gbps(demand_units); }
};
static_assert(sizeof(Flow) == 64, "a Flow fills one cache line: a rate assignment touches one line per flow");

// The allocation (what recompute_rates() computes; update_rates() gives the same integers):
// progressive filling by levels. At each step the level L is the smallest of the next unserved
// demand value and the smallest share floor(remaining capacity / unfrozen flows) of any
// resource; a demand step freezes every unfrozen flow with that demand at it; otherwise every
// resource whose share equals L "saturates" at L, and every unfrozen flow through one of them
// is frozen at L. Integer arithmetic and whole-level steps make the result a function of the
// flow set alone (no visiting order, no index tie-break). Determinism: the same sequence of
// calls gives the same rates and the same changed_flows() order.
class FlowNetwork {
 public:
  int add_resource(double capacity_gbps, std::string name);
  int num_resources() const { return static_cast<int>(capacity_.size()); }
  double capacity(int resource_idx) const { return capacity_gbps_[resource_idx]; }
  const std::string& resource_name(int resource_idx) const { return names_[resource_idx]; }

  // Optional, for speed: every demand value flows will use (any order, repeats allowed). A
  // demand not declared here is added when its first flow starts (a slower path).
  void declare_demands(const std::vector<double>& demands_gbps);
  // Optional, for memory locality, before the first flow: flow indices [0, num_slots) are given
  // only to start_flow() calls that name them as their slot (e.g. one per issuing SM, so that
  // the flows of one GPU's SMs lie together in every per-flow array); other flows get indices
  // from num_slots up.
  void reserve_slots(int num_slots);
  // Starts a flow with rate 0; rates are stale until recompute_rates(), update_rates() or admit().
  // Its index is `slot` when that is a reserved slot with no active flow, else a free index.
  // Throws Error (bad input), changing nothing, for a path longer than kMaxPathLen, a resource
  // index out of range, a negative or NaN demand, or negative bytes.
  int start_flow(const int* path, int path_len, double demand_gbps, int64_t bytes, int slot = -1);
  // Ends a flow (its bytes are credited to the resources on its path).
  void finish_flow(int flow_idx);
  // Max-min fair rates by a full progressive filling over every active flow.
  void recompute_rates();
  // For a consumer on another thread that applies changed_flows() while recompute_rates() is
  // still filling: reserve_changes() gives changed_flows() and changed_rates() room for every
  // active flow, so that their storage stays where it is (data()) through the next
  // recompute_rates(); that call then stores the number of entries written so far in `*count`
  // (release) every kPublishEvery entries. The entries already published never change.
  static constexpr size_t kPublishEvery = 32;
  void reserve_changes();
  void publish_changes_to(std::atomic<int64_t>* count) { publish_ = count; }
  // The same rates as recompute_rates(), bit for bit, re-solving only what the flows started and
  // finished since the last assignment can change (see flow_network.cpp). Requires that the
  // last assignment was recompute_rates() or update_rates() (not admit()).
  void update_rates();
  // Flows whose rate the last recompute_rates() / update_rates() changed, plus every flow
  // started since the assignment before it (order: deterministic, not sorted).
  const std::vector<int>& changed_flows() const { return changed_; }
  // The rate of each of changed_flows() (same positions), in rate units.
  const std::vector<int64_t>& changed_rates() const { return changed_rate_; }
  // Between full recomputes (rate quantum > 0): gives a new flow what is left unused on its path,
  // min(demand, smallest residual capacity); capacity freed by finished flows becomes residual.
  void admit(int flow_idx);

  const Flow& flow(int flow_idx) const { return flows_[flow_idx]; }
  // The lowest-index resource of the flow's path that saturated at its rate in the last
  // recompute_rates() / update_rates(); -1 when its own demand fixed the rate (or it has no rate
  // yet). After admit(): the resource that admit() found tightest, -1 for the demand. A
  // function of the rate, the demand and the path's saturation levels, so it is derived on
  // demand rather than stored.
  int bottleneck(int flow_idx) const;
  bool active(int flow_idx) const { return links_[flow_idx].active; }
  const std::vector<int>& active_flows() const { return active_; }
  // Bytes that completed flows carried through each resource (exact integers).
  const std::vector<int64_t>& resource_bytes() const { return resource_bytes_; }
  int64_t num_recomputes() const { return num_recomputes_; }
  // Work counters of update_rates(): resources it tracked exactly, attempts repeated because a
  // resource assumed unsaturated turned out not to be, and updates handed to recompute_rates()
  // because they touched too much of the network.
  int64_t num_tracked_resources() const { return num_tracked_; }
  int64_t num_retries() const { return num_retries_; }
  int64_t num_full_fallbacks() const { return num_fallbacks_; }

 private:
  static constexpr int64_t kInf = INT64_MAX;
  static constexpr int kNotAdmitted = -2;
  std::vector<double> capacity_gbps_;
  std::vector<int64_t> capacity_;  // in rate units
  std::vector<std::string> names_;
  std::vector<int64_t> resource_bytes_;
  std::vector<int64_t> residual_;             // capacity minus the rates of active flows (exact)
  std::vector<int64_t> level_;                // level at which the resource saturated; kInf: never
  std::vector<std::vector<int>> res_flows_;   // resource -> active flows through it (a flow once per appearance on its path)
  std::vector<Flow> flows_;
  struct Links {  // where a flow sits in the per-resource and per-class lists
    int slot[kMaxPathLen];
    int class_slot = 0;
    bool active = false;
    int admitted_bottleneck = kNotAdmitted;  // what admit() chose, until the next full filling:
    uint32_t admitted_epoch = 0;             // valid while this equals epoch_
  };
  std::vector<Links> links_;
  std::vector<int> free_flows_;  // free indices from num_slots_ up
  int num_slots_ = 0;
  std::vector<int> active_;        // active flow indices (order: a function of the call sequence)
  std::vector<int> active_pos_;    // flow -> position in active_
  int64_t num_recomputes_ = 0, num_tracked_ = 0, num_retries_ = 0, num_fallbacks_ = 0;
  bool last_fell_back_ = false;  // the last update_rates() ended in a full filling
  // Demand classes: the distinct demand values, ascending; the active flows of each; and a bit
  // per class that has any, so that a recompute visits demands in order without sorting.
  std::vector<int64_t> class_demand_;
  std::vector<std::vector<int>> class_flows_;
  std::vector<uint64_t> class_bits_;
  int class_of(int64_t demand_units);
  void renumber_classes(std::vector<int64_t> demands);
  // Changes since the last assignment: started flows, resources of finished flows.
  std::vector<int> pending_flows_;
  std::vector<int> pending_resources_;
  std::vector<int> changed_;
  std::vector<int64_t> changed_rate_;
  std::atomic<int64_t>* publish_ = nullptr;
  // scratch for recompute_rates()
  // A resource's remaining capacity and unfrozen flows, side by side (a freeze updates both).
  struct FillAcct {
    int64_t rem = 0;
    int64_t unfrozen = 0;
  };
  std::vector<FillAcct> fill_;
  // Per flow, what every freeze of recompute_rates() reads and writes, in 8 bytes rather than
  // in the flow's Links (another cache line per frozen flow): frozen in this recompute iff
  // frozen_epoch == epoch_; fresh = started since the last assignment.
  struct FillMark {
    uint32_t frozen_epoch = 0;
    uint32_t fresh = 0;
  };
  std::vector<FillMark> fill_mark_;
  uint32_t epoch_ = 0;  // recompute_rates() calls, mod 2^32 (0 skipped after a wrap)
  std::vector<std::pair<int64_t, int>> heap_;
  std::vector<int> saturating_;
  std::vector<int64_t> old_rate_;
  // scratch for update_rates() (flow_network.cpp explains the algorithm)
  struct Event {  // ordered by (level, key): key packs (sub, kind, idx) so that one compare decides ties
    int64_t level;
    uint64_t key;  // sub << 34 | kind << 32 | idx
    // sub 0: demand step, 1: saturation step of the same level
    int sub() const { return static_cast<int>(key >> 34); }
    // kind 0: a tracked resource's share check, or its old saturation level (cand_level_), 1: a
    // flow's demand
    int kind() const { return static_cast<int>((key >> 32) & 3); }
    int idx() const { return static_cast<int>(static_cast<uint32_t>(key)); }
  };
  std::vector<Event> events_;
  std::vector<uint32_t> force_stamp_;
  uint32_t stamp_ = 0, update_id_ = 0;
  std::vector<int64_t> new_level_;
  std::vector<int64_t> cand_level_;  // a tracked resource's old saturation level not yet reached; kInf: none
  // A resource's account in the current attempt, in one 16-byte entry (a frozen flow's path
  // reads and writes it per resource): dirty in this attempt iff stamp_mode >> 2 == stamp_,
  // mode (clean, tracked, passive) in the low 2 bits; a tracked resource's remaining capacity and
  // unfrozen flows.
  struct ResAcct {
    int64_t rem = 0;
    uint32_t stamp_mode = 0;
    int32_t unfrozen = 0;
  };
  static_assert(sizeof(ResAcct) == 16, "four resource accounts per cache line");
  std::vector<ResAcct> acct_;
  bool dirty(int r) const { return (acct_[r].stamp_mode >> 2) == stamp_; }
  uint8_t mode(int r) const { return static_cast<uint8_t>(acct_[r].stamp_mode & 3); }
  std::vector<int> tracked_, passive_, done_, spread_, candidates_;
  // A tracked resource's fixed flows not yet frozen when it became dirty, with their old
  // freezing points (advance() accounts for them lazily as the filling passes their points), and
  // its flows that were free then (point kInf): the saturation and candidates scans need only
  // the pool.
  struct Pending {
    int64_t point;  // point_key(old rate, old sub)
    int32_t flow;
  };
  // A flow's old freezing point (rate, sub) as one integer, rate * 2 + sub (sub 0: frozen by its
  // demand, 1: by a saturating resource), ordered as the filling passes them; kept in step with
  // Flow::rate_units so that an update reads 8 bytes per flow instead of the flow's cache line.
  // Beside it, the flow's status in the current attempt (attempt stamp << 2 | status), so that a
  // scan of a resource's flows touches one line per flow. A flow frozen at a new rate in the
  // attempt (status kDone) holds that rate in `point` instead, until the commit sets both.
  // Also here, in the entry's spare bytes: whether the flow's demand is above a capacity on its
  // path (read when the flow is freed, right after its status is written).
  struct FlowKey {
    int64_t point = 0;
    uint32_t mark = 0;
    bool demand_unreachable = false;
  };
  static_assert(sizeof(FlowKey) == 16, "a flow's key stays 16 bytes");
  std::vector<FlowKey> key_;
  void set_rate(int f, int64_t rate) {
    flows_[f].rate_units = rate;
    key_[f].point = rate * 2 + (rate == flows_[f].demand_units ? 0 : 1);
  }
  std::vector<Pending> pool_;
  std::vector<int> pool_begin_, pool_end_, pool_cursor_;
  std::vector<int64_t> pool_min_;  // smallest point in a pool after its cursor
  int64_t work_ = 0;
  void advance(int r, int64_t level, int sub);
  enum class Attempt { kDone, kRetry, kTooBig };
  Attempt attempt_update();
  void make_dirty(int r, int64_t level, int sub);
  void push_event(int64_t level, int32_t sub, int32_t kind, int32_t idx);
  void freeze_tracked(int f, int64_t rate);
};

}  // namespace mok::sim
