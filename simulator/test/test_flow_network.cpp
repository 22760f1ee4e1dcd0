// Max-min fair sharing: analytic single-flow, incast, all-to-all and demand-capped cases, exact
// in fixed-point rate units (an equal share is floor(capacity / flows)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mok/sim/error.hpp"
#include "mok/sim/flow_network.hpp"

namespace mok::sim {
namespace {

// A positive rate below half a unit (2^-33 GB/s) is one unit: a demand rounded to 0 would leave
// its flow at rate 0 forever (the forty-ninth session's audit found a layer that ended in an
// internal error that way).
TEST(FlowNetwork, APositiveRateBelowOneUnitIsOneUnit) {
  EXPECT_EQ(rate_units(0.0), 0);
  EXPECT_EQ(rate_units(-1.0), 0);
  EXPECT_EQ(rate_units(std::nan("")), 0);
  EXPECT_EQ(rate_units(1e-12), 1);
  EXPECT_EQ(rate_units(std::ldexp(1.0, -40)), 1);
  EXPECT_EQ(rate_units(std::ldexp(3.0, -33)), 2);  // 1.5 units: the nearest, ties to even
  EXPECT_EQ(rate_units(1.0), int64_t{1} << 32);
  FlowNetwork net;
  const int a = net.add_resource(10.0, "a");
  const int f = net.start_flow(&a, 1, 1e-12, 16);
  net.recompute_rates();
  EXPECT_EQ(net.flow(f).rate_units, 1);
}

TEST(FlowNetwork, OneFlowGetsTheSmallerOfCapacityAndDemand) {
  FlowNetwork net;
  const int a = net.add_resource(100.0, "a");
  const int b = net.add_resource(40.0, "b");
  int path[2] = {a, b};
  const int f = net.start_flow(path, 2, 1000.0, 4000);
  net.recompute_rates();
  EXPECT_EQ(net.flow(f).rate_units, rate_units(40.0));
  const int g = net.start_flow(path, 1, 25.0, 4000);  // only resource a, demand 25
  net.recompute_rates();
  EXPECT_EQ(net.flow(g).rate_units, rate_units(25.0));
  EXPECT_EQ(net.flow(f).rate_units, rate_units(40.0));
}

TEST(FlowNetwork, IncastSharesTheReceiverEqually) {
  for (int n : {1, 2, 3, 7, 71}) {
    FlowNetwork net;
    const int in = net.add_resource(900.0, "in");
    std::vector<int> flows;
    for (int i = 0; i < n; ++i) {
      const int out = net.add_resource(900.0, "out" + std::to_string(i));
      int path[2] = {out, in};
      flows.push_back(net.start_flow(path, 2, 1e9, 1000));
    }
    net.recompute_rates();
    for (int f : flows) EXPECT_EQ(net.flow(f).rate_units, rate_units(900.0) / n) << "n=" << n;
  }
}

TEST(FlowNetwork, AllToAllOnANonBlockingSwitchGetsCapacityOverPeers) {
  const int n = 8;
  FlowNetwork net;
  std::vector<int> out(n), in(n);
  for (int g = 0; g < n; ++g) {
    out[g] = net.add_resource(450.0, "out");
    in[g] = net.add_resource(450.0, "in");
  }
  std::vector<int> flows;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (s != d) {
        int path[2] = {out[s], in[d]};
        flows.push_back(net.start_flow(path, 2, 1e9, 1000));
      }
  net.recompute_rates();
  for (int f : flows) EXPECT_EQ(net.flow(f).rate_units, rate_units(450.0) / (n - 1));
}

TEST(FlowNetwork, MaxMinGivesLeftoverToUnconstrainedFlows) {
  // Flows A (r1), B (r1, r2), C (r2); r1 = 10, r2 = 4: B and C get 2, A gets 8.
  FlowNetwork net;
  const int r1 = net.add_resource(10.0, "r1"), r2 = net.add_resource(4.0, "r2");
  int pa[1] = {r1}, pb[2] = {r1, r2}, pc[1] = {r2};
  const int a = net.start_flow(pa, 1, 1e9, 1);
  const int b = net.start_flow(pb, 2, 1e9, 1);
  const int c = net.start_flow(pc, 1, 1e9, 1);
  net.recompute_rates();
  EXPECT_EQ(net.flow(a).rate_units, rate_units(8.0));
  EXPECT_EQ(net.flow(b).rate_units, rate_units(2.0));
  EXPECT_EQ(net.flow(c).rate_units, rate_units(2.0));
}

TEST(FlowNetwork, ALocalCopyCountsTwiceOnHbm) {
  FlowNetwork net;
  const int hbm = net.add_resource(100.0, "hbm");
  int path[2] = {hbm, hbm};
  const int f = net.start_flow(path, 2, 1e9, 1);
  net.recompute_rates();
  EXPECT_EQ(net.flow(f).rate_units, rate_units(50.0));
}

TEST(FlowNetwork, FinishedFlowsCreditExactBytesToTheirPath) {
  FlowNetwork net;
  const int a = net.add_resource(10.0, "a"), b = net.add_resource(10.0, "b");
  int p1[2] = {a, b}, p2[1] = {b};
  const int f1 = net.start_flow(p1, 2, 1e9, 1234);
  const int f2 = net.start_flow(p2, 1, 1e9, 77);
  net.finish_flow(f1);
  net.finish_flow(f2);
  EXPECT_EQ(net.resource_bytes()[a], 1234);
  EXPECT_EQ(net.resource_bytes()[b], 1234 + 77);
}

TEST(FlowNetwork, ReservedSlotsGoOnlyToTheirCallers) {
  FlowNetwork net;
  const int a = net.add_resource(10.0, "a");
  int path[1] = {a};
  net.reserve_slots(4);
  EXPECT_EQ(net.start_flow(path, 1, 1e9, 1, 2), 2);
  const int plain = net.start_flow(path, 1, 1e9, 1);
  EXPECT_GE(plain, 4) << "a flow without a slot must not take a reserved index";
  const int busy = net.start_flow(path, 1, 1e9, 1, 2);  // slot 2 is taken: any free index
  EXPECT_GE(busy, 4);
  EXPECT_NE(busy, plain);
  net.finish_flow(2);
  EXPECT_EQ(net.start_flow(path, 1, 1e9, 1, 2), 2) << "a finished slot is free for its caller again";
  net.finish_flow(plain);
  EXPECT_EQ(net.start_flow(path, 1, 1e9, 1), plain) << "an unreserved index is reused";
  net.update_rates();
  for (int f : net.active_flows()) EXPECT_EQ(net.flow(f).rate_units, rate_units(10.0) / 3);
}

TEST(FlowNetwork, BottleneckIsTheLowestIndexResourceSaturatedAtTheRate) {
  // One flow over b then a, both 50: both saturate at 50, and the bottleneck is the lower index
  // whatever the path order. A flow frozen by its demand has none, even when a resource on its
  // path fills at the same level (c: 2 x 25 = 50).
  FlowNetwork net;
  const int a = net.add_resource(50.0, "a"), b = net.add_resource(50.0, "b"), c = net.add_resource(50.0, "c");
  int pba[2] = {b, a}, pc[1] = {c};
  const int f = net.start_flow(pba, 2, 1e9, 1);
  const int g = net.start_flow(pc, 1, 25.0, 1);
  const int h = net.start_flow(pc, 1, 25.0, 1);
  net.recompute_rates();
  EXPECT_EQ(net.flow(f).rate_units, rate_units(50.0));
  EXPECT_EQ(net.bottleneck(f), a);
  EXPECT_EQ(net.flow(g).rate_units, rate_units(25.0));
  EXPECT_EQ(net.bottleneck(g), -1);
  EXPECT_EQ(net.bottleneck(h), -1);
  // The incremental update names the same ones.
  const int k = net.start_flow(pba, 2, 1e9, 1);
  net.update_rates();
  EXPECT_EQ(net.flow(k).rate_units, rate_units(25.0));
  EXPECT_EQ(net.bottleneck(f), a);
  EXPECT_EQ(net.bottleneck(k), a);
}

TEST(FlowNetwork, AdmitGivesANewFlowWhatIsLeftOnItsPath) {
  // After a full filling, admit() gives a new flow min(demand, residual / times on the path) and
  // names the tightest resource (-1 when its demand binds, ties included), without moving the
  // other flows; a finished flow's rate becomes residual again.
  FlowNetwork net;
  const int a = net.add_resource(100.0, "a"), b = net.add_resource(40.0, "b");
  int pab[2] = {a, b}, pa[1] = {a}, pbb[2] = {b, b};
  const int f = net.start_flow(pab, 2, 30.0, 1);
  net.recompute_rates();
  ASSERT_EQ(net.flow(f).rate_units, rate_units(30.0));  // residuals: a 70, b 10
  const int g = net.start_flow(pa, 1, 1e9, 1);
  net.admit(g);
  EXPECT_EQ(net.flow(g).rate_units, rate_units(70.0));
  EXPECT_EQ(net.bottleneck(g), a);
  EXPECT_EQ(net.flow(f).rate_units, rate_units(30.0));
  const int h = net.start_flow(pbb, 2, 1e9, 1);  // b twice (a local copy's HBM): 10 / 2
  net.admit(h);
  EXPECT_EQ(net.flow(h).rate_units, rate_units(10.0) / 2);
  EXPECT_EQ(net.bottleneck(h), b);
  net.finish_flow(g);
  const int k = net.start_flow(pa, 1, 70.0, 1);  // its demand equals a's residual: the demand binds
  net.admit(k);
  EXPECT_EQ(net.flow(k).rate_units, rate_units(70.0));
  EXPECT_EQ(net.bottleneck(k), -1);
  const int m = net.start_flow(pa, 1, 1e9, 1);  // nothing left on a
  net.admit(m);
  EXPECT_EQ(net.flow(m).rate_units, 0);
  EXPECT_EQ(net.bottleneck(m), a);
}

TEST(FlowNetwork, ChangedFlowsHoldEveryNewFlowEvenAtRateZero) {
  // changed_flows() lists every flow started since the last assignment, also one whose new rate
  // equals the 0 it started with (a zero demand), in the full filling and in the update.
  for (bool incremental : {false, true}) {
    FlowNetwork net;
    const int a = net.add_resource(100.0, "a");
    int pa[1] = {a};
    const int f = net.start_flow(pa, 1, 1e9, 1);
    net.recompute_rates();
    const int idle = net.start_flow(pa, 1, 0.0, 1);
    const int g = net.start_flow(pa, 1, 1e9, 1);
    if (incremental) net.update_rates();
    else net.recompute_rates();
    std::vector<int> changed = net.changed_flows();
    std::sort(changed.begin(), changed.end());
    std::vector<int> expected = {f, idle, g};
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(changed, expected) << (incremental ? "update_rates" : "recompute_rates");
    EXPECT_EQ(net.flow(idle).rate_units, 0);
    EXPECT_EQ(net.flow(g).rate_units, rate_units(50.0));
  }
}

// A bad flow is refused with a message naming the problem, and the network is left as it was:
// the flows before it keep their indices and rates, and the next flow takes the index the
// refused one would have had. A resource named twice on a path (a local copy's HBM) is allowed
// and checked against the full filling below.
TEST(FlowNetwork, RefusesABadFlowAndChangesNothing) {
  FlowNetwork net;
  const int a = net.add_resource(4.0, "hbm0");
  const int b = net.add_resource(8.0, "nvl0");
  const int pab[2] = {a, b};
  const int f = net.start_flow(pab, 2, 1e9, 100);
  net.recompute_rates();
  const int64_t rate = net.flow(f).rate_units;
  auto refused = [&](const std::vector<int>& path, double demand, int64_t bytes, const std::string& says) {
    try {
      net.start_flow(path.data(), static_cast<int>(path.size()), demand, bytes);
      ADD_FAILURE() << "accepted a flow that should be refused (" << says << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({a, 2}, 1.0, 1, "names resource 2; the network has 2");
  refused({-1}, 1.0, 1, "names resource -1");
  {
    FlowNetwork empty;
    const int p0[1] = {0};
    try {
      empty.start_flow(p0, 1, 1.0, 1);
      ADD_FAILURE() << "a network without resources accepted a path";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("names resource 0; the network has none"), std::string::npos) << e.what();
    }
  }
  refused(std::vector<int>(kMaxPathLen + 1, a), 1.0, 1, "has 7 resources; it may have 0 to 6");
  refused({a}, -1.0, 1, "demand >= 0");
  refused({a}, std::nan(""), 1, "demand >= 0");
  refused({a}, 1.0, -5, "bytes >= 0");
  EXPECT_EQ(net.active_flows(), std::vector<int>{f});
  net.recompute_rates();
  EXPECT_EQ(net.flow(f).rate_units, rate);
  const int paa[2] = {a, a};  // twice: allowed
  const int g = net.start_flow(paa, 2, 1e9, 100);
  EXPECT_EQ(g, f + 1);
  net.update_rates();
  FlowNetwork full;
  full.add_resource(4.0, "hbm0");
  full.add_resource(8.0, "nvl0");
  full.start_flow(pab, 2, 1e9, 100);
  full.start_flow(paa, 2, 1e9, 100);
  full.recompute_rates();
  // hbm0 carries f once and g twice: 4 / 3 each.
  EXPECT_EQ(net.flow(f).rate_units, full.flow(f).rate_units);
  EXPECT_EQ(net.flow(g).rate_units, full.flow(g).rate_units);
  EXPECT_EQ(net.flow(g).rate_units, rate_units(4.0) / 3);
}

// A resource named three or more times on one path. finish_flow() takes a flow's entries out of
// each resource's list in path order, mending the slot of the entry it moves; it once mended an
// appearance of the finishing flow already taken out, whose old slot named the list's last
// position, and then dropped another flow's entry, so both fillings stopped seeing a live flow
// (update_rates() threw; notes/mutation_v46.md). Each case replays a call sequence that broke a
// list that way, and after each assignment compares every live flow's rate and bottleneck, and
// update_rates()'s against recompute_rates()'s, with a fresh network holding only the live flows.
TEST(FlowNetwork, AResourceManyTimesOnAPathKeepsEveryLiveFlowListed) {
  struct Start {
    std::vector<int> path;
    double demand;
  };
  struct Step {
    int start = -1;   // index into the case's starts, or -1
    int finish = -1;  // index into the case's starts of the flow to finish, or -1
    bool assign = false;
  };
  auto run_case = [](const std::vector<double>& caps, const std::vector<Start>& starts, const std::vector<Step>& steps,
                     const std::string& name) {
    FlowNetwork inc, full;
    for (double c : caps) {
      inc.add_resource(c, "r");
      full.add_resource(c, "r");
    }
    std::vector<int> id(starts.size(), -1);  // flow index of each start while it is live
    bool first = true;
    for (size_t k = 0; k < steps.size(); ++k) {
      const Step& st = steps[k];
      if (st.start >= 0) {
        const Start& s = starts[static_cast<size_t>(st.start)];
        id[static_cast<size_t>(st.start)] = inc.start_flow(s.path.data(), static_cast<int>(s.path.size()), s.demand, 1);
        ASSERT_EQ(full.start_flow(s.path.data(), static_cast<int>(s.path.size()), s.demand, 1),
                  id[static_cast<size_t>(st.start)]);
      }
      if (st.finish >= 0) {
        inc.finish_flow(id[static_cast<size_t>(st.finish)]);
        full.finish_flow(id[static_cast<size_t>(st.finish)]);
        id[static_cast<size_t>(st.finish)] = -1;
      }
      if (!st.assign) continue;
      if (first) {
        inc.recompute_rates();
        first = false;
      } else {
        ASSERT_NO_THROW(inc.update_rates()) << name << ", step " << k;
      }
      full.recompute_rates();
      FlowNetwork fresh;
      for (double c : caps) fresh.add_resource(c, "r");
      std::vector<int> fresh_id(starts.size(), -1);
      for (size_t i = 0; i < starts.size(); ++i)
        if (id[i] >= 0)
          fresh_id[i] = fresh.start_flow(starts[i].path.data(), static_cast<int>(starts[i].path.size()),
                                         starts[i].demand, 1);
      fresh.recompute_rates();
      EXPECT_EQ(inc.active_flows().size(), fresh.active_flows().size()) << name << ", step " << k;
      for (size_t i = 0; i < starts.size(); ++i) {
        if (id[i] < 0) continue;
        EXPECT_EQ(inc.flow(id[i]).rate_units, fresh.flow(fresh_id[i]).rate_units)
            << name << ", step " << k << ", start " << i << " (update_rates)";
        EXPECT_EQ(full.flow(id[i]).rate_units, fresh.flow(fresh_id[i]).rate_units)
            << name << ", step " << k << ", start " << i << " (recompute_rates)";
        EXPECT_EQ(inc.bottleneck(id[i]), fresh.bottleneck(fresh_id[i])) << name << ", step " << k << ", start " << i;
      }
    }
  };
  auto start = [](int i) { return Step{i, -1, false}; };
  auto finish = [](int i) { return Step{-1, i, false}; };
  const Step assign{-1, -1, true};
  // The smallest case the F23 search found: one resource of 4 GB/s.
  run_case({4.0},
           {{{0, 0, 0}, 0.5}, {{0, 0, 0, 0}, 0.5}, {{0, 0, 0, 0}, 2.0}, {{0, 0, 0}, 1.0}, {{0}, 2.0}},
           {start(0), start(1), assign, start(2), start(3), assign, finish(1), finish(0), start(4), assign, finish(3),
            finish(2), assign},
           "smallest search case");
  // The shortest sequence that breaks a list (an exhaustive enumeration, depth 7), with an
  // assignment after every call. The last finish left resource 0's list holding the finished flow
  // 3 and not flow 1, whose rate resource 0 (2 GB/s, below resource 1's 3 and its demand) sets.
  run_case({2.0, 3.0},
           {{{0, 0, 0}, 1.0}, {{0, 1}, 10.0}, {{0}, 1.5}, {{0, 0, 0, 0}, 0.25}, {{0}, 1.0}},
           {start(0), assign, start(1), assign, start(2), assign, start(3), assign, finish(2), assign, finish(0),
            assign, finish(3), assign, start(4), assign, finish(1), assign},
           "depth-7 enumeration case");
}

}  // namespace
}  // namespace mok::sim
