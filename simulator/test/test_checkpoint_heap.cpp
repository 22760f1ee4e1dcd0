// The engine's completion heap driven the way LayerSim drives it: a key bound kept beside each
// flow lets an earlier completion at or above the bound skip the heap; the pops must be those of
// a heap that sees every earlier completion (the rule before the bound existed).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "checkpoint_heap.hpp"

namespace mok::sim {
namespace {

constexpr int64_t kNone = INT64_MAX;

RC_GTEST_PROP(CheckpointHeapProps, KeyBoundSkipsOnlyWhatLowerWouldIgnore, ()) {
  const int n = *rc::gen::inRange(1, 40);
  const int64_t spread = *rc::gen::element<int64_t>(3, 50, 1000);  // small spreads make ties
  const int ops = *rc::gen::inRange(1, 600);
  // Reference: lower() on every earlier completion. Bounded: lower() only below the bound.
  detail::CheckpointHeap ref, fast;
  std::vector<int64_t> ref_due(n, kNone), fast_due(n, kNone), bound(n, kNone);
  auto ref_due_of = [&](int f) { return ref_due[f]; };
  auto fast_due_of = [&](int f) { return fast_due[f]; };
  auto no_rekey = [](int, int64_t) {};
  auto rekeyed = [&](int f, int64_t key) { bound[f] = key; };
  int64_t now = 0;
  for (int op = 0; op < ops; ++op) {
    if (*rc::gen::inRange(0, 4) == 0) {  // the earliest completion happens
      RC_ASSERT(ref.empty() == fast.empty());
      if (ref.empty()) continue;
      now = ref.top_time(ref_due_of, no_rekey);
      RC_ASSERT(fast.top_time(fast_due_of, rekeyed) == now);
      const int f = ref.top(ref_due_of, no_rekey);
      RC_ASSERT(fast.top(fast_due_of, rekeyed) == f);
      ref.erase(f);
      fast.erase(f);
      ref_due[f] = fast_due[f] = bound[f] = kNone;
      continue;
    }
    // A flow gets a new completion time (a rate change), or none (rate 0).
    const int f = *rc::gen::inRange(0, n);
    if (*rc::gen::inRange(0, 10) == 0) {
      ref.erase(f);
      fast.erase(f);
      ref_due[f] = fast_due[f] = bound[f] = kNone;
      continue;
    }
    const int64_t due = now + *rc::gen::inRange<int64_t>(0, spread);
    if (due < ref_due[f]) ref.lower(f, due);
    ref_due[f] = due;
    if (due < bound[f]) {
      fast.lower(f, due);
      bound[f] = due;
    }
    fast_due[f] = due;
  }
  // Drain both.
  while (!ref.empty()) {
    RC_ASSERT(!fast.empty());
    const int64_t t = ref.top_time(ref_due_of, no_rekey);
    RC_ASSERT(fast.top_time(fast_due_of, rekeyed) == t);
    const int f = ref.top(ref_due_of, no_rekey);
    RC_ASSERT(fast.top(fast_due_of, rekeyed) == f);
    ref.erase(f);
    fast.erase(f);
    ref_due[f] = fast_due[f] = bound[f] = kNone;
  }
  RC_ASSERT(fast.empty());
}

}  // namespace
}  // namespace mok::sim

namespace mok::sim {
namespace {

RC_GTEST_PROP(CheckpointHeapProps, CeilBelow1e17IsStdCeil, ()) {
  // Integers, integers plus or minus an ulp or two, tiny values, and values of every magnitude.
  const int kind = *rc::gen::inRange(0, 4);
  double x = 0;
  if (kind == 0) {
    x = static_cast<double>(*rc::gen::inRange<int64_t>(0, int64_t{100000000000000000}));
  } else if (kind == 1) {
    x = static_cast<double>(*rc::gen::inRange<int64_t>(0, int64_t{1} << 40));
    const int steps = *rc::gen::inRange(-2, 3);
    for (int i = 0; i < steps; ++i) x = std::nextafter(x, 1e17);
    for (int i = 0; i > steps; --i) x = std::nextafter(x, 0.0);
  } else if (kind == 2) {
    x = std::ldexp(*rc::gen::inRange(1, 1 << 20), -*rc::gen::inRange(1, 1000));
  } else {
    x = std::ldexp(static_cast<double>(*rc::gen::inRange<int64_t>(1, int64_t{1} << 52)), *rc::gen::inRange(-60, 4));
  }
  RC_PRE(x >= 0 && x < 1e17);
  RC_ASSERT(detail::ceil_below_1e17(x) == static_cast<int64_t>(std::ceil(x)));
}

}  // namespace
}  // namespace mok::sim
