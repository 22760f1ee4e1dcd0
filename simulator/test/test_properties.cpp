// RapidCheck properties: more bandwidth is never slower; pushing more load onto one expert is
// never faster; a seed fixes the output; thread count does not change sweep results; the
// engine's GEMM tiles are the routing plan's.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>

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
  RoutingSpec spec;  // what generated `work`
};

rc::Gen<Case> gen_case(Phases phases) {
  return rc::gen::exec([phases] {
    const int ranks = *rc::gen::element(2, 4, 8);
    const int64_t tokens = *rc::gen::inRange<int64_t>(16, 300);
    RoutingSpec s;
    s.kind = RoutingKind::kPowerLaw;
    s.exponent = *rc::gen::element(0.0, 0.8, 1.2, 1.5);
    s.seed = *rc::gen::inRange<uint64_t>(1, 1u << 30);
    Case c{ranks, generate_workload(layer(ranks, tokens, 2, 2), s), {}, s};
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
  fast.sm_load_gbps *= factor;
  fast.sm_tma_load_gbps *= factor;
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
  // last, taking them from other GPUs' tokens that did not reach that GPU (so the bytes it
  // receives over NVLink strictly grow). A token of the hot GPU itself would turn a remote slot
  // into a local copy, which can well be faster (a counterexample CI found: 2,400 -> 2,300 ns).
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
    if (g / cfg.tokens_per_rank == hot_gpu) continue;  // the hot GPU's own token
    int32_t* row = &topk[g * cfg.top_k];
    bool reaches_hot_gpu = false;
    for (int k = 0; k < cfg.top_k; ++k) reaches_hot_gpu |= row[k] >= 0 && cfg.owner_rank(row[k]) == hot_gpu;
    if (!reaches_hot_gpu) row[*rc::gen::inRange<int>(0, static_cast<int>(cfg.top_k))] = static_cast<int32_t>(hot);
  }
  RC_PRE(topk != base.topk_experts);  // at least one slot moved (else the property is trivially true)
  const Workload moved = Workload::from_topk(cfg, topk, "moved");
  const LayerResult b = simulate_layer(topo, moved, p);
  RC_ASSERT(b.gpus[hot_gpu].recv_payload_bytes_dispatch > a.gpus[hot_gpu].recv_payload_bytes_dispatch);
  // Not a theorem of the model, only close to one, as for list schedules (Graham's anomalies):
  // - max-min sharing couples flows through shared ports: more bytes into the hot GPU from one
  //   source can end that source's transfer to a third GPU sooner, freeing its out-port for its
  //   own transfer to the hot GPU (a case CI found, 8 GPUs, 77 tokens, flag_in_data: the hot
  //   GPU's last byte 9 ns earlier, 3,204 -> 3,195 ns);
  // - a fenced transfer's rate holds one fence stall per chunk, so a slot moved into a new chunk
  //   of a transfer lowers that transfer's rate, and the others into the hot GPU get more of its
  //   in-port early instead of one slow flow running alone at the end (4 GPUs, 137 tokens,
  //   fence_flag: the hot GPU's last flow 4,537 -> 4,354 ns, known 5,700 -> 5,500);
  // - either shift can cross a boundary of the receiver's flag sweep (100 ns here).
  // Measured with this generator (20 x 10,000 cases): the phase end moved earlier in 9 cases,
  // each by one sweep after a 5-17 ns shift of the data; the second case above, by two sweeps,
  // came once in about 360,000. So: 0.1 % for integer-nanosecond rounding and two sweeps for
  // the anomalies (5 % was allowed until 2026-12-05; the two-sweep bound held over 5 x 20,000
  // cases, RapidCheck seeds 1-5); a mechanism that made concentrated load really faster fails it.
  const int64_t sweep = std::max<int64_t>(p.poll_interval_ns, static_cast<int64_t>(topo.local_poll_ns));
  RC_ASSERT(b.dispatch.end_ns >= a.dispatch.end_ns - a.dispatch.end_ns / 1000 - 2 * sweep);
}

RC_GTEST_PROP(Properties, ASeedFixesTheOutput, ()) {
  // The workload is drawn again from the same spec and seed: the same routing and the same bytes
  // of output; another seed draws another routing.
  const Case c = *gen_case(Phases::kLayer);
  const Topology topo = simple_topology(c.ranks);
  const Workload again = generate_workload(c.work.cfg, c.spec);
  RC_ASSERT(again.topk_experts == c.work.topk_experts);
  RC_ASSERT(result_to_json(simulate_layer(topo, c.work, c.proto), true).dump() ==
            result_to_json(simulate_layer(topo, again, c.proto), true).dump());
  RoutingSpec other = c.spec;
  other.seed = c.spec.seed + 1;
  RC_ASSERT(generate_workload(c.work.cfg, other).topk_experts != c.work.topk_experts);
}

// The engine leaves a GPU's HBM off remote flows' paths where it provably never saturates
// (LayerSim::choose_hbm_paths). Random layers on 1 or 2 domains, with HBM capacities around that
// bound (so that both choices, and saturating HBMs, occur), exact or under a rate quantum, with
// or without signal queueing: every output byte equals the run that keeps HBM on every path.
RC_GTEST_PROP(Properties, HbmLeftOffPathsChangesNoOutput, ()) {
  Case c = *gen_case(Phases::kLayer);
  Topology topo = simple_topology(c.ranks);
  if (c.ranks >= 4 && *rc::gen::arbitrary<bool>()) {
    topo.num_domains = 2;
    topo.gpus_per_domain = c.ranks / 2;
  }
  topo.sm_store_gbps = topo.sm_tma_store_gbps = topo.sm_load_gbps = topo.sm_tma_load_gbps = *rc::gen::element(20.0, 100.0, 1000.0);
  topo.hbm_gbps = *rc::gen::element(100.0, 250.0, 400.0, 700.0, 1500.0, 3000.0, 1e5);
  SimOptions off, on;
  off.rate_quantum_ns = on.rate_quantum_ns = *rc::gen::element<int64_t>(0, 0, 2000);
  off.signal_queueing = on.signal_queueing = *rc::gen::arbitrary<bool>();
  on.hbm_on_every_path = true;
  RC_ASSERT(result_to_json(simulate_layer(topo, c.work, c.proto, off), true).dump() ==
            result_to_json(simulate_layer(topo, c.work, c.proto, on), true).dump());
}

// The engine cuts each GPU's GEMM tiles from the runs build_traffic() keeps with the pieces
// (tile_ready.hpp, walked in token order); SimOptions::check_tiles cuts them again from
// spec::build_routing_plan's row lists and throws where rows or ready times differ. Random
// layers: 1-8 ranks, 1-4 experts per rank, top-1 to top-4, chunks that do and do not divide the
// tokens, tiles of 1-40 rows, empty slots, dedup on and off, push or pull, exact or quantised.
RC_GTEST_PROP(Properties, TilesFromPieceRunsAreThePlans, ()) {
  const int ranks = *rc::gen::inRange(1, 9);
  const int64_t per_rank = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t k = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(4, ranks * per_rank) + 1);
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 300);
  RoutingSpec s;
  s.kind = *rc::gen::element(RoutingKind::kUniform, RoutingKind::kPowerLaw, RoutingKind::kHot);
  s.exponent = 1.2;
  s.empty_slot_fraction = *rc::gen::element(0.0, 0.1);
  s.seed = *rc::gen::inRange<uint64_t>(1, 1u << 30);
  const Workload w = generate_workload(layer(ranks, tokens, per_rank, k), s);
  ProtocolConfig p;
  p.chunk_tokens = *rc::gen::inRange<int64_t>(1, 70);
  p.gemm_tile_rows = *rc::gen::inRange<int64_t>(1, 41);
  p.dispatch_dedup = *rc::gen::arbitrary<bool>();
  p.dispatch = *rc::gen::element(Direction::kPush, Direction::kPull);
  p.comm_sms = *rc::gen::inRange(1, 8);
  SimOptions o;
  o.check_tiles = true;
  o.rate_quantum_ns = *rc::gen::element<int64_t>(0, 2000);
  const LayerResult r = simulate_layer(simple_topology(ranks), w, p, o);  // throws where tiles differ
  RC_ASSERT(r.layer_ns > 0);
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

// The incremental rate update must give the full progressive filling's integers exactly: the
// same rate and bottleneck for every flow, the same changed flows, on random networks of
// GPU-like ports (HBM, NVLink out/in, NIC out/in behind two shared uplinks) under random batches
// of flow starts and finishes; and at the end of each sequence, the rates of a fresh network that
// holds only the live flows (which both networks' flow lists must agree with: a list that lost a
// live flow misleads both fillings alike). About one flow in eight names a GPU's HBM three to five
// times (a list-upkeep case the simulator's own paths, at most twice, never make). Capacities
// and demands come from small sets so that ties between resources, and between a demand and a
// share, are common. The cases that tell a wrong update
// apart are rare (a demand equal to a share as the filling passes it; a tracked resource's fixed
// flow accounted one point late): such mutants of flow_network.cpp failed only after 80 to 3,400
// sequences (mutation testing, simulator/notes/mutation_v46.md), so each case runs
// kSequencesPerCase of them (0.41 s for the 100 cases on the development VM, 2026-12-07).
constexpr int kSequencesPerCase = 48;
void check_update_sequence() {
  const int gpus = *rc::gen::inRange(2, 9);
  FlowNetwork inc, full;
  std::vector<int> hbm, out, in, nic_out, nic_in, up;
  for (FlowNetwork* net : {&inc, &full}) {
    std::vector<int> h, o, i, no, ni, u;
    for (int g = 0; g < gpus; ++g) {
      h.push_back(net->add_resource(1000.0, "hbm"));
      o.push_back(net->add_resource(g % 3 == 0 ? 40.0 : 100.0, "out"));
      i.push_back(net->add_resource(g % 2 == 0 ? 100.0 : 60.0, "in"));
      no.push_back(net->add_resource(50.0, "nic_out"));
      ni.push_back(net->add_resource(50.0, "nic_in"));
    }
    u.push_back(net->add_resource(120.0, "uplink0"));
    u.push_back(net->add_resource(90.0, "uplink1"));
    if (net == &inc) hbm = h, out = o, in = i, nic_out = no, nic_in = ni, up = u;
  }
  std::vector<int> live;  // flow ids (equal in both networks: same call sequence)
  struct Made {
    std::vector<int> path;
    double demand;
  };
  std::map<int, Made> made;  // live flow id -> its path and demand
  int updates = 0;
  const int batches = *rc::gen::inRange(3, 40);
  for (int b = 0; b < batches; ++b) {
    const int changes = *rc::gen::inRange(1, 8);
    for (int k = 0; k < changes; ++k) {
      if (!live.empty() && *rc::gen::inRange(0, 3) == 0) {
        const size_t at = *rc::gen::inRange<size_t>(0, live.size());
        inc.finish_flow(live[at]);
        full.finish_flow(live[at]);
        made.erase(live[at]);
        live.erase(live.begin() + static_cast<long>(at));
        continue;
      }
      const int s = *rc::gen::inRange(0, gpus), d = *rc::gen::inRange(0, gpus);
      const int route = *rc::gen::inRange(0, 3);
      int path[kMaxPathLen];
      int n = 0;
      if (*rc::gen::inRange(0, 8) == 0) {
        const int times = *rc::gen::inRange(3, 6);
        for (int t = 0; t < times; ++t) path[n++] = hbm[s];
      } else {
        path[n++] = hbm[s];
        if (s != d && route == 0) path[n++] = out[s], path[n++] = in[d];
        if (s != d && route > 0) {
          path[n++] = nic_out[s];
          if (route == 2) path[n++] = up[s % 2], path[n++] = up[d % 2];
          path[n++] = nic_in[d];
        }
        path[n++] = hbm[d];
      }
      const double demand = *rc::gen::element(5.0, 12.5, 20.0, 25.0, 36.0, 50.0, 1e6);
      const int a = inc.start_flow(path, n, demand, 1000);
      const int c = full.start_flow(path, n, demand, 1000);
      RC_ASSERT(a == c);
      live.push_back(a);
      made[a] = Made{std::vector<int>(path, path + n), demand};
    }
    inc.update_rates();
    full.recompute_rates();
    ++updates;
    for (int f : live) {
      if (inc.flow(f).rate_units != full.flow(f).rate_units || inc.bottleneck(f) != full.bottleneck(f))
        RC_FAIL("flow " + std::to_string(f) + " after update " + std::to_string(updates) + ": incremental rate " +
                std::to_string(inc.flow(f).rate_units) + " bottleneck " + std::to_string(inc.bottleneck(f)) +
                ", full " + std::to_string(full.flow(f).rate_units) + " bottleneck " +
                std::to_string(full.bottleneck(f)));
    }
    std::vector<int> ci = inc.changed_flows(), cf = full.changed_flows();
    std::sort(ci.begin(), ci.end());
    std::sort(cf.begin(), cf.end());
    RC_ASSERT(ci == cf);
  }
  FlowNetwork fresh;
  for (int r = 0; r < inc.num_resources(); ++r) fresh.add_resource(inc.capacity(r), inc.resource_name(r));
  std::vector<std::pair<int, int>> pairs;  // (live id, fresh id)
  for (const auto& [f, m] : made)
    pairs.emplace_back(f, fresh.start_flow(m.path.data(), static_cast<int>(m.path.size()), m.demand, 1000));
  fresh.recompute_rates();
  RC_ASSERT(inc.active_flows().size() == made.size());
  for (const auto& [f, g] : pairs)
    if (inc.flow(f).rate_units != fresh.flow(g).rate_units || inc.bottleneck(f) != fresh.bottleneck(g))
      RC_FAIL("flow " + std::to_string(f) + " at the end: rate " + std::to_string(inc.flow(f).rate_units) +
              " bottleneck " + std::to_string(inc.bottleneck(f)) + ", a fresh network's " +
              std::to_string(fresh.flow(g).rate_units) + " bottleneck " + std::to_string(fresh.bottleneck(g)));
}
RC_GTEST_PROP(FlowNetworkProperty, IncrementalUpdateEqualsFullRecompute, ()) {
  for (int i = 0; i < kSequencesPerCase; ++i) check_update_sequence();
}

// Which index a flow gets (a reserved slot or a free index) changes nothing but the index: a
// network whose flows take random slots gives, flow for flow, the rates and changed flows of one
// without slots, through incremental updates.
RC_GTEST_PROP(FlowNetworkProperty, SlotsDoNotChangeRates, ()) {
  const int gpus = *rc::gen::inRange(2, 7);
  const int num_slots = *rc::gen::inRange(0, 12);
  FlowNetwork with, without;
  with.reserve_slots(num_slots);
  std::vector<int> out, in;
  for (FlowNetwork* net : {&with, &without}) {
    out.clear();
    in.clear();
    for (int g = 0; g < gpus; ++g) {
      out.push_back(net->add_resource(g % 3 == 0 ? 40.0 : 100.0, "out"));
      in.push_back(net->add_resource(g % 2 == 0 ? 100.0 : 60.0, "in"));
    }
  }
  std::vector<std::pair<int, int>> live;  // (index with slots, index without)
  const int batches = *rc::gen::inRange(2, 30);
  for (int b = 0; b < batches; ++b) {
    const int changes = *rc::gen::inRange(1, 8);
    for (int k = 0; k < changes; ++k) {
      if (!live.empty() && *rc::gen::inRange(0, 3) == 0) {
        const size_t at = *rc::gen::inRange<size_t>(0, live.size());
        with.finish_flow(live[at].first);
        without.finish_flow(live[at].second);
        live.erase(live.begin() + static_cast<long>(at));
        continue;
      }
      int path[2] = {out[*rc::gen::inRange(0, gpus)], in[*rc::gen::inRange(0, gpus)]};
      const double demand = *rc::gen::element(12.5, 25.0, 50.0, 1e6);
      const int slot = *rc::gen::inRange(-1, num_slots + 2);
      const int a = with.start_flow(path, 2, demand, 1000, slot);
      const int c = without.start_flow(path, 2, demand, 1000);
      for (const auto& [x, y] : live) RC_ASSERT(x != a);
      live.emplace_back(a, c);
    }
    with.update_rates();
    without.update_rates();
    std::vector<int> map(static_cast<size_t>(num_slots) + 64 * 30 + 64, -1);
    for (const auto& [x, y] : live) {
      RC_ASSERT(with.flow(x).rate_units == without.flow(y).rate_units);
      map[static_cast<size_t>(x)] = y;
    }
    std::vector<int> cw, cn = without.changed_flows();
    for (int f : with.changed_flows()) cw.push_back(map[static_cast<size_t>(f)]);
    std::sort(cw.begin(), cw.end());
    std::sort(cn.begin(), cn.end());
    RC_ASSERT(cw == cn);
  }
}

}  // namespace
}  // namespace mok::sim
