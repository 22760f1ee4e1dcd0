// The simulated workload: layer shapes plus topk_experts with each expert's row count (the
// offsets of the spec's routing plan), and the routing generators.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mok/spec/config.hpp"
#include "mok/spec/routing_plan.hpp"

namespace mok::sim {

// Built only through from_topk() or generate_workload(), so the offsets always match
// topk_experts. The plan's canonical row lists are not kept: the engine cuts each expert's rows
// into GEMM tiles straight from the routing (layer_sim.cpp), in the plan's order.
struct Workload {
  spec::LayerConfig cfg;
  std::vector<int32_t> topk_experts;      // [G*K], global token order, -1 = empty slot
  std::vector<int64_t> expert_offsets;    // [E+1], as spec::build_routing_plan's
  std::string description;

  // Validates cfg and routing with the spec's own checks (message names the token and slot)
  // and counts each expert's rows. This is the entry point for golden files: a reader hands over
  // (cfg, topk_experts) in global token order.
  static Workload from_topk(const spec::LayerConfig& cfg, std::vector<int32_t> topk_experts,
                            std::string description);
  int64_t expert_rows(int64_t expert_idx) const {
    return expert_offsets[expert_idx + 1] - expert_offsets[expert_idx];
  }
};

// kGolden: routing from a golden file (mok-golden v1). The library stays free of HDF5: the CLI
// reads the file and hands the Workload over (generate_workload refuses this kind).
enum class RoutingKind { kUniform, kPowerLaw, kHot, kDirichlet, kTopkFile, kGolden };

// A routing generator. Popularity of expert e is p_e (normalised); each token draws K distinct
// experts by successive sampling without replacement from p (the rank's own mix when
// per_rank_skew > 0). Deterministic for a seed.
struct RoutingSpec {
  RoutingKind kind = RoutingKind::kUniform;
  double exponent = 1.2;        // power_law: p_e proportional to 1/(1+rank(e))^exponent
  int64_t num_hot = 1;          // hot: this many hot experts ...
  double hot_factor = 8.0;      // ... each this many times as popular as a cold one
  double alpha = 1.0;           // dirichlet: p ~ Dir(alpha, ..., alpha)
  double per_rank_skew = 0.0;   // in [0,1]: weight of a rank-local Dir(0.2) preference
  bool shuffle_experts = true;  // permute which expert ids are popular (seeded)
  double empty_slot_fraction = 0.0;  // fraction of slots set to -1 (dropped tokens)
  std::string topk_file;        // topk_file: raw little-endian int32 [R*T*K], global token order
  std::string golden_file;      // golden: path of the HDF5 file ("file" in scenarios)
  uint64_t seed = 1;
};

// Parses {"kind": "power_law", "exponent": 1.2, ...}; origin names the file for errors.
RoutingSpec routing_spec_from_json(const nlohmann::json& doc, const std::string& origin);
nlohmann::json routing_spec_to_json(const RoutingSpec& spec);
// threads > 1: ranks are drawn, and the routing plan built, on that many threads; the same
// workload, byte for byte (each rank draws from its own stream).
Workload generate_workload(const spec::LayerConfig& cfg, const RoutingSpec& spec, int threads = 1);

// Storage for generating one workload after another (Monte-Carlo trials): the same workload as
// generate_workload(cfg, spec), built in `buffers`, whose vectors keep their capacity from one
// call to the next (an NVL72 layer's routing and plan are ~50 MB, and fresh pages cost a page
// fault each). The result lives in buffers.workload until the next call.
struct WorkloadBuffers {
  Workload workload;
};
const Workload& generate_workload(const spec::LayerConfig& cfg, const RoutingSpec& spec, WorkloadBuffers& buffers,
                                  int threads = 1);

// The layer of the simulator's speed targets (mok-sim-bench, the slow tests): DeepSeek-V3 shapes
// (H 7168, I 2048, one shared expert of 2048), top-8, 4 experts per GPU (the spec places E/R
// experts per GPU, so 256 experts cannot be spread over 72 GPUs; 288 is the nearest multiple).
inline spec::LayerConfig speed_reference_layer(int64_t gpus, int64_t tokens_per_gpu = 8192) {
  spec::LayerConfig cfg;
  cfg.hidden = 7168;
  cfg.intermediate = 2048;
  cfg.shared_intermediate = 2048;
  cfg.num_ranks = gpus;
  cfg.num_experts = 4 * gpus;
  cfg.top_k = 8;
  cfg.tokens_per_rank = tokens_per_gpu;
  return cfg;
}

// Load statistics of a set of non-negative counts.
struct LoadStats {
  double mean = 0, max = 0, p99 = 0, gini = 0, max_over_mean = 0;
};
LoadStats load_stats(const std::vector<int64_t>& counts);

}  // namespace mok::sim
