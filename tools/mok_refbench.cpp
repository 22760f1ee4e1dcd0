// mok-refbench: throughput of the CPU emulator and oracle (tokens per second, forward and backward).
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/reference/parallel.hpp"

#include "mok/cli.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <vector>

namespace {

template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // A pipe whose reader has gone (`mok-refbench | head -1` once head has ended) makes the
  // report's write fail with EPIPE, which stdout_ok reports (exit 2), instead of SIGPIPE ending the
  // process without a word (exit 141). Ignored here, not in mok::cli::parse: an ignored signal
  // stays ignored across exec, and the ranks mok-launch starts must not inherit that.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"mok-refbench: tokens per second of the CPU emulator and oracle on a preset (median of --reps runs).\n"
               "Backward time = (forward+backward) - forward. The oracle row times oracle_bounds on the\n"
               "emulator's intermediates (every output and gradient element, stage by stage); the end-to-end\n"
               "row times oracle_end_to_end (the same elements from the inputs alone).\n\n"
               "  mok-refbench --preset small -j 2 --reps 5\n\n"
               "Exit codes: 0 measured, 2 bad input or usage, or output that cannot be written.",
               "mok-refbench"};
  std::string preset = "dsv3-mini";
  int threads = 0, reps = 3;
  uint64_t seed = 1;
  std::string names;
  for (const mok::ref::Preset& p : mok::ref::presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  app.add_option("--preset,-p", preset, "configuration preset: " + names)->capture_default_str();
  app.add_option("--threads,-j", threads, "threads (0 = all cores)")->capture_default_str()->check(CLI::Range(0, 4096));
  app.add_option("--reps,-r", reps, "repetitions (median reported)")->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--seed,-s", seed, "input seed")->capture_default_str()->check(mok::cli::seed());
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  try {
    const mok::spec::LayerConfig cfg = mok::ref::preset_config(preset);
    const mok::ref::TensorMap in = mok::ref::generate_inputs(cfg, mok::ref::parse_routing("uniform"), seed);
    const double G = static_cast<double>(cfg.num_tokens());
    mok::ref::EmulateOptions fwd;
    fwd.backward = false;
    fwd.intermediates = false;
    fwd.num_threads = threads;
    mok::ref::EmulateOptions both;
    both.num_threads = threads;
    mok::ref::TensorMap result;
    // Each stage takes seconds to minutes at the presets' sizes: say what runs (stderr).
    const auto stage = [&](const char* what, double t) {
      std::fprintf(stderr, "mok-refbench: %s: median %.3f s of %d\n", what, t, reps);
      return t;
    };
    std::fprintf(stderr, "mok-refbench: %s, %d repetitions of 4 stages (emulate forward, forward+backward, oracle, "
                         "end-to-end oracle)\n", preset.c_str(), reps);
    const double t_fwd = stage("emulate forward", median_seconds(reps, [&] { mok::ref::emulate(cfg, in, fwd); }));
    const double t_both =
        stage("emulate forward+backward", median_seconds(reps, [&] { result = mok::ref::emulate(cfg, in, both); }));
    mok::ref::OracleOptions oo;
    oo.num_threads = threads;
    const double t_oracle =
        stage("oracle (all bounds)", median_seconds(reps, [&] { mok::ref::oracle_bounds(cfg, in, result, oo); }));
    const double t_e2e =
        stage("end-to-end oracle", median_seconds(reps, [&] { mok::ref::oracle_end_to_end(cfg, in, oo); }));
    std::printf("# mok-refbench preset=%s G=%lld H=%lld I=%lld Is=%lld E=%lld K=%lld threads=%d reps=%d seed=%llu\n",
                preset.c_str(), (long long)cfg.num_tokens(), (long long)cfg.hidden, (long long)cfg.intermediate,
                (long long)cfg.shared_intermediate, (long long)cfg.num_experts, (long long)cfg.top_k,
                mok::ref::resolve_threads(threads), reps, static_cast<unsigned long long>(seed));
    std::printf("%-28s %12s %14s\n", "stage", "median_s", "tokens_per_s");
    std::printf("%-28s %12.3f %14.1f\n", "emulate forward", t_fwd, G / t_fwd);
    std::printf("%-28s %12.3f %14.1f\n", "emulate backward", t_both - t_fwd, G / (t_both - t_fwd));
    std::printf("%-28s %12.3f %14.1f\n", "emulate forward+backward", t_both, G / t_both);
    std::printf("%-28s %12.3f %14.1f\n", "oracle (all bounds)", t_oracle, G / t_oracle);
    std::printf("%-28s %12.3f %14.1f\n", "oracle end to end (all)", t_e2e, G / t_e2e);
    if (!mok::cli::stdout_ok()) {
      std::fprintf(stderr, "mok-refbench: cannot write the report to standard output; check where it goes\n");
      return 2;
    }
    return 0;
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "mok-refbench: %s\n", e.what());
    return 2;
  }
}
