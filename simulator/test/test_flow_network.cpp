// Max-min fair sharing: analytic single-flow, incast, all-to-all and demand-capped cases, exact
// in fixed-point rate units (an equal share is floor(capacity / flows)).
#include <gtest/gtest.h>

#include "mok/sim/flow_network.hpp"

namespace mok::sim {
namespace {

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

}  // namespace
}  // namespace mok::sim
