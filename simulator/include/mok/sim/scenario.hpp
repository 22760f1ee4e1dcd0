// Scenario files (JSON): topology, layer shapes, workload, protocol, sweeps and Monte-Carlo
// trials; expanding and running them deterministically, serially or on several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mok/sim/layer_sim.hpp"
#include "mok/sim/protocol.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim {

struct Scenario {
  std::string name;
  Topology topo;
  spec::LayerConfig cfg;
  RoutingSpec routing;
  ProtocolConfig proto;
  SimOptions options;        // "engine": {"rate_quantum_ns": 0} (0 = exact max-min rates)
  int64_t trials = 1;        // Monte-Carlo trials per sweep point (workload seeds derived from routing.seed)
};

// Parses one (already patched) scenario document. `origin` names the file in errors.
Scenario scenario_from_json(const nlohmann::json& doc, const std::string& origin);

// One sweep point: the settings that define it and the patched document.
struct SweepPoint {
  std::vector<std::pair<std::string, nlohmann::json>> settings;  // JSON pointer -> value
  nlohmann::json doc;
};
// Limits that keep a mistyped sweep from exhausting memory: points of one sweep, and sweep
// points x trials of one scenario.
inline constexpr size_t kMaxSweepPoints = 100'000;
inline constexpr uint64_t kMaxRuns = 10'000'000;
// Expands "sweep": [{"path": "/protocol/dispatch", "values": ["push", "pull"]}, ...] into the
// cartesian product, first axis outermost. No "sweep" gives one point. Throws Error past
// kMaxSweepPoints.
std::vector<SweepPoint> expand_sweep(const nlohmann::json& doc, const std::string& origin);
// `origin` with the point's settings, as errors about that point name it:
// "s.json [/protocol/chunk_tokens=64]".
std::string point_origin(const SweepPoint& p, const std::string& origin);

struct RunRow {
  size_t point_idx = 0;
  int64_t trial_idx = 0;
  uint64_t workload_seed = 0;
  std::vector<std::pair<std::string, double>> metrics;
};

// Runs every point and trial; results come back in (point, trial) order whatever num_threads is.
// `fixed_workload` (e.g. read from a golden file) replaces the generated routing in every run;
// each point's layer must then equal its config. `options` apply to every run (no trace).
// `progress`, when set, gets a line about every 2 s of wall time (runs done, time, an estimate
// of the time left); it never changes a result.
std::vector<RunRow> run_points(const std::vector<SweepPoint>& points, const std::string& origin, int num_threads,
                               const Workload* fixed_workload = nullptr,
                               const std::function<void(const std::string&)>& progress = {});
// Refuses sweep axes that set the workload where it cannot change: any /workload axis when a
// golden workload fixes the routing (`golden_workload`), and "golden" as a swept value (the
// golden file is read once, before the sweep). Errors name the /sweep/N entry. run_points calls it.
void check_sweep_workloads(const std::vector<SweepPoint>& points, const std::string& origin, bool golden_workload);
// Workload seed of trial i (trial 0 uses the scenario's own seed).
uint64_t trial_seed(uint64_t base_seed, int64_t trial_idx);

// CSV of all rows: sweep settings, trial, seed, metrics.
std::string rows_to_csv(const std::vector<SweepPoint>& points, const std::vector<RunRow>& rows);
// Per point summary over trials: mean, p50, p99, min, max of every metric.
std::string summary_csv(const std::vector<SweepPoint>& points, const std::vector<RunRow>& rows);

}  // namespace mok::sim
