// Max-min fair sharing of resource capacities among flows: progressive filling by levels in
// fixed-point integers, in full (recompute_rates) or incrementally (update_rates), bit-identical.
#include "mok/sim/flow_network.hpp"

#include <algorithm>
#include <cmath>

#include "mok/sim/error.hpp"

namespace mok::sim {

int64_t rate_units(double gbps) {
  if (!(gbps > 0)) return 0;
  const double u = std::nearbyint(std::ldexp(gbps, kRateFracBits));
  // A positive rate below half a unit is one unit, not 0: a flow with a demand of 0 would never
  // move (nor finish), where one unit ends or meets the engine's too-slow check.
  if (u < 1) return 1;
  return u >= static_cast<double>(kMaxRateUnits) ? kMaxRateUnits : static_cast<int64_t>(u);
}

namespace {
[[noreturn]] void internal(const char* what) {
  throw Error(std::string("internal: flow network: ") + what + "; please report", ErrorKind::kInternal);
}
// Where in the filling a frozen flow was frozen: (level, 0) by its demand, (level, 1) by a
// saturating resource (a demand step of a level comes before its saturation step).
bool point_le(int64_t la, int sa, int64_t lb, int sb) { return la != lb ? la < lb : sa <= sb; }
// (level, sub) as FlowNetwork::FlowKey::point encodes it; level may be -1 (before the filling) or kInf.
int64_t point_key(int64_t level, int sub) { return level == INT64_MAX ? INT64_MAX : level * 2 + sub; }
// The full filling's min-heap of (share, resource), ordered as one unsigned 128-bit number
// (shares >= 0; a resource is in it at most once, so no two entries tie). Written out rather
// than std::push_heap / pop_heap: the smaller child is chosen arithmetically instead of by a
// branch that is a coin flip at every level, and a re-checked top is replaced in one sift.
using ShareEntry = std::pair<int64_t, int>;
bool share_less(const ShareEntry& a, const ShareEntry& b) {
  return (static_cast<unsigned __int128>(static_cast<uint64_t>(a.first)) << 64 | static_cast<uint32_t>(a.second)) <
         (static_cast<unsigned __int128>(static_cast<uint64_t>(b.first)) << 64 | static_cast<uint32_t>(b.second));
}
// Puts e into the hole at i, moving smaller children up.
void share_sift_down(std::vector<ShareEntry>& h, size_t i, ShareEntry e) {
  const size_t n = h.size();
  size_t c = 2 * i + 1;
  while (c + 1 < n) {
    c += share_less(h[c + 1], h[c]);
    if (!share_less(h[c], e)) break;
    h[i] = h[c];
    i = c;
    c = 2 * i + 1;
  }
  if (c + 1 == n && share_less(h[c], e)) {
    h[i] = h[c];
    i = c;
  }
  h[i] = e;
}
void share_pop(std::vector<ShareEntry>& h) {
  const ShareEntry e = h.back();
  h.pop_back();
  if (!h.empty()) share_sift_down(h, 0, e);
}
void share_heapify(std::vector<ShareEntry>& h) {
  for (size_t i = h.size() / 2; i-- > 0;) share_sift_down(h, i, h[i]);
}
}  // namespace

int FlowNetwork::add_resource(double capacity_gbps, std::string name) {
  capacity_gbps_.push_back(capacity_gbps);
  capacity_.push_back(rate_units(capacity_gbps));
  names_.push_back(std::move(name));
  resource_bytes_.push_back(0);
  residual_.push_back(capacity_.back());
  level_.push_back(kInf);
  res_flows_.emplace_back();
  acct_.push_back(ResAcct{});
  force_stamp_.push_back(0);
  new_level_.push_back(kInf);
  cand_level_.push_back(kInf);
  return static_cast<int>(capacity_.size()) - 1;
}

void FlowNetwork::declare_demands(const std::vector<double>& demands_gbps) {
  std::vector<int64_t> units;
  units.reserve(demands_gbps.size());
  for (double d : demands_gbps) units.push_back(rate_units(d));
  renumber_classes(std::move(units));
}

void FlowNetwork::renumber_classes(std::vector<int64_t> demands) {
  for (int64_t d : class_demand_) demands.push_back(d);
  std::sort(demands.begin(), demands.end());
  demands.erase(std::unique(demands.begin(), demands.end()), demands.end());
  if (demands == class_demand_) return;
  // Renumber classes; active flows move with their demand value.
  class_demand_ = std::move(demands);
  class_flows_.assign(class_demand_.size(), {});
  class_bits_.assign((class_demand_.size() + 63) / 64, 0);
  for (int idx : active_) {
    Flow& f = flows_[idx];
    f.demand_class = static_cast<int>(std::lower_bound(class_demand_.begin(), class_demand_.end(), f.demand_units) -
                                      class_demand_.begin());
    links_[idx].class_slot = static_cast<int>(class_flows_[f.demand_class].size());
    class_flows_[f.demand_class].push_back(idx);
    class_bits_[f.demand_class / 64] |= uint64_t{1} << (f.demand_class % 64);
  }
}

int FlowNetwork::class_of(int64_t demand_units) {
  auto it = std::lower_bound(class_demand_.begin(), class_demand_.end(), demand_units);
  if (it == class_demand_.end() || *it != demand_units) {
    renumber_classes({demand_units});
    it = std::lower_bound(class_demand_.begin(), class_demand_.end(), demand_units);
  }
  return static_cast<int>(it - class_demand_.begin());
}

void FlowNetwork::reserve_slots(int num_slots) {
  if (!flows_.empty()) internal("reserve_slots() after the first flow");
  num_slots_ = num_slots;
  flows_.resize(num_slots);
  links_.resize(num_slots);
  active_pos_.resize(num_slots, -1);
  fill_mark_.resize(num_slots);
  key_.resize(num_slots);
}

int FlowNetwork::start_flow(const int* path, int path_len, double demand_gbps, int64_t bytes, int slot) {
  // A bad flow is refused before it touches any list. A resource may appear on a path more than
  // once (a local copy's HBM read and write); each appearance is its own list entry.
  if (path_len < 0 || path_len > kMaxPathLen)
    throw Error("flow network: a flow's path has " + std::to_string(path_len) + " resources; it may have 0 to " +
                std::to_string(kMaxPathLen));
  for (int i = 0; i < path_len; ++i) {
    if (path[i] < 0 || path[i] >= num_resources())
      throw Error("flow network: a flow's path names resource " + std::to_string(path[i]) + "; the network has " +
                  (num_resources() == 0 ? std::string("none")
                                        : std::to_string(num_resources()) + " (0 to " +
                                              std::to_string(num_resources() - 1) + ")"));
  }
  if (!(demand_gbps >= 0) || bytes < 0)
    throw Error("flow network: a flow needs a demand >= 0 GB/s and bytes >= 0 (got " + std::to_string(demand_gbps) +
                " GB/s, " + std::to_string(bytes) + " bytes)");
  int idx;
  if (slot >= 0 && slot < num_slots_ && !links_[slot].active) {
    idx = slot;
  } else if (!free_flows_.empty()) {
    idx = free_flows_.back();
    free_flows_.pop_back();
  } else {
    idx = static_cast<int>(flows_.size());
    flows_.emplace_back();
    links_.emplace_back();
    active_pos_.push_back(-1);
    fill_mark_.emplace_back();
    key_.push_back(FlowKey{});
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
  f.demand_units = rate_units(demand_gbps);
  f.demand_class = class_of(f.demand_units);
  l.class_slot = static_cast<int>(class_flows_[f.demand_class].size());
  class_flows_[f.demand_class].push_back(idx);
  class_bits_[f.demand_class / 64] |= uint64_t{1} << (f.demand_class % 64);
  f.total_bytes = bytes;
  // A flow whose demand exceeds a capacity on its path is never frozen by its demand: while it
  // is unfrozen, that resource's share is at most its capacity, so a saturation step comes first.
  int64_t smallest = kInf;
  for (int i = 0; i < path_len; ++i) smallest = std::min(smallest, capacity_[path[i]]);
  key_[idx].demand_unreachable = f.demand_units > smallest;
  set_rate(idx, 0);
  l.admitted_bottleneck = kNotAdmitted;
  l.active = true;
  fill_mark_[idx].fresh = 1;
  active_pos_[idx] = static_cast<int>(active_.size());
  active_.push_back(idx);
  pending_flows_.push_back(idx);
  return idx;
}

void FlowNetwork::finish_flow(int flow_idx) {
  Flow& f = flows_[flow_idx];
  Links& l = links_[flow_idx];
  for (int i = 0; i < f.path_len; ++i) {
    const int r = f.path[i];
    resource_bytes_[r] += f.total_bytes;
    residual_[r] += f.rate_units;
    pending_resources_.push_back(r);
    // Swap-remove from the resource's list; fix the moved flow's slot for this resource. The
    // entry's slot is cleared as it is taken out: when the entry moved is this flow's own (a later
    // appearance of r on its path), the search below must not find an appearance already taken
    // out whose old slot happens to name the list's last position (with r three times on a path
    // that mended the wrong slot and dropped another flow's entry; notes/mutation_v46.md).
    auto& list = res_flows_[r];
    const int pos = l.slot[i];
    l.slot[i] = -1;
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
  fill_mark_[flow_idx].fresh = 0;
  set_rate(flow_idx, 0);
  // Swap-remove: the order of active_ stays a pure function of the call sequence.
  const int pos = active_pos_[flow_idx];
  const int last = active_.back();
  active_[pos] = last;
  active_pos_[last] = pos;
  active_.pop_back();
  active_pos_[flow_idx] = -1;
  if (flow_idx >= num_slots_) free_flows_.push_back(flow_idx);  // a slot waits for its own caller
}

void FlowNetwork::admit(int flow_idx) {
  Flow& f = flows_[flow_idx];
  int64_t rate = f.demand_units;
  int bottleneck = -1;
  for (int i = 0; i < f.path_len; ++i) {
    int mult = 0;
    for (int j = 0; j < f.path_len; ++j) mult += f.path[j] == f.path[i];
    const int64_t share = std::max<int64_t>(0, residual_[f.path[i]]) / mult;
    if (share < rate) {
      rate = share;
      bottleneck = f.path[i];
    }
  }
  for (int i = 0; i < f.path_len; ++i) residual_[f.path[i]] -= rate - f.rate_units;
  set_rate(flow_idx, rate);
  fill_mark_[flow_idx].fresh = 0;
  links_[flow_idx].admitted_bottleneck = bottleneck;
  links_[flow_idx].admitted_epoch = epoch_;
}

int FlowNetwork::bottleneck(int flow_idx) const {
  const Links& l = links_[flow_idx];
  if (!l.active || fill_mark_[flow_idx].fresh) return -1;
  if (l.admitted_epoch == epoch_ && l.admitted_bottleneck != kNotAdmitted) return l.admitted_bottleneck;
  const Flow& f = flows_[flow_idx];
  if (f.rate_units == f.demand_units) return -1;
  int best = -1;
  for (int i = 0; i < f.path_len; ++i)
    if (level_[f.path[i]] == f.rate_units && (best < 0 || f.path[i] < best)) best = f.path[i];
  if (best < 0) internal("a flow below its demand has no saturated resource at its rate");
  return best;
}

void FlowNetwork::reserve_changes() {
  changed_.reserve(active_.size());
  changed_rate_.reserve(active_.size());
}

void FlowNetwork::recompute_rates() {
  ++num_recomputes_;
  changed_.clear();
  changed_rate_.clear();
  // At most one entry per active flow: with reserve_changes() before, no push_back below moves
  // the storage a consumer on another thread is reading.
  reserve_changes();
  // A new epoch also ends every admit() choice (admitted_epoch is now stale).
  if (++epoch_ == 0) {  // wrapped: clear the stamps once every 2^32 recomputes
    for (FillMark& m : fill_mark_) m.frozen_epoch = 0;
    for (Links& l : links_) l.admitted_bottleneck = kNotAdmitted;
    epoch_ = 1;
  }
  const int num_res = num_resources();
  fill_.resize(num_res);
  std::fill(level_.begin(), level_.end(), kInf);
  // Min-heap of (share, resource); stale entries are skipped on pop. Freezing a flow at a level
  // <= a resource's share never lowers that share (floor((rem - s) / (n - 1)) >= floor(rem / n)
  // when s <= rem / n), so heap keys are lower bounds: a popped key is re-checked and re-pushed
  // when it has grown.
  heap_.clear();
  for (int r = 0; r < num_res; ++r) {
    const int64_t n = static_cast<int64_t>(res_flows_[r].size());
    fill_[r] = FillAcct{capacity_[r], n};
    if (n > 0) heap_.emplace_back(capacity_[r] / n, r);
  }
  share_heapify(heap_);
  int num_unfrozen = static_cast<int>(active_.size());

  // The flows of a list are scattered over the per-flow arrays (~1 MB at 576 GPUs, above L2):
  // each one's fill mark and flow line are requested a few entries ahead of its freeze. Only
  // when the flow lines outgrow a 512 KB L2; below that (NVL72: 147 KB) it only costs.
  constexpr size_t kFreezeAhead = 8;
  const size_t ahead = flows_.size() * sizeof(Flow) > (size_t{512} << 10) ? kFreezeAhead : SIZE_MAX;
  auto prefetch_flow = [&](int idx) {
    __builtin_prefetch(&fill_mark_[idx]);
    __builtin_prefetch(&flows_[idx], 1);
  };
  auto freeze = [&](int idx, int64_t rate) {
    Flow& f = flows_[idx];
    FillMark& m = fill_mark_[idx];
    if (m.fresh || f.rate_units != rate) {
      changed_.push_back(idx);
      changed_rate_.push_back(rate);
      set_rate(idx, rate);  // an unchanged rate keeps its key (set_rate keeps it in step)
      if (publish_ != nullptr && changed_.size() % kPublishEvery == 0)
        publish_->store(static_cast<int64_t>(changed_.size()), std::memory_order_release);
    }
    m.fresh = 0;
    m.frozen_epoch = epoch_;
    --num_unfrozen;
    for (int i = 0; i < f.path_len; ++i) {
      const int r = f.path[i];
      fill_[r].rem -= rate;
      --fill_[r].unfrozen;
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
    int64_t share = kInf;
    while (!heap_.empty()) {
      const auto [s, r] = heap_.front();
      if (fill_[r].unfrozen == 0) {
        share_pop(heap_);
        continue;
      }
      const int64_t current = fill_[r].rem / fill_[r].unfrozen;
      if (current > s) {
        share_sift_down(heap_, 0, ShareEntry{current, r});  // the top, re-keyed
        continue;
      }
      share = current;
      break;
    }
    const int c = next_class();
    if (c < 0 && heap_.empty()) break;
    if (c >= 0 && class_demand_[c] <= share) {
      // Demand step: the flows' own limit binds before (or as) any shared resource fills.
      const std::vector<int>& list = class_flows_[c];
      const size_t n = list.size();
      for (size_t i = 0; i < n; ++i) {
        if (n > ahead && i < n - ahead) prefetch_flow(list[i + ahead]);
        const int idx = list[i];
        if (fill_mark_[idx].frozen_epoch != epoch_) freeze(idx, class_demand_[c]);
      }
      bits &= bits - 1;
      continue;
    }
    // Saturation step at level `share`: every resource whose share equals it, all at once.
    saturating_.clear();
    while (!heap_.empty() && heap_.front().first == share) {
      const int r = heap_.front().second;
      if (fill_[r].unfrozen == 0) {
        share_pop(heap_);
        continue;
      }
      const int64_t current = fill_[r].rem / fill_[r].unfrozen;
      if (current == share) {
        share_pop(heap_);
        if (level_[r] != share) {
          level_[r] = share;
          saturating_.push_back(r);
        }
      } else {
        share_sift_down(heap_, 0, ShareEntry{current, r});  // the top, re-keyed
      }
    }
    for (int r : saturating_) {
      const std::vector<int>& list = res_flows_[r];
      const size_t n = list.size();
      for (size_t i = 0; i < n; ++i) {
        if (n > ahead && i < n - ahead) prefetch_flow(list[i + ahead]);
        const int idx = list[i];
        if (fill_mark_[idx].frozen_epoch != epoch_) freeze(idx, share);
      }
    }
  }
  if (num_unfrozen != 0) internal("progressive filling left flows without a rate");
  for (int r = 0; r < num_res; ++r) residual_[r] = fill_[r].rem;
  pending_flows_.clear();
  pending_resources_.clear();
}

// update_rates(): the filling above, replayed only where it can differ from the last one.
//
// Every flow keeps its old rate ("fixed") unless shown otherwise; a resource is clean (not
// looked at), tracked (its remaining capacity and unfrozen count are followed level by level)
// or passive (assumed never to saturate, checked at the end). Resources on the path of a new
// flow, or of a flow that finished, start dirty. A clean resource sees exactly the states it saw
// last time (all its flows keep their old freezing points up to now), so it saturates at its
// old level again. Events, in level order (a level's demand step before its saturation step):
// a tracked resource's share (a lazy lower bound, re-pushed when it has grown), a new or freed
// flow's demand, and a tracked resource's old saturation level (the flows it froze there are
// checked there). A tracked resource's fixed flows are sorted by old freezing point and
// accounted lazily by a cursor. At a saturation step at level
// L: tracked resources whose share is L saturate and freeze their unfrozen flows at L (a fixed
// flow frozen here earlier than before has changed); a fixed flow at its old point (L,
// saturation) stays frozen only if a resource on its path saturates at L (a clean one with old
// level L, or a tracked one now), and otherwise is freed (its rate is decided later). Every
// resource on the path of a changed or freed flow becomes dirty, its state rebuilt from its
// flow list. A passive resource with final slack >= its number of flow entries (in rate units)
// provably never reached share == level (at a step at level L its remaining capacity is at
// least slack + L x unfrozen, and it has at most that many unfrozen entries), so treating it as
// unsaturated changed nothing; otherwise it is forced to be tracked and the update repeated.
// The steps are therefore exactly those recompute_rates() takes and the integers agree (the
// RapidCheck property and the racks tests check it). Since both give the same result, an update
// whose tracked work grows past a share of the network falls back to recompute_rates().
namespace {
constexpr uint8_t kFixed = 0, kFree = 1, kDone = 2, kFixedFrozen = 3;  // flow status in an update
constexpr uint8_t kClean = 0, kTracked = 1, kPassive = 2;              // resource mode in an update
// Levels are never negative, so (level, key) compares as one unsigned 128-bit number.
bool event_later(const auto& a, const auto& b) {
  const unsigned __int128 ka = static_cast<unsigned __int128>(static_cast<uint64_t>(a.level)) << 64 | a.key;
  const unsigned __int128 kb = static_cast<unsigned __int128>(static_cast<uint64_t>(b.level)) << 64 | b.key;
  return ka > kb;
}
// Removes the smallest event, as std::pop_heap + pop_back would (equal events are identical, so
// any min-heap pops the same sequence): the hole goes down to a leaf along the smaller children,
// chosen arithmetically (a branch there is a coin flip per level), and the last event rises
// from it.
template <typename Event>
void event_pop(std::vector<Event>& h) {
  const Event e = h.back();
  h.pop_back();
  const size_t n = h.size();
  if (n == 0) return;
  size_t i = 0, c = 1;
  while (c + 1 < n) {
    c += event_later(h[c], h[c + 1]);
    h[i] = h[c];
    i = c;
    c = 2 * i + 1;
  }
  if (c + 1 == n) {
    h[i] = h[c];
    i = c;
  }
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!event_later(h[parent], e)) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = e;
}
// Replaces the smallest event by e (not smaller than it), as a pop followed by a push of e
// would: the hole goes down along the smaller children while they are smaller than e.
template <typename Event>
void event_replace_top(std::vector<Event>& h, const Event& e) {
  const size_t n = h.size();
  size_t i = 0, c = 1;
  while (c + 1 < n) {
    c += event_later(h[c], h[c + 1]);
    if (!event_later(e, h[c])) break;
    h[i] = h[c];
    i = c;
    c = 2 * i + 1;
  }
  if (c + 1 == n && event_later(e, h[c])) {
    h[i] = h[c];
    i = c;
  }
  h[i] = e;
}
}  // namespace

void FlowNetwork::push_event(int64_t level, int32_t sub, int32_t kind, int32_t idx) {
  if (level < 0) internal("a negative filling level");
  events_.push_back(Event{level, static_cast<uint64_t>(sub) << 34 | static_cast<uint64_t>(kind) << 32 |
                                     static_cast<uint32_t>(idx)});
  std::push_heap(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return event_later(a, b); });
}

// A flow frozen at a new rate in this update: the tracked resources on its path account for it.
void FlowNetwork::freeze_tracked(int f, int64_t rate) {
  const Flow& fl = flows_[f];
  for (int i = 0; i < fl.path_len; ++i) {
    const int r = fl.path[i];
    ResAcct& a = acct_[r];
    if (a.stamp_mode != (stamp_ << 2 | kTracked)) continue;
    a.rem -= rate;
    --a.unfrozen;
    if (a.rem < 0 || a.unfrozen < 0) internal("a tracked resource went over its capacity");
  }
}

// Accounts for the tracked resource's fixed flows whose old freezing point is <= (level, sub)
// and that are still frozen there (not changed, not freed).
// The pool is not sorted: entries taken are moved before the cursor, and the smallest point of
// the rest is kept, so that a call that takes nothing costs one compare. A flow found free (freed
// at its old point, which has now passed) is not taken: its entry stays after the cursor with
// point kInf, so that every entry before the cursor is frozen for good (fixed at a point already
// passed, or frozen in this attempt) and the saturation scan need not look at them.
void FlowNetwork::advance(int r, int64_t level, int sub) {
  const int64_t key = point_key(level, sub);
  if (key < pool_min_[r]) return;
  int c = pool_cursor_[r];
  const int end = pool_end_[r];
  int64_t rest_min = kInf;
  for (int i = c; i < end; ++i) {
    Pending p = pool_[i];
    if (p.point > key) {
      rest_min = std::min(rest_min, p.point);
      continue;
    }
    const uint8_t st = (key_[p.flow].mark >> 2) == stamp_ ? static_cast<uint8_t>(key_[p.flow].mark & 3) : kFixed;
    if (st == kFree && key != kInf) {
      pool_[i].point = kInf;  // unfrozen: left to the saturation scan (or to the commit's last call)
      continue;
    }
    if (st == kFixed || st == kFixedFrozen) {
      acct_[r].rem -= p.point >> 1;
      --acct_[r].unfrozen;
    }
    pool_[i] = pool_[c];
    pool_[c++] = p;
  }
  pool_cursor_[r] = c;
  pool_min_[r] = rest_min;
}

void FlowNetwork::make_dirty(int r, int64_t level, int sub) {
  if (dirty(r)) return;  // already dirty in this attempt
  acct_[r].stamp_mode = stamp_ << 2 | kClean;
  const auto& list = res_flows_[r];
  auto status = [&](int f) { return (key_[f].mark >> 2) == stamp_ ? static_cast<uint8_t>(key_[f].mark & 3) : kFixed; };
  if (force_stamp_[r] != update_id_ && level_[r] == kInf) {
    // Passive (a guess; the end of the update checks it) when over 1/64 of it is unused, or when
    // it has room for what its free flows can take (their demand, or the smallest capacity on
    // their path) on top of what it carries.
    int64_t need = static_cast<int64_t>(list.size());
    const bool roomy = residual_[r] - need >= capacity_[r] / 64;
    for (size_t k = 0; !roomy && k < list.size(); ++k) {
      const int f = list[k];
      if (status(f) != kFree) continue;
      const Flow& fl = flows_[f];
      int64_t most = fl.demand_units;
      for (int i = 0; i < fl.path_len; ++i) most = std::min(most, capacity_[fl.path[i]]);
      need = std::min(kMaxRateUnits, need + most);
    }
    if (roomy || residual_[r] >= need) {
      acct_[r].stamp_mode = stamp_ << 2 | kPassive;
      passive_.push_back(r);
      return;
    }
  }
  acct_[r].stamp_mode = stamp_ << 2 | kTracked;
  tracked_.push_back(r);
  ++num_tracked_;
  work_ += static_cast<int64_t>(list.size());
  // Saturated already in this run (as a clean resource, at its old level)?
  new_level_[r] = level_[r] != kInf && point_le(level_[r], 1, level, sub) ? level_[r] : kInf;
  int64_t rem = capacity_[r];
  int n = 0;
  const int begin = static_cast<int>(pool_.size());
  const int64_t key = point_key(level, sub);
  for (int f : list) {
    const uint8_t st = status(f);
    if (st == kDone) {
      rem -= key_[f].point;  // kDone: the new rate
    } else if (st == kFree) {
      ++n;
      pool_.push_back(Pending{kInf, f});  // last: only the saturation scan below looks at it
    } else {
      const int64_t pt = key_[f].point;
      if (st == kFixedFrozen || pt <= key) {
        rem -= pt >> 1;
        continue;
      }
      ++n;
      pool_.push_back(Pending{pt, f});
    }
  }
  // r saturated at a later level last time: whether the flows it froze then stay frozen there
  // is decided at that level. r's one event waits for the earlier of that level and its share.
  const int64_t cand = level_[r] != kInf && new_level_[r] == kInf ? level_[r] : kInf;
  cand_level_[r] = cand;
  int64_t pool_min = kInf;
  for (size_t c = begin; c < pool_.size(); ++c) pool_min = std::min(pool_min, pool_[c].point);
  pool_min_[r] = pool_min;
  pool_begin_[r] = begin;
  pool_cursor_[r] = begin;
  pool_end_[r] = static_cast<int>(pool_.size());
  if (rem < 0) internal("a dirty resource is over its capacity");
  acct_[r].rem = rem;
  acct_[r].unfrozen = n;
  if (n > 0) {
    if (new_level_[r] != kInf) internal("a saturated resource has unfrozen flows");
    if (rem / n <= level) internal("a resource made dirty mid-step would saturate at the same level");
    push_event(std::min(rem / n, cand), 1, 0, r);
  } else if (cand != kInf) {
    push_event(cand, 1, 0, r);
  }
}

FlowNetwork::Attempt FlowNetwork::attempt_update() {
  if (++stamp_ == (1u << 30)) {  // wrapped: clear the stamps once every 2^30 attempts
    for (FlowKey& k : key_) k.mark = 0;
    for (ResAcct& a : acct_) a.stamp_mode = kClean;
    stamp_ = 1;
  }
  events_.clear();
  tracked_.clear();
  passive_.clear();
  done_.clear();
  pool_.clear();
  work_ = 0;
  if (pool_begin_.size() != capacity_.size()) {
    pool_begin_.resize(capacity_.size());
    pool_end_.resize(capacity_.size());
    pool_cursor_.resize(capacity_.size());
    pool_min_.resize(capacity_.size());
  }
  // Past this many tracked flow entries a full recompute is cheaper (same result). Right after a
  // fallback the limit is an eighth of that: fallbacks come in runs (in NVL72 Monte-Carlo trials,
  // 65 % of updates after a fallback fell back too, against 4 % after an update that held), and
  // an update that succeeds tracks ~65 entries, so a short attempt loses few of those while a
  // doomed one gives up sooner.
  const int64_t work_limit = static_cast<int64_t>(active_.size()) / (last_fell_back_ ? 16 : 2) + 64;
  auto status = [&](int f) { return (key_[f].mark >> 2) == stamp_ ? static_cast<uint8_t>(key_[f].mark & 3) : kFixed; };
  auto set_status = [&](int f, uint8_t st) { key_[f].mark = stamp_ << 2 | st; };
  // Free flows not yet frozen. A flow whose demand is unreachable gets no demand event: in the
  // filling a saturation step freezes it first, so it needs a tracked resource on its path (the
  // loop before the filling sees to that for new flows; a flow freed later comes out of a tracked
  // resource's pool).
  int64_t free_left = 0;
  auto free_flow = [&](int f) {
    set_status(f, kFree);
    ++free_left;
    if (!key_[f].demand_unreachable) push_event(flows_[f].demand_units, 0, 1, f);
  };
  auto freeze_new = [&](int f, int64_t rate) {
    set_status(f, kDone);
    key_[f].point = rate;  // the new rate while kDone (update_rates() restores the point otherwise)
    done_.push_back(f);
    freeze_tracked(f, rate);
  };
  for (int f : pending_flows_)
    if (links_[f].active && fill_mark_[f].fresh && status(f) != kFree) free_flow(f);
  for (int f : pending_flows_)
    if (links_[f].active && fill_mark_[f].fresh)
      for (int i = 0; i < flows_[f].path_len; ++i) make_dirty(flows_[f].path[i], -1, 1);
  for (int r : pending_resources_) make_dirty(r, -1, 1);
  // A new flow whose demand is unreachable must be frozen by a tracked resource on its path; if
  // every resource on its path was guessed passive, nothing would freeze it, so those resources
  // are tracked now, before the filling starts.
  for (int f : pending_flows_) {
    if (!links_[f].active || !fill_mark_[f].fresh || !key_[f].demand_unreachable) continue;
    const Flow& fl = flows_[f];
    bool any_tracked = false;
    for (int i = 0; i < fl.path_len && !any_tracked; ++i) any_tracked = mode(fl.path[i]) == kTracked;
    if (any_tracked) continue;
    for (int i = 0; i < fl.path_len; ++i) {
      const int r = fl.path[i];
      if (mode(r) != kPassive) continue;  // a path may hold a resource more than once
      acct_[r].stamp_mode = kPassive;  // not dirty; a stale entry in passive_ (skipped below once tracked)
      force_stamp_[r] = update_id_;
      make_dirty(r, -1, 1);
    }
  }

  while (!events_.empty()) {
    if (work_ > work_limit) return Attempt::kTooBig;
    const int64_t level = events_.front().level;
    if (events_.front().sub() == 0) {  // demand step: only new or freed flows have events here
      while (!events_.empty() && events_.front().level == level && events_.front().sub() == 0) {
        const int f = events_.front().idx();
        event_pop(events_);
        if (status(f) == kFree) {
          --free_left;
          freeze_new(f, level);
        }
      }
      continue;
    }
    // Saturation step at `level`.
    saturating_.clear();
    candidates_.clear();
    // A tracked resource has one event, at the earlier of its share (a lower bound) and its old
    // saturation level while that is still ahead (cand_level_): one heap entry instead of two.
    while (!events_.empty() && events_.front().level == level) {
      const Event e = events_.front();
      const int r = e.idx();
      if (cand_level_[r] == level) {
        candidates_.push_back(r);
        cand_level_[r] = kInf;
      }
      advance(r, level, 0);
      const int64_t cand = cand_level_[r];
      if (acct_[r].unfrozen == 0) {
        if (cand != kInf) event_replace_top(events_, Event{cand, e.key});
        else event_pop(events_);
        continue;
      }
      const int64_t share = acct_[r].rem / acct_[r].unfrozen;
      if (share > level) {  // grown: the same event, re-keyed in place (one sift, not a pop and a push)
        event_replace_top(events_, Event{std::min(share, cand), e.key});
        continue;
      }
      event_pop(events_);
      if (share == level) {
        // Its old level, if still ahead, needs no check: this saturation freezes every flow of
        // its pool at a later point (the candidates' loop below would skip it).
        cand_level_[r] = kInf;
        if (new_level_[r] != level) {
          new_level_[r] = level;
          saturating_.push_back(r);
        }
      } else {
        internal("a tracked resource's share fell below the filling level");
      }
    }
    spread_.clear();
    const int64_t sat_key = point_key(level, 1);
    // A tracked resource's pool holds every flow of its list that was free, or fixed at a later
    // point, when it became dirty; the others were frozen before then and need nothing here. Nor
    // do the pool's entries before its cursor (advance() has just moved it to (level, 0)): they
    // are fixed at points already passed, or frozen in this attempt; free flows stay after it.
    for (int r : saturating_)
      for (int c = pool_cursor_[r]; c < pool_end_[r]; ++c) {
        const int f = pool_[c].flow;
        const uint8_t st = status(f);
        if (st == kFree) {
          --free_left;
          freeze_new(f, level);
        } else if (st == kFixed) {
          const int64_t pt = key_[f].point;
          if (pt == sat_key) {
            set_status(f, kFixedFrozen);  // where it froze last time (cursors account for it)
          } else if (pt > sat_key) {
            freeze_new(f, level);  // frozen earlier than last time
            spread_.push_back(f);
          }
        }
      }
    // Tracked resources that saturated at this level last time and do not now: the flows they
    // froze here stay frozen only if a clean resource on their path saturates here again.
    for (int rc : candidates_) {
      // Saturates again: its flows were frozen above. Saturated at a lower level in this
      // attempt: its scan then froze every flow of its pool at a later point (this one included).
      if (new_level_[rc] != kInf) continue;
      // Its fixed flows at this point are in its pool (the point is later than where it became
      // dirty), after the cursor (advance() has taken points up to (level, 0) at most).
      for (int c = pool_cursor_[rc]; c < pool_end_[rc]; ++c) {
        if (pool_[c].point != sat_key) continue;
        const int f = pool_[c].flow;
        if (status(f) != kFixed) continue;
        const Flow& fl = flows_[f];
        bool held = false;
        for (int i = 0; i < fl.path_len && !held; ++i) {
          const int r = fl.path[i];
          held = !dirty(r) && level_[r] == level;
        }
        if (held) {
          set_status(f, kFixedFrozen);
        } else {
          free_flow(f);
          spread_.push_back(f);
        }
      }
    }
    for (int f : spread_) {
      const Flow& fl = flows_[f];
      for (int i = 0; i < fl.path_len; ++i)
        if (!dirty(fl.path[i])) make_dirty(fl.path[i], level, 1);
    }
  }

  // Every free flow has a demand event or sits, counted, in the pool of a tracked resource whose
  // event stays in the heap until its saturation scan freezes it (the unreachable-demand loop
  // before the filling and the candidates' loop keep that true; notes/mutation_v46.md, F23), so
  // an empty heap leaves none free.
  if (free_left != 0) internal("an update attempt left a free flow unfrozen");
  // Passive resources: final slack must be at least their number of flow entries. The residuals
  // move to the new rates here, once per frozen flow and path entry: the commit keeps them, a
  // repeated attempt gets them back.
  auto move_residuals = [&](int64_t sign) {
    for (int f : done_) {
      const Flow& fl = flows_[f];
      const int64_t delta = sign * (key_[f].point - fl.rate_units);
      for (int i = 0; i < fl.path_len; ++i) residual_[fl.path[i]] -= delta;
    }
  };
  move_residuals(1);
  bool ok = true;
  for (int r : passive_)
    if (mode(r) == kPassive && residual_[r] < static_cast<int64_t>(res_flows_[r].size())) {
      force_stamp_[r] = update_id_;
      ok = false;
    }
  if (ok) return Attempt::kDone;
  move_residuals(-1);
  return Attempt::kRetry;
}

void FlowNetwork::update_rates() {
  ++update_id_;
  changed_.clear();
  changed_rate_.clear();
  for (;;) {
    const Attempt a = attempt_update();
    if (a == Attempt::kDone) break;
    for (int f : done_) set_rate(f, flows_[f].rate_units);  // the old points back (kDone held new rates)
    if (a == Attempt::kTooBig) {
      last_fell_back_ = true;
      ++num_fallbacks_;
      recompute_rates();
      return;
    }
    ++num_retries_;
  }
  last_fell_back_ = false;
  ++num_recomputes_;
  // Commit: new rates, residuals, saturation levels (bottlenecks follow from them).
  for (int f : done_) {
    Flow& fl = flows_[f];
    FillMark& m = fill_mark_[f];
    const int64_t rate = key_[f].point;  // kDone: the new rate
    if (m.fresh || rate != fl.rate_units) {
      changed_.push_back(f);
      changed_rate_.push_back(rate);
    }
    m.fresh = 0;
    set_rate(f, rate);  // residual_ already moved (attempt_update)
  }
  for (int r : tracked_) {
    advance(r, kInf, 1);
    if (acct_[r].unfrozen != 0 || residual_[r] != acct_[r].rem)
      internal("a tracked resource's account differs from the committed rates");
    level_[r] = new_level_[r];
  }
  pending_flows_.clear();
  pending_resources_.clear();
}

}  // namespace mok::sim
