// Layer simulation: exact analytic cases, conservation of bytes, signaling mechanisms, determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "mok/sim/error.hpp"
#include "mok/sim/report.hpp"
#include "result_checks.hpp"
#include "sim_test_util.hpp"

namespace mok::sim {
namespace {

using testing::layer;
using testing::simple_topology;
using testing::push_dispatch;
using testing::rank0_to_expert;
using testing::all_to_all_topk;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(LayerSim, OnePulledFlowTakesBytesOverBandwidthPlusARoundTrip) {
  // Rank 0's tokens all go to the expert on rank 1; rank 1's slots are empty.
  const auto cfg = layer(2, 512, 1, 1);
  const Workload w = rank0_to_expert(cfg, 1, 512, "one flow");
  ProtocolConfig p;
  p.dispatch = Direction::kPull;
  p.phases = Phases::kDispatch;
  p.comm_sms = 1;
  const Topology topo = simple_topology(2);
  const LayerResult r = simulate_layer(topo, w, p);
  const int64_t bytes = 512 * 1024 * 2;
  EXPECT_EQ(r.dispatch.data_end_ns, ceil_div(bytes, 100) + 2 * 1000);
  EXPECT_EQ(r.dispatch.scaleup_bytes, bytes);
  // Only rank 1 receives: the completion signal (last byte in -> it knows) has one sample, and
  // rank 0, which receives nothing, does not add its absolute completion time (review, 2026-12-05).
  EXPECT_EQ(r.dispatch.completion_signal.count, 1);
  EXPECT_LT(r.dispatch.completion_signal.max_ns, 10000);
}

TEST(LayerSim, IncastSharesTheReceiverPort) {
  // Every rank's tokens go to the single expert on rank 0: N-1 pushers share rank 0's in-port.
  for (int n : {2, 4, 8}) {
    const auto cfg = layer(n, 256, 1, 1);
    std::vector<int32_t> topk(cfg.num_slots(), 0);
    const Workload w = Workload::from_topk(cfg, topk, "incast");
    ProtocolConfig p = push_dispatch(Signaling::kFlagInData, 4);
    const LayerResult r = simulate_layer(simple_topology(n), w, p);
    const int64_t remote_wire = r.dispatch.scaleup_bytes;
    EXPECT_EQ(remote_wire, (n - 1) * ceil_div(int64_t{128} * 1024 * 2 * 128, 120) * 2) << n;
    // All senders finish together: total remote bytes over the one port, plus one-way latency.
    EXPECT_NEAR(static_cast<double>(r.dispatch.data_end_ns), static_cast<double>(ceil_div(remote_wire, 100) + 1000), 1.0)
        << n;
  }
}

TEST(LayerSim, AllToAllOnANonBlockingSwitchIsPortBound) {
  // Token t of rank r goes to every other rank (E = R, K = R-1): each GPU sends T rows to each peer.
  const int n = 6;
  const auto cfg = layer(n, 128, 1, n - 1);
  const Workload w = Workload::from_topk(cfg, all_to_all_topk(n, 128), "all-to-all");
  ProtocolConfig p = push_dispatch(Signaling::kFlagInData, n);  // one SM per peer, all concurrent
  const LayerResult r = simulate_layer(simple_topology(n), w, p);
  const int64_t per_pair = ceil_div(int64_t{128} * 1024 * 2 * 128, 120);
  EXPECT_NEAR(static_cast<double>(r.dispatch.data_end_ns), static_cast<double>(ceil_div((n - 1) * per_pair, 100) + 1000),
              1.0);
  EXPECT_NEAR(r.dispatch.nvlink_utilization * r.dispatch.end_ns, static_cast<double>((n - 1) * per_pair) / 100, 1e-6 * r.dispatch.end_ns);
}

Workload random_workload(int ranks, uint64_t seed, double exponent = 1.2) {
  RoutingSpec s;
  s.kind = RoutingKind::kPowerLaw;
  s.exponent = exponent;
  s.seed = seed;
  return generate_workload(layer(ranks, 512, 4, 4), s);
}

TEST(LayerSim, EveryByteSentArrivesOnce) {
  const Workload w = random_workload(8, 3);
  for (int mode = 0; mode < 3; ++mode) {  // push per_peer, pull, push row_order
    const Direction dir = mode == 1 ? Direction::kPull : Direction::kPush;
    for (auto sig : {Signaling::kFenceFlag, Signaling::kCounter, Signaling::kFlagInData, Signaling::kBarrier,
                     Signaling::kPeerFenceFlag}) {
      ProtocolConfig p;
      p.dispatch = dir;
      p.combine = dir;
      p.signaling = sig;
      p.comm_sms = 5;
      p.push_row_order = mode == 2;
      const LayerResult r = simulate_layer(simple_topology(8), w, p);
      for (const PhaseResult* ph : {&r.dispatch, &r.combine}) {
        EXPECT_EQ(ph->scaleout_bytes, 0);
        EXPECT_LE(ph->scaleup_bytes, ph->wire_bytes);
        EXPECT_EQ(ph->chunk_signal.count, ph->num_chunks) << to_string(dir) << " " << to_string(sig);
      }
      // The payload that arrives is exactly what the routing plan asks for (dedup per GPU for x,
      // one y row per slot).
      int64_t dispatch_payload = 0, combine_payload = 0;
      for (const auto& g : r.gpus) {
        dispatch_payload += g.recv_payload_bytes_dispatch;
        combine_payload += g.recv_payload_bytes_combine;
      }
      EXPECT_EQ(combine_payload, w.expert_offsets.back() * 1024 * 2);
      int64_t token_gpu_pairs = 0;
      for (int64_t g = 0; g < w.cfg.num_tokens(); ++g) {
        std::vector<char> seen(8, 0);
        for (int k = 0; k < 4; ++k) {
          const int32_t e = w.topk_experts[g * 4 + k];
          if (e >= 0 && !seen[w.cfg.owner_rank(e)]) seen[w.cfg.owner_rank(e)] = 1, ++token_gpu_pairs;
        }
      }
      EXPECT_EQ(dispatch_payload, token_gpu_pairs * 1024 * 2);
      int64_t nvl_out = -1, nvl_in = -2, hbm = 0;
      for (const auto& s : r.resources) {
        if (s.kind == "nvlink_out") nvl_out = s.bytes;
        if (s.kind == "nvlink_in") nvl_in = s.bytes;
        if (s.kind == "hbm") hbm = s.bytes;
      }
      EXPECT_EQ(nvl_out, nvl_in);
      EXPECT_EQ(nvl_out, r.dispatch.scaleup_bytes + r.combine.scaleup_bytes);
      // Every byte is read from one HBM and written to one HBM (local copies: the same one twice).
      EXPECT_EQ(hbm, 2 * (r.dispatch.wire_bytes + r.combine.wire_bytes));
      EXPECT_GT(r.layer_ns, 0);
    }
  }
}

TEST(LayerSim, PullKnowsArrivalSoonerThanFencedPush) {
  const Workload w = random_workload(8, 5, 0.0);
  ProtocolConfig push;
  push.dispatch = Direction::kPush;
  push.signaling = Signaling::kFenceFlag;
  push.phases = Phases::kDispatch;
  ProtocolConfig pull = push;
  pull.dispatch = Direction::kPull;
  const Topology topo = simple_topology(8);
  const LayerResult a = simulate_layer(topo, w, push);
  const LayerResult b = simulate_layer(topo, w, pull);
  // fence_flag: acks back (+L), fence overhead, flag write (+L) after the data lands.
  EXPECT_GE(a.dispatch.chunk_signal.p50_ns, 2 * 1000 + 100);
  EXPECT_LT(b.dispatch.chunk_signal.p99_ns, a.dispatch.chunk_signal.p50_ns);
}

TEST(LayerSim, BarrierAndCounterDelayKnowledgeToTheEnd) {
  const Workload w = random_workload(8, 9, 0.0);
  ProtocolConfig p;
  p.dispatch = Direction::kPush;
  p.phases = Phases::kDispatch;
  const Topology topo = simple_topology(8);
  p.signaling = Signaling::kFlagInData;
  const LayerResult flags = simulate_layer(topo, w, p);
  p.signaling = Signaling::kBarrier;
  const LayerResult barrier = simulate_layer(topo, w, p);
  p.signaling = Signaling::kCounter;
  const LayerResult counter = simulate_layer(topo, w, p);
  // With a barrier a chunk is known only after the last one everywhere: log2(8) = 3 rounds.
  EXPECT_GE(barrier.dispatch.end_ns - barrier.dispatch.data_end_ns, 3 * 1000);
  EXPECT_GT(barrier.dispatch.chunk_signal.p50_ns, flags.dispatch.chunk_signal.p99_ns);
  EXPECT_GT(counter.dispatch.chunk_signal.p50_ns, flags.dispatch.chunk_signal.p50_ns);
}

// Barrier signaling is collective (model audit, 2026-12-05): every GPU executes the barrier and
// leaves it only when every GPU has arrived, whatever it receives. Two GPUs of simple_topology
// (L = 1,000 ns, f = 100, 100 ns polls), one SM each: rank 0's 16 tokens go to its own expert (a
// local copy), rank 1's slots are empty. Rank 0's SM ends its copy at 33 ns and arrives at
// 33 + 2L + f = 2,133; rank 1's, with nothing to write, at 2L + f = 2,100. One round: rank 0 sees
// rank 1's flag at 3,100, polled at 3,200; rank 1 sees rank 0's at 3,133, polled at 3,300. Before
// the fix rank 0, which receives only its own chunk, knew it at 200 ns without waiting (rank 1,
// which receives nothing, waited); its chunk is still known early for its GEMM tiles.
TEST(LayerSim, BarrierSignalingHoldsEveryGpuWhateverItReceives) {
  const auto cfg = layer(2, 16, 1, 1);
  std::vector<int32_t> own(cfg.num_slots(), -1), empty(cfg.num_slots(), -1);
  for (int t = 0; t < 16; ++t) own[t] = 0;
  const Topology topo = simple_topology(2);
  ProtocolConfig p = push_dispatch(Signaling::kBarrier, 1);
  const LayerResult r = simulate_layer(topo, Workload::from_topk(cfg, own, "rank 0 to itself"), p);
  EXPECT_EQ(r.gpus[0].dispatch_known_ns, 3200);
  EXPECT_EQ(r.gpus[1].dispatch_known_ns, 3300);
  EXPECT_EQ(r.dispatch.chunk_signal.count, 1);
  EXPECT_LT(r.dispatch.chunk_signal.max_ns, 1000);  // the local chunk: a local flag, as before
  EXPECT_EQ(r.dispatch.completion_signal.count, 1);  // only rank 0 receives
  EXPECT_EQ(r.dispatch.completion_signal.max_ns, 3200 - r.dispatch.data_end_ns);
  // Every slot empty: the barrier still runs on every GPU (both arrive at 2,100 and leave at
  // 3,200), in a whole layer for both phases; the other schemes know at once.
  const Workload none = Workload::from_topk(cfg, empty, "all slots empty");
  const LayerResult e = simulate_layer(topo, none, p);
  for (const GpuTimeline& g : e.gpus) EXPECT_EQ(g.dispatch_known_ns, 3200);
  ProtocolConfig whole;
  whole.signaling = Signaling::kBarrier;
  whole.dispatch = whole.combine = Direction::kPush;
  whole.comm_sms = 1;
  const LayerResult layer_e = simulate_layer(topo, none, whole);
  for (const GpuTimeline& g : layer_e.gpus) {
    EXPECT_GE(g.dispatch_known_ns, 3200);
    EXPECT_GE(g.combine_known_ns, g.dispatch_known_ns + 3200);
  }
  whole.signaling = Signaling::kFlagInData;
  for (const GpuTimeline& g : simulate_layer(topo, none, whole).gpus) EXPECT_EQ(g.dispatch_known_ns, 0);
}

TEST(LayerSim, SameInputsGiveTheSameBytes) {
  const Workload w1 = random_workload(8, 21);
  const Workload w2 = random_workload(8, 21);
  ProtocolConfig p;
  p.comm_sms = 3;
  SimOptions opt;
  opt.record_trace = true;
  const LayerResult a = simulate_layer(simple_topology(8), w1, p, opt);
  const LayerResult b = simulate_layer(simple_topology(8), w2, p, opt);
  EXPECT_EQ(result_to_json(a, true).dump(), result_to_json(b, true).dump());
  EXPECT_EQ(chrome_trace_json(a), chrome_trace_json(b));
}

TEST(LayerSim, RowOrderPushSharesTheWindowAndBlocksTheFastDestinationBehindTheSlowOne) {
  // Every rank's tokens go to the expert on rank 0 (hot: three senders share its in-port) and to
  // one other rank's expert: rank 1's to rank 2, which only rank 1 feeds (cold, fast).
  const int n = 4;
  const int64_t T = 512;
  const auto cfg = layer(n, T, 1, 2);
  std::vector<int32_t> topk(cfg.num_slots());
  const int other[n] = {1, 2, 3, 1};
  for (int r = 0; r < n; ++r)
    for (int64_t t = 0; t < T; ++t) {
      topk[(r * T + t) * 2] = 0;
      topk[(r * T + t) * 2 + 1] = other[r];
    }
  const Workload w = Workload::from_topk(cfg, topk, "hot and cold");
  ProtocolConfig p = push_dispatch(Signaling::kFlagInData, 4);  // per_peer: one SM per peer, independent windows
  p.chunk_tokens = 32;
  const Topology topo = simple_topology(n);
  const LayerResult per_peer = simulate_layer(topo, w, p);
  p.push_row_order = true;  // 16 chunks: 4 per SM, each holding rows for rank 0 and rank 2
  const LayerResult row = simulate_layer(topo, w, p);
  // The hot in-port carries the same bytes either way and stays busy: its GPU finishes alike.
  const double hot_ratio = static_cast<double>(row.gpus[0].dispatch_known_ns) / per_peer.gpus[0].dispatch_known_ns;
  EXPECT_NEAR(hot_ratio, 1.0, 0.1);
  // per_peer: rank 2 gets its 1 MB at what rank 1's out-port has left beside its flow into the
  // hot port (100 - 33 GB/s: ~18 us). Row order: each of rank 1's SMs waits for its chunk's slow
  // writes to rank 0 before it writes the next chunk's rows to rank 2, so rank 2 finishes with
  // the hot GPU (~31 us, 1.7x later).
  EXPECT_GT(row.gpus[2].dispatch_known_ns, 3 * per_peer.gpus[2].dispatch_known_ns / 2);
  EXPECT_NEAR(static_cast<double>(row.gpus[2].dispatch_known_ns), static_cast<double>(row.gpus[0].dispatch_known_ns),
              0.15 * row.gpus[0].dispatch_known_ns);
  EXPECT_EQ(row.dispatch.scaleup_bytes, per_peer.dispatch.scaleup_bytes);

  // The window is shared: one SM per GPU with 64 KiB in flight over a 2 us round trip (32 GB/s).
  // per_peer: rank 1's SM serves rank 2 first (rotated order) with all of its window; row order:
  // rank 2 gets half of it (its half of each chunk's bytes), rank 0 the other half, although
  // no port is full: rank 2's throughput halves (~33 us -> ~66 us).
  Topology small = topo;
  small.sm_store_inflight_bytes = 65536;
  p.comm_sms = 1;
  p.push_row_order = false;
  const LayerResult win_peer = simulate_layer(small, w, p);
  p.push_row_order = true;
  const LayerResult win_row = simulate_layer(small, w, p);
  const LayerResult win_row2 = simulate_layer(small, w, p);
  EXPECT_GT(win_row.gpus[2].dispatch_known_ns, 9 * win_peer.gpus[2].dispatch_known_ns / 5);
  // Deterministic: same inputs, same bytes.
  EXPECT_EQ(result_to_json(win_row, true).dump(), result_to_json(win_row2, true).dump());
}

TEST(LayerSim, RateQuantumApproximationStaysClose) {
  const Workload w = random_workload(8, 4, 1.01);
  ProtocolConfig p;
  p.comm_sms = 4;
  SimOptions exact, fast;
  fast.rate_quantum_ns = 1000;
  const LayerResult a = simulate_layer(simple_topology(8), w, p, exact);
  const LayerResult b = simulate_layer(simple_topology(8), w, p, fast);
  EXPECT_NEAR(static_cast<double>(b.dispatch.end_ns), static_cast<double>(a.dispatch.end_ns), 0.05 * a.dispatch.end_ns);
  EXPECT_NEAR(static_cast<double>(b.layer_ns), static_cast<double>(a.layer_ns), 0.05 * a.layer_ns);
}

// A layer for the engine-equivalence tests below: power-law routing over `ranks` GPUs of a
// preset ("": simple_topology, 4 domains of 4 GPUs connected by NICs), 16 comm SMs, 64-token chunks.
struct EngineCase {
  const char* topology;
  int ranks;
  Direction dispatch;
  Signaling signaling;
  bool queueing;
  bool row_order;
  int64_t quantum_ns;
};
struct EngineInputs {
  Topology topo;
  Workload work;
  ProtocolConfig proto;
};
EngineInputs engine_inputs(const EngineCase& c, uint64_t seed) {
  RoutingSpec s;
  s.kind = RoutingKind::kPowerLaw;
  s.exponent = 1.2;
  s.seed = seed;
  EngineInputs in{simple_topology(4), generate_workload(layer(c.ranks, 256, 2, 4), s), ProtocolConfig{}};
  in.topo.num_domains = 4;
  if (*c.topology) in.topo = resolve_topology(c.topology);
  in.proto.dispatch = c.dispatch;
  in.proto.signaling = c.signaling;
  in.proto.push_row_order = c.row_order;
  in.proto.comm_sms = 16;
  in.proto.chunk_tokens = 64;
  return in;
}

// Exact rates: the incremental update and a full progressive filling at every change give the
// same integers, so every output byte agrees (protocols, signaling, one and several domains).
TEST(LayerSim, IncrementalRatesGiveTheSameBytesAsFullRecomputes) {
  for (const EngineCase& c : {EngineCase{"gb200-nvl72", 36, Direction::kPull, Signaling::kFenceFlag, false, false, 0},
                              EngineCase{"gb200-nvl72", 36, Direction::kPush, Signaling::kFenceFlag, true, false, 0},
                              EngineCase{"gb200-nvl72", 18, Direction::kPush, Signaling::kCounter, false, true, 0},
                              EngineCase{"hgx-h200", 8, Direction::kPush, Signaling::kPeerFenceFlag, false, false, 0},
                              EngineCase{"hgx-h200", 8, Direction::kPull, Signaling::kFenceFlag, true, false, 0},
                              EngineCase{"", 16, Direction::kPull, Signaling::kFenceFlag, false, false, 0},
                              EngineCase{"", 16, Direction::kPush, Signaling::kFlagInData, false, false, 0}}) {
    const EngineInputs in = engine_inputs(c, 1);
    SimOptions inc, full;
    inc.signal_queueing = full.signal_queueing = c.queueing;
    full.full_rate_recompute = true;
    EXPECT_EQ(result_to_json(simulate_layer(in.topo, in.work, in.proto, inc), true).dump(),
              result_to_json(simulate_layer(in.topo, in.work, in.proto, full), true).dump())
        << c.topology << " ranks " << c.ranks;
  }
}

// Under a rate quantum, a helper thread that applies each recompute's rate changes while the
// filling runs (SimOptions::threads) changes no output byte: protocols, signaling with port
// queueing, several domains, a trace.
TEST(LayerSim, HelperThreadGivesTheSameBytes) {
  for (const EngineCase& c : {EngineCase{"gb200-nvl72", 36, Direction::kPull, Signaling::kFenceFlag, false, false, 5000},
                              EngineCase{"gb200-nvl72", 36, Direction::kPush, Signaling::kFenceFlag, true, false, 2000},
                              EngineCase{"gb200-nvl72", 18, Direction::kPush, Signaling::kCounter, false, false, 1000},
                              EngineCase{"hgx-h200", 8, Direction::kPush, Signaling::kPeerFenceFlag, true, false, 500},
                              EngineCase{"", 16, Direction::kPull, Signaling::kFenceFlag, false, false, 3000},
                              EngineCase{"", 16, Direction::kPush, Signaling::kFlagInData, false, false, 700}}) {
    // A fixed routing per case (was std::random_device: a failure could not be reproduced), a
    // different seed for each case; the messages below name it.
    const uint64_t seed = 0x5eed0000u + static_cast<uint64_t>(c.ranks) * 131u + static_cast<uint64_t>(c.quantum_ns);
    const EngineInputs in = engine_inputs(c, seed);
    SimOptions one, two;
    one.signal_queueing = two.signal_queueing = c.queueing;
    one.rate_quantum_ns = two.rate_quantum_ns = c.quantum_ns;
    one.record_trace = two.record_trace = true;
    two.threads = 2;
    two.helper_min_comm_sms = 1;
    const LayerResult a = simulate_layer(in.topo, in.work, in.proto, one);
    const LayerResult b = simulate_layer(in.topo, in.work, in.proto, two);
    EXPECT_EQ(result_to_json(a, true).dump(), result_to_json(b, true).dump())
        << c.topology << " ranks " << c.ranks << " seed " << seed;
    EXPECT_EQ(chrome_trace_json(a), chrome_trace_json(b)) << c.topology << " ranks " << c.ranks << " seed " << seed;
  }
}

TEST(LayerSim, RejectsMoreRanksThanGpusAndTooManyCommSms) {
  const Workload w = random_workload(8, 1);
  ProtocolConfig p;
  EXPECT_THROW(simulate_layer(simple_topology(4), w, p), Error);
  p.comm_sms = 100;
  EXPECT_THROW(simulate_layer(simple_topology(8), w, p), Error);
}

// Row order across domains: a chunk's NIC member is moved by the NIC's DMA engines, so it takes
// no share of the SM's window: the NVLink member into the same domain lands as fast as without
// it (found by a model audit, 2026-12-05: it ran at half the rate when the NIC member counted).
TEST(LayerSim, RowOrderNicMembersTakeNoShareOfTheSmWindow) {
  Topology t = simple_topology(4);
  t.num_domains = 2;  // GPUs 0-3 and 4-7
  t.sm_store_inflight_bytes = 65536;  // the window binds (32 GB/s at a 2 us round trip)
  const int n = 8;
  const int64_t T = 64;
  const auto cfg = layer(n, T, 1, 2);
  auto run = [&](bool with_nic) {
    std::vector<int32_t> topk(cfg.num_slots(), -1);
    for (int64_t tok = 0; tok < T; ++tok) {  // rank 0's tokens: expert 1 (NVLink), expert 5 (NIC)
      topk[tok * 2] = 1;
      if (with_nic) topk[tok * 2 + 1] = 5;
    }
    const Workload w = Workload::from_topk(cfg, topk, with_nic ? "nvlink and nic" : "nvlink only");
    ProtocolConfig p = push_dispatch(Signaling::kFlagInData, 1);
    p.chunk_tokens = 16;
    p.push_row_order = true;
    return simulate_layer(t, w, p);
  };
  const LayerResult alone = run(false), both = run(true);
  EXPECT_GT(both.dispatch.scaleout_bytes, 0);
  EXPECT_EQ(both.gpus[1].dispatch_known_ns, alone.gpus[1].dispatch_known_ns);
}

// The two row-order tests' case: 8 GPUs of hgx-h200, every rank's 128 tokens to expert 2 (GPU 2's
// in-port is congested) and rank 0's also to expert `other`, 16-token row-order chunks on 8 SMs,
// with fence_flag and counter, each with and without signal queueing. check(r, sig, queueing,
// slow_end, other_end, p) runs for each, with the ends of rank 0's stores into GPU 2 and into GPU
// `other` (8 flows each, asserted here).
template <class Check>
void row_order_with_a_congested_destination(int other, const char* what, Check check) {
  const Topology topo = resolve_topology("hgx-h200");
  const int n = 8;
  const spec::LayerConfig cfg{7168, 2048, 0, n, 2, n, 128};
  std::vector<int32_t> topk(cfg.num_slots(), -1);
  for (int r = 0; r < n; ++r)
    for (int64_t t = 0; t < 128; ++t) {
      topk[(r * 128 + t) * 2] = 2;
      if (r == 0) topk[(r * 128 + t) * 2 + 1] = other;
    }
  const Workload w = Workload::from_topk(cfg, topk, what);
  const std::string other_name = "dispatch push 0->" + std::to_string(other);
  for (Signaling sig : {Signaling::kFenceFlag, Signaling::kCounter})
    for (bool queueing : {false, true}) {
      ProtocolConfig p = push_dispatch(sig, 8);
      p.chunk_tokens = 16;
      p.push_row_order = true;
      SimOptions o;
      o.record_trace = true;
      o.signal_queueing = queueing;
      const LayerResult r = simulate_layer(topo, w, p, o);
      SCOPED_TRACE(std::string(sig == Signaling::kCounter ? "counter" : "fence_flag") +
                   (queueing ? ", signal queueing" : ""));
      int64_t slow_end = 0, other_end = 0;
      int slow_flows = 0, other_flows = 0;
      for (const auto& span : r.trace) {
        if (span.gpu != 0) continue;
        if (span.name == "dispatch push 0->2") {
          ++slow_flows;
          slow_end = std::max(slow_end, span.end_ns);
        }
        if (span.name == other_name) {
          ++other_flows;
          other_end = std::max(other_end, span.end_ns);
        }
      }
      EXPECT_EQ(slow_flows, 8);
      EXPECT_EQ(other_flows, 8);
      check(r, sig, queueing, slow_end, other_end, p);
    }
}

// Row-order fenced push, a fast destination behind a slow one: each of rank 0's chunks writes rows
// to GPU 1 (fast) and GPU 2 (slow) under one window and one fence, which ends when the chunk's
// stores into GPU 2 have drained (their flow's end, the stall folded in: the last at 35,681 ns);
// no flag to GPU 1 can land before that plus L (36,381), and the receiver's 300 ns sweep sees it
// at 36,900, with GPU 2 (counter: GPU 1's atomics are served at once; GPU 2's 64 wait behind each
// other, 38,100 as before). Before the fix each member's fence was timed from its own end: GPU 1
// knew its data at 22,500 ns (its own stores ended at 21,301).
TEST(LayerSim, RowOrderFenceWaitsForTheChunksSlowestDestination) {
  const int64_t L = static_cast<int64_t>(resolve_topology("hgx-h200").nvlink_latency_ns);
  row_order_with_a_congested_destination(
      1, "one fast and one congested destination",
      [&](const LayerResult& r, Signaling sig, bool queueing, int64_t slow_end, int64_t fast_end,
          const ProtocolConfig&) {
        EXPECT_EQ(slow_end, 35681);
        EXPECT_EQ(fast_end, 21301);  // GPU 1's own stores end long before
        EXPECT_GE(r.gpus[1].dispatch_known_ns, slow_end + L);
        EXPECT_GE(r.gpus[2].dispatch_known_ns, slow_end + L);
        if (!queueing) {
          EXPECT_EQ(r.gpus[1].dispatch_known_ns, 36900);
          EXPECT_EQ(r.gpus[2].dispatch_known_ns, sig == Signaling::kCounter ? 38100 : 36900);
        }
      });
}

// Rank 0's tokens go to its own expert 0 and to the congested expert 2, so each of rank 0's
// row-order chunks holds local rows and rows for GPU 2. The SM writes both, fences once after its
// last NVLink store, then writes the flags: the local flag too follows the fence, which ends 2L + f
// after the last store into GPU 2 (at the flow's end, the fluid milestone holding the stall), and
// is then seen by a local poll (GPU 0 knew its rows at 12,300 ns before the fix).
TEST(LayerSim, RowOrderLocalFlagWaitsForTheChunksFence) {
  const int64_t poll = static_cast<int64_t>(resolve_topology("hgx-h200").local_poll_ns);
  row_order_with_a_congested_destination(
      0, "own rows in chunks with a congested destination",
      [&](const LayerResult& r, Signaling, bool, int64_t slow_end, int64_t local_end, const ProtocolConfig& p) {
        EXPECT_LT(local_end + 10000, slow_end);  // the local stores end long before
        // The fence ends at slow_end (= last store issue + 2L + f); the local flag is seen at the
        // next local poll after it.
        const int64_t fence_end = slow_end;
        EXPECT_GE(r.gpus[0].dispatch_known_ns, fence_end);
        const int64_t period = std::max(p.poll_interval_ns, poll);
        EXPECT_EQ(r.gpus[0].dispatch_known_ns, (fence_end + period - 1) / period * period + poll);
      });
}

TEST(LayerSim, MultiRackTrafficCrossesTheNics) {
  Topology t = simple_topology(4);
  t.num_domains = 2;
  const Workload w = random_workload(8, 2, 0.0);
  ProtocolConfig p;
  const LayerResult r = simulate_layer(t, w, p);
  EXPECT_GT(r.dispatch.scaleout_bytes, 0);
  EXPECT_GT(r.dispatch.scaleup_bytes, 0);
}

TEST(LayerSim, SignalQueueingDelaysFlagsByTheQueuedBytesAtACongestedPort) {
  // 7 senders push into GPU 0 (incast); each sender's one SM keeps W = 100 KB in flight, but the
  // in-port gives each flow 100/7 GB/s, so W - rate x 2L = 100000 - 14.29 x 2000 = 71.4 KB waits
  // at the port per flow: 7 x 71.4 KB / 100 GB/s = 5.0 us that every flag queues behind.
  const int n = 8;
  const auto cfg = layer(n, 512, 1, 1);
  const std::vector<int32_t> topk(cfg.num_slots(), 0);
  const Workload w = Workload::from_topk(cfg, topk, "incast");
  Topology topo = simple_topology(n);
  topo.sm_store_inflight_bytes = 100000;
  ProtocolConfig p = push_dispatch(Signaling::kFenceFlag, 4);
  SimOptions off, on;
  on.signal_queueing = true;
  const LayerResult a = simulate_layer(topo, w, p, off);
  const LayerResult b = simulate_layer(topo, w, p, on);
  const double rate = 100.0 / 7, expected_ns = 7 * (100000 - rate * 2000) / 100;
  ASSERT_GT(a.dispatch.chunk_signal.count, 7);
  EXPECT_EQ(a.dispatch.data_end_ns, b.dispatch.data_end_ns);  // the data itself is not slower
  EXPECT_NEAR(static_cast<double>(b.dispatch.chunk_signal.p50_ns - a.dispatch.chunk_signal.p50_ns), expected_ns,
              0.05 * expected_ns);
  // Pull needs no flag: nothing changes.
  p.dispatch = Direction::kPull;
  EXPECT_EQ(simulate_layer(topo, w, p, off).dispatch.chunk_signal.p50_ns,
            simulate_layer(topo, w, p, on).dispatch.chunk_signal.p50_ns);
}

// Signal queueing, the last flags (review, 2026-12-05): three senders push 512 tokens each into
// GPU 0 of an hgx-h200 whose in-port is cut to 30 x 0.8 = 24 GB/s, one SM per sender, four
// 128-token chunks of 1,835,008 B. The port gives each 8 GB/s, so all three end together at
// 3 x 7,340,032 B / 24 GB/s = 917,504 ns; that instant the queue they kept at the port (their
// window minus rate x round trip) drains with them. The last flags therefore wait for nothing:
// last byte issued 917,504 - (2L + f) = 915,804, landed at 916,504; fence done 917,504, flag at
// 918,204, seen by the 300 ns sweep at 918,600 -- with or without queueing. Before the fix the
// flags were charged the queue of the flows that had just ended (921,300 ns).
TEST(LayerSim, SignalQueueingChargesNoQueueToFlagsRaisedAsTheQueueDrains) {
  Topology topo = resolve_topology("hgx-h200");
  topo.nvlink_gbps = 30;
  const spec::LayerConfig cfg{7168, 2048, 0, 4, 1, 4, 512};
  std::vector<int32_t> topk(cfg.num_slots(), 0);
  for (int t = 0; t < 512; ++t) topk[t] = -1;  // GPU 0 sends nothing
  const Workload w = Workload::from_topk(cfg, topk, "three-way incast");
  ProtocolConfig p = push_dispatch(Signaling::kFenceFlag, 4);
  SimOptions off, on;
  on.signal_queueing = true;
  for (const SimOptions& o : {off, on}) {
    const LayerResult r = simulate_layer(topo, w, p, o);
    EXPECT_EQ(r.dispatch.data_end_ns, 916504);
    EXPECT_EQ(r.dispatch.end_ns, 918600);
    EXPECT_EQ(r.dispatch.completion_signal.max_ns, 918600 - 916504);
  }
}

// A row-order chunk that writes to a GPU of its own domain and to one across the NIC (review,
// 2026-12-05): hgx-h200 cut into 2 domains of 2 GPUs; rank 0's 512 tokens go to GPU 1 (NVLink)
// and GPU 2 (NIC), 4 chunks on 4 SMs. A chunk's NVLink member (1,835,008 B) gets all of the
// SM's window cap (23.406 GB/s: the NIC member is the NIC's, so it takes no share of the window,
// since a model audit of 2026-12-05; before, it took half and the flow ended at 158,500), and its
// fence waits for the acks of the SM's NVLink stores only: 2L + f = 1,700 ns folded in, so the
// flow ends at 78,400 + 1,700 = 80,100 ns. Its last byte left at 78,400 and lands at 79,100; the
// fence ends at 80,100, the flag lands at 80,800 and the receiver's 300 ns poll sees it at
// 81,300 (counter: the atomics land and are served before that poll too). Before the first
// fix, the fence was folded with the NIC member's latency (6,300 ns) but timed with the NVLink
// one's, so GPU 1 "knew" its data before its flows ended: an event in the past.
TEST(LayerSim, RowOrderChunkFencesOnItsNvlinkStoresOnly) {
  Topology topo = resolve_topology("hgx-h200");
  topo.num_domains = 2;
  topo.gpus_per_domain = 2;
  const spec::LayerConfig cfg{7168, 2048, 0, 4, 2, 4, 512};
  std::vector<int32_t> topk(cfg.num_slots(), -1);
  for (int t = 0; t < 512; ++t) {
    topk[2 * t] = 1;
    topk[2 * t + 1] = 2;
  }
  const Workload w = Workload::from_topk(cfg, topk, "one chunk, two domains");
  for (Signaling sig : {Signaling::kFenceFlag, Signaling::kCounter}) {
    ProtocolConfig p;
    p.dispatch = Direction::kPush;
    p.push_row_order = true;
    p.phases = Phases::kDispatch;
    p.signaling = sig;
    SimOptions o;
    o.record_trace = true;
    const LayerResult r = simulate_layer(topo, w, p, o);
    int nvlink_flows = 0;
    for (const auto& span : r.trace)
      if (span.gpu == 0 && span.name == "dispatch push 0->1") {
        ++nvlink_flows;
        EXPECT_EQ(span.end_ns, 80100);
      }
    EXPECT_EQ(nvlink_flows, 4);
    EXPECT_EQ(r.gpus[1].dispatch_known_ns, 81300);
  }
}

// Pulls are issued as loads (review, 2026-12-05): one 128-token chunk (1,835,008 B) pulled over
// hgx-h200 by one SM with TMA. The load issue rate caps it at 40 GB/s by default: 45,875.2 ns of
// loads, the last returning 2L = 1,400 ns later (47,276 after rounding up). With the load rate
// raised the 128 KiB load window over the round trip caps it (93.62 GB/s): 19,600 + 1,400 =
// 21,000 ns. The store rate plays no part in a pull.
TEST(LayerSim, PullIsBoundByTheLoadIssueRateOrTheLoadWindowNotTheStoreRate) {
  const spec::LayerConfig cfg{7168, 2048, 0, 2, 1, 2, 128};
  const Workload w = rank0_to_expert(cfg, 1, 128, "one pulled chunk");
  ProtocolConfig p;
  p.dispatch = Direction::kPull;
  p.phases = Phases::kDispatch;
  Topology topo = resolve_topology("hgx-h200");
  ASSERT_EQ(topo.sm_tma_load_gbps, 40);
  EXPECT_EQ(simulate_layer(topo, w, p).dispatch.data_end_ns, 47276);
  topo.sm_tma_store_gbps = 1;  // irrelevant to loads
  EXPECT_EQ(simulate_layer(topo, w, p).dispatch.data_end_ns, 47276);
  topo.sm_tma_load_gbps = 1000;
  EXPECT_EQ(simulate_layer(topo, w, p).dispatch.data_end_ns, 21000);
}

// The combine's clock in a whole layer starts at its first byte (review, 2026-12-05): GPU 0's
// experts get no rows (it runs only the shared expert and finishes early), GPU 1's get all 512.
// Before, the clock started when GPU 0 finished, long before any combine byte could move.
TEST(LayerSim, CombineClockStartsAtItsFirstByteNotAtAnIdleGpusFinish) {
  const spec::LayerConfig cfg{7168, 2048, 2048, 2, 1, 2, 256};
  const std::vector<int32_t> topk(cfg.num_slots(), 1);
  const Workload w = Workload::from_topk(cfg, topk, "one busy expert");
  ProtocolConfig p;
  p.dispatch = Direction::kPull;
  p.combine = Direction::kPush;
  const LayerResult r = simulate_layer(resolve_topology("hgx-h200"), w, p);
  const int64_t idle_done = r.gpus[0].compute_done_ns, busy_done = r.gpus[1].compute_done_ns;
  ASSERT_LT(idle_done, busy_done);
  // GPU 1 pushes its outputs once they are published (a local release fence after its compute).
  EXPECT_GE(r.combine.start_ns, busy_done);
  EXPECT_LE(r.combine.start_ns, busy_done + 1000);
  double recv = 0;
  for (const GpuTimeline& g : r.gpus) recv += static_cast<double>(g.recv_payload_bytes_combine);
  EXPECT_DOUBLE_EQ(r.combine.recv_gbps_per_gpu, recv / 2 / static_cast<double>(r.combine.end_ns - r.combine.start_ns));
}

TEST(LayerSim, FinalWeightedSumWaitsForTheGpusOwnSharedExpert) {
  // The weighted sum adds the shared expert's output to the routed results: a GPU whose combine
  // data is known early (all slots empty, or only other GPUs' tokens) still waits for its own
  // GEMMs. Before the fix the empty layer ended at the combine's completion (~1.7 us on hgx-h200
  // at T = 64) while the shared expert took ~14 us.
  const spec::LayerConfig cfg{7168, 2048, 2048, 2, 1, 2, 64};
  std::vector<int32_t> empty(cfg.num_slots(), -1);
  std::vector<int32_t> rank0_to_1(cfg.num_slots(), -1);
  for (int64_t t = 0; t < cfg.tokens_per_rank; ++t) rank0_to_1[t] = 1;  // rank 1's own tokens route nowhere
  for (const auto& [topk, name] : {std::pair{empty, "all slots empty"}, std::pair{rank0_to_1, "rank 0 to expert 1"}}) {
    const Workload w = Workload::from_topk(cfg, topk, name);
    for (Direction combine : {Direction::kPush, Direction::kPull}) {
      ProtocolConfig p;
      p.combine = combine;
      const LayerResult r = simulate_layer(resolve_topology("hgx-h200"), w, p);
      ASSERT_GT(r.compute_ns_max, 10000) << name;
      int64_t last_done = 0;
      for (size_t g = 0; g < r.gpus.size(); ++g) {
        EXPECT_GT(r.gpus[g].compute_done_ns, 0) << name << " gpu" << g;
        EXPECT_GT(r.gpus[g].done_ns, r.gpus[g].compute_done_ns) << name << " gpu" << g;
        EXPECT_GE(r.gpus[g].done_ns, r.gpus[g].combine_known_ns) << name << " gpu" << g;
        last_done = std::max(last_done, r.gpus[g].done_ns);
      }
      EXPECT_EQ(r.layer_ns, last_done) << name;
      EXPECT_GE(r.layer_ns, r.compute_ns_max) << name;
      ASSERT_FALSE(r.critical_path.empty()) << name;
      EXPECT_EQ(r.critical_path.back().end_ns, r.layer_ns) << name;
    }
  }
}

// Combine-only runs charge the final weighted sum as whole layers do (model audit, 2026-12-05:
// it took 0 ns there): on each token owner, a read of K slot rows and a write of one output row
// per token, (K + 1) x T x H x 2 bytes at the HBM rate, after its combine data is known. On
// hgx-h200 (4,800 GB/s), T = 512, K = 2, H = 7,168: 22,020,096 B, 4,588 ns. The combine's own
// figures (end, received GB/s) are the transfer's, as before: the sum is not part of the phase.
TEST(LayerSim, CombineOnlyRunsChargeTheFinalWeightedSum) {
  const spec::LayerConfig cfg{7168, 2048, 0, 4, 2, 4, 512};
  RoutingSpec s;
  s.seed = 7;
  const Workload w = generate_workload(cfg, s);
  const Topology topo = resolve_topology("hgx-h200");
  const int64_t sum_ns = ceil_div(int64_t{512} * 3 * 7168 * 2 * 1000, static_cast<int64_t>(topo.hbm_gbps * 1000));
  ASSERT_EQ(sum_ns, 4588);
  for (Direction combine : {Direction::kPush, Direction::kPull}) {
    ProtocolConfig p;
    p.phases = Phases::kCombine;
    p.combine = combine;
    const LayerResult r = simulate_layer(topo, w, p);
    int64_t last = 0;
    for (const GpuTimeline& g : r.gpus) {
      EXPECT_EQ(g.done_ns, g.combine_known_ns + sum_ns) << to_string(combine);
      last = std::max(last, g.done_ns);
    }
    EXPECT_EQ(r.layer_ns, last);
    EXPECT_EQ(r.layer_ns, r.combine.end_ns + sum_ns);
    ASSERT_FALSE(r.critical_path.empty());
    EXPECT_EQ(r.critical_path.back().what.rfind("final weighted sum", 0), 0u) << r.critical_path.back().what;
    EXPECT_EQ(r.critical_path.back().end_ns - r.critical_path.back().start_ns, sum_ns);
    double recv = 0;
    for (const GpuTimeline& g : r.gpus) recv += static_cast<double>(g.recv_payload_bytes_combine);
    EXPECT_DOUBLE_EQ(r.combine.recv_gbps_per_gpu, recv / 4 / static_cast<double>(r.combine.end_ns));
  }
}

TEST(LayerSim, PeerFenceFlagSerialisesOneRoundTripPerPeerPerSignalThread) {
  // All-to-all, one SM per peer: every flow ends at the same t. Each SM fences (+2L + f), the
  // GPU's signal thread sees that through a local flag (rounded to the 100 ns poll, + 100 ns),
  // then issues "fence; flag" per peer: flag k (k = 1..7) lands at t0 + f + (k-1)(2L + f) + L,
  // because each fence waits for the previous flag's ack. The receiver's poll adds the same
  // rounding. With 7 threads every peer gets the first slot.
  const int n = 8;
  const auto cfg = layer(n, 128, 1, n - 1);
  const Workload w = Workload::from_topk(cfg, all_to_all_topk(n, 128), "all-to-all");
  ProtocolConfig p = push_dispatch(Signaling::kPeerFenceFlag, n);
  const Topology topo = simple_topology(n);
  auto observe = [](int64_t v) { return ceil_div(v, 100) * 100 + 100; };
  const int64_t L = 1000, f = 100;
  for (int threads : {1, 2, 7}) {
    p.signal_threads = threads;
    const LayerResult r = simulate_layer(topo, w, p);
    const int64_t t_fluid = r.dispatch.data_end_ns - L;
    const int64_t t0 = observe(t_fluid + 2 * L + f);
    const int64_t slots = ceil_div(n - 1, threads);  // flags the busiest thread sends
    const int64_t last_flag = t0 + f + (slots - 1) * (2 * L + f) + L;
    EXPECT_EQ(r.dispatch.end_ns, observe(last_flag)) << threads;
    EXPECT_EQ(r.dispatch.num_signal_writes, n * (n - 1)) << threads;
    EXPECT_EQ(r.dispatch.completion_signal.max_ns, r.dispatch.end_ns - r.dispatch.data_end_ns) << threads;
  }
  // Pull needs no flag: unchanged by the push-only scheme.
  p.dispatch = Direction::kPull;
  p.signal_threads = 1;
  const LayerResult pull = simulate_layer(topo, w, p);
  EXPECT_LT(pull.dispatch.completion_signal.max_ns, 2 * L);
}

}  // namespace
}  // namespace mok::sim

namespace mok::sim {
namespace {

// Progress lines for long runs: with the interval at 0 every 4,096th time step reports the
// simulated time and transfers done; the results are the bytes of a run without them.
TEST(LayerSim, ProgressLinesChangeNoResult) {
  const Topology topo = resolve_topology("multi-rack:2");
  RoutingSpec s;
  s.seed = 3;
  const Workload w = generate_workload(layer(144, 128, 4, 8), s);
  const ProtocolConfig p;
  SimOptions quiet, chatty;
  std::vector<std::string> lines;
  chatty.progress = [&](const std::string& line) { lines.push_back(line); };
  chatty.progress_interval_s = 0;
  const LayerResult a = simulate_layer(topo, w, p, quiet);
  const LayerResult b = simulate_layer(topo, w, p, chatty);
  EXPECT_EQ(result_to_json(a, true).dump(), result_to_json(b, true).dump());
  ASSERT_FALSE(lines.empty()) << "no progress line in " << a.layer_ns << " ns of layer";
  EXPECT_NE(lines.front().find("transfers done"), std::string::npos) << lines.front();
}

}  // namespace
}  // namespace mok::sim

namespace mok::sim {
namespace {

// A fenced push's chunk, by hand (review, 2026-12-05): hgx-h200, where the SM's 32 KiB window
// over 2L = 1.4 us caps it (23.406 GB/s, below the 40 GB/s TMA store rate, which is raised to
// 1000 here only so that the window stays the one cap if the preset changes). Rank 0's 512
// tokens go to rank 1's expert, 4 chunks of 128 rows (1,835,008 B each), one SM each. A chunk's
// bytes take 78,400 ns; the fence after it (2L + f = 1,700 ns) is folded into the flow's rate, so
// its fluid milestone is 80,100 ns. Its last byte was issued at 78,400 and lands one way later:
// 79,100. The fence ends at 80,100, the flag lands at 80,800, the receiver's 100 ns sweep of 2
// flags (a 300 ns period here) sees it at 81,300.
TEST(LayerSim, FencedPushChunkArrivesBeforeItsFenceAndIsKnownAfterTheFlag) {
  Topology topo = resolve_topology("hgx-h200");
  topo.sm_tma_store_gbps = 1000;
  const spec::LayerConfig cfg{7168, 2048, 0, 2, 1, 2, 512};  // bf16 rows of 14,336 B
  const Workload w = rank0_to_expert(cfg, 1, 512, "one fenced push");
  ProtocolConfig p = push_dispatch(Signaling::kFenceFlag);
  const LayerResult r = simulate_layer(topo, w, p);
  EXPECT_EQ(r.dispatch.data_end_ns, 79100);
  EXPECT_EQ(r.dispatch.end_ns, 81300);
}

// Pull combine: a reading SM that reaches its wait at w polls the producer's "outputs ready" flag,
// which becomes visible at V = the producer's GEMMs' end + its local release fence: poll k is
// issued at w + kP, reads the flag one way later and returns one more way later, with P = max(poll
// interval, round trip) (2,000 ns here). So the SM's combine read starts at w + kP + 2L for the
// first k with w + kP + L >= V. Rank 0's tokens all go to rank 1's expert; rank 0's SMs push them
// first (w = the end of their dispatch transfer) or have nothing to dispatch (pull dispatch, w = 0).
// A 1,500 ns release fence, so that leaving it out moves most reads by a poll period. The combine's
// clock starts at its first transfer's start, earlier than others here.
TEST(LayerSim, PullCombinePollsTheProducersReadyFlagOncePerRoundTrip) {
  Topology topo = simple_topology(2);
  topo.local_fence_ns = 1500;
  const int64_t L = 1000, P = std::max<int64_t>(100, 2 * L);
  int checked = 0, staggered = 0;
  for (Direction dispatch : {Direction::kPush, Direction::kPull})
    for (int64_t tokens : {64, 200, 333}) {
      const auto cfg = layer(2, tokens, 1, 1);
      const Workload w = rank0_to_expert(cfg, 1, tokens, "rank 0 to rank 1");
      ProtocolConfig p;
      p.dispatch = dispatch;
      p.combine = Direction::kPull;
      p.signaling = Signaling::kFenceFlag;
      p.comm_sms = 6;
      p.chunk_tokens = 16;
      SimOptions o;
      o.record_trace = true;
      const LayerResult r = simulate_layer(topo, w, p, o);
      const int64_t visible = r.gpus[1].compute_done_ns + static_cast<int64_t>(topo.local_fence_ns);
      int64_t first = INT64_MAX, last = INT64_MIN;
      for (const TraceSpan& span : r.trace) {
        if (span.gpu != 0 || span.name != "combine pull 1->0") continue;
        first = std::min(first, span.start_ns);
        last = std::max(last, span.start_ns);
        int64_t wait_start = 0;  // the end of the same SM's dispatch transfer, if it had one
        for (const TraceSpan& d : r.trace)
          if (d.gpu == 0 && d.lane == span.lane && d.name == "dispatch push 0->1") wait_start = d.end_ns;
        const int64_t k = std::max<int64_t>(0, ceil_div(visible - L - wait_start, P));
        EXPECT_EQ(span.start_ns, wait_start + k * P + 2 * L)
            << to_string(dispatch) << " dispatch, " << tokens << " tokens, SM " << span.lane << ": waited from "
            << wait_start << " ns for the flag visible at " << visible << " ns";
        ++checked;
      }
      EXPECT_EQ(r.combine.start_ns, first) << to_string(dispatch) << " dispatch, " << tokens << " tokens";
      staggered += first < last;
    }
  EXPECT_GE(checked, 12);
  EXPECT_GE(staggered, 1) << "no case whose combine reads start at different times";
}

// The receiver of fence_flag sweeps one flag per source, 32 flags per local read: on R GPUs a
// sweep takes ceil(R / 32) local reads (100 ns each here, above the 100 ns poll interval from 33
// GPUs on). One fenced push from rank 0 to rank 1: its last flag lands 2L + fence after the
// chunk's last byte (data_end_ns), and the receiver sees it at the next sweep's end.
TEST(LayerSim, FenceFlagSweepReadsThirtyTwoFlagsPerLocalRead) {
  for (int ranks : {2, 32, 33, 64, 65, 100})
    for (int64_t tokens : {48, 100}) {
      const Topology topo = simple_topology(ranks);
      const auto cfg = layer(ranks, tokens, 1, 1);
      const Workload w = rank0_to_expert(cfg, 1, tokens, "one fenced push");
      ProtocolConfig p = push_dispatch(Signaling::kFenceFlag, 1);
      p.chunk_tokens = 16;
      const LayerResult r = simulate_layer(topo, w, p);
      const int64_t period = std::max<int64_t>(p.poll_interval_ns, ceil_div(ranks, 32) * 100);
      const int64_t lands = r.dispatch.data_end_ns + 2 * 1000 + 100;
      EXPECT_EQ(r.dispatch.end_ns, ceil_div(lands, period) * period + 100) << ranks << " ranks, " << tokens << " tokens";
    }
}

// The critical path goes back from the GPU that finished last, the lowest-index one on a tie
// (symmetric layers tie often): its segments join end to start from 0 to the layer's end, and
// the last one is that GPU's. Dispatch-only and whole layers, push and pull, random routing.
TEST(LayerSim, CriticalPathJoinsZeroToTheEndAtTheLowestLastGpu) {
  int ties = 0;
  for (uint64_t seed : {1, 2, 3})
    for (Phases phases : {Phases::kDispatch, Phases::kLayer})
      for (Direction dir : {Direction::kPush, Direction::kPull}) {
        const int n = 4;
        const Workload w = seed == 3 ? Workload::from_topk(layer(n, 64, 1, n - 1), all_to_all_topk(n, 64), "all-to-all")
                                     : random_workload(n, seed);
        ProtocolConfig p;
        p.phases = phases;
        p.dispatch = p.combine = dir;
        p.comm_sms = 8;
        const LayerResult r = simulate_layer(simple_topology(n), w, p);
        int last = 0;
        for (int g = 0; g < n; ++g)
          if (r.gpus[g].done_ns > r.gpus[last].done_ns) last = g;
        for (int g = last + 1; g < n; ++g) ties += r.gpus[g].done_ns == r.gpus[last].done_ns;
        const std::string where = "seed " + std::to_string(seed) + (phases == Phases::kLayer ? " layer " : " dispatch ") + to_string(dir);
        ASSERT_FALSE(r.critical_path.empty()) << where;
        EXPECT_EQ(r.critical_path.front().start_ns, 0) << where;
        for (size_t i = 1; i < r.critical_path.size(); ++i)
          EXPECT_EQ(r.critical_path[i].start_ns, r.critical_path[i - 1].end_ns) << where << ", segment " << i;
        EXPECT_EQ(r.critical_path.back().end_ns, r.layer_ns) << where;
        const std::string& what = r.critical_path.back().what;
        const std::string gpu = "gpu" + std::to_string(last);
        EXPECT_EQ(what.substr(what.size() - gpu.size()), gpu) << where << ": " << what;
      }
  EXPECT_GE(ties, 1) << "no case where two GPUs finish last together";
}

// Under counter and barrier signaling every remote chunk into a GPU becomes known at one instant,
// so the chunk that released a GPU's last tile is decided by the tie rule: the largest (known
// time, piece index), i.e. the pair's last chunk. Rank 0's tokens all go to rank 1, pushed by one
// SM in chunk order, and rank 0 finishes last (it waits for the combine): its critical path starts
// with rank 1's dispatch data up to that chunk's last byte, which is the last dispatch byte.
TEST(LayerSim, LastTileChunkOnAKnownTimeTieIsTheLastChunk) {
  for (Signaling sig : {Signaling::kCounter, Signaling::kBarrier}) {
    const auto cfg = layer(2, 256, 1, 1);
    const Workload w = rank0_to_expert(cfg, 1, 256, "rank 0 to rank 1");
    ProtocolConfig p;
    p.dispatch = p.combine = Direction::kPush;
    p.signaling = sig;
    p.comm_sms = 1;
    p.chunk_tokens = 32;
    const LayerResult r = simulate_layer(simple_topology(2), w, p);
    ASSERT_FALSE(r.critical_path.empty());
    EXPECT_EQ(r.critical_path.front().what, "dispatch data into gpu1 (bytes that released its last tile)") << to_string(sig);
    EXPECT_EQ(r.critical_path.front().end_ns, r.dispatch.data_end_ns) << to_string(sig);
  }
}

// A local copy (rank 0's tokens to its own expert) is issued by one SM that both loads and
// stores: it runs at the smaller of the two issue rates, pushed or pulled, whichever is smaller.
TEST(LayerSim, ALocalCopyRunsAtTheSmallerOfTheLoadAndStoreIssueRates) {
  const auto cfg = layer(2, 512, 1, 1);
  const Workload w = rank0_to_expert(cfg, 0, 512, "one local copy");
  const int64_t bytes = 512 * 1024 * 2;
  for (bool load_slower : {true, false})
    for (Direction dir : {Direction::kPush, Direction::kPull}) {
      Topology topo = simple_topology(2);
      topo.sm_store_gbps = topo.sm_tma_store_gbps = load_slower ? 100 : 40;
      topo.sm_load_gbps = topo.sm_tma_load_gbps = load_slower ? 40 : 100;
      ProtocolConfig p;
      p.dispatch = dir;
      p.phases = Phases::kDispatch;
      p.comm_sms = 1;
      const LayerResult r = simulate_layer(topo, w, p);
      EXPECT_EQ(r.dispatch.data_end_ns, ceil_div(bytes, 40)) << to_string(dir) << (load_slower ? ", loads" : ", stores") << " slower";
    }
}

// An expert GEMM tile costs its rows' three projections (gate, up, down: 2 x 3 x H x I FLOPs per
// row, a partial tile as a full one) at the compute SMs' share of the GEMM rate: peak x
// efficiency x (SMs - comm SMs) / SMs. Rank 0's 300 tokens go to rank 1's expert: ceil(300 /
// tile rows) tiles, the busiest GPU's compute time.
TEST(LayerSim, ExpertTilesCostThreeProjectionsAtTheComputeSmsShare) {
  const auto cfg = layer(2, 300, 1, 1);
  const Workload w = rank0_to_expert(cfg, 1, 300, "300 rows on rank 1");
  const Topology topo = simple_topology(2);
  for (int comm_sms : {1, 32, 60})
    for (int64_t tile_rows : {64, 128, 512}) {
      ProtocolConfig p;
      p.comm_sms = comm_sms;
      p.gemm_tile_rows = tile_rows;
      const LayerResult r = simulate_layer(topo, w, p);
      const double flops_per_ns = 1000 * 1e3 * 0.5 * (100 - comm_sms) / 100.0;
      const auto tile_ns = static_cast<int64_t>(std::ceil(2.0 * 3.0 * 1024 * 256 * static_cast<double>(tile_rows) / flops_per_ns));
      EXPECT_EQ(r.compute_ns_max, ceil_div(300, tile_rows) * tile_ns) << comm_sms << " comm SMs, tiles of " << tile_rows;
    }
}

// Rank 0's tokens each go to the experts of ranks 1 and 2 (top-2), which then do the same work
// and push their outputs back into rank 0 at the same nanosecond: the critical path names the
// producer by the tie rule, the largest (last byte, source), i.e. gpu2.
TEST(LayerSim, CombineProducersTyingOnTheLastByteNameTheHighestSource) {
  const auto cfg = layer(3, 128, 1, 2);
  std::vector<int32_t> topk(cfg.num_slots(), -1);
  for (int64_t t = 0; t < 128; ++t) topk[t * 2] = 1, topk[t * 2 + 1] = 2;
  const Workload w = Workload::from_topk(cfg, topk, "rank 0 to ranks 1 and 2");
  ProtocolConfig p;
  p.dispatch = p.combine = Direction::kPush;
  p.signaling = Signaling::kFlagInData;
  p.comm_sms = 3;
  const LayerResult r = simulate_layer(simple_topology(3), w, p);
  ASSERT_EQ(r.gpus[1].compute_done_ns, r.gpus[2].compute_done_ns);
  bool named = false;
  for (const PathSegment& s : r.critical_path) {
    EXPECT_EQ(s.what.find("combine gpu1 -> "), std::string::npos) << s.what;
    named |= s.what.rfind("combine gpu2 -> gpu0", 0) == 0;
  }
  EXPECT_TRUE(named) << "no segment names the combine from gpu2 to gpu0";
}

}  // namespace
}  // namespace mok::sim

namespace mok::sim {
namespace {

// Nearest-rank quantiles: the value at rank ceil(p x n) of the sorted samples, the same from
// quantiles_of (completion signals) and from the engine's histogram (chunk signals), whose
// samples from 2^18 ns on are kept apart from the dense counts.
TEST(LayerSim, QuantilesAreNearestRankInBothSummaries) {
  const std::vector<int64_t> seven = {70, 10, 60, 20, 50, 30, 40};
  const Quantiles a = quantiles_of(seven);
  EXPECT_EQ(a.count, 7);
  EXPECT_DOUBLE_EQ(a.mean_ns, 40.0);
  EXPECT_EQ(a.p50_ns, 40);  // rank 4 of 7
  EXPECT_EQ(a.p90_ns, 70);  // rank 7
  EXPECT_EQ(a.max_ns, 70);
  std::vector<int64_t> hundred_one;
  for (int64_t v = 1; v <= 101; ++v) hundred_one.push_back(v * 5000);  // 5 us .. 505 us: dense and overflow
  const Quantiles b = quantiles_of(hundred_one);
  EXPECT_EQ(b.p50_ns, 51 * 5000);  // rank 51
  EXPECT_EQ(b.p90_ns, 91 * 5000);  // rank ceil(90.9) = 91
  EXPECT_EQ(b.p99_ns, 100 * 5000);  // rank ceil(99.99) = 100
  EXPECT_EQ(b.max_ns, 101 * 5000);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("random samples from seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const std::vector<int64_t>& values : {seven, hundred_one}) {
    for (int round = 0; round < 2; ++round) {
      std::vector<int64_t> v = values;
      if (round == 1)
        for (int i = 0; i < 300; ++i) v.push_back(static_cast<int64_t>(rng() % 600000));
      detail::NsHistogram h;
      for (int64_t x : v) h.add(x);
      const Quantiles q = quantiles_of(v), g = h.summary();
      EXPECT_EQ(g.count, q.count);
      EXPECT_EQ(g.p50_ns, q.p50_ns);
      EXPECT_EQ(g.p90_ns, q.p90_ns);
      EXPECT_EQ(g.p99_ns, q.p99_ns);
      EXPECT_EQ(g.max_ns, q.max_ns);
      EXPECT_DOUBLE_EQ(g.mean_ns, q.mean_ns);
    }
  }
}

// The report writes each field from its own source: a result with a distinct value in every
// field, through result_to_json, flat_metrics (the CSV columns, in us) and the Chrome trace.
TEST(LayerSim, ReportWritesEveryFieldFromItsOwnSource) {
  LayerResult r;
  r.layer_ns = 123456;
  r.dispatch.simulated = true;
  r.dispatch.end_ns = 50000;
  r.dispatch.data_end_ns = 41000;
  r.dispatch.chunk_signal = Quantiles{10, 1500.5, 1200, 1900, 2700, 3100};
  r.dispatch.completion_signal = Quantiles{4, 2500.0, 2000, 2600, 2900, 3000};
  r.compute_ns_max = 7777;
  r.expert_load = LoadStats{10.0, 30.0, 29.0, 0.4, 3.0};
  r.gpu_load = LoadStats{20.0, 25.0, 24.0, 0.1, 1.25};
  r.resources.push_back(ResourceSummary{"nvlink_out", 2, 450, 999, 0.5, 0.7, "gpu1.nvlink_out"});
  r.gpus.push_back(GpuTimeline{100, 200, 300, 400, 5, 6, 7});
  r.trace.push_back(TraceSpan{0, -1, 1000, 3500, "tile 0", 0});
  r.trace.push_back(TraceSpan{0, 2, 2000, 2600, "dispatch push 0->1", 64});
  const nlohmann::json j = result_to_json(r, true);
  EXPECT_EQ(j["dispatch"]["data_end_ns"], 41000);
  EXPECT_EQ(j["dispatch"]["end_ns"], 50000);
  EXPECT_EQ(j["expert_load"]["p99"], 29.0);
  EXPECT_EQ(j["expert_load"]["max"], 30.0);
  EXPECT_EQ(j["resources"][0]["busiest"], "gpu1.nvlink_out");
  EXPECT_EQ(j["gpus"][0]["combine_known_ns"], 300);
  EXPECT_EQ(j["gpus"][0]["compute_done_ns"], 200);
  EXPECT_FALSE(j.contains("combine")) << "a phase that was not simulated is not written";
  std::map<std::string, double> m;
  for (const auto& [k, v] : flat_metrics(r)) m[k] = v;
  EXPECT_DOUBLE_EQ(m.at("layer_us"), 123.456);
  EXPECT_DOUBLE_EQ(m.at("dispatch_chunk_signal_p99_us"), 2.7);
  EXPECT_DOUBLE_EQ(m.at("dispatch_completion_signal_mean_us"), 2.5);
  EXPECT_DOUBLE_EQ(m.at("gpu_gini"), 0.1);
  EXPECT_DOUBLE_EQ(m.at("expert_gini"), 0.4);
  EXPECT_EQ(format_number(1.0 / 3.0), "0.3333333333");
  const nlohmann::json t = nlohmann::json::parse(chrome_trace_json(r));
  int spans = 0, instants = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "tile 0") {
      EXPECT_EQ(e["tid"], 100000) << "the compute queue's thread";
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2.5);
      ++spans;
    }
    if (e["ph"] == "X" && e["name"] == "dispatch push 0->1") {
      EXPECT_EQ(e["tid"], 2);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.6);
      ++spans;
    }
    if (e["ph"] == "i") {
      EXPECT_NE(e["name"], "combine known complete") << "dispatch-only result";
      ++instants;
    }
  }
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(instants, 2);  // dispatch known, layer done
}

// Perfetto draws the spans of one thread only if they nest or are disjoint, an enclosing span
// first. A row-order chunk's members start together and end apart, and were written shortest
// first (found by audit, fiftieth session). Spans are written by start, longest first; a span
// that would overlap a track's innermost open span in part goes on another track of its lane
// (tid + k * 1,000,000, named after the lane); nested and disjoint ones stay on the lane's own.
TEST(LayerSim, ChromeTraceSpansNestOnTheirThread) {
  LayerResult r;
  r.gpus.push_back(GpuTimeline{});
  r.trace.push_back(TraceSpan{0, 3, 0, 1500, "short", 1});  // recorded first: it finished first
  r.trace.push_back(TraceSpan{0, 3, 0, 2376, "long", 1});   // same start, encloses it
  r.trace.push_back(TraceSpan{0, 3, 1000, 4078, "b", 1});   // overlaps "long" in part: track 1
  r.trace.push_back(TraceSpan{0, 3, 2376, 3000, "c", 1});   // starts as "long" ends: track 0
  r.trace.push_back(TraceSpan{0, 3, 4078, 5000, "d", 1});   // after both: track 0
  r.trace.push_back(TraceSpan{0, -1, 100, 200, "tile", 0});  // the compute queue: its own thread
  const nlohmann::json t = nlohmann::json::parse(chrome_trace_json(r));
  std::map<std::string, int64_t> tid;
  std::vector<std::string> order;
  bool named = false;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      tid[e["name"].get<std::string>()] = e["tid"].get<int64_t>();
      order.push_back(e["name"].get<std::string>());
    }
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 1000003) named = e["args"]["name"] == "SM 3 (overlapping 1)";
  }
  EXPECT_EQ(tid.at("long"), 3);
  EXPECT_EQ(tid.at("short"), 3) << "a nested span stays on its lane's thread";
  EXPECT_EQ(tid.at("b"), 1000003);
  EXPECT_EQ(tid.at("c"), 3);
  EXPECT_EQ(tid.at("d"), 3);
  EXPECT_EQ(tid.at("tile"), 100000);
  EXPECT_TRUE(named) << "track 1 of SM 3 has no thread name";
  EXPECT_LT(std::find(order.begin(), order.end(), "long") - order.begin(),
            std::find(order.begin(), order.end(), "short") - order.begin())
      << "the enclosing span is written first";
}

// The fixed-width table (mok-sim's default output): every figure in its own column, from its own
// field, in microseconds where the field holds nanoseconds; a phase that was not simulated has
// no row. Each value below is distinct, so a field written from the wrong source shows.
TEST(LayerSim, TableWritesEveryFieldInItsColumn) {
  LayerResult r;
  r.layer_ns = 123456;
  r.compute_ns_max = 7777;
  r.combine.simulated = true;
  r.combine.end_ns = 50000;
  r.combine.data_end_ns = 41000;
  r.combine.recv_gbps_per_gpu = 321.5;
  r.combine.nvlink_utilization = 0.625;
  r.combine.chunk_signal = Quantiles{10, 1500.5, 1200, 1900, 2700, 3100};
  r.combine.completion_signal = Quantiles{4, 2500.0, 2000, 2600, 2900, 3300};
  r.combine.num_chunks = 4321;
  r.expert_load = LoadStats{10.5, 30.0, 29.0, 0.4, 3.0};
  r.gpu_load = LoadStats{20.5, 25.0, 24.0, 0.125, 1.25};
  r.critical_path.push_back(PathSegment{"gpu 3 expert GEMMs", 1500, 9250});
  r.resources.push_back(ResourceSummary{"nvlink_out", 72, 450, 999, 0.5, 0.75, "gpu1.nvlink_out"});
  const std::string want =
      "the title\n"
      "layer time 123.456 us   compute (busiest GPU) 7.777 us\n"
      "\n"
      "phase         end_us    data_us  recv_GB/s  nvl_util  sig_p50_us  sig_p99_us   compl_max    chunks\n"
      "combine       50.000     41.000      321.5     0.625       1.200       2.700       3.300      4321\n"
      "\n"
      "load                mean        max        p99     gini\n"
      "expert rows         10.5         30         29    0.400\n"
      "GPU rows            20.5         25         24    0.125\n"
      "\n"
      "critical path\n"
      "       1.500 ..      9.250 us  (    7.750)  gpu 3 expert GEMMs\n"
      "\n"
      "resource     count  GB/s each util_mean  util_max  busiest\n"
      "nvlink_out      72      450.0     0.500     0.750  gpu1.nvlink_out\n";
  EXPECT_EQ(format_table(r, "the title"), want);
}

// Two diagnostics that clamped report instead (model audit, 2026-12-05): a chunk known before its
// data landed (a negative signal latency, recorded as 0 before) and a critical-path segment that
// ends before it starts (dropped before) are internal errors, exit code 1, naming the quantity.
TEST(LayerSim, NegativeSignalLatencyAndBackwardPathSegmentAreInternalErrors) {
  detail::NsHistogram h;
  h.add(0);
  h.add(1500);
  try {
    h.add(-3);
    ADD_FAILURE() << "a negative signal latency was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("signal latency"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
  const Quantiles q = h.summary();
  EXPECT_EQ(q.count, 2);
  EXPECT_EQ(q.max_ns, 1500);

  std::vector<PathSegment> path;
  detail::append_path_segment(path, "dispatch signal at gpu1", 100, 100);  // zero length: kept
  detail::append_path_segment(path, "expert GEMMs on gpu1", 100, 250);
  ASSERT_EQ(path.size(), 2u);
  try {
    detail::append_path_segment(path, "combine completion signal at gpu3", 900, 850);
    ADD_FAILURE() << "a backward critical-path segment was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("combine completion signal at gpu3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(path.size(), 2u);
}

}  // namespace
}  // namespace mok::sim
