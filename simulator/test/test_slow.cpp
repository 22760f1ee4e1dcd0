// Slow checks (label slow): the rate-quantum approximation against exact rates on the NVL72
// reference layer, the bound that README.md and VALIDATION.md quote; incremental exact rates
// against full recomputes on two and four racks.
#include <gtest/gtest.h>

#include <cmath>

#include "mok/sim/layer_sim.hpp"
#include "mok/sim/report.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim {
namespace {

TEST(SlowLayerSim, RateQuantumStaysWithinOnePercentOnNvl72) {
  const Topology topo = resolve_topology("gb200-nvl72");
  for (RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kPowerLaw}) {
    RoutingSpec routing;
    routing.kind = kind;
    const Workload w = generate_workload(speed_reference_layer(72, 4096), routing);
    for (Direction dir : {Direction::kPull, Direction::kPush}) {
      ProtocolConfig p;
      p.dispatch = dir;
      SimOptions exact, fast;
      fast.rate_quantum_ns = 5000;
      const LayerResult a = simulate_layer(topo, w, p, exact);
      const LayerResult b = simulate_layer(topo, w, p, fast);
      for (auto [x, y] : {std::pair{a.layer_ns, b.layer_ns}, std::pair{a.dispatch.end_ns, b.dispatch.end_ns},
                          std::pair{a.combine.end_ns, b.combine.end_ns}})
        EXPECT_LE(std::abs(static_cast<double>(y - x)), 0.01 * static_cast<double>(x))
            << "routing " << static_cast<int>(kind) << " dispatch " << to_string(dir) << ": exact " << x
            << " ns, quantum 5 us " << y << " ns";
    }
  }
}

// The bench's multi-rack layers (mok-sim-bench racks2; racks4 with fewer tokens): the
// incremental update and a full progressive filling at every change give identical outputs.
TEST(SlowLayerSim, IncrementalRatesEqualFullRecomputesOnTwoAndFourRacks) {
  for (auto [racks, tokens] : {std::pair{2, int64_t{8192}}, std::pair{4, int64_t{2048}}}) {
    const Topology topo = resolve_topology("multi-rack:" + std::to_string(racks));
    RoutingSpec routing;
    routing.kind = RoutingKind::kUniform;
    const Workload w = generate_workload(speed_reference_layer(72 * racks, tokens), routing);
    SimOptions inc, full;
    full.full_rate_recompute = true;
    const LayerResult a = simulate_layer(topo, w, {}, inc);
    const LayerResult b = simulate_layer(topo, w, {}, full);
    EXPECT_EQ(a.num_rate_recomputes, b.num_rate_recomputes);
    EXPECT_EQ(result_to_json(a, true).dump(), result_to_json(b, true).dump()) << racks << " racks";
  }
}

}  // namespace
}  // namespace mok::sim
