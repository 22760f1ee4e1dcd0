// RapidCheck properties: more bandwidth is never slower; pushing more load onto one expert is
// never faster; a seed fixes the output; thread count does not change sweep results.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>

#include "mok/sim/flow_network.hpp"
#include "mok/sim/report.hpp"
#include "mok/sim/scenario.hpp"
#include "sim_test_util.hpp"

namespace mok::sim {
namespace {

using testing::layer;
using testing::simple_topology;

struct Case {
  int ranks;
  Workload work;
  ProtocolConfig proto;
};

rc::Gen<Case> gen_case(Phases phases) {
  return rc::gen::exec([phases] {
    const int ranks = *rc::gen::element(2, 4, 8);
    const int64_t tokens = *rc::gen::inRange<int64_t>(16, 300);
    RoutingSpec s;
    s.kind = RoutingKind::kPowerLaw;
    s.exponent = *rc::gen::element(0.0, 0.8, 1.2, 1.5);
    s.seed = *rc::gen::inRange<uint64_t>(1, 1u << 30);
    Case c{ranks, generate_workload(layer(ranks, tokens, 2, 2), s), {}};
    c.proto.phases = phases;
    c.proto.dispatch = *rc::gen::element(Direction::kPush, Direction::kPull);
    c.proto.combine = *rc::gen::element(Direction::kPush, Direction::kPull);
    c.proto.signaling = *rc::gen::element(Signaling::kFenceFlag, Signaling::kFlagInData, Signaling::kCounter,
                                          Signaling::kBarrier);
    c.proto.comm_sms = *rc::gen::inRange(1, 12);
    c.proto.chunk_tokens = *rc::gen::element<int64_t>(16, 64, 128);
    return c;
  });
}

RC_GTEST_PROP(Properties, MoreBandwidthIsNeverSlowerForOneTransferPerSm, ()) {
  // With every SM holding at most one transfer (comm_sms >= ranks), no ordering decision depends
  // on rates, so raising every bandwidth can only bring every milestone earlier.
  Case c = *gen_case(Phases::kDispatch);
  c.proto.comm_sms = c.ranks * *rc::gen::inRange(1, 3);
  const double factor = *rc::gen::inRange(100, 400) / 100.0;
  Topology slow = simple_topology(c.ranks);
  Topology fast = slow;
  fast.nvlink_gbps *= factor;
  fast.hbm_gbps *= factor;
  fast.sm_store_gbps *= factor;
  fast.sm_tma_store_gbps *= factor;
  const LayerResult a = simulate_layer(slow, c.work, c.proto);
  const LayerResult b = simulate_layer(fast, c.work, c.proto);
  RC_ASSERT(b.dispatch.end_ns <= a.dispatch.end_ns);
  RC_ASSERT(b.dispatch.data_end_ns <= a.dispatch.data_end_ns);
}

// Not a property of the whole layer: RapidCheck found layers that got ~1% slower with more
// NVLink bandwidth, because earlier arrivals reorder the FIFO tile queue and the SMs'
// sequential transfers (a list-scheduling anomaly in the sense of Graham, 1969), the same
// thing a real kernel with static schedules can do. README.md documents it.

RC_GTEST_PROP(Properties, PushingMoreLoadOntoOneExpertIsNeverFaster, ()) {
  // Concentrate load: move slots onto the hottest expert of the GPU whose dispatch completes
  // last, taking them from tokens that did not reach that GPU (so its bytes strictly grow).
  const int ranks = *rc::gen::element(2, 4, 8);
  RoutingSpec s;
  s.kind = RoutingKind::kPowerLaw;
  s.exponent = *rc::gen::element(0.0, 1.01, 1.5);
  s.seed = *rc::gen::inRange<uint64_t>(1, 1u << 30);
  const auto cfg = layer(ranks, *rc::gen::inRange<int64_t>(16, 300), 2, 2);
  const Workload base = generate_workload(cfg, s);
  ProtocolConfig p;
  p.phases = Phases::kDispatch;
  p.dispatch = Direction::kPush;
  p.signaling = *rc::gen::element(Signaling::kFenceFlag, Signaling::kFlagInData);
  p.comm_sms = ranks * *rc::gen::inRange(1, 3);
  const Topology topo = simple_topology(ranks);
  const LayerResult a = simulate_layer(topo, base, p);
  // The GPU whose data lands last is the one the extra load goes to.
  int64_t hot_gpu = 0;
  for (int g = 0; g < ranks; ++g)
    if (a.gpus[g].dispatch_known_ns > a.gpus[hot_gpu].dispatch_known_ns) hot_gpu = g;
  int64_t hot = cfg.first_expert(hot_gpu);
  for (int64_t e = hot; e < cfg.first_expert(hot_gpu) + cfg.experts_per_rank(); ++e)
    if (base.expert_rows(e) > base.expert_rows(hot)) hot = e;
  std::vector<int32_t> topk = base.topk_experts;
  const int moves = *rc::gen::inRange(1, 64);
  for (int m = 0; m < moves; ++m) {
    const int64_t g = *rc::gen::inRange<int64_t>(0, cfg.num_tokens());
    int32_t* row = &topk[g * cfg.top_k];
    bool reaches_hot_gpu = false;
    for (int k = 0; k < cfg.top_k; ++k) reaches_hot_gpu |= row[k] >= 0 && cfg.owner_rank(row[k]) == hot_gpu;
    if (!reaches_hot_gpu) row[*rc::gen::inRange<int>(0, static_cast<int>(cfg.top_k))] = static_cast<int32_t>(hot);
  }
  const Workload moved = Workload::from_topk(cfg, topk, "moved");
  const LayerResult b = simulate_layer(topo, moved, p);
  // Integer-nanosecond milestones round each rate change up by < 1 ns, so two different
  // workloads may differ by a few ns of rounding; allow 0.1%.
  RC_ASSERT(b.dispatch.end_ns >= a.dispatch.end_ns - a.dispatch.end_ns / 1000);
}

RC_GTEST_PROP(Properties, ASeedFixesTheOutput, ()) {
  const Case c = *gen_case(Phases::kLayer);
  const Topology topo = simple_topology(c.ranks);
  const Workload again = Workload::from_topk(c.work.cfg, c.work.topk_experts, "again");
  RC_ASSERT(result_to_json(simulate_layer(topo, c.work, c.proto), true).dump() ==
            result_to_json(simulate_layer(topo, again, c.proto), true).dump());
}

TEST(Properties, SweepResultsDoNotDependOnThreadCount) {
  const nlohmann::json doc = {
      {"topology", "hgx-h200"},
      {"layer", {{"hidden", 512}, {"intermediate", 256}, {"experts_per_rank", 2}, {"top_k", 4}, {"tokens_per_rank", 256}}},
      {"workload", {{"kind", "power_law"}, {"exponent", 1.2}, {"seed", 3}}},
      {"trials", 3},
      {"sweep", {{{"path", "/protocol/dispatch"}, {"values", {"push", "pull"}}}}}};
  const auto points = expand_sweep(doc, "test");
  ASSERT_EQ(points.size(), 2u);
  const auto one = run_points(points, "test", 1);
  const auto two = run_points(points, "test", 2);
  EXPECT_EQ(rows_to_csv(points, one), rows_to_csv(points, two));
  EXPECT_EQ(one.size(), 6u);
}

// The exact shortcuts (a departing flow with slack, a new flow that fits at its demand, a
// new flow that takes over a departed one's rate) must leave the rates a full progressive
// filling gives: random networks of GPU-like ports, random start/finish sequences.
RC_GTEST_PROP(FlowNetworkProperty, ShortcutsAgreeWithAFullRecompute, ()) {
  const int gpus = *rc::gen::inRange(2, 7);
  FlowNetwork inc, full;
  std::vector<int> hbm, out, in;
  for (int g = 0; g < gpus; ++g) {
    const double port = *rc::gen::element(40.0, 100.0, 450.0);
    for (FlowNetwork* net : {&inc, &full}) {
      const int h = net->add_resource(1000.0, "hbm");
      const int o = net->add_resource(port, "out");
      const int i = net->add_resource(port, "in");
      if (net == &inc) hbm.push_back(h), out.push_back(o), in.push_back(i);
    }
  }
  std::vector<int> live;  // flow ids (equal in both networks: same call sequence)
  int shortcuts = 0, takeovers = 0;
  const int steps = *rc::gen::inRange(5, 60);
  for (int step = 0; step < steps; ++step) {
    const bool finish = !live.empty() && *rc::gen::inRange(0, 3) == 0;
    FlowNetwork::Departed departed;
    bool have_departed = false, stale = false;
    if (finish) {
      const size_t k = *rc::gen::inRange<size_t>(0, live.size());
      const int f = live[k];
      // Without slack the remaining rates are not max-min fair until the departed flow's rate
      // is taken over in place or rates are recomputed (what the engine does).
      stale = !inc.path_has_slack(f);
      departed = inc.describe(f);
      have_departed = true;
      inc.finish_flow(f);
      full.finish_flow(f);
      live.erase(live.begin() + static_cast<long>(k));
    }
    const int s = *rc::gen::inRange(0, gpus), d = *rc::gen::inRange(0, gpus);
    int path[4];
    int n = 0;
    path[n++] = hbm[s];
    if (s != d) path[n++] = out[s], path[n++] = in[d];
    path[n++] = hbm[d];
    const double demand = *rc::gen::element(5.0, 18.0, 36.0, 1e6);
    const int a = inc.start_flow(path, n, demand, 1000);
    const int b = full.start_flow(path, n, demand, 1000);
    RC_ASSERT(a == b);
    live.push_back(a);
    const bool in_place = stale || (have_departed && *rc::gen::arbitrary<bool>());
    const bool ok = in_place ? inc.admit_in_place_of(a, departed) : inc.admit_at_demand(a);
    if (ok) ++shortcuts;
    if (ok && stale) ++takeovers;
    if (!ok) inc.recompute_rates();
    full.recompute_rates();
    for (int f : live)
      RC_ASSERT(std::abs(inc.flow(f).rate_gbps - full.flow(f).rate_gbps) <= 1e-9 * (1.0 + full.flow(f).rate_gbps));
  }
  RC_TAG(shortcuts > 0 ? "some shortcuts taken" : "no shortcut taken",
         takeovers > 0 ? "a rate taken over from a bottlenecked flow" : "no take-over");
}

}  // namespace
}  // namespace mok::sim
