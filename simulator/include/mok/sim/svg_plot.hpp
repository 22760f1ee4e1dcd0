// Minimal SVG line plots for sweeps (no dependency): axes, ticks, one polyline per series.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mok/sim/scenario.hpp"

namespace mok::sim {

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // sorted by x when drawn
};

std::string svg_line_plot(const std::string& title, const std::string& x_label, const std::string& y_label,
                          std::vector<PlotSeries> series);

// A plot request from a scenario's "plots" list: {"file": "a.svg", "x": "/workload/exponent",
// "y": "dispatch_nvlink_util", "series": "/protocol/dispatch", "title": "..."}; y is a metric
// name (mean over trials), x and series are sweep paths. Returns the file name and SVG text.
// Checks a plot request against the sweep before anything runs (keys, types, sweep paths, the
// metric name); plot_from_rows() checks it again.
void check_plot_request(const nlohmann::json& request, const std::vector<SweepPoint>& points, const std::string& origin);
std::pair<std::string, std::string> plot_from_rows(const nlohmann::json& request, const std::vector<SweepPoint>& points,
                                                   const std::vector<RunRow>& rows, const std::string& origin);

}  // namespace mok::sim
