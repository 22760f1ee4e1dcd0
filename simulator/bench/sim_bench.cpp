// mok-sim-bench: wall-clock speed of the simulator on the reference cases.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>

#include "mok/cli.hpp"
#include "mok/sim/layer_sim.hpp"
#include "mok/sim/scenario.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int one_layer(const std::string& topo_name, int gpus, int64_t quantum_ns, bool full, int threads) {
  const auto topo = mok::sim::resolve_topology(topo_name);
  mok::sim::RoutingSpec routing;
  routing.kind = mok::sim::RoutingKind::kUniform;
  mok::sim::ProtocolConfig proto;
  mok::sim::SimOptions opt;
  opt.rate_quantum_ns = quantum_ns;
  opt.full_rate_recompute = full;
  opt.threads = threads;
  auto t0 = std::chrono::steady_clock::now();
  const auto work = mok::sim::generate_workload(mok::sim::speed_reference_layer(gpus), routing, threads);
  const double t_gen = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const auto r = mok::sim::simulate_layer(topo, work, proto, opt);
  const double t_sim = seconds_since(t0);
  std::printf("%-14s gpus=%d tokens/gpu=8192 experts=%d top-8 chunk=128 uniform, rate quantum %lld ns%s%s: "
              "workload %.3f s, simulate %.3f s, total %.3f s (layer %.1f us, %lld events, %lld rate recomputes, "
              "%lld flows, %lld chunk milestones)\n",
              topo_name.c_str(), gpus, 4 * gpus, static_cast<long long>(quantum_ns), full ? " (full recomputes)" : "",
              threads > 1 ? (" (" + std::to_string(threads) + " threads)").c_str() : "", t_gen, t_sim, t_gen + t_sim, r.layer_ns / 1000.0,
              static_cast<long long>(r.num_events), static_cast<long long>(r.num_rate_recomputes),
              static_cast<long long>(r.num_flows), static_cast<long long>(r.num_chunk_milestones));
  return 0;
}

// Trials of the NVL72 layer with power-law 1.2 routing (seeds 1, 2, ...). Prints the wall time
// and, so that exact and quantised runs can be compared from the same output, the mean and the
// largest layer time over the trials.
int monte_carlo(int trials, int threads, int64_t quantum_ns) {
  nlohmann::json doc = {
      {"topology", "gb200-nvl72"},
      {"layer", {{"hidden", 7168}, {"intermediate", 2048}, {"shared_intermediate", 2048},
                 {"experts_per_rank", 4}, {"top_k", 8}, {"tokens_per_rank", 8192}}},
      {"workload", {{"kind", "power_law"}, {"exponent", 1.2}, {"seed", 1}}},
      {"engine", {{"rate_quantum_ns", quantum_ns}}},
      {"trials", trials}};
  const auto points = mok::sim::expand_sweep(doc, "bench");
  const auto t0 = std::chrono::steady_clock::now();
  const auto rows = mok::sim::run_points(points, "bench", threads);
  const double t = seconds_since(t0);
  double sum_us = 0, max_us = 0;
  for (const auto& row : rows)
    for (const auto& [name, v] : row.metrics)
      if (name == "layer_us") {
        sum_us += v;
        max_us = std::max(max_us, v);
      }
  std::printf("monte-carlo gb200-nvl72: %d trials on %d threads, rate quantum %lld ns: %.1f s (%.3f s per trial; "
              "layer mean %.3f us, max %.3f us)\n",
              trials, threads, static_cast<long long>(quantum_ns), t, t / trials,
              rows.empty() ? 0.0 : sum_us / static_cast<double>(rows.size()), max_us);
  return rows.size() == static_cast<size_t>(trials) ? 0 : 1;
}

}  // namespace

// Standard output is checked like the other tools': a report that cannot be written (a full disk,
// a pipe whose reader has gone) is exit 2 with a message, never a silent 0.
int finish(int rc) {
  errno = 0;
  if (mok::cli::stdout_ok()) return rc;
  std::fprintf(stderr, "mok-sim-bench: cannot write to standard output (%s); check where it goes\n",
               errno != 0 ? std::strerror(errno) : "write failed");
  return 2;
}

int run(int argc, char** argv) {
  const char* usage =
      "usage: mok-sim-bench nvl72|racksN [RATE_QUANTUM_NS [full|THREADS]] | mc [TRIALS [THREADS [RATE_QUANTUM_NS]]]\n"
      "Times one forward layer (DeepSeek-V3 shapes, 8192 tokens per GPU) on gb200-nvl72 or N NVL72 racks, or\n"
      "TRIALS Monte-Carlo layers of NVL72 with power-law 1.2 routing (simulator/README.md, Speed).\n"
      "  mok-sim-bench nvl72            exact rates, one thread\n"
      "  mok-sim-bench racks8 5000 2    576 GPUs, 5 us rate quantum, a helper thread\n"
      "  mok-sim-bench mc 1000 2        1,000 trials on two threads\n"
      "Exit codes: 0 ran, 1 a Monte-Carlo trial failed, 2 bad usage or output that cannot be written.\n";
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::fputs(usage, stdout);
    return 0;
  }
  // Whole numbers only, in range; anything else is bad usage (atoll would read "5us" as 5 and
  // "abc" as 0).
  bool bad = false;
  auto number = [&](int i, int64_t fallback, int64_t lo, int64_t hi, const char* what) -> int64_t {
    if (argc <= i) return fallback;
    const std::string text = argv[i];
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
      std::fprintf(stderr, "mok-sim-bench: %s '%s' must be a whole number from %lld to %lld\n", what, text.c_str(),
                   static_cast<long long>(lo), static_cast<long long>(hi));
      bad = true;
    }
    return v;
  };
  const std::string what = argc > 1 ? argv[1] : "nvl72";
  if (what == "mc") {
    const int64_t trials = number(2, 1000, 1, 1000000, "TRIALS");
    const int64_t threads = number(3, 2, 1, 256, "THREADS");
    const int64_t quantum = number(4, 0, 0, 1000000000, "RATE_QUANTUM_NS");
    if (bad || argc > 5) return bad ? 2 : (std::fputs(usage, stderr), 2);
    return monte_carlo(static_cast<int>(trials), static_cast<int>(threads), quantum);
  }
  const int64_t quantum = number(2, 0, 0, 1000000000, "RATE_QUANTUM_NS");
  // Third argument: "full" (exact rates by full recomputes) or a thread count (SimOptions::threads).
  const std::string third = argc > 3 ? argv[3] : "";
  const bool full = third == "full";
  const int threads = !third.empty() && !full ? static_cast<int>(number(3, 1, 1, 256, "THREADS")) : 1;
  if (bad || argc > 4) return bad ? 2 : (std::fputs(usage, stderr), 2);
  if (what == "nvl72") return one_layer("gb200-nvl72", 72, quantum, full, threads);
  if (what.rfind("racks", 0) == 0 && what.size() > 5 && what.find_first_not_of("0123456789", 5) == std::string::npos) {
    const int n = std::atoi(what.c_str() + 5);
    if (n >= 1 && n <= 64) return one_layer("multi-rack:" + std::to_string(n), 72 * n, quantum, full, threads);
  }
  std::fprintf(stderr, "mok-sim-bench: unknown case '%s'\n%s", what.c_str(), usage);
  return 2;
}

int main(int argc, char** argv) {
  // A closed pipe then fails the write (EPIPE, reported by finish()) instead of ending the process
  // with SIGPIPE and no word, as in mok-sim (mok_sim_main.cpp says why this is per program).
  std::signal(SIGPIPE, SIG_IGN);
  return finish(run(argc, argv));
}
