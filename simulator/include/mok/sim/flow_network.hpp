// Flow-level network: shared resources (ports, HBM) with capacities, flows over paths of
// resources, and exact max-min fair rates by progressive filling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mok::sim {

inline constexpr int kMaxPathLen = 8;

// One flow: `remaining_bytes` to move over `path` (a resource may appear twice, e.g. HBM read
// and write of a local copy, and then counts twice), never faster than `demand_gbps`.
struct Flow {
  int path[kMaxPathLen];
  int path_len = 0;
  double demand_gbps = 0;     // the initiator's own limit (SM issue rate, in-flight window)
  double remaining_bytes = 0; // fluid remaining at `updated_ns`
  double rate_gbps = 0;       // current max-min rate (bytes per ns)
  int64_t updated_ns = 0;
  int64_t total_bytes = 0;
  bool active = false;
};

// Capacities in GB/s (= bytes/ns). Determinism: the rate computation visits flows and
// resources in index order and breaks ties by index, so equal inputs give equal rates.
class FlowNetwork {
 public:
  int add_resource(double capacity_gbps, std::string name);
  int num_resources() const { return static_cast<int>(capacity_.size()); }
  double capacity(int resource_idx) const { return capacity_[resource_idx]; }
  void set_capacity(int resource_idx, double capacity_gbps) { capacity_[resource_idx] = capacity_gbps; }
  const std::string& resource_name(int resource_idx) const { return names_[resource_idx]; }

  // Starts a flow at `now_ns`; rates are stale until recompute_rates().
  int start_flow(int64_t now_ns, const int* path, int path_len, double demand_gbps, int64_t bytes);
  // Ends a flow (its bytes are credited to the resources on its path).
  void finish_flow(int flow_idx);
  // Advances every active flow's remaining bytes to `now_ns` at its current rate.
  void advance(int64_t now_ns);
  // Max-min fair rates by progressive filling, capped by each flow's demand. Call after advance().
  void recompute_rates();
  // Between full recomputes (rate quantum > 0): gives a new flow what is left unused on its path,
  // min(demand, smallest residual capacity); capacity freed by finished flows becomes residual.
  void admit(int flow_idx);

  const Flow& flow(int flow_idx) const { return flows_[flow_idx]; }
  Flow& flow(int flow_idx) { return flows_[flow_idx]; }
  const std::vector<int>& active_flows() const { return active_; }
  // Bytes that completed flows carried through each resource (exact integers).
  const std::vector<int64_t>& resource_bytes() const { return resource_bytes_; }
  int64_t num_recomputes() const { return num_recomputes_; }

 private:
  std::vector<double> capacity_;
  std::vector<std::string> names_;
  std::vector<int64_t> resource_bytes_;
  std::vector<double> residual_;  // capacity minus the rates of active flows
  std::vector<Flow> flows_;
  std::vector<int> free_flows_;
  std::vector<int> active_;        // active flow indices (order: a function of the call sequence)
  std::vector<int> active_pos_;    // flow -> position in active_
  int64_t num_recomputes_ = 0;
  // scratch for recompute_rates()
  std::vector<double> rem_cap_;
  std::vector<int> unfrozen_count_;
  std::vector<int> csr_offsets_, csr_flows_;
  std::vector<char> frozen_;
  std::vector<std::pair<double, int>> heap_;
  std::vector<int> cursor_, by_demand_;
};

}  // namespace mok::sim
