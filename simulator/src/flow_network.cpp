// Max-min fair sharing of resource capacities among flows (progressive filling with heaps).
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
  res_flows_.emplace_back();
  return static_cast<int>(capacity_.size()) - 1;
}

void FlowNetwork::declare_demands(std::vector<double> demands_gbps) {
  for (double d : class_demand_) demands_gbps.push_back(d);
  std::sort(demands_gbps.begin(), demands_gbps.end());
  demands_gbps.erase(std::unique(demands_gbps.begin(), demands_gbps.end()), demands_gbps.end());
  if (demands_gbps == class_demand_) return;
  // Renumber classes; active flows move with their demand value.
  class_demand_ = std::move(demands_gbps);
  class_flows_.assign(class_demand_.size(), {});
  class_bits_.assign((class_demand_.size() + 63) / 64, 0);
  for (int idx : active_) {
    Flow& f = flows_[idx];
    f.demand_class = static_cast<int>(std::lower_bound(class_demand_.begin(), class_demand_.end(), f.demand_gbps) -
                                      class_demand_.begin());
    links_[idx].class_slot = static_cast<int>(class_flows_[f.demand_class].size());
    class_flows_[f.demand_class].push_back(idx);
    class_bits_[f.demand_class / 64] |= uint64_t{1} << (f.demand_class % 64);
  }
}

int FlowNetwork::class_of(double demand_gbps) {
  auto it = std::lower_bound(class_demand_.begin(), class_demand_.end(), demand_gbps);
  if (it == class_demand_.end() || *it != demand_gbps) {
    declare_demands({demand_gbps});
    it = std::lower_bound(class_demand_.begin(), class_demand_.end(), demand_gbps);
  }
  return static_cast<int>(it - class_demand_.begin());
}

int FlowNetwork::start_flow(const int* path, int path_len, double demand_gbps, int64_t bytes) {
  int idx;
  if (!free_flows_.empty()) {
    idx = free_flows_.back();
    free_flows_.pop_back();
  } else {
    idx = static_cast<int>(flows_.size());
    flows_.emplace_back();
    links_.emplace_back();
    active_pos_.push_back(-1);
    frozen_epoch_.push_back(0);
  }
  Flow& f = flows_[idx];
  Links& l = links_[idx];
  f.path_len = path_len;
  for (int i = 0; i < path_len; ++i) {
    f.path[i] = path[i];
    auto& list = res_flows_[path[i]];
    l.slot[i] = static_cast<int>(list.size());
    list.push_back(idx);
  }
  f.demand_gbps = demand_gbps;
  f.demand_class = class_of(demand_gbps);
  l.class_slot = static_cast<int>(class_flows_[f.demand_class].size());
  class_flows_[f.demand_class].push_back(idx);
  class_bits_[f.demand_class / 64] |= uint64_t{1} << (f.demand_class % 64);
  f.total_bytes = bytes;
  f.rate_gbps = 0;
  f.bottleneck = -1;
  l.active = true;
  active_pos_[idx] = static_cast<int>(active_.size());
  active_.push_back(idx);
  return idx;
}

void FlowNetwork::finish_flow(int flow_idx) {
  Flow& f = flows_[flow_idx];
  Links& l = links_[flow_idx];
  for (int i = 0; i < f.path_len; ++i) {
    const int r = f.path[i];
    resource_bytes_[r] += f.total_bytes;
    residual_[r] += f.rate_gbps;
    // Swap-remove from the resource's list; fix the moved flow's slot for this resource.
    auto& list = res_flows_[r];
    const int pos = l.slot[i];
    const int moved = list.back();
    list.pop_back();
    if (pos < static_cast<int>(list.size())) {
      list[pos] = moved;
      const Flow& m = flows_[moved];
      Links& ml = links_[moved];
      for (int k = 0; k < m.path_len; ++k)
        if (m.path[k] == r && ml.slot[k] == static_cast<int>(list.size())) {
          ml.slot[k] = pos;
          break;
        }
    }
  }
  {
    auto& list = class_flows_[f.demand_class];
    const int moved = list.back();
    list.pop_back();
    if (l.class_slot < static_cast<int>(list.size())) {
      list[l.class_slot] = moved;
      links_[moved].class_slot = l.class_slot;
    }
    if (list.empty()) class_bits_[f.demand_class / 64] &= ~(uint64_t{1} << (f.demand_class % 64));
  }
  l.active = false;
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

namespace {
// A resource counts as saturated when less than this fraction of its capacity is left:
// progressive filling leaves saturated resources at 0 up to rounding.
constexpr double kSaturatedFraction = 1e-9;
}  // namespace

bool FlowNetwork::path_has_slack(int flow_idx) const {
  const Flow& f = flows_[flow_idx];
  for (int i = 0; i < f.path_len; ++i)
    if (residual_[f.path[i]] <= kSaturatedFraction * capacity_[f.path[i]]) return false;
  return true;
}

bool FlowNetwork::admit_at_demand(int flow_idx) {
  Flow& f = flows_[flow_idx];
  for (int i = 0; i < f.path_len; ++i) {
    int mult = 0;
    for (int j = 0; j < f.path_len; ++j) mult += f.path[j] == f.path[i];
    const int r = f.path[i];
    if (mult * f.demand_gbps > residual_[r] - kSaturatedFraction * capacity_[r]) return false;
  }
  for (int i = 0; i < f.path_len; ++i) residual_[f.path[i]] -= f.demand_gbps - f.rate_gbps;
  f.rate_gbps = f.demand_gbps;
  f.bottleneck = -1;
  return true;
}

FlowNetwork::Departed FlowNetwork::describe(int flow_idx) const {
  const Flow& f = flows_[flow_idx];
  Departed d;
  d.path_len = f.path_len;
  d.rate_gbps = f.rate_gbps;
  d.demand_gbps = f.demand_gbps;
  d.bottleneck = f.bottleneck;
  for (int i = 0; i < f.path_len; ++i) {
    d.path[i] = f.path[i];
    d.saturated[i] = residual_[f.path[i]] <= kSaturatedFraction * capacity_[f.path[i]];
  }
  return d;
}

bool FlowNetwork::admit_in_place_of(int flow_idx, const Departed& old) {
  Flow& f = flows_[flow_idx];
  const double rate = old.rate_gbps;
  // The new flow's bottleneck: its own demand at exactly that rate, or (the old flow was held
  // below its demand by a saturated resource, which the checks below make a shared one) a
  // demand at least that rate.
  if (!(f.demand_gbps == rate || (rate < old.demand_gbps && f.demand_gbps >= rate))) return false;
  auto count = [](const int* path, int len, int r) {
    int n = 0;
    for (int i = 0; i < len; ++i) n += path[i] == r;
    return n;
  };
  for (int i = 0; i < old.path_len; ++i) {
    const int r = old.path[i];
    const int mine = count(f.path, f.path_len, r), theirs = count(old.path, old.path_len, r);
    if (mine == 0 && old.saturated[i]) return false;  // its departure frees a bottleneck
    if (mine != 0 && mine != theirs) return false;
  }
  for (int i = 0; i < f.path_len; ++i) {
    const int r = f.path[i];
    if (count(old.path, old.path_len, r) != 0) continue;
    const int mine = count(f.path, f.path_len, r);
    if (mine * rate > residual_[r] - kSaturatedFraction * capacity_[r]) return false;
  }
  for (int i = 0; i < f.path_len; ++i) residual_[f.path[i]] -= rate - f.rate_gbps;
  f.rate_gbps = rate;
  f.bottleneck = f.demand_gbps == rate ? -1 : old.bottleneck;
  return true;
}

void FlowNetwork::admit(int flow_idx) {
  Flow& f = flows_[flow_idx];
  double rate = f.demand_gbps;
  f.bottleneck = -1;
  for (int i = 0; i < f.path_len; ++i) {
    int mult = 0;
    for (int j = 0; j < f.path_len; ++j) mult += f.path[j] == f.path[i];
    const double share = std::max(0.0, residual_[f.path[i]]) / mult;
    if (share < rate) {
      rate = share;
      f.bottleneck = f.path[i];
    }
  }
  for (int i = 0; i < f.path_len; ++i) residual_[f.path[i]] -= rate - f.rate_gbps;
  f.rate_gbps = rate;
}

void FlowNetwork::recompute_rates() {
  ++num_recomputes_;
  if (++epoch_ == 0) {  // wrapped: clear the stamps once every 2^32 recomputes
    std::fill(frozen_epoch_.begin(), frozen_epoch_.end(), 0);
    epoch_ = 1;
  }
  const int num_res = num_resources();
  rem_cap_.assign(capacity_.begin(), capacity_.end());
  unfrozen_count_.resize(num_res);
  // Min-heap of (fair share, resource), ties by index; stale entries are skipped on pop. A
  // flow's demand acts as a private single-flow resource, visited in ascending demand order.
  auto cmp = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  };
  heap_.clear();
  for (int r = 0; r < num_res; ++r) {
    unfrozen_count_[r] = static_cast<int>(res_flows_[r].size());
    if (unfrozen_count_[r] > 0) heap_.emplace_back(rem_cap_[r] / unfrozen_count_[r], r);
  }
  std::make_heap(heap_.begin(), heap_.end(), cmp);
  int num_unfrozen = static_cast<int>(active_.size());

  // Freezing a flow at rate s <= a resource's share never lowers that share, so heap keys
  // are lower bounds: a popped key is re-checked and re-pushed when it has grown. For the same
  // reason every flow of one demand class can be frozen at once.
  auto freeze = [&](int idx, double rate, int bottleneck) {
    Flow& f = flows_[idx];
    f.rate_gbps = rate;
    f.bottleneck = bottleneck;
    frozen_epoch_[idx] = epoch_;
    --num_unfrozen;
    for (int i = 0; i < f.path_len; ++i) {
      const int r = f.path[i];
      rem_cap_[r] -= rate;
      if (rem_cap_[r] < 0) rem_cap_[r] = 0;
      --unfrozen_count_[r];
    }
  };
  // Cursor over non-empty demand classes, ascending.
  size_t word = 0;
  uint64_t bits = class_bits_.empty() ? 0 : class_bits_[0];
  auto next_class = [&]() -> int {
    while (bits == 0) {
      if (++word >= class_bits_.size()) return -1;
      bits = class_bits_[word];
    }
    return static_cast<int>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
  };

  while (num_unfrozen > 0) {
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
    const int c = next_class();
    if (c < 0 && res < 0) break;
    if (c >= 0 && class_demand_[c] <= share) {
      // The flows' own limit binds before any shared resource fills.
      for (int idx : class_flows_[c])
        if (frozen_epoch_[idx] != epoch_) freeze(idx, class_demand_[c], -1);
      bits &= bits - 1;
      continue;
    }
    if (res < 0) break;
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    heap_.pop_back();
    // Resource `res` saturates: every unfrozen flow through it gets `share`.
    for (int idx : res_flows_[res])
      if (frozen_epoch_[idx] != epoch_) freeze(idx, share, res);
  }
  residual_ = rem_cap_;
}

}  // namespace mok::sim
