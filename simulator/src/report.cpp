// Formatting of simulation results as table, JSON, CSV values and Chrome trace events.
#include "mok/sim/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace mok::sim {

std::string format_number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

std::string csv_number(double x) { return std::isnan(x) ? std::string() : format_number(x); }

namespace {
double us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

nlohmann::json quantiles_json(const Quantiles& q) {
  return nlohmann::json{{"count", q.count}, {"mean_ns", q.mean_ns}, {"p50_ns", q.p50_ns},
                        {"p90_ns", q.p90_ns}, {"p99_ns", q.p99_ns}, {"max_ns", q.max_ns}};
}
nlohmann::json phase_json(const PhaseResult& p) {
  return nlohmann::json{{"start_ns", p.start_ns},
                        {"end_ns", p.end_ns},
                        {"data_end_ns", p.data_end_ns},
                        {"wire_bytes", p.wire_bytes},
                        {"scaleup_bytes", p.scaleup_bytes},
                        {"scaleout_bytes", p.scaleout_bytes},
                        {"payload_bytes_max_gpu", p.payload_bytes_max_gpu},
                        {"recv_gbps_per_gpu", p.recv_gbps_per_gpu},
                        {"nvlink_utilization", p.nvlink_utilization},
                        {"chunk_signal", quantiles_json(p.chunk_signal)},
                        {"completion_signal", quantiles_json(p.completion_signal)},
                        {"num_chunks", p.num_chunks},
                        {"num_signal_writes", p.num_signal_writes}};
}
nlohmann::json load_json(const LoadStats& s) {
  return nlohmann::json{{"mean", s.mean}, {"max", s.max}, {"p99", s.p99}, {"gini", s.gini},
                        {"max_over_mean", s.max_over_mean}};
}
}  // namespace

std::vector<std::pair<std::string, double>> flat_metrics(const LayerResult& r) {
  std::vector<std::pair<std::string, double>> m;
  constexpr double kNotRun = std::numeric_limits<double>::quiet_NaN();
  m.emplace_back("layer_us", us(r.layer_ns));
  for (int ph = 0; ph < 2; ++ph) {
    const PhaseResult& p = ph == 0 ? r.dispatch : r.combine;
    const std::string n = ph == 0 ? "dispatch" : "combine";
    const bool on = p.simulated;
    m.emplace_back(n + "_us", on ? us(p.end_ns) : kNotRun);
    m.emplace_back(n + "_data_us", on ? us(p.data_end_ns) : kNotRun);
    m.emplace_back(n + "_recv_gbps", on ? p.recv_gbps_per_gpu : kNotRun);
    m.emplace_back(n + "_nvlink_util", on ? p.nvlink_utilization : kNotRun);
    m.emplace_back(n + "_chunk_signal_p50_us", on ? us(p.chunk_signal.p50_ns) : kNotRun);
    m.emplace_back(n + "_chunk_signal_p99_us", on ? us(p.chunk_signal.p99_ns) : kNotRun);
    m.emplace_back(n + "_completion_signal_max_us", on ? us(p.completion_signal.max_ns) : kNotRun);
    m.emplace_back(n + "_completion_signal_mean_us", on ? p.completion_signal.mean_ns / 1000.0 : kNotRun);
  }
  m.emplace_back("compute_max_us", r.dispatch.simulated && r.combine.simulated ? us(r.compute_ns_max) : kNotRun);
  m.emplace_back("expert_max_over_mean", r.expert_load.max_over_mean);
  m.emplace_back("expert_gini", r.expert_load.gini);
  m.emplace_back("gpu_max_over_mean", r.gpu_load.max_over_mean);
  m.emplace_back("gpu_gini", r.gpu_load.gini);
  return m;
}

nlohmann::json result_to_json(const LayerResult& r, bool per_gpu) {
  nlohmann::json j;
  j["layer_ns"] = r.layer_ns;
  if (r.dispatch.simulated) j["dispatch"] = phase_json(r.dispatch);
  if (r.combine.simulated) j["combine"] = phase_json(r.combine);
  j["compute_ns_max"] = r.compute_ns_max;
  j["expert_load"] = load_json(r.expert_load);
  j["gpu_load"] = load_json(r.gpu_load);
  for (const auto& s : r.critical_path)
    j["critical_path"].push_back({{"what", s.what}, {"start_ns", s.start_ns}, {"end_ns", s.end_ns}});
  for (const auto& s : r.resources)
    j["resources"].push_back({{"kind", s.kind},
                              {"count", s.count},
                              {"capacity_gbps", s.capacity_gbps},
                              {"bytes", s.bytes},
                              {"mean_utilization", s.mean_utilization},
                              {"max_utilization", s.max_utilization},
                              {"busiest", s.busiest}});
  j["engine"] = {{"events", r.num_events}, {"chunk_milestones", r.num_chunk_milestones}, {"rate_recomputes", r.num_rate_recomputes}, {"flows", r.num_flows}};
  if (per_gpu) {
    for (size_t g = 0; g < r.gpus.size(); ++g) {
      const auto& t = r.gpus[g];
      j["gpus"].push_back({{"gpu", g},
                           {"rows", t.rows},
                           {"dispatch_known_ns", t.dispatch_known_ns},
                           {"compute_done_ns", t.compute_done_ns},
                           {"combine_known_ns", t.combine_known_ns},
                           {"done_ns", t.done_ns},
                           {"recv_payload_bytes_dispatch", t.recv_payload_bytes_dispatch},
                           {"recv_payload_bytes_combine", t.recv_payload_bytes_combine}});
    }
  }
  return j;
}

std::string format_table(const LayerResult& r, const std::string& title) {
  std::ostringstream os;
  char line[256];
  os << title << "\n";
  std::snprintf(line, sizeof line, "layer time %.3f us   compute (busiest GPU) %.3f us\n", us(r.layer_ns),
                us(r.compute_ns_max));
  os << line;
  os << "\n";
  std::snprintf(line, sizeof line, "%-9s %10s %10s %10s %9s %11s %11s %11s %9s\n", "phase", "end_us", "data_us",
                "recv_GB/s", "nvl_util", "sig_p50_us", "sig_p99_us", "compl_max", "chunks");
  os << line;
  for (int ph = 0; ph < 2; ++ph) {
    const PhaseResult& p = ph == 0 ? r.dispatch : r.combine;
    if (!p.simulated) continue;
    std::snprintf(line, sizeof line, "%-9s %10.3f %10.3f %10.1f %9.3f %11.3f %11.3f %11.3f %9lld\n",
                  ph == 0 ? "dispatch" : "combine", us(p.end_ns), us(p.data_end_ns), p.recv_gbps_per_gpu,
                  p.nvlink_utilization, us(p.chunk_signal.p50_ns), us(p.chunk_signal.p99_ns),
                  us(p.completion_signal.max_ns), static_cast<long long>(p.num_chunks));
    os << line;
  }
  os << "\n";
  std::snprintf(line, sizeof line, "%-13s %10s %10s %10s %8s\n", "load", "mean", "max", "p99", "gini");
  os << line;
  std::snprintf(line, sizeof line, "%-13s %10.1f %10.0f %10.0f %8.3f\n", "expert rows", r.expert_load.mean,
                r.expert_load.max, r.expert_load.p99, r.expert_load.gini);
  os << line;
  std::snprintf(line, sizeof line, "%-13s %10.1f %10.0f %10.0f %8.3f\n", "GPU rows", r.gpu_load.mean,
                r.gpu_load.max, r.gpu_load.p99, r.gpu_load.gini);
  os << line;
  os << "\ncritical path\n";
  for (const auto& s : r.critical_path) {
    std::snprintf(line, sizeof line, "  %10.3f .. %10.3f us  (%9.3f)  ", us(s.start_ns), us(s.end_ns),
                  us(s.end_ns - s.start_ns));
    os << line << s.what << "\n";
  }
  os << "\n";
  std::snprintf(line, sizeof line, "%-11s %6s %10s %9s %9s  %s\n", "resource", "count", "GB/s each", "util_mean",
                "util_max", "busiest");
  os << line;
  for (const auto& s : r.resources) {
    std::snprintf(line, sizeof line, "%-11s %6d %10.1f %9.3f %9.3f  ", s.kind.c_str(), s.count, s.capacity_gbps,
                  s.mean_utilization, s.max_utilization);
    os << line << s.busiest << "\n";
  }
  return os.str();
}

std::string chrome_trace_json(const LayerResult& r) {
  nlohmann::json events = nlohmann::json::array();
  int max_gpu = -1;
  for (const auto& s : r.trace) max_gpu = std::max(max_gpu, s.gpu);
  for (int g = 0; g <= max_gpu; ++g) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", g}, {"args", {{"name", "gpu" + std::to_string(g)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", g}, {"tid", 100000},
                      {"args", {{"name", "expert GEMMs"}}}});
  }
  // Spans on one thread must nest or be disjoint for Perfetto to draw them, and an enclosing span
  // must come before the spans inside it. Spans are recorded as transfers finish, so a chunk's
  // members (which start together and end apart) came shortest first. Each (GPU, lane)'s spans
  // are written by start, then longest first (then their order in the result: deterministic);
  // a span that would overlap the innermost open span of a track in part goes on the next track
  // (none did in the runs tried: a chunk's members nest). Track 0 is the lane's own thread id;
  // track k adds k * 1,000,000 and is named after the lane.
  std::vector<size_t> order(r.trace.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = r.trace[a];
    const auto& y = r.trace[b];
    return std::make_tuple(x.gpu, x.lane, x.start_ns, -x.end_ns) < std::make_tuple(y.gpu, y.lane, y.start_ns, -y.end_ns);
  });
  std::vector<std::vector<int64_t>> open;  // per track of the current (gpu, lane): ends of its open spans, innermost last
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& sp = r.trace[order[k]];
    if (k == 0 || r.trace[order[k - 1]].gpu != sp.gpu || r.trace[order[k - 1]].lane != sp.lane) open.clear();
    size_t t = 0;
    for (;; ++t) {
      if (t == open.size()) {
        open.emplace_back();
        if (t > 0)
          events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", sp.gpu},
                            {"tid", (sp.lane < 0 ? 100000 : sp.lane) + static_cast<int64_t>(t) * 1000000},
                            {"args", {{"name", (sp.lane < 0 ? std::string("expert GEMMs") : "SM " + std::to_string(sp.lane)) +
                                                   " (overlapping " + std::to_string(t) + ")"}}}});
      }
      std::vector<int64_t>& stack = open[t];
      while (!stack.empty() && stack.back() <= sp.start_ns) stack.pop_back();  // closed before this span
      if (stack.empty() || sp.end_ns <= stack.back()) {  // disjoint from the track, or inside its innermost span
        stack.push_back(sp.end_ns);
        break;
      }
    }
    nlohmann::json e{{"ph", "X"},
                     {"name", sp.name},
                     {"pid", sp.gpu},
                     {"tid", (sp.lane < 0 ? 100000 : sp.lane) + static_cast<int64_t>(t) * 1000000},
                     {"ts", static_cast<double>(sp.start_ns) / 1000.0},
                     {"dur", static_cast<double>(sp.end_ns - sp.start_ns) / 1000.0}};
    if (sp.bytes > 0) e["args"] = {{"bytes", sp.bytes}};
    events.push_back(std::move(e));
  }
  for (size_t g = 0; g < r.gpus.size() && static_cast<int>(g) <= max_gpu; ++g) {
    const auto& t = r.gpus[g];
    auto instant = [&](const char* name, int64_t ns) {
      events.push_back({{"ph", "i"}, {"s", "p"}, {"name", name}, {"pid", g}, {"tid", 100000},
                        {"ts", static_cast<double>(ns) / 1000.0}});
    };
    if (r.dispatch.simulated) instant("dispatch known complete", t.dispatch_known_ns);
    if (r.combine.simulated) instant("combine known complete", t.combine_known_ns);
    instant("layer done", t.done_ns);
  }
  nlohmann::json doc{{"traceEvents", events}, {"displayTimeUnit", "ns"}};
  return doc.dump() + "\n";
}

}  // namespace mok::sim
