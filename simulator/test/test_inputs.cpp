// Bad inputs get errors that name the file, the field and the fix; presets all load.
#include <gtest/gtest.h>

#include "mok/sim/error.hpp"
#include "mok/sim/protocol.hpp"
#include "mok/sim/scenario.hpp"
#include "mok/sim/topology.hpp"

namespace mok::sim {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Inputs, EveryPresetLoadsAndHasSources) {
  for (const auto& name : preset_names()) {
    const Topology t = resolve_topology(name);
    EXPECT_EQ(t.name, name);
    EXPECT_GE(t.sources.size(), 20u) << name;  // every number says where it comes from
  }
  const Topology racks = resolve_topology("multi-rack:8:800");
  EXPECT_EQ(racks.num_gpus(), 576);
  EXPECT_DOUBLE_EQ(racks.nic_gbps, 100.0);
}

TEST(Inputs, TopologyErrorsNameTheField) {
  nlohmann::json doc = preset_json("hgx-h200");
  doc["scale_up"]["nvlink_gbs"] = 450;
  EXPECT_NE(error_of([&] { topology_from_json(doc, "my.json"); }).find("my.json: unknown field 'scale_up.nvlink_gbs'"),
            std::string::npos);
  doc = preset_json("hgx-h200");
  doc["gpu"]["gemm_efficiency"] = 1.5;
  EXPECT_NE(error_of([&] { topology_from_json(doc, "my.json"); }).find("'gpu.gemm_efficiency' = 1.5 is out of range"),
            std::string::npos);
  doc = preset_json("hgx-h200");
  doc["scale_up"].erase("nvlink_gbps");
  EXPECT_NE(error_of([&] { topology_from_json(doc, "my.json"); }).find("'scale_up.nvlink_gbps'"), std::string::npos);
  // Every field is required, also those whose default is in range (audit 2026-12-05: these ran
  // silently with a latency of 0, one domain, no oversubscription).
  for (const char* key : {"scale_up.num_switch_chips", "scale_up.nvlink_latency_ns", "scale_out.num_domains",
                          "scale_out.uplink_oversubscription", "scale_out.nic_latency_ns", "signaling.fence_overhead_ns",
                          "signaling.local_fence_ns", "signaling.atomic_service_ns", "signaling.local_poll_ns"}) {
    const std::string k = key, section = k.substr(0, k.find('.')), field = k.substr(k.find('.') + 1);
    doc = preset_json("hgx-h200");
    ASSERT_TRUE(doc[section].contains(field)) << key;
    doc[section].erase(field);
    EXPECT_NE(error_of([&] { topology_from_json(doc, "my.json"); }).find("my.json: missing field '" + k + "'"),
              std::string::npos)
        << key << ": " << error_of([&] { topology_from_json(doc, "my.json"); });
  }
  // Overrides on a preset change one field of a complete topology.
  const Topology overridden =
      apply_overrides(resolve_topology("hgx-h200"), {{"scale_up.nvlink_latency_ns", 700}}, "s.json");
  EXPECT_DOUBLE_EQ(overridden.nvlink_latency_ns, 700);
  EXPECT_DOUBLE_EQ(apply_overrides(resolve_topology("multi-rack:2"), {{"scale_out.nic_latency_ns", 5000}}, "s.json")
                       .nic_latency_ns,
                   5000);
  EXPECT_NE(error_of([] { resolve_topology("multi-rack:0"); }).find("multi-rack:N"), std::string::npos);
  EXPECT_NE(error_of([] { resolve_topology("dgx-z9"); }).find("unknown topology preset 'dgx-z9'"), std::string::npos);
}

TEST(Inputs, ScenarioErrorsNameTheField) {
  nlohmann::json doc = {{"topology", "hgx-h200"},
                        {"layer", {{"hidden", 7168}, {"intermediate", 2048}, {"num_experts", 30}, {"top_k", 8},
                                   {"tokens_per_rank", 64}}}};
  EXPECT_NE(error_of([&] { scenario_from_json(doc, "s.json"); }).find("divisible by config.R"), std::string::npos);
  doc["layer"]["num_experts"] = 32;
  doc["protocol"] = {{"dispatch", "shove"}};
  EXPECT_NE(error_of([&] { scenario_from_json(doc, "s.json"); }).find("s.json: protocol.dispatch = \"shove\""),
            std::string::npos);
  doc["protocol"] = {{"comm_sms", 0}};
  EXPECT_NE(error_of([&] { scenario_from_json(doc, "s.json"); }).find("protocol.comm_sms = 0 is out of range"),
            std::string::npos);
  doc.erase("protocol");
  doc["workload"] = {{"kind", "zipf"}, {"exponnent", 1.2}};
  EXPECT_NE(error_of([&] { scenario_from_json(doc, "s.json"); }).find("workload.exponnent is unknown"),
            std::string::npos);
  doc.erase("workload");
  doc["sweep"] = {{{"path", "protocol/dispatch"}, {"values", {"push"}}}};
  EXPECT_NE(error_of([&] { expand_sweep(doc, "s.json"); }).find("not a JSON pointer"), std::string::npos);
  doc["sweep"] = {{{"path", "/protocol/dispatch"}, {"values", {"push", "pul"}}}};
  const auto points = expand_sweep(doc, "s.json");
  EXPECT_NE(error_of([&] { run_points(points, "s.json", 1); }).find("[/protocol/dispatch=\"pul\"]"),
            std::string::npos);
}

TEST(Inputs, TwoSweepAxesOnOneFieldAreRefused) {
  // The second axis would overwrite the first's value while runs.csv labels the run with both.
  nlohmann::json doc = {{"topology", "hgx-h200"},
                        {"layer", {{"hidden", 7168}, {"intermediate", 2048}, {"num_experts", 32}, {"top_k", 8},
                                   {"tokens_per_rank", 64}}},
                        {"sweep", {{{"path", "/protocol/dispatch"}, {"values", {"push", "pull"}}},
                                   {{"path", "/protocol/dispatch"}, {"values", {"pull"}}}}}};
  EXPECT_NE(error_of([&] { expand_sweep(doc, "s.json"); }).find("s.json: /sweep/1/path '/protocol/dispatch' repeats /sweep/0/path"),
            std::string::npos)
      << error_of([&] { expand_sweep(doc, "s.json"); });
  doc["sweep"][1] = {{"path", "/protocol"}, {"values", {nlohmann::json::object()}}};
  EXPECT_NE(error_of([&] { expand_sweep(doc, "s.json"); }).find("/sweep/1/path '/protocol' holds the field of /sweep/0/path"),
            std::string::npos);
  // An axis inside an earlier one's field sets it after: labelled correctly, so it stays allowed.
  doc["sweep"] = {{{"path", "/workload"}, {"values", {{{"kind", "uniform"}}, {{"kind", "hot"}}}}},
                  {{"path", "/workload/seed"}, {"values", {1, 2}}}};
  EXPECT_EQ(expand_sweep(doc, "s.json").size(), 4u);
}

TEST(Inputs, ASweepOnManyThreadsReportsTheLowestIndexFailure) {
  // Job 0 fails late (its workload is drawn first: 65,536 tokens a GPU, then the compute-overflow
  // refusal), jobs 1..5 fail at once (a topk_file that does not exist). On one thread job 0's
  // error comes first; several threads must report the same one, not whichever failed first in
  // time (before: the first failure in time, mostly a topk_file one).
  nlohmann::json base = {
      {"topology", {{"preset", "hgx-h200"}, {"overrides", {{"gpu.bf16_dense_tflops", 1}, {"gpu.gemm_efficiency", 0.01}}}}},
      {"layer", {{"hidden", 16777216}, {"intermediate", 16777216}, {"num_experts", 32}, {"top_k", 8},
                 {"tokens_per_rank", 65536}}}};
  std::vector<SweepPoint> points;
  for (int i = 0; i < 6; ++i) {
    SweepPoint p{{{"/n", i}}, base};
    if (i > 0) {
      p.doc["layer"]["tokens_per_rank"] = 64;
      p.doc["workload"] = {{"kind", "topk_file"}, {"topk_file", "/nonexistent/topk" + std::to_string(i) + ".bin"}};
    }
    points.push_back(std::move(p));
  }
  const std::string one = error_of([&] { run_points(points, "s.json", 1); });
  ASSERT_NE(one.find("s.json [/n=0]"), std::string::npos) << one;
  ASSERT_NE(one.find("1e17 ns"), std::string::npos) << one;
  for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(error_of([&] { run_points(points, "s.json", 4); }), one) << rep;
}

// Every protocol knob is read into its own field (no default left in place, no neighbour's field
// set), and protocol_to_json writes back what protocol_from_json reads: non-default values, each
// named as the scenario names it.
TEST(Inputs, ProtocolKnobsAreReadIntoTheirFieldsAndWrittenBack) {
  const nlohmann::json doc = {{"dispatch", "push"},        {"combine", "pull"},       {"signaling", "counter"},
                              {"copy_engine", "ldst"},     {"phases", "dispatch"},    {"chunk_tokens", 64},
                              {"comm_sms", 20},            {"signal_threads", 3},     {"poll_interval_ns", 250},
                              {"gemm_tile_rows", 96},      {"dispatch_dtype", "fp8"}, {"dispatch_dedup", false},
                              {"combine_reduce_per_rank", true}, {"push_order", "row_order"}};
  const ProtocolConfig p = protocol_from_json(doc, "s.json");
  EXPECT_EQ(p.dispatch, Direction::kPush);
  EXPECT_EQ(p.combine, Direction::kPull);
  EXPECT_EQ(p.signaling, Signaling::kCounter);
  EXPECT_EQ(p.copy_engine, CopyEngine::kLdSt);
  EXPECT_EQ(p.phases, Phases::kDispatch);
  EXPECT_EQ(p.chunk_tokens, 64);
  EXPECT_EQ(p.comm_sms, 20);
  EXPECT_EQ(p.signal_threads, 3);
  EXPECT_EQ(p.poll_interval_ns, 250);
  EXPECT_EQ(p.gemm_tile_rows, 96);
  EXPECT_EQ(p.dispatch_bytes_per_element, 1);
  EXPECT_FALSE(p.dispatch_dedup);
  EXPECT_TRUE(p.combine_reduce_per_rank);
  EXPECT_TRUE(p.push_row_order);
  EXPECT_EQ(protocol_to_json(p), doc);
  // The other value of each two-way knob, and every signaling scheme, copy engine and phase set.
  const nlohmann::json flipped = {{"dispatch", "pull"}, {"combine", "push"}, {"copy_engine", "tma"},
                                  {"dispatch_dtype", "bf16"}, {"push_order", "per_peer"}};
  const ProtocolConfig q = protocol_from_json(flipped, "s.json");
  EXPECT_EQ(q.dispatch, Direction::kPull);
  EXPECT_EQ(q.combine, Direction::kPush);
  EXPECT_EQ(q.copy_engine, CopyEngine::kTma);
  EXPECT_EQ(q.dispatch_bytes_per_element, 2);
  EXPECT_FALSE(q.push_row_order);
  EXPECT_EQ(protocol_to_json(q).count("push_order"), 0u) << "per_peer is the default and is not written";
  for (const char* s : {"fence_flag", "counter", "flag_in_data", "barrier", "peer_fence_flag"})
    EXPECT_EQ(protocol_to_json(protocol_from_json({{"signaling", s}}, "s.json"))["signaling"], s);
  for (const char* s : {"layer", "dispatch", "combine"})
    EXPECT_EQ(protocol_to_json(protocol_from_json({{"phases", s}}, "s.json"))["phases"], s);
}

TEST(Inputs, ProtocolIntegerKnobsTakeTheirWholeRange) {
  const struct {
    const char* key;
    int64_t lo, hi;
  } knobs[] = {{"chunk_tokens", 1, int64_t{1} << 24}, {"comm_sms", 1, 4096},          {"signal_threads", 1, 4096},
               {"poll_interval_ns", 1, 100000000},    {"gemm_tile_rows", 1, 65536}};
  for (const auto& k : knobs) {
    for (int64_t ok : {k.lo, k.hi})
      EXPECT_EQ(protocol_to_json(protocol_from_json({{k.key, ok}}, "s.json"))[k.key], ok) << k.key;
    for (int64_t bad : {k.lo - 1, k.hi + 1})
      EXPECT_NE(error_of([&] { protocol_from_json({{k.key, bad}}, "s.json"); }).find(std::string("protocol.") + k.key + " = " + std::to_string(bad) + " is out of range"),
                std::string::npos)
          << k.key << " = " << bad;
  }
}

// Topology values: an integer field refuses a fraction; at most 65,536 GPUs; multi-rack:N takes N from 1 to 56 racks at
// 400 Gb/s per GPU unless told 800; an override names itself as its value's source; a topology
// written out keeps its sources and reads back equal (the table mok-sim topology show prints).
TEST(Inputs, TopologyValuesRangesAndSourcesRoundTrip) {
  nlohmann::json doc = preset_json("hgx-h200");
  doc["gpu"]["num_sms"] = 132.5;
  EXPECT_NE(error_of([&] { topology_from_json(doc, "my.json"); }).find("'gpu.num_sms' must be an integer"),
            std::string::npos);
  for (int racks : {1, 56}) {
    const Topology t = resolve_topology("multi-rack:" + std::to_string(racks));
    EXPECT_EQ(t.num_domains, racks);
    EXPECT_EQ(t.num_gpus(), 72 * racks);
    EXPECT_DOUBLE_EQ(t.nic_gbps, 50.0) << "400 Gb/s by default";
  }
  EXPECT_NE(error_of([] { resolve_topology("multi-rack:57"); }).find("1 <= N <= 56"), std::string::npos);
  // At most 65,536 GPUs in all: 4,096 per domain times 17 domains is too many.
  EXPECT_NE(error_of([] {
              apply_overrides(resolve_topology("hgx-h200"), {{"scale_up.gpus_per_domain", 4096}, {"scale_out.num_domains", 17}},
                              "s.json");
            }).find("must be at most 65536"),
            std::string::npos);
  EXPECT_EQ(apply_overrides(resolve_topology("hgx-h200"), {{"scale_up.gpus_per_domain", 4096}, {"scale_out.num_domains", 16}},
                            "s.json")
                .num_gpus(),
            65536);
  const Topology o = apply_overrides(resolve_topology("hgx-h200"), {{"scale_up.nvlink_latency_ns", 700}}, "s.json");
  EXPECT_EQ(o.sources.at("scale_up.nvlink_latency_ns"), "override in s.json");
  for (const auto& name : preset_names()) {
    const Topology t = resolve_topology(name);
    const nlohmann::json j = topology_to_json(t);
    const Topology back = topology_from_json(j, name);
    EXPECT_EQ(back.sources, t.sources) << name;
    EXPECT_EQ(topology_to_json(back), j) << name;
  }
}

}  // namespace
}  // namespace mok::sim
