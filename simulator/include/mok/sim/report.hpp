// Result outputs: flat metrics, the fixed-width table, JSON, CSV rows and Chrome trace files.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mok/sim/layer_sim.hpp"

namespace mok::sim {

// Named scalar metrics of one run, in a fixed order (CSV columns, sweep plots, Monte-Carlo).
// What the run did not simulate is NaN (an empty CSV cell): a phase that protocol.phases leaves
// out, and the expert GEMMs unless the run is a whole layer.
std::vector<std::pair<std::string, double>> flat_metrics(const LayerResult& res);

nlohmann::json result_to_json(const LayerResult& res, bool per_gpu);
// Human-readable report: header lines, phase table, load statistics, critical path, resources.
std::string format_table(const LayerResult& res, const std::string& title);
// Chrome trace-event JSON (open in Perfetto or chrome://tracing): one process per GPU, one
// thread per comm SM, and one for the expert GEMM queue.
std::string chrome_trace_json(const LayerResult& res);

// Shortest round-trip text of a double, the same bytes on every run.
std::string format_number(double x);
// A metric's CSV cell: format_number(), or empty for NaN (not simulated).
std::string csv_number(double x);

}  // namespace mok::sim
