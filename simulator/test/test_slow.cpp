// Slow checks (label slow): the rate-quantum approximation against exact rates on the NVL72
// reference layer, the bound that README.md and VALIDATION.md quote.
#include <gtest/gtest.h>

#include <cmath>

#include "mok/sim/layer_sim.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim {
namespace {

spec::LayerConfig nvl72_layer(int64_t tokens) {
  spec::LayerConfig cfg;
  cfg.hidden = 7168;
  cfg.intermediate = 2048;
  cfg.shared_intermediate = 2048;
  cfg.num_ranks = 72;
  cfg.num_experts = 288;
  cfg.top_k = 8;
  cfg.tokens_per_rank = tokens;
  return cfg;
}

TEST(SlowLayerSim, RateQuantumStaysWithinOnePercentOnNvl72) {
  const Topology topo = resolve_topology("gb200-nvl72");
  for (RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kPowerLaw}) {
    RoutingSpec routing;
    routing.kind = kind;
    const Workload w = generate_workload(nvl72_layer(4096), routing);
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

}  // namespace
}  // namespace mok::sim
