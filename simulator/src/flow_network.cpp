// Max-min fair sharing of resource capacities among flows (progressive filling with a heap).
#include "mok/sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mok::sim {

int FlowNetwork::add_resource(double capacity_gbps, std::string name) {
  capacity_.push_back(capacity_gbps);
  names_.push_back(std::move(name));
  resource_bytes_.push_back(0);
  residual_.push_back(capacity_gbps);
  return static_cast<int>(capacity_.size()) - 1;
}

int FlowNetwork::start_flow(int64_t now_ns, const int* path, int path_len, double demand_gbps, int64_t bytes) {
  int idx;
  if (!free_flows_.empty()) {
    idx = free_flows_.back();
    free_flows_.pop_back();
  } else {
    idx = static_cast<int>(flows_.size());
    flows_.emplace_back();
    active_pos_.push_back(-1);
  }
  Flow& f = flows_[idx];
  f.path_len = path_len;
  for (int i = 0; i < path_len; ++i) f.path[i] = path[i];
  f.demand_gbps = demand_gbps;
  f.remaining_bytes = static_cast<double>(bytes);
  f.total_bytes = bytes;
  f.rate_gbps = 0;
  f.updated_ns = now_ns;
  f.active = true;
  active_pos_[idx] = static_cast<int>(active_.size());
  active_.push_back(idx);
  return idx;
}

void FlowNetwork::finish_flow(int flow_idx) {
  Flow& f = flows_[flow_idx];
  for (int i = 0; i < f.path_len; ++i) {
    resource_bytes_[f.path[i]] += f.total_bytes;
    residual_[f.path[i]] += f.rate_gbps;
  }
  f.active = false;
  f.rate_gbps = 0;
  // Swap-remove: the order of active_ stays a pure function of the call sequence.
  const int pos = active_pos_[flow_idx];
  const int last = active_.back();
  active_[pos] = last;
  active_pos_[last] = pos;
  active_.pop_back();
  active_pos_[flow_idx] = -1;
  free_flows_.push_back(flow_idx);
}

void FlowNetwork::advance(int64_t now_ns) {
  for (int idx : active_) {
    Flow& f = flows_[idx];
    if (now_ns > f.updated_ns) {
      f.remaining_bytes -= f.rate_gbps * static_cast<double>(now_ns - f.updated_ns);
      if (f.remaining_bytes < 0) f.remaining_bytes = 0;
      f.updated_ns = now_ns;
    }
  }
}

void FlowNetwork::admit(int flow_idx) {
  Flow& f = flows_[flow_idx];
  double rate = f.demand_gbps;
  for (int i = 0; i < f.path_len; ++i) {
    int mult = 0;
    for (int j = 0; j < f.path_len; ++j) mult += f.path[j] == f.path[i];
    rate = std::min(rate, std::max(0.0, residual_[f.path[i]]) / mult);
  }
  for (int i = 0; i < f.path_len; ++i) residual_[f.path[i]] -= rate - f.rate_gbps;
  f.rate_gbps = rate;
}

void FlowNetwork::recompute_rates() {
  ++num_recomputes_;
  const int num_res = num_resources();
  rem_cap_.assign(capacity_.begin(), capacity_.end());
  unfrozen_count_.assign(num_res, 0);
  for (int idx : active_) {
    const Flow& f = flows_[idx];
    for (int i = 0; i < f.path_len; ++i) ++unfrozen_count_[f.path[i]];
  }
  // resource -> flows (CSR), flows listed in start order
  csr_offsets_.assign(num_res + 1, 0);
  for (int r = 0; r < num_res; ++r) csr_offsets_[r + 1] = csr_offsets_[r] + unfrozen_count_[r];
  csr_flows_.resize(csr_offsets_[num_res]);
  {
    std::vector<int>& cursor = cursor_;
    cursor.assign(csr_offsets_.begin(), csr_offsets_.end() - 1);
    for (int idx : active_) {
      const Flow& f = flows_[idx];
      for (int i = 0; i < f.path_len; ++i) csr_flows_[cursor[f.path[i]]++] = idx;
    }
  }
  frozen_.assign(flows_.size(), 1);
  for (int idx : active_) frozen_[idx] = 0;

  // Demands act as private single-flow resources: visit flows by ascending demand.
  std::vector<int>& by_demand = by_demand_;
  by_demand.assign(active_.begin(), active_.end());
  std::stable_sort(by_demand.begin(), by_demand.end(),
                   [&](int a, int b) { return flows_[a].demand_gbps < flows_[b].demand_gbps; });
  size_t demand_cursor = 0;

  // Min-heap of (fair share, resource); stale entries are skipped on pop.
  auto cmp = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  };
  heap_.clear();
  for (int r = 0; r < num_res; ++r)
    if (unfrozen_count_[r] > 0) heap_.emplace_back(rem_cap_[r] / unfrozen_count_[r], r);
  std::make_heap(heap_.begin(), heap_.end(), cmp);

  // Freezing a flow at rate s <= a resource's share never lowers that share, so heap keys
  // are lower bounds: a popped key is re-checked and re-pushed when it has grown.
  auto freeze = [&](int idx, double rate) {
    Flow& f = flows_[idx];
    f.rate_gbps = rate;
    frozen_[idx] = 1;
    for (int i = 0; i < f.path_len; ++i) {
      const int r = f.path[i];
      rem_cap_[r] -= rate;
      if (rem_cap_[r] < 0) rem_cap_[r] = 0;
      --unfrozen_count_[r];
    }
  };

  for (;;) {
    // Smallest current resource share.
    double share = std::numeric_limits<double>::infinity();
    int res = -1;
    while (!heap_.empty()) {
      const auto [s, r] = heap_.front();
      if (unfrozen_count_[r] == 0) {
        std::pop_heap(heap_.begin(), heap_.end(), cmp);
        heap_.pop_back();
        continue;
      }
      const double current = rem_cap_[r] / unfrozen_count_[r];
      if (current > s) {
        std::pop_heap(heap_.begin(), heap_.end(), cmp);
        heap_.back() = {current, r};
        std::push_heap(heap_.begin(), heap_.end(), cmp);
        continue;
      }
      share = current;
      res = r;
      break;
    }
    while (demand_cursor < by_demand.size() && frozen_[by_demand[demand_cursor]]) ++demand_cursor;
    const bool have_demand = demand_cursor < by_demand.size();
    if (!have_demand && res < 0) break;
    if (have_demand && flows_[by_demand[demand_cursor]].demand_gbps <= share) {
      // The flow's own limit binds before any shared resource fills.
      const int idx = by_demand[demand_cursor++];
      freeze(idx, flows_[idx].demand_gbps);
      continue;
    }
    if (res < 0) break;
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    heap_.pop_back();
    // Resource `res` saturates: every unfrozen flow through it gets `share`.
    for (int k = csr_offsets_[res]; k < csr_offsets_[res + 1]; ++k) {
      const int idx = csr_flows_[k];
      if (!frozen_[idx]) freeze(idx, share);
    }
  }
  residual_ = rem_cap_;
}

}  // namespace mok::sim
