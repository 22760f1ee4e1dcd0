// Scenario parsing, sweep expansion, Monte-Carlo trials and their CSV outputs.
#include "mok/sim/scenario.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <fstream>
#include <sstream>
#include <thread>

#include "mok/sim/error.hpp"
#include "mok/sim/report.hpp"
#include "mok/sim/rng.hpp"

namespace mok::sim {


namespace {

spec::LayerConfig layer_from_json(const nlohmann::json& j, const Topology& topo, const std::string& origin) {
  if (!j.is_object()) throw Error(origin + ": \"layer\" must be an object with hidden, intermediate, ...");
  spec::LayerConfig cfg;
  cfg.num_ranks = topo.num_gpus();
  int64_t experts_per_rank = 0;
  bool per_rank_given = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (!it->is_number_integer()) throw Error(origin + ": layer." + k + " must be an integer");
    const int64_t v = it->get<int64_t>();
    if (k == "hidden") cfg.hidden = v;
    else if (k == "intermediate") cfg.intermediate = v;
    else if (k == "shared_intermediate") cfg.shared_intermediate = v;
    else if (k == "num_experts") cfg.num_experts = v;
    else if (k == "experts_per_rank") {
      if (v < 1) throw Error(origin + ": layer.experts_per_rank must be at least 1 (or left out: layer.num_experts)");
      experts_per_rank = v;
      per_rank_given = true;
    }
    else if (k == "top_k") cfg.top_k = v;
    else if (k == "num_ranks") cfg.num_ranks = v;
    else if (k == "tokens_per_rank") cfg.tokens_per_rank = v;
    else
      throw Error(origin + ": layer." + k + " is unknown; known: hidden, intermediate, shared_intermediate, " +
                  "num_experts, experts_per_rank, top_k, num_ranks (default: all GPUs), tokens_per_rank");
  }
  if (per_rank_given) {
    if (cfg.num_experts > 0 && cfg.num_experts != experts_per_rank * cfg.num_ranks)
      throw Error(origin + ": give layer.num_experts or layer.experts_per_rank, not both");
    cfg.num_experts = experts_per_rank * cfg.num_ranks;
  }
  if (cfg.num_ranks < 1) throw Error(origin + ": layer.num_ranks must be at least 1 (default: every GPU of the topology)");
  if (!j.contains("num_ranks") && cfg.num_ranks > spec::kMaxRanks)
    throw Error(origin + ": the topology has " + std::to_string(cfg.num_ranks) +
                " GPUs and layer.num_ranks defaults to all of them, but a layer has at most " +
                std::to_string(spec::kMaxRanks) + " ranks: set layer.num_ranks, or use a smaller topology");
  const spec::Status st = cfg.validate();
  if (!st.ok)
    throw Error(origin + ": " + st.message +
                " (the layer's fields by the spec's names: H hidden, I intermediate, Is shared_intermediate, "
                "E num_experts, K top_k, R num_ranks, T tokens_per_rank)");
  return cfg;
}

bool same_layer(const spec::LayerConfig& a, const spec::LayerConfig& b) {
  return a.hidden == b.hidden && a.intermediate == b.intermediate && a.shared_intermediate == b.shared_intermediate &&
         a.num_experts == b.num_experts && a.top_k == b.top_k && a.num_ranks == b.num_ranks &&
         a.tokens_per_rank == b.tokens_per_rank;
}

SimOptions engine_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw Error(origin + ": \"engine\" must be an object like {\"rate_quantum_ns\": 0}");
  SimOptions o;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "rate_quantum_ns") {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000000000)
        throw Error(origin + ": engine.rate_quantum_ns must be an integer number of ns in [0, 1e9] (0 = exact)");
      o.rate_quantum_ns = it->get<int64_t>();
    } else if (it.key() == "signal_queueing") {
      if (!it->is_boolean()) throw Error(origin + ": engine.signal_queueing must be true or false");
      o.signal_queueing = it->get<bool>();
    } else {
      throw Error(origin + ": engine." + it.key() + " is unknown; known: rate_quantum_ns, signal_queueing");
    }
  }
  return o;
}

// resolve_topology with the scenario's origin and the field in its message.
Topology resolve_topology_at(const std::string& name, const std::string& origin, const std::string& field) {
  try {
    return resolve_topology(name);
  } catch (const Error& e) {
    throw Error(origin + ": " + field + ": " + e.what());
  }
}

Topology topology_of(const nlohmann::json& j, const std::string& origin) {
  if (j.is_string()) return resolve_topology_at(j.get<std::string>(), origin, "topology");
  if (j.is_object()) {
    if (!j.contains("preset") || !j["preset"].is_string())
      throw Error(origin + ": topology object needs \"preset\" (a preset name, multi-rack:N or a file path)");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "preset" && it.key() != "overrides")
        throw Error(origin + ": topology." + it.key() + " is unknown; use {\"preset\": ..., \"overrides\": {...}}");
    Topology t = resolve_topology_at(j["preset"].get<std::string>(), origin, "topology.preset");
    if (j.contains("overrides")) t = apply_overrides(t, j["overrides"], origin);
    return t;
  }
  throw Error(origin + ": \"topology\" must be a name (\"hgx-h200\") or {\"preset\": ..., \"overrides\": {...}}");
}

}  // namespace

namespace {

Scenario parse_scenario(const nlohmann::json& doc, const std::string& origin) {
  if (!doc.is_object()) throw Error(origin + ": a scenario must be a JSON object");
  Scenario s;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& k = it.key();
    if (k != "name" && k != "topology" && k != "layer" && k != "workload" && k != "protocol" && k != "trials" &&
        k != "sweep" && k != "plots" && k != "notes" && k != "engine" && k != "$comment")
      throw Error(origin + ": top-level key '" + k +
                  "' is unknown; known: name, topology, layer, workload, protocol, engine, trials, sweep, plots, notes");
  }
  for (const char* required : {"topology", "layer"})
    if (!doc.contains(required)) throw Error(origin + ": missing \"" + std::string(required) + "\"");
  if (doc.contains("name") && !doc["name"].is_string()) throw Error(origin + ": \"name\" must be a string");
  s.name = doc.value("name", std::string("scenario"));
  s.topo = topology_of(doc["topology"], origin);
  s.cfg = layer_from_json(doc["layer"], s.topo, origin);
  if (doc.contains("workload")) s.routing = routing_spec_from_json(doc["workload"], origin);
  if (doc.contains("protocol")) s.proto = protocol_from_json(doc["protocol"], origin);
  if (doc.contains("engine")) s.options = engine_from_json(doc["engine"], origin);
  if (doc.contains("trials")) {
    if (!doc["trials"].is_number_integer() || doc["trials"].get<int64_t>() < 1 ||
        doc["trials"].get<int64_t>() > 1000000)
      throw Error(origin + ": trials must be an integer in [1, 1000000]");
    s.trials = doc["trials"].get<int64_t>();
  }
  if (s.cfg.num_ranks > s.topo.num_gpus())
    throw Error(origin + ": layer.num_ranks = " + std::to_string(s.cfg.num_ranks) + " but topology '" + s.topo.name +
                "' has only " + std::to_string(s.topo.num_gpus()) + " GPUs; lower num_ranks or pick a larger topology");
  if (s.proto.comm_sms >= s.topo.num_sms)
    throw Error(origin + ": protocol.comm_sms = " + std::to_string(s.proto.comm_sms) + " leaves no SM for the expert " +
                "GEMMs on a " + std::to_string(s.topo.num_sms) + "-SM GPU; use fewer comm SMs");
  if (s.routing.kind == RoutingKind::kHot && s.routing.num_hot > s.cfg.num_experts)
    throw Error(origin + ": workload.num_hot = " + std::to_string(s.routing.num_hot) + " exceeds the layer's " +
                std::to_string(s.cfg.num_experts) + " experts; lower it");
  return s;
}

}  // namespace

Scenario scenario_from_json(const nlohmann::json& doc, const std::string& origin) {
  try {
    return parse_scenario(doc, origin);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type that a check above did not name (e.g. "name": 5).
    throw Error(origin + ": " + e.what() + "; a field has the wrong type (`mok-sim example` shows each field's form)");
  }
}

std::vector<SweepPoint> expand_sweep(const nlohmann::json& doc, const std::string& origin) {
  std::vector<SweepPoint> points{SweepPoint{{}, doc}};
  if (!doc.contains("sweep")) return points;
  const auto& axes = doc["sweep"];
  if (!axes.is_array())
    throw Error(origin + ": \"sweep\" must be a list of {\"path\": \"/protocol/dispatch\", \"values\": [...]}");
  for (size_t a = 0; a < axes.size(); ++a) {
    const auto& axis = axes[a];
    if (!axis.is_object() || !axis.contains("path") || !axis["path"].is_string() || !axis.contains("values") ||
        !axis["values"].is_array() || axis["values"].empty())
      throw Error(origin + ": /sweep/" + std::to_string(a) +
                  " must be {\"path\": \"/json/pointer\", \"values\": [v1, v2, ...]} with at least one value");
    const std::string path = axis["path"].get<std::string>();
    nlohmann::json::json_pointer ptr;
    try {
      ptr = nlohmann::json::json_pointer(path);
    } catch (const nlohmann::json::exception& e) {
      throw Error(origin + ": /sweep/" + std::to_string(a) + "/path '" + path +
                  "' is not a JSON pointer (write it like /workload/exponent)");
    }
    if (path.empty() || path[0] != '/' || path == "/")
      throw Error(origin + ": /sweep/" + std::to_string(a) + "/path '" + path +
                  "' must name a field below the top, like /workload/exponent");
    if (path.rfind("/sweep", 0) == 0 || path.rfind("/trials", 0) == 0)
      throw Error(origin + ": /sweep/" + std::to_string(a) + "/path cannot change the sweep or trials");
    // Two axes on one field (or a later axis on a field that holds an earlier one's) would
    // overwrite the earlier axis's value while the CSV still labels the run with it.
    for (size_t b = 0; b < a; ++b) {
      const std::string earlier = axes[b]["path"].get<std::string>();
      const bool within = earlier.size() > path.size() && earlier.compare(0, path.size(), path) == 0 &&
                          earlier[path.size()] == '/';
      if (earlier == path || within)
        throw Error(origin + ": /sweep/" + std::to_string(a) + "/path '" + path + "' " +
                    (earlier == path ? "repeats" : "holds the field of") + " /sweep/" + std::to_string(b) +
                    "/path '" + earlier + "', so the runs would be mislabelled; give each field one axis (all its " +
                    "values in one \"values\" list)");
    }
    // Each point holds a copy of the scenario: refuse a product that would exhaust memory
    // before building any of it.
    if (points.size() * axis["values"].size() > kMaxSweepPoints)
      throw Error(origin + ": the sweep's axes multiply to more than " + std::to_string(kMaxSweepPoints) +
                  " points (by /sweep/" + std::to_string(a) + ", " + std::to_string(points.size()) + " x " +
                  std::to_string(axis["values"].size()) + "); split it into several scenarios or use fewer values");
    std::vector<SweepPoint> next;
    for (const auto& p : points) {
      for (const auto& v : axis["values"]) {
        SweepPoint q = p;
        q.settings.emplace_back(path, v);
        try {
          q.doc[ptr] = v;
        } catch (const nlohmann::json::exception& e) {
          throw Error(origin + ": /sweep/" + std::to_string(a) + "/path '" + path + "' cannot be set in this scenario (" +
                      e.what() + "); every step but the last must name an object, so write e.g. the topology as " +
                      "{\"preset\": \"hgx-h200\", \"overrides\": {}} to sweep /topology/overrides/...");
        }
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  for (auto& p : points) p.doc.erase("sweep");
  return points;
}

uint64_t trial_seed(uint64_t base_seed, int64_t trial_idx) {
  if (trial_idx == 0) return base_seed;
  return Rng::derive(base_seed, 1000003ull + static_cast<uint64_t>(trial_idx)).next_u64() >> 1;
}

std::string point_origin(const SweepPoint& p, const std::string& origin) {
  std::string where = origin;
  for (const auto& [path, v] : p.settings) where += " [" + path + "=" + v.dump() + "]";
  return where;
}

void check_sweep_workloads(const std::vector<SweepPoint>& points, const std::string& origin, bool golden_workload) {
  for (const SweepPoint& p : points) {
    // The axis (settings are in axis order) that sets the workload, if any.
    int64_t axis = -1;
    for (size_t a = 0; a < p.settings.size(); ++a) {
      const std::string& path = p.settings[a].first;
      if (path == "/workload" || path.rfind("/workload/", 0) == 0) axis = static_cast<int64_t>(a);
    }
    if (axis < 0) continue;
    const std::string where = point_origin(p, origin);
    const std::string sweep = "/sweep/" + std::to_string(axis);
    if (golden_workload)
      throw Error(where + ": " + sweep + "/path '" + p.settings[axis].first +
                  "' changes the workload, but a golden workload fixes the routing of every run; sweep other fields");
    const nlohmann::json::json_pointer kind_ptr("/workload/kind");
    if (p.doc.contains(kind_ptr) && p.doc[kind_ptr] == "golden")
      throw Error(where + ": " + sweep +
                  "/values: golden cannot be a sweep value (the golden file is read once, before the sweep); give "
                  "\"workload\": {\"kind\": \"golden\", \"file\": FILE} (or --golden FILE) and sweep other fields");
  }
}

std::vector<RunRow> run_points(const std::vector<SweepPoint>& points, const std::string& origin, int num_threads,
                               const Workload* fixed_workload, const std::function<void(const std::string&)>& progress) {
  check_sweep_workloads(points, origin, fixed_workload != nullptr);
  // Parse every point first, so a bad value stops the run before any work.
  std::vector<Scenario> scenarios;
  std::vector<std::string> wheres;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::string where = point_origin(points[i], origin);
    wheres.push_back(where);
    scenarios.push_back(scenario_from_json(points[i].doc, where));
    // A trial changes the workload's seed alone: with routing from a file every trial is the
    // same run, and runs.csv would list seeds that were never used.
    const RoutingKind kind = scenarios.back().routing.kind;
    if (scenarios.back().trials > 1 && (kind == RoutingKind::kTopkFile || kind == RoutingKind::kGolden))
      throw Error(where + ": trials " + std::to_string(scenarios.back().trials) + " would repeat one run: a " +
                  (kind == RoutingKind::kGolden ? "golden" : "topk_file") +
                  " workload fixes the routing, the only thing a trial's seed changes; set trials to 1 "
                  "(--set /trials=1) or use a generated workload");
    try {
      check_layer_times(scenarios.back().topo, scenarios.back().cfg, scenarios.back().proto);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what(), e.kind());
    }
    if (fixed_workload != nullptr && !same_layer(scenarios.back().cfg, fixed_workload->cfg))
      throw Error(where + ": the layer differs from the workload's (" + fixed_workload->description +
                  "); a golden workload fixes the layer, so do not sweep /layer");
    if (fixed_workload == nullptr && scenarios.back().routing.kind == RoutingKind::kGolden)
      throw Error(where + ": workload.kind golden needs the file read first (the mok-sim CLI does it)",
                  ErrorKind::kUnsupported);
  }
  std::vector<std::pair<size_t, int64_t>> jobs;
  for (size_t i = 0; i < scenarios.size(); ++i)
    for (int64_t t = 0; t < scenarios[i].trials; ++t) jobs.emplace_back(i, t);
  std::vector<RunRow> rows(jobs.size());
  std::atomic<size_t> next{0};
  // Progress: the thread that finishes a run reports when the next report is due (one thread
  // at a time; the lines go to `progress`, never into the results).
  const auto wall0 = std::chrono::steady_clock::now();
  std::atomic<size_t> done{0};
  std::atomic<int64_t> next_report_ms{2000};
  auto report = [&] {
    const size_t d = done.fetch_add(1) + 1;
    if (!progress) return;
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - wall0).count();
    int64_t due = next_report_ms.load();
    if (ms < due || !next_report_ms.compare_exchange_strong(due, ms + 2000)) return;
    const double secs = static_cast<double>(ms) / 1000.0;
    char line[160];
    std::snprintf(line, sizeof line, "%zu of %zu runs done, %.0f s, about %.0f s left", d, jobs.size(), secs,
                  secs * static_cast<double>(jobs.size() - d) / static_cast<double>(d));
    progress(line);
  };
  // The error reported is the lowest-index failing job's, what one thread gives: jobs are taken
  // in index order and a failure only stops new ones from starting, so every job below a failed
  // one has started and runs to its end.
  std::mutex error_mutex;
  size_t first_error_job = SIZE_MAX;
  std::string first_error;
  ErrorKind first_kind = ErrorKind::kInternal;
  std::atomic<bool> failed{false};
  auto record_error = [&](size_t j, std::string what, ErrorKind kind) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (j < first_error_job) {
      first_error_job = j;
      first_error = std::move(what);
      first_kind = kind;
    }
    failed.store(true);
  };
  auto worker = [&] {
    WorkloadBuffers buffers;  // reused by this thread's trials
    for (;;) {
      // Checked before a job is taken, so a job once taken always runs: every job below a
      // failed one (taken earlier, fetch_add being monotonic) runs to its end, and the error
      // reported is the lowest-index one, as on one thread.
      if (failed.load()) return;
      const size_t j = next.fetch_add(1);
      if (j >= jobs.size()) return;
      const auto [pi, trial] = jobs[j];
      try {
        RoutingSpec routing = scenarios[pi].routing;
        routing.seed = trial_seed(routing.seed, trial);
        const Workload& w =
            fixed_workload ? *fixed_workload : generate_workload(scenarios[pi].cfg, routing, buffers);
        const LayerResult r = simulate_layer(scenarios[pi].topo, w, scenarios[pi].proto, scenarios[pi].options);
        rows[j] = RunRow{pi, trial, routing.seed, flat_metrics(r)};
        report();
      } catch (const Error& e) {
        const std::string what = e.what();
        record_error(j, what.rfind(wheres[pi], 0) == 0 ? what : wheres[pi] + " (trial " + std::to_string(trial) + "): " + what,
                     e.kind());
        return;
      } catch (const std::exception& e) {
        record_error(j, std::string("internal: ") + e.what() + "; please report", ErrorKind::kInternal);
        return;
      }
    }
  };
  const int n = std::max(1, std::min<int>(num_threads, static_cast<int>(jobs.size())));
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  if (failed) throw Error(first_error, first_kind);
  return rows;
}

namespace {
std::string csv_cell(const nlohmann::json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n") != std::string::npos) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return s;
}
}  // namespace

std::string rows_to_csv(const std::vector<SweepPoint>& points, const std::vector<RunRow>& rows) {
  std::ostringstream os;
  if (rows.empty()) return "";
  for (const auto& [path, v] : points[0].settings) os << csv_cell(path) << ",";
  os << "trial,workload_seed";
  for (const auto& [name, v] : rows[0].metrics) os << "," << name;
  os << "\n";
  for (const auto& r : rows) {
    for (const auto& [path, v] : points[r.point_idx].settings) os << csv_cell(v) << ",";
    os << r.trial_idx << "," << r.workload_seed;
    for (const auto& [name, v] : r.metrics) os << "," << csv_number(v);
    os << "\n";
  }
  return os.str();
}

std::string summary_csv(const std::vector<SweepPoint>& points, const std::vector<RunRow>& rows) {
  std::ostringstream os;
  if (rows.empty()) return "";
  for (const auto& [path, v] : points[0].settings) os << csv_cell(path) << ",";
  os << "trials";
  for (const auto& [name, v] : rows[0].metrics)
    for (const char* stat : {"mean", "p50", "p99", "min", "max"}) os << "," << name << "_" << stat;
  os << "\n";
  for (size_t p = 0; p < points.size(); ++p) {
    std::vector<const RunRow*> mine;
    for (const auto& r : rows)
      if (r.point_idx == p) mine.push_back(&r);
    if (mine.empty()) continue;
    for (const auto& [path, v] : points[p].settings) os << csv_cell(v) << ",";
    os << mine.size();
    for (size_t m = 0; m < mine[0]->metrics.size(); ++m) {
      std::vector<double> xs;
      for (const RunRow* r : mine)
        if (!std::isnan(r->metrics[m].second)) xs.push_back(r->metrics[m].second);  // NaN: not simulated
      if (xs.empty()) {
        os << ",,,,,";
        continue;
      }
      std::sort(xs.begin(), xs.end());
      double sum = 0;
      for (double x : xs) sum += x;
      auto nth = [&](double q) {
        size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(xs.size())));
        return xs[std::max<size_t>(rank, 1) - 1];
      };
      os << "," << format_number(sum / static_cast<double>(xs.size())) << "," << format_number(nth(0.5)) << ","
         << format_number(nth(0.99)) << "," << format_number(xs.front()) << "," << format_number(xs.back());
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace mok::sim
