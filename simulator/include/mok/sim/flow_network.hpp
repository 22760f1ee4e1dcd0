// Flow-level network: shared resources (ports, HBM) with capacities, flows over paths of
// resources, and exact max-min fair rates by progressive filling.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mok::sim {

// The longest path: HBM, NIC out, rack uplink out, rack uplink in, NIC in, HBM.
inline constexpr int kMaxPathLen = 6;

// One flow: `total_bytes` over `path` (a resource may appear twice, e.g. HBM read and write of
// a local copy, and then counts twice), never faster than `demand_gbps`. The caller tracks
// progress; the network only assigns rates.
struct alignas(64) Flow {  // one cache line: what a rate recompute reads and writes
  int path[kMaxPathLen];
  int path_len = 0;
  int demand_class = 0;       // index of demand_gbps among the network's sorted demand values
  double demand_gbps = 0;     // the initiator's own limit (SM issue rate, in-flight window)
  double rate_gbps = 0;       // current rate (bytes per ns)
  int64_t total_bytes = 0;
  int bottleneck = -1;        // the resource that fixed the rate in the last assignment; -1: demand
};

// Capacities in GB/s (= bytes/ns). Determinism: every structure is updated in call order and
// ties are broken by index, so the same sequence of calls gives the same rates.
static_assert(sizeof(Flow) == 64, "a Flow fills one cache line: recompute_rates touches one line per flow");

class FlowNetwork {
 public:
  int add_resource(double capacity_gbps, std::string name);
  int num_resources() const { return static_cast<int>(capacity_.size()); }
  double capacity(int resource_idx) const { return capacity_[resource_idx]; }
  void set_capacity(int resource_idx, double capacity_gbps) { capacity_[resource_idx] = capacity_gbps; }
  const std::string& resource_name(int resource_idx) const { return names_[resource_idx]; }

  // Optional, for speed: every demand value flows will use (any order, repeats allowed). A
  // demand not declared here is added when its first flow starts (a slower path).
  void declare_demands(std::vector<double> demands_gbps);
  // Starts a flow with rate 0; rates are stale until recompute_rates() or admit().
  int start_flow(const int* path, int path_len, double demand_gbps, int64_t bytes);
  // Ends a flow (its bytes are credited to the resources on its path).
  void finish_flow(int flow_idx);
  // Max-min fair rates by progressive filling, capped by each flow's demand (exact).
  void recompute_rates();
  // Between full recomputes (rate quantum > 0): gives a new flow what is left unused on its path,
  // min(demand, smallest residual capacity); capacity freed by finished flows becomes residual.
  void admit(int flow_idx);

  // Exact shortcuts (max-min allocations are unique, and each flow keeps its bottleneck):
  // removing a flow none of whose resources is saturated changes no other rate; a new flow
  // whose demand fits in what every resource on its path has left gets its demand and changes
  // no other rate. path_has_slack() is asked before finish_flow(); admit_at_demand() returns
  // false and changes nothing when the demand does not fit (then call recompute_rates()).
  bool path_has_slack(int flow_idx) const;
  bool admit_at_demand(int flow_idx);
  // A flow that just left, as seen before it released its rate.
  struct Departed {
    int path[kMaxPathLen];
    bool saturated[kMaxPathLen];
    int path_len = 0;
    double rate_gbps = 0, demand_gbps = 0;
    int bottleneck = -1;
  };
  Departed describe(int flow_idx) const;
  // A new flow takes over a departed one's rate (an SM moving on to its next peer): exact when
  // the resources only the old flow used had slack, those only the new one uses have room for
  // that rate, and the new flow keeps the old one's bottleneck (its demand, or a saturated
  // resource they share). Returns false and changes nothing otherwise.
  bool admit_in_place_of(int flow_idx, const Departed& old);

  const Flow& flow(int flow_idx) const { return flows_[flow_idx]; }
  bool active(int flow_idx) const { return links_[flow_idx].active; }
  const std::vector<int>& active_flows() const { return active_; }
  // Bytes that completed flows carried through each resource (exact integers).
  const std::vector<int64_t>& resource_bytes() const { return resource_bytes_; }
  int64_t num_recomputes() const { return num_recomputes_; }

 private:
  std::vector<double> capacity_;
  std::vector<std::string> names_;
  std::vector<int64_t> resource_bytes_;
  std::vector<double> residual_;              // capacity minus the rates of active flows
  std::vector<std::vector<int>> res_flows_;   // resource -> active flows through it (a flow twice if its path repeats it)
  std::vector<Flow> flows_;
  struct Links {  // where a flow sits in the per-resource and per-class lists
    int slot[kMaxPathLen];
    int class_slot = 0;
    bool active = false;
  };
  std::vector<Links> links_;
  std::vector<int> free_flows_;
  std::vector<int> active_;        // active flow indices (order: a function of the call sequence)
  std::vector<int> active_pos_;    // flow -> position in active_
  int64_t num_recomputes_ = 0;
  // Demand classes: the distinct demand values, ascending; the active flows of each; and a bit
  // per class that has any, so that a recompute visits demands in order without sorting.
  std::vector<double> class_demand_;
  std::vector<std::vector<int>> class_flows_;
  std::vector<uint64_t> class_bits_;
  int class_of(double demand_gbps);
  // scratch for recompute_rates()
  std::vector<double> rem_cap_;
  std::vector<int> unfrozen_count_;
  std::vector<uint32_t> frozen_epoch_;  // flow frozen in this recompute iff == epoch_
  uint32_t epoch_ = 0;
  std::vector<std::pair<double, int>> heap_;
};

}  // namespace mok::sim
