// mok-sim: the command-line front end of the simulator (run scenarios, sweeps, presets).
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include "mok/cli.hpp"

#include "mok/reference/golden.hpp"
#include "mok/reference/output_path.hpp"
#include "mok/sim/error.hpp"
#include "mok/sim/layer_sim.hpp"
#include "mok/sim/report.hpp"
#include "mok/sim/scenario.hpp"
#include "mok/sim/svg_plot.hpp"
#include "mok/sim/topology.hpp"

namespace {

using mok::sim::Error;
namespace fs = std::filesystem;

constexpr int kExitOk = 0;
constexpr int kExitInternal = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitUnsupported = 3;

int exit_code(const mok::Error& e) {
  switch (e.kind()) {
    case mok::ErrorKind::kBadInput: return kExitBadInput;
    case mok::ErrorKind::kUnsupported: return kExitUnsupported;
    case mok::ErrorKind::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

// A golden file (mok-golden v1) as the workload: its config fixes the layer, and
// inputs/topk_experts (int32 [G, K], global token order) is the routing.
mok::sim::Workload read_golden_workload(const std::string& path) {
  mok::ref::ReadOptions opts;
  opts.load_intermediates = false;
  opts.load_bounds = false;
  const mok::ref::Golden golden = mok::ref::read_golden(path, opts);
  const mok::ref::Tensor& topk = mok::ref::at(golden.tensors, "inputs/topk_experts");
  const int32_t* data = topk.data<int32_t>();
  return mok::sim::Workload::from_topk(golden.cfg, std::vector<int32_t>(data, data + topk.numel()),
                                       "golden " + path);
}

nlohmann::json layer_to_json(const mok::spec::LayerConfig& cfg) {
  return {{"hidden", cfg.hidden},           {"intermediate", cfg.intermediate},
          {"shared_intermediate", cfg.shared_intermediate}, {"num_experts", cfg.num_experts},
          {"top_k", cfg.top_k},             {"num_ranks", cfg.num_ranks},
          {"tokens_per_rank", cfg.tokens_per_rank}};
}

const char* kDescription = R"(mok-sim: flow-level simulator of one fused MoE layer on multi-GPU systems.

What it models
  GPUs (comm SMs with per-SM issue rates and in-flight windows, HBM), NVLink ports behind a
  non-blocking NVSwitch fabric (HGX 8-GPU nodes, GB200/GB300 NVL72 racks), scale-out NICs
  between racks. Dispatch sends token rows to the GPUs owning their experts, the expert GEMMs
  run tile by tile as rows arrive, combine sends the expert outputs back. Each phase can push
  (the data holder writes) or pull (the data consumer reads); pushed data needs a completion
  signal (fence_flag, counter, flag_in_data, barrier or peer_fence_flag), and every signal's
  cost is what its mechanism waits for: acknowledgements, flag writes, polling, atomics,
  barrier rounds, fences serialised behind earlier flags.
  The routing is generated (uniform, power_law, hot, dirichlet, per-rank skew) or read from a
  topk file; each expert's rows form GEMM tiles in the spec's routing-plan order
  (mok::spec::build_routing_plan).
  Time is integer nanoseconds; the same inputs and seed give the same output bytes.

Examples
  mok-sim run                                   DeepSeek-V3-like layer on hgx-h200, defaults
  mok-sim run --topology gb200-nvl72 --set /protocol/dispatch=push
  mok-sim run simulator/scenarios/push_vs_pull_skew_hgx_h200.json --out /tmp/pvp   (a sweep: CSV + SVG)
  mok-sim run --topology gb200-nvl72 --format json --trace trace.json   then open trace.json in
                                                ui.perfetto.dev (a single run; sweeps print CSV)
  mok-sim topology list
  mok-sim topology show gb200-nvl72
  mok-sim example > my_scenario.json
  mok-sim run --golden fixtures/small-zipf.h5   layer and routing from a golden file

Exit codes: 0 ran, 1 internal error (a failure while running), 2 bad input or usage, or an output
  that cannot be written (a full disk, standard output closed or full), 3 unsupported; on any
  error no output file is left behind.)";

const char* kExampleScenario = R"({
  "name": "example: pull vs push dispatch under a power-law routing on an HGX H200 node",
  "topology": "hgx-h200",
  "layer": {"hidden": 7168, "intermediate": 2048, "shared_intermediate": 2048,
            "experts_per_rank": 32, "top_k": 8, "tokens_per_rank": 4096},
  "workload": {"kind": "power_law", "exponent": 1.2, "seed": 1},
  "protocol": {"dispatch": "pull", "combine": "push", "signaling": "fence_flag",
               "chunk_tokens": 128, "comm_sms": 32, "copy_engine": "tma", "poll_interval_ns": 100},
  "trials": 1,
  "sweep": [{"path": "/protocol/dispatch", "values": ["push", "pull"]},
            {"path": "/workload/exponent", "values": [0.0, 0.6, 1.01, 1.2, 1.5]}],
  "plots": [{"file": "nvlink_util_vs_skew.svg", "x": "/workload/exponent",
             "y": "dispatch_nvlink_util", "series": "/protocol/dispatch"}]
}
)";

nlohmann::json default_scenario(const std::string& topology) {
  nlohmann::json doc = nlohmann::json::parse(kExampleScenario);
  doc["name"] = "default: DeepSeek-V3-like layer";
  doc["topology"] = topology;
  doc.erase("sweep");
  doc.erase("plots");
  doc["workload"] = {{"kind", "uniform"}, {"seed", 1}};
  return doc;
}

// The first ancestor of `p` that exists (p itself if it does); "." for a relative path with none.
fs::path existing_ancestor(fs::path p) {
  std::error_code ec;
  while (!p.empty() && !fs::exists(fs::symlink_status(p, ec))) p = p.parent_path();
  return p.empty() ? fs::path(".") : p;
}

// Standard output is checked like any other output: a failed write (a full disk, a closed
// pipe) is an error (exit 2), never a silent exit 0.
// Callers set errno to 0 before they write, so that the message can give the write's reason.
// `out_helps`: the text is a run's result, which --out DIR would write to files instead.
void flush_stdout(const std::string& what, bool out_helps = false) {
  if (!mok::cli::stdout_ok())
    throw Error("cannot write " + what + " to standard output (" + (errno != 0 ? std::strerror(errno) : "write failed") +
                "); check where standard output goes (free space, a closed pipe)" +
                (out_helps ? " or give --out DIR" : ""));
}

// A stream or device (mok::ref::is_stream_or_device: a pipe, /dev/stdout, ...) is written to
// directly rather than through a temporary file and a rename.
bool write_directly(const fs::path& p) { return mok::ref::is_stream_or_device(p); }

// Output files are written only after every run succeeded, and all of them or none: each is
// first written in full to a temporary file beside its target, and only when every one has been
// written are they renamed into place (a failure removes the temporaries and the directories made
// for them). A symbolic link is followed, so its target is replaced and the link stays; a
// stream or device (write_directly) is written to directly, last.
struct PendingFiles {
  struct Item {
    fs::path path;
    std::string text;
    std::string flag;  // the option that named it, for messages: "--trace", "--out"
  };
  std::vector<Item> items;
  std::optional<std::string> stdout_text;  // the result printed to standard output, if any
  std::string stdout_what = "the result";  // what it is, for messages
  bool stdout_out_helps = true;             // whether --out DIR could take it instead
  void add(fs::path p, std::string text, std::string flag) { items.push_back({std::move(p), std::move(text), std::move(flag)}); }
  void add_stdout(std::string text, std::string what = "the result", bool out_helps = true) {
    stdout_text = std::move(text);
    stdout_what = std::move(what);
    stdout_out_helps = out_helps;
  }

  // The file a rename would replace: `p` with its symbolic links followed.
  static fs::path resolved(const fs::path& p, const std::string& flag) {
    std::error_code ec;
    const fs::path target = mok::ref::follow_links(p, flag + " '" + p.string() + "'");
    return fs::weakly_canonical(fs::absolute(target, ec), ec);
  }

  // Before any run: fails early on paths that cannot be written (a directory given as a file, a
  // file given as --out, a parent that is a file, a directory without write permission).
  static void check_file(const fs::path& p, const std::string& flag) {
    if (write_directly(p)) return;  // a stream or device: written as it is
    std::error_code ec;
    if (fs::is_directory(p, ec))
      throw Error(flag + " '" + p.string() + "' is a directory; give a file name, e.g. " + (p / "trace.json").string());
    const fs::path target = resolved(p, flag);
    check_parent(target.has_parent_path() ? target.parent_path() : fs::path("."), flag, p);
  }
  static void check_dir(const fs::path& d, const std::string& flag) {
    std::error_code ec;
    if (fs::exists(d, ec) && !fs::is_directory(d, ec))
      throw Error(flag + " '" + d.string() + "' exists and is not a directory; give a new or existing directory");
    check_parent(d, flag, d);
  }
  static void check_parent(const fs::path& dir, const std::string& flag, const fs::path& named) {
    std::error_code ec;
    const fs::path base = existing_ancestor(dir);
    if (!fs::is_directory(base, ec))
      throw Error(flag + " '" + named.string() + "': '" + base.string() + "' is not a directory; choose another path");
    if (::access(base.c_str(), W_OK | X_OK) != 0)
      throw Error(flag + " '" + named.string() + "': no permission to write in '" + base.string() +
                  "'; choose a directory you can write to");
  }
  // Two outputs that name one file (e.g. --trace DIR/result.json with --out DIR) would overwrite
  // each other: refused before the run.
  void check_distinct() const {
    for (size_t i = 0; i < items.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (resolved(items[i].path, items[i].flag) == resolved(items[j].path, items[j].flag))
          throw Error(items[j].flag + " and " + items[i].flag + " both write '" + items[i].path.string() +
                      "'; give them different files");
  }

  // Order, so that a failure leaves nothing: (1) every file goes to its temporary; (2) streams,
  // devices and standard output are written (nothing can take those back, so they come after
  // everything that can still fail before them); (3) the temporaries are renamed into place.
  // A failure in (1) or (2) removes the temporaries and the directories made for them.
  void commit() {
    check_distinct();
    std::vector<fs::path> made_dirs;  // created here, outermost first
    std::vector<std::pair<fs::path, fs::path>> renames;  // (temporary, target)
    std::vector<const Item*> direct;
    auto undo = [&] {
      std::error_code ec;
      for (const auto& [tmp, target] : renames) fs::remove(tmp, ec);
      for (auto it = made_dirs.rbegin(); it != made_dirs.rend(); ++it) fs::remove(*it, ec);  // only if empty
    };
    try {
      for (const Item& item : items) {
        std::error_code ec;
        if (write_directly(item.path)) {
          direct.push_back(&item);
          continue;
        }
        const fs::path target = resolved(item.path, item.flag);
        if (fs::is_directory(target, ec))
          throw Error(item.flag + " '" + item.path.string() + "' is a directory; give a file name");
        const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
        if (!fs::exists(parent, ec)) {
          std::vector<fs::path> missing;
          for (fs::path d = parent; !d.empty() && !fs::exists(fs::symlink_status(d, ec)); d = d.parent_path())
            missing.push_back(d);
          for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
            if (!fs::create_directory(*it, ec) && ec)
              throw Error(item.flag + " '" + item.path.string() + "': cannot create the directory '" + it->string() +
                          "': " + ec.message());
            made_dirs.push_back(*it);
          }
        }
        const fs::path tmp = target.string() + ".mok-sim-" + std::to_string(::getpid()) + ".tmp";
        renames.emplace_back(tmp, target);
        std::ofstream out(tmp, std::ios::binary);
        out << item.text;
        out.close();
        if (!out)
          throw Error(item.flag + " '" + item.path.string() + "': cannot write it (" + std::strerror(errno) +
                      "); check the directory and free space");
      }
      for (const Item* item : direct) write_direct(*item);
      if (stdout_text) {
        errno = 0;
        std::cout << *stdout_text;
        flush_stdout(stdout_what, stdout_out_helps);
      }
    } catch (...) {
      undo();
      throw;
    }
    // (3) Each existing target is first linked to a backup name (a hard link: the target stays in
    // place), then the temporary is renamed over it in one step; a failed rename puts every target
    // already replaced back from its backup (and removes the ones that were new), so the outputs
    // change all together or not at all. The backups go once every rename succeeded.
    std::vector<std::pair<fs::path, std::optional<fs::path>>> placed;  // (target, its backup)
    auto roll_back = [&](const std::optional<fs::path>& own_backup) {
      std::vector<std::string> lost;  // targets that could not be put back
      std::error_code ec2;
      if (own_backup) fs::remove(*own_backup, ec2);  // its target was never replaced
      for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
        ec2.clear();
        if (it->second)
          fs::rename(*it->second, it->first, ec2);
        else
          fs::remove(it->first, ec2);
        if (ec2) lost.push_back(it->first.string() + " (" + ec2.message() + ")");
      }
      undo();
      return lost;
    };
    for (const auto& [tmp, target] : renames) {
      std::error_code ec, ec_exists;  // (symlink_status sets ec_exists for a missing target)
      std::optional<fs::path> backup;
      if (fs::exists(fs::symlink_status(target, ec_exists))) {
        backup = fs::path(target.string() + ".mok-sim-" + std::to_string(::getpid()) + ".old");
        std::error_code stale;
        fs::remove(*backup, stale);  // one left by an earlier run that had this pid
        fs::create_hard_link(target, *backup, ec);
      }
      if (!ec) fs::rename(tmp, target, ec);
      if (ec) {
        const std::vector<std::string> lost = roll_back(backup);
        std::string message = "cannot move the finished file into place at '" + target.string() + "': " + ec.message();
        if (lost.empty()) {
          message += "; no output file was changed";
        } else {
          message += "; these could not be put back as they were:";
          for (const auto& l : lost) message += " " + l;
        }
        throw Error(message + (stdout_text ? " (ignore the line printed above)" : ""));
      }
      placed.emplace_back(target, backup);
    }
    for (const auto& [target, backup] : placed) {
      std::error_code ec;
      if (backup) fs::remove(*backup, ec);
    }
  }

  static void write_direct(const Item& item) {
    // This process's own standard output or error (/dev/stdout, /proc/self/fd/1, ... even
    // when redirected to a file) goes through the same stream as the rest of the output, so
    // the two keep their order and neither overwrites the other.
    struct stat target {}, fd_st {};
    const bool exists = ::stat(item.path.c_str(), &target) == 0;
    auto same_as = [&](int fd) {
      return exists && ::fstat(fd, &fd_st) == 0 && fd_st.st_dev == target.st_dev && fd_st.st_ino == target.st_ino;
    };
    if (same_as(1)) {
      errno = 0;
      std::cout << item.text;
      flush_stdout(item.flag + " '" + item.path.string() + "'");
    } else if (same_as(2)) {
      std::cerr << item.text << std::flush;
      if (!std::cerr) throw Error(item.flag + " '" + item.path.string() + "': cannot write it to standard error");
    } else {
      errno = 0;
      std::ofstream out(item.path, std::ios::binary | std::ios::app);  // a stream: append, never truncate
      out << item.text;
      out.close();
      if (!out)
        throw Error(item.flag + " '" + item.path.string() + "': cannot write to it (" +
                    (errno != 0 ? std::strerror(errno) : "write failed") + "); nothing else was written");
    }
  }
};

// Valid JSON is read as JSON, with the checks a scenario file gets (a key repeated in an object,
// nesting); anything else is a string: --set /protocol/dispatch=push.
nlohmann::json parse_set_value(const std::string& set, const std::string& text) {
  if (!nlohmann::json::accept(text, /*ignore_comments=*/true)) return nlohmann::json(text);
  std::istringstream in(text);
  return mok::sim::parse_json_checked(in, "--set '" + set + "'", set.substr(0, set.find('=')));
}

// Whether JSON pointer `a` is `b` or lies inside it.
bool pointer_within(const std::string& a, const std::string& b) {
  return a == b || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '/');
}

int run_command(const std::string& scenario_path, const std::string& topology, const std::string& golden_path,
                const std::vector<std::string>& sets,
                const std::string& format, const std::string& out_dir, const std::string& trace_path,
                int trace_gpus, int threads, bool per_gpu, bool format_given) {
  nlohmann::json doc;
  std::string origin;
  if (scenario_path.empty()) {
    doc = default_scenario(topology.empty() ? "hgx-h200" : topology);
    origin = "(default scenario)";
  } else {
    doc = mok::sim::read_json_file(scenario_path);
    origin = scenario_path;
    if (!doc.is_object())
      throw Error(origin + ": a scenario must be a JSON object {\"topology\": ..., \"layer\": {...}, ...}, not " +
                  doc.type_name() + " (`mok-sim example` prints one)");
    if (!topology.empty()) {
      // A scenario's {"preset": ..., "overrides": {...}} keeps its overrides (sweeps over
      // /topology/overrides/... need the object): --topology replaces the preset only.
      auto it = doc.find("topology");
      if (it != doc.end() && it->is_object() && it->contains("overrides") && (*it)["overrides"].is_object() &&
          !(*it)["overrides"].empty()) {
        std::cerr << "mok-sim: --topology " << topology << " replaces the scenario's topology preset; its "
                  << (*it)["overrides"].size() << " override(s) (/topology/overrides) still apply\n";
        (*it)["preset"] = topology;
      } else if (it != doc.end() && it->is_object()) {
        (*it)["preset"] = topology;
      } else {
        doc["topology"] = topology;
      }
    }
  }
  if (!golden_path.empty()) doc["workload"] = {{"kind", "golden"}, {"file", golden_path}};
  std::vector<std::pair<std::string, nlohmann::json>> set_values;  // (pointer, value) of each --set
  for (const auto& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || s.empty() || s[0] != '/')
      throw Error("--set '" + s + "': write it as /json/pointer=value, e.g. --set /protocol/comm_sms=24");
    set_values.emplace_back(s.substr(0, eq), parse_set_value(s, s.substr(eq + 1)));
    try {
      doc[nlohmann::json::json_pointer(set_values.back().first)] = set_values.back().second;
    } catch (const nlohmann::json::exception& e) {
      throw Error("--set '" + s + "': " + e.what() + "; the pointer must lead through objects of the scenario to " +
                  "the field to change (e.g. /protocol/comm_sms; `mok-sim example` shows the fields)");
    }
  }
  // A --set on a field the sweep varies would be overwritten at every point, in silence.
  if (doc.contains("sweep") && doc["sweep"].is_array())
    for (size_t i = 0; i < sets.size(); ++i) {
      const std::string& s = sets[i];
      const auto& [ptr, value] = set_values[i];
      if (pointer_within(ptr, "/sweep") || pointer_within(ptr, "/plots")) continue;  // the sweep itself
      for (size_t a = 0; a < doc["sweep"].size(); ++a) {
        const nlohmann::json& axis = doc["sweep"][a];
        if (!axis.is_object() || !axis.contains("path") || !axis["path"].is_string()) continue;  // refused later
        const std::string path = axis["path"].get<std::string>();
        // On the swept field or inside it; or on an object above it whose value gives that field.
        bool replaced = !path.empty() && pointer_within(ptr, path);  // an empty path is refused with the sweep
        if (!replaced && !path.empty() && pointer_within(path, ptr)) {
          try {
            replaced = value.contains(nlohmann::json::json_pointer(path.substr(ptr.size())));
          } catch (const nlohmann::json::exception&) {
          }
        }
        if (replaced)
          throw Error("--set '" + s + "': /sweep/" + std::to_string(a) + "/path '" + path +
                      "' sweeps this field, so every point would replace the --set; drop the axis (--set "
                      "/sweep=[] removes the whole sweep) or the --set");
      }
    }
  if (!sets.empty()) {
    origin += " with";
    for (const auto& s : sets) origin += " --set " + s;
  }
  // A golden workload fixes the layer: a scenario that names one must not give a layer too
  // (--golden and the default scenario drop theirs).
  std::optional<mok::sim::Workload> golden;
  const bool golden_kind = doc.contains("workload") && doc["workload"].is_object() && doc["workload"].contains("kind") &&
                           doc["workload"]["kind"] == "golden";
  if (golden_kind) {
    for (const auto& s : sets)
      if (s.rfind("/layer", 0) == 0)
        throw Error("--set '" + s + "': a golden workload fixes the layer (its file's config); drop this --set");
    const mok::sim::RoutingSpec spec = mok::sim::routing_spec_from_json(doc["workload"], origin);
    if (scenario_path.empty() || !golden_path.empty()) {
      doc.erase("layer");
      if (scenario_path.empty()) doc["name"] = "golden workload " + spec.golden_file;
    } else if (doc.contains("layer")) {
      throw Error(origin + ": a golden workload fixes the layer; remove \"layer\" from the scenario");
    }
    try {
      golden = read_golden_workload(spec.golden_file);
    } catch (const Error& e) {
      if (!golden_path.empty()) throw;  // --golden FILE: the message names the file already
      // From a scenario: name the scenario and the field, and where a relative path was looked for.
      std::string where = origin + ": /workload/file '" + spec.golden_file + "': " + e.what();
      std::error_code ec;
      if (fs::path(spec.golden_file).is_relative() && !fs::exists(spec.golden_file, ec))
        where += " (a relative path is read from the current folder, " + fs::current_path(ec).string() + ")";
      throw Error(where, e.kind());
    }
    doc["layer"] = layer_to_json(golden->cfg);
  }
  const std::vector<mok::sim::SweepPoint> points = mok::sim::expand_sweep(doc, origin);
  mok::sim::check_sweep_workloads(points, origin, golden.has_value());
  const mok::sim::Scenario first = mok::sim::scenario_from_json(points[0].doc, mok::sim::point_origin(points[0], origin));
  const bool many = points.size() > 1 || first.trials > 1;
  if (static_cast<uint64_t>(points.size()) * static_cast<uint64_t>(first.trials) > mok::sim::kMaxRuns)
    throw Error(origin + ": " + std::to_string(points.size()) + " sweep points x " + std::to_string(first.trials) +
                " trials make more than " + std::to_string(mok::sim::kMaxRuns) +
                " runs; lower the trials or split the sweep into several scenarios");
  // Everything that can be checked before a run is checked here, so a mistake costs no time.
  if (!trace_path.empty()) PendingFiles::check_file(trace_path, "--trace");
  if (!out_dir.empty()) PendingFiles::check_dir(out_dir, "--out");
  if (!many && !trace_path.empty() && !out_dir.empty() && !write_directly(trace_path) &&
      PendingFiles::resolved(trace_path, "--trace") ==
          PendingFiles::resolved(fs::path(out_dir) / ("result." + std::string(format == "table" ? "txt" : format)), "--out"))
    throw Error("--trace '" + trace_path + "' is the file --out writes the result to; give them different files");
  // Plots: checked before any run. A single run has nothing to plot: its plots would be dropped
  // unseen, so they are refused.
  const nlohmann::json plots = doc.value("plots", nlohmann::json::array());
  if (!plots.is_array()) throw Error(origin + ": \"plots\" must be a list");
  if (!many && !plots.empty())
    throw Error(origin + ": \"plots\" needs a sweep or trials > 1 (this is a single run, with nothing to plot); " +
                "remove \"plots\" (--set /plots=[]) or add a \"sweep\"");
  // The files --out will write, checked like --trace (one that is a directory, say).
  if (!out_dir.empty()) {
    std::vector<std::string> names;
    if (!many) {
      names.push_back("result." + std::string(format == "table" ? "txt" : format));
    } else {
      names = {"runs.csv", "summary.csv"};
      for (const auto& p : plots)
        if (p.is_object() && p.contains("file") && p["file"].is_string()) names.push_back(p["file"].get<std::string>());
    }
    for (const auto& name : names) {
      std::error_code ec;
      const fs::path file = fs::path(out_dir) / name;
      if (fs::is_directory(file, ec))
        throw Error("--out '" + out_dir + "': '" + file.string() + "', a file it writes, is a directory; remove it " +
                    "or give another --out directory");
      PendingFiles::check_file(file, "--out");
    }
  }
  PendingFiles files;
  if (!many) {
    // A routing file named without the kind that reads it is unused in a single run: say so, since
    // the run goes on with another routing. (A topk_file is kept for sweeps over /workload/kind;
    // "golden" is no sweep value, so a stray golden file is never used.)
    // The kind is the parsed spec's (scenario_from_json has checked the field), named as its echo names it.
    if (points[0].doc.contains("workload")) {
      const nlohmann::json& wl = points[0].doc["workload"];
      const std::string kind = mok::sim::routing_spec_to_json(first.routing)["kind"].get<std::string>();
      for (const auto& [key, needs] : {std::pair{"topk_file", "topk_file"}, std::pair{"file", "golden"}})
        if (wl.contains(key) && kind != needs)
          std::cerr << "mok-sim: note: " << origin << ": /workload/" << key << " is set but /workload/kind is \""
                    << kind << "\", so it is not used; add \"kind\": \"" << needs << "\" to route by it\n";
    }
    mok::sim::RoutingSpec routing = first.routing;
    mok::sim::SimOptions opt = first.options;
    opt.record_trace = !trace_path.empty();
    opt.trace_max_gpus = trace_gpus;
    opt.threads = threads;  // one layer: a helper thread at racks scale (same output)
    // The first progress line of a long exact run also names the approximation that makes it
    // shorter (simulator/README.md, "Speed": at 576 GPUs about 4x faster, layer time within ~1%).
    opt.progress = [hint = first.options.rate_quantum_ns == 0](const std::string& line) mutable {
      std::cerr << "mok-sim: " << line << "\n";
      if (hint)
        std::cerr << "mok-sim: (exact max-min rates; --set /engine/rate_quantum_ns=5000 re-solves them once per 5 us "
                     "instead, several times faster on large topologies, layer time within about 1% in "
                     "simulator/README.md's measurements)\n";
      hint = false;
    };
    // Errors of the run (a refused layer, a topk_file's content) name the scenario and the --set
    // changes, as a sweep's do.
    auto run_one = [&] {
      try {
        mok::sim::check_layer_times(first.topo, first.cfg, first.proto);  // before a workload is built
        // A large layer's set-up (routing, transfers) takes seconds before the event loop's
        // progress lines start: say what it is doing.
        const int64_t slots = first.cfg.num_ranks * first.cfg.tokens_per_rank * first.cfg.top_k;
        if (slots >= (int64_t{1} << 24) && !golden)
          opt.progress("building the routing of " + std::to_string(slots) + " (token, slot) pairs and their transfers");
        const mok::sim::Workload w = golden ? *golden : mok::sim::generate_workload(first.cfg, routing, threads);
        return mok::sim::simulate_layer(first.topo, w, first.proto, opt);
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.rfind(origin, 0) == 0) throw;
        throw Error(origin + ": " + what, e.kind());
      }
    };
    const mok::sim::LayerResult r = run_one();
    nlohmann::json j;
    j["scenario"] = first.name;
    j["topology"] = first.topo.name;
    j["layer"] = {{"hidden", first.cfg.hidden},
                  {"intermediate", first.cfg.intermediate},
                  {"shared_intermediate", first.cfg.shared_intermediate},
                  {"num_experts", first.cfg.num_experts},
                  {"top_k", first.cfg.top_k},
                  {"num_ranks", first.cfg.num_ranks},
                  {"tokens_per_rank", first.cfg.tokens_per_rank}};
    j["workload"] = mok::sim::routing_spec_to_json(routing);
    j["protocol"] = mok::sim::protocol_to_json(first.proto);
    j["engine"] = {{"rate_quantum_ns", first.options.rate_quantum_ns},
                   {"signal_queueing", first.options.signal_queueing}};
    j["result"] = mok::sim::result_to_json(r, per_gpu);
    std::string text;
    if (format == "json") {
      text = j.dump(2) + "\n";
    } else if (format == "csv") {
      std::string header, row;
      bool first_column = true;
      for (const auto& [k, v] : mok::sim::flat_metrics(r)) {
        header += (first_column ? "" : ",") + k;
        row += (first_column ? "" : ",") + mok::sim::csv_number(v);  // empty: not simulated
        first_column = false;
      }
      text = header + "\n" + row + "\n";
    } else {
      std::string title = first.name + "\n" + first.topo.name + " (" + first.topo.description + ")\n" +
                          "layer " + mok::ref::format_config(first.cfg) + "\nworkload " + j["workload"].dump() +
                          "\nprotocol " + j["protocol"].dump() + "\n";
      text = mok::sim::format_table(r, title);
    }
    if (!trace_path.empty()) files.add(trace_path, mok::sim::chrome_trace_json(r), "--trace");
    if (!out_dir.empty()) {
      const fs::path result = fs::path(out_dir) / ("result." + std::string(format == "table" ? "txt" : format));
      files.add(result, text, "--out");
      // As a sweep's, the summary line goes out with the file, before its rename.
      files.add_stdout("wrote " + result.string() + "\n", "the summary line (so no file was written to " + out_dir + ")",
                       false);
      files.commit();
    } else {
      files.add_stdout(text);
      files.commit();
    }
    return kExitOk;
  }
  if (!trace_path.empty()) throw Error("--trace needs a single run (no sweep, trials = 1)");
  if (format == "table" && format_given)
    throw Error("--format table prints one run's result; " + origin + " has " + std::to_string(points.size()) +
                " sweep points x " + std::to_string(first.trials) + " trials, which print as CSV: leave --format out" +
                (out_dir.empty() ? " or give --format csv (--out DIR writes runs.csv and summary.csv)" : ""));
  if (format == "json")
    throw Error("--format json prints one run's result; " + origin + " has " + std::to_string(points.size()) +
                " sweep points x " + std::to_string(first.trials) + " trials, which print as CSV (--format csv, " +
                "or --out DIR for runs.csv and summary.csv)");
  // Validate plot requests before running.
  if (!plots.empty() && out_dir.empty()) throw Error(origin + " has plots: give --out DIR for the SVG files");
  for (const auto& p : plots) mok::sim::check_plot_request(p, points, origin);
  for (size_t i = 0; i < plots.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (plots[i]["file"] == plots[j]["file"])
        throw Error(origin + ": /plots/" + std::to_string(i) + "/file '" + plots[i]["file"].get<std::string>() +
                    "' is also /plots/" + std::to_string(j) + "/file; give each plot its own file");
  const std::vector<mok::sim::RunRow> rows =
      mok::sim::run_points(points, origin, threads, golden ? &*golden : nullptr,
                           [](const std::string& line) { std::cerr << "mok-sim: " << line << std::endl; });
  const std::string csv = mok::sim::rows_to_csv(points, rows);
  const std::string summary = mok::sim::summary_csv(points, rows);
  for (const auto& p : plots) {
    auto [file, svg] = mok::sim::plot_from_rows(p, points, rows, origin);
    files.add(fs::path(out_dir) / file, svg, "--out");
  }
  if (!out_dir.empty()) {
    files.add(fs::path(out_dir) / "runs.csv", csv, "--out");
    files.add(fs::path(out_dir) / "summary.csv", summary, "--out");
    // The summary line goes out with the files (before their renames), so a standard output that
    // cannot take it leaves no file behind either.
    files.add_stdout("wrote " + std::to_string(rows.size()) + " runs of " + std::to_string(points.size()) +
                     " points to " + out_dir + " (runs.csv, summary.csv" + (plots.empty() ? "" : ", plots") + ")\n",
                     "the summary line (so no file was written to " + out_dir + ")", false);
    files.commit();
  } else {
    files.add_stdout(first.trials > 1 ? summary : csv);
    files.commit();
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  // A pipe whose reader has gone (`mok-sim example | head -1` once head has ended) makes a write
  // to standard output fail with EPIPE, which flush_stdout reports (exit 2), instead of SIGPIPE
  // ending the process without a word (exit 141). Ignored here, not in mok::cli::parse: an ignored
  // signal stays ignored across exec, and the ranks mok-launch starts must not inherit that.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{kDescription, "mok-sim"};
  app.require_subcommand(1);
  app.get_formatter()->column_width(34);

  auto* run = app.add_subcommand("run", "Simulate a scenario (a JSON file) or the default layer; sweeps and "
                                        "Monte-Carlo trials when the scenario has them");
  std::string scenario_path, topology, format = "table", out_dir, trace_path;
  std::vector<std::string> sets;
  int trace_gpus = 8;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool per_gpu = false;
  // No CLI::ExistingFile check here: it runs before CLI11 reports unknown options, so a misspelt
  // flag (`--fromat json`) was reported as a missing scenario file 'json'; read_json_file() names
  // a missing or unreadable scenario itself, after the options are known to be right.
  run->add_option("scenario", scenario_path, "Scenario JSON file (see `mok-sim example`); omit for the default layer");
  std::string golden_path;
  run->add_option("--golden", golden_path,
                  "Take the layer and routing from a golden file (mok-golden v1 HDF5, e.g. "
                  "fixtures/small-zipf.h5); same as workload {\"kind\": \"golden\", \"file\": FILE}")
      ->check(CLI::ExistingFile);
  run->add_option("--topology", topology,
                  "Override the topology: a preset (hgx-h100, hgx-h200, hgx-h800, hgx-b200, gb200-nvl72, "
                  "gb300-nvl72), multi-rack:N[:400|800], or a topology JSON file");
  run->add_option("--set", sets,
                  "Change one scenario field: /json/pointer=value, e.g. --set /protocol/dispatch=push "
                  "--set /workload/exponent=1.2 (repeatable)");
  run->add_option("--format", format, "Single-run output: table, json or csv")
      ->check(CLI::IsMember({"table", "json", "csv"}));
  run->add_option("--out", out_dir, "Directory for result files (sweeps: runs.csv, summary.csv, plots)");
  run->add_option("--trace", trace_path, "Write a Chrome trace (open in ui.perfetto.dev); single runs only");
  run->add_option("--trace-gpus", trace_gpus, "Trace only GPUs [0, N) (default 8)")->check(CLI::Range(1, 65536));
  run->add_option("--threads", threads,
                  "Threads for sweeps and trials; a single run with a rate quantum and 2,048+ comm SMs "
                  "uses a second one to apply rate changes (results never depend on it; default: the cores)")
      ->check(CLI::Range(1, 256));
  run->add_flag("--per-gpu", per_gpu, "Include per-GPU timelines in JSON output");

  auto* topo_cmd = app.add_subcommand("topology", "List the topology presets or show one with its sources");
  topo_cmd->require_subcommand(1);
  topo_cmd->add_subcommand("list", "Names and one-line descriptions of the presets");
  auto* show = topo_cmd->add_subcommand("show", "Print a preset (or multi-rack:N) as JSON with the source of every value");
  std::string show_name;
  show->add_option("name", show_name, "Preset name, multi-rack:N[:400|800], or a topology file")->required();

  app.add_subcommand("example", "Print an example scenario with a sweep and a plot");

  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd != "run" && cmd != "topology" && cmd != "example") {
      std::cerr << "mok-sim: error: unknown command '" << cmd << "'; commands: run, topology, example (mok-sim --help)\n";
      return kExitBadInput;
    }
  }
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  try {
    if (run->parsed() && run->count("scenario") > 0 && scenario_path.empty())
      throw Error("the scenario path is empty; give a JSON file, or leave it out for the default layer");
    if (run->parsed() && run->count("--topology") > 0 && topology.empty())
      throw Error("--topology is empty; give a preset (mok-sim topology list), multi-rack:N or a topology file");
    if (run->parsed() && run->count("--trace") > 0 && trace_path.empty())
      throw Error("--trace is empty; give a file name, e.g. --trace trace.json (or leave --trace out)");
    if (run->parsed() && run->count("--out") > 0 && out_dir.empty())
      throw Error("--out is empty; give a directory, e.g. --out results (or leave --out out to print the result)");
    // Options that would change nothing are refused rather than dropped unseen (audit, fiftieth session).
    if (run->parsed() && run->count("--trace-gpus") > 0 && trace_path.empty())
      throw Error("--trace-gpus chooses the GPUs of the Chrome trace: give --trace FILE too (or leave --trace-gpus out)");
    if (run->parsed() && per_gpu && format != "json")
      throw Error("--per-gpu adds per-GPU timelines to a run's JSON: give --format json (or leave --per-gpu out)");
    if (run->parsed()) return run_command(scenario_path, topology, golden_path, sets, format, out_dir, trace_path, trace_gpus,
                                          threads, per_gpu, run->count("--format") > 0);
    if (topo_cmd->parsed()) {
      errno = 0;
      if (show->parsed()) {
        std::cout << mok::sim::topology_to_json(mok::sim::resolve_topology(show_name)).dump(2) << "\n";
      } else {
        for (const auto& name : mok::sim::preset_names()) {
          const auto t = mok::sim::resolve_topology(name);
          std::printf("%-13s %s\n", name.c_str(), t.description.c_str());
        }
        std::printf("%-13s %s\n", "multi-rack:N", "N gb200-nvl72 racks, 400 Gb/s NIC per GPU (multi-rack:N:800 for 800)");
      }
      flush_stdout(show->parsed() ? "the topology" : "the preset list");
      return kExitOk;
    }
    errno = 0;
    std::cout << kExampleScenario;
    flush_stdout("the example scenario");
    return kExitOk;
  } catch (const Error& e) {
    std::cerr << "mok-sim: error: " << e.what() << "\n";
    return exit_code(e);
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "mok-sim: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong type that no check above named.
    std::cerr << "mok-sim: error: " << e.what() << "; a field of the scenario or topology has the wrong type "
              << "(`mok-sim example` and `mok-sim topology show NAME` show each field's form)\n";
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    // A failure while running (exit 1), like a sweep's: the input may be valid but too large.
    std::cerr << "mok-sim: error: out of memory while running; the layer is too large for this machine: lower "
              << "/layer/tokens_per_rank or the number of GPUs, or run with more memory\n";
    return kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "mok-sim: error: internal: " << e.what() << "; please report\n";
    return kExitInternal;
  }
}
