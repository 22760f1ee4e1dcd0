// Internal parts of the engine (mok::sim), in a header so that tests can drive them: the
// flow-completion heap, and the rounding of completion times.
#pragma once

#include <cstdint>
#include <vector>

namespace mok::sim::detail {

// std::ceil(x) for 0 <= x < 1e17, without a call into libm (the x86-64 baseline has no rounding
// instruction; a completion time is rounded at every rate change): the truncation is x's integer
// part, exact as a double since it is below 2^63, so one compare finds whether x has a fraction.
inline int64_t ceil_below_1e17(double x) {
  const int64_t whole = static_cast<int64_t>(x);
  return whole + (x > static_cast<double>(whole));
}

// Completion time of every active flow, keyed (time, flow index): an indexed binary heap, so a
// rate change moves the flow's entry instead of leaving stale copies behind. Ties go by flow
// index, not by when the rate was set, so the order in which a rate update lists its changed
// flows does not matter.
// The completion time itself (the due time) is kept by the caller, in the flow's own state, and
// an entry's key is only a lower bound of it: a later completion time costs no heap access at
// all, and an entry that reaches the top with key < due is moved down then (normalize(), which
// reads the due time through `due`). The top is then exact: every other entry's (due, flow) is
// at least its (key, flow), which is at least the top's. A flow's rate changes hundreds of times
// at 576 GPUs, and about half of the changes make it later.
// The caller may also keep an upper bound of each entry's key (`rekeyed` reports the key that
// normalize() gives an entry; lower() makes the key at most its time): an earlier completion time
// at or above that bound leaves the key as it is, so it needs no heap access either.
class CheckpointHeap {
 public:
  bool empty() const { return heap_.empty(); }
  template <typename Due, typename Rekeyed>
  int top(Due&& due, Rekeyed&& rekeyed) {
    normalize(due, rekeyed);
    return static_cast<int>(heap_[0].flow);
  }
  template <typename Due, typename Rekeyed>
  int64_t top_time(Due&& due, Rekeyed&& rekeyed) {
    normalize(due, rekeyed);
    return heap_[0].time_ns;
  }
  // The flow's key becomes at most time_ns (the flow is inserted when absent).
  void lower(int flow, int64_t time_ns) {
    if (static_cast<size_t>(flow) >= pos_.size()) pos_.resize(flow + 1, -1);
    if (pos_[flow] < 0) {
      pos_[flow] = static_cast<int>(heap_.size());
      heap_.push_back(Entry{time_ns, flow});
      sift_up(pos_[flow]);
      return;
    }
    const int i = pos_[flow];
    if (time_ns < heap_[i].time_ns) {
      heap_[i].time_ns = time_ns;
      sift_up(i);
    }
  }
  void erase(int flow) {
    if (static_cast<size_t>(flow) >= pos_.size() || pos_[flow] < 0) return;
    const int i = pos_[flow];
    const Entry last = heap_.back();
    heap_.pop_back();
    pos_[flow] = -1;
    if (last.flow == flow) return;
    heap_[i] = last;
    pos_[last.flow] = i;
    sift_up(i);
    sift_down(pos_[last.flow]);
  }

 private:
  // Keys live in the heap entries (no indirection while sifting).
  struct Entry {
    int64_t time_ns;  // the key: at most the flow's due time
    int64_t flow;
  };
  template <typename Due, typename Rekeyed>
  void normalize(Due&& due, Rekeyed&& rekeyed) {
    for (int64_t d; heap_[0].time_ns < (d = due(static_cast<int>(heap_[0].flow)));) {
      heap_[0].time_ns = d;
      rekeyed(static_cast<int>(heap_[0].flow), d);
      sift_down(0);
    }
  }
  // Times and flow indices are never negative: (time, flow) compares as one 128-bit number.
  static bool less(const Entry& a, const Entry& b) {
    return (static_cast<unsigned __int128>(static_cast<uint64_t>(a.time_ns)) << 64 | static_cast<uint64_t>(a.flow)) <
           (static_cast<unsigned __int128>(static_cast<uint64_t>(b.time_ns)) << 64 | static_cast<uint64_t>(b.flow));
  }
  void sift_up(int i) {
    const Entry e = heap_[i];
    while (i > 0) {
      const int parent = (i - 1) / 2;
      if (!less(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      pos_[heap_[i].flow] = i;
      i = parent;
    }
    heap_[i] = e;
    pos_[e.flow] = i;
  }
  void sift_down(int i) {
    const int n = static_cast<int>(heap_.size());
    const Entry e = heap_[i];
    for (;;) {
      int best = -1;
      const int l = 2 * i + 1, r = l + 1;
      if (l < n && less(heap_[l], e)) best = l;
      if (r < n && less(heap_[r], best < 0 ? e : heap_[l])) best = r;
      if (best < 0) break;
      heap_[i] = heap_[best];
      pos_[heap_[i].flow] = i;
      i = best;
    }
    heap_[i] = e;
    pos_[e.flow] = i;
  }
  std::vector<Entry> heap_;
  std::vector<int> pos_;
};

}  // namespace mok::sim::detail
