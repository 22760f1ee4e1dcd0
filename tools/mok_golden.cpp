// mok-golden: makes a golden HDF5 file (inputs, outputs, grads, intermediates, bounds) from a config and a seed.
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/golden.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/reference/schema.hpp"

#include "mok/cli.hpp"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <new>
#include <string>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr const char* kSmallerLayer = "lower --H, --I, --Is, --E or --T, or run on a machine with more memory";

// Bytes of the tensors the golden will hold at once (inputs, output, gradients, bounds), a lower
// bound on what making it takes (the intermediates and working copies come on top).
double golden_bytes(const mok::spec::LayerConfig& cfg, bool forward_only, bool bounds, bool terms, bool end_to_end) {
  using mok::ref::Role;
  double total = 0;
  for (const mok::ref::TensorSpec& spec : mok::ref::golden_schema()) {
    if (!mok::ref::spec_applies(spec, cfg)) continue;
    const std::string path = spec.path;
    const bool backward = path == "inputs/d_output" || spec.role == Role::kGrad ||
                          (mok::ref::is_bound_role(spec.role) && mok::ref::checked_path_of_bound(path) != "outputs/output");
    if (forward_only && backward) continue;
    const bool wanted = spec.role == Role::kInput || spec.role == Role::kOutput || spec.role == Role::kGrad ||
                        (bounds && (spec.role == Role::kBoundExact || spec.role == Role::kBoundRadius)) ||
                        (terms && spec.role == Role::kBoundTerms) ||
                        (end_to_end && (spec.role == Role::kEndToEndExact || spec.role == Role::kEndToEndRadius));
    if (wanted) total += mok::ref::spec_bytes(spec, cfg);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG, which the writer reports and
  // cleans up after (temporary file removed), instead of SIGXFSZ ending the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  std::string preset_help = "configuration preset:";
  for (const auto& p : mok::ref::presets())
    preset_help += "\n  " + std::string(p.name) + ": " + mok::ref::format_config(p.cfg) + " (" + p.what + ")";
  CLI::App app{
      "mok-golden: make a golden file for one MoE layer case (HDF5 schema mok-golden v1).\n"
      "It draws fresh random inputs from --seed, runs the CPU emulator (profile bf16-v1, Hopper MMA\n"
      "model) forward and backward, computes the oracle's exact values and error radii, and writes\n"
      "inputs, outputs, grads, intermediates and bounds. The same arguments give the same bytes.\n\n"
      "Examples:\n"
      "  mok-golden --preset tiny --seed 1 -o tiny.h5\n"
      "  mok-golden --preset small --routing zipf:1.2 --empty-slots 0.05 --seed 7 -o small-zipf.h5\n"
      "  mok-golden --H 256 --I 64 --Is 0 --E 16 --K 4 --R 2 --T 64 --routing hot:2 -o custom.h5\n\n"
      "Exit codes: 0 written, 2 bad input or usage (nothing written).",
      "mok-golden"};
  app.set_version_flag("--version", std::string("mok-golden 0.1.0 ") + mok::ref::kGeneratorVersion);
  std::string preset = "tiny", routing = "uniform", out;
  uint64_t seed = 1;
  double rank_skew = 0, empty = 0;
  int threads = 0;
  bool no_intermediates = false, no_bounds = false, forward_only = false, end_to_end_bounds = false,
       bound_terms = false;
  int64_t H = -1, I = -1, Is = -1, E = -1, K = -1, R = -1, T = -1;  // -1: take the preset's
  app.add_option("--preset,-p", preset, preset_help)->capture_default_str();
  using mok::cli::layer_size_range;
  app.add_option("--H", H, "hidden size, a multiple of 16 (overrides the preset)")->check(layer_size_range('H'));
  app.add_option("--I", I, "routed expert intermediate size, a multiple of 16")->check(layer_size_range('I'));
  app.add_option("--Is", Is, "shared expert intermediate size, a multiple of 16 (0 = no shared expert)")
      ->check(layer_size_range('s'));
  app.add_option("--E", E, "number of experts (a multiple of R)")->check(layer_size_range('E'));
  app.add_option("--K", K, "experts per token (top-k, at most E)")->check(layer_size_range('K'));
  app.add_option("--R", R, "ranks (the expert placement: E/R contiguous experts per rank)")->check(layer_size_range('R'));
  app.add_option("--T", T, "tokens per rank (R*T*K must fit in int32)")->check(layer_size_range('T'));
  app.add_option("--routing", routing,
                 "expert choice: uniform | zipf:S (popularity ~ 1/rank^S, e.g. zipf:1.2) | hot:N[:F] "
                 "(N hot experts, each F times as likely, default F=16)")
      ->capture_default_str();
  const CLI::Validator probability = mok::cli::finite_range(0.0, 1.0, "a probability (a number from 0 to 1)");
  app.add_option("--rank-skew", rank_skew, "probability that a slot picks among its own rank's experts")->check(probability);
  app.add_option("--empty-slots", empty, "probability that a slot is empty (-1)")->check(probability);
  app.add_option("--seed,-s", seed, "random seed")->capture_default_str()->check(mok::cli::seed());
  app.add_option("--threads,-j", threads, "CPU threads (0 = all cores); the file does not depend on it")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--forward-only", forward_only, "no d_output, grads or backward intermediates");
  app.add_flag("--no-intermediates", no_intermediates, "leave out /intermediates (smaller file)");
  auto* nb = app.add_flag("--no-bounds", no_bounds, "leave out /bounds (skips the oracle)");
  app.add_flag("--end-to-end-bounds", end_to_end_bounds,
               "also store the end-to-end oracle's values and radii (bounds/<name>_e2e_exact, _e2e_bound: from the "
               "inputs alone, for the output and every gradient), so that mok-verify run --end-to-end reads them "
               "instead of computing them (about 4x an emulation's time, once)")
      ->excludes(nb);
  app.add_flag("--bound-terms", bound_terms,
               "also store the oracle's bound material: bounds/<name>_terms, the sum of |terms| of each element's "
               "last stage (rounded up to f32; for output and d_x the shared expert's chain products and the slot "
               "terms), for error models of your own")
      ->excludes(nb);
  app.add_option("--output,-o", out, "output file (written atomically)")->required();
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  try {
    if (out == "-")
      throw mok::Error("-o -: an HDF5 file needs a file it can seek in, not standard output; give a file name such "
                       "as case.h5 (./- for a file named '-')");
    mok::ref::check_output_path(out);  // before the work, which can take minutes
    mok::spec::LayerConfig cfg = mok::ref::preset_config(preset);
    if (H != -1) cfg.hidden = H;
    if (I != -1) cfg.intermediate = I;
    if (Is != -1) cfg.shared_intermediate = Is;
    if (E != -1) cfg.num_experts = E;
    if (K != -1) cfg.top_k = K;
    if (R != -1) cfg.num_ranks = R;
    if (T != -1) cfg.tokens_per_rank = T;
    const mok::spec::Status st = cfg.validate();
    if (!st.ok)
      throw mok::Error(std::string(st.message) + " (the layer asked for: " + mok::ref::format_config(cfg) +
                       ", from --preset " + preset + " and --H --I --Is --E --K --R --T)");
    mok::ref::RoutingSpec rs = mok::ref::parse_routing(routing);
    rs.rank_skew = rank_skew;
    rs.empty_prob = empty;
    mok::ref::check_routing(cfg, rs);  // before the header line: a usage error prints only itself
    // A layer too large for this machine is refused now, not after minutes or by the OOM killer.
    const double need = golden_bytes(cfg, forward_only, !no_bounds, bound_terms, end_to_end_bounds);
    if (const auto available = mok::ref::available_memory_bytes(); available && need > static_cast<double>(*available))
      throw mok::Error("the layer " + mok::ref::format_config(cfg) + " needs at least " +
                       mok::ref::format_bytes_estimate(need) + " of memory for its inputs, results and " +
                       "bounds, but only " + mok::ref::format_bytes(*available) +
                       " can be allocated here (memory limits, the machine's memory and swap); " + kSmallerLayer);

    const auto t0 = std::chrono::steady_clock::now();
    // The preset's name alone only where it still describes the layer. One word either way:
    // fixtures/regenerate reads the layer after the first word of this line.
    const bool overridden = H != -1 || I != -1 || Is != -1 || E != -1 || K != -1 || R != -1 || T != -1;
    const std::string label = overridden ? preset + "+overrides" : preset;
    std::fprintf(stderr, "mok-golden: %s %s routing=%s seed=%llu\n", label.c_str(),
                 mok::ref::format_config(cfg).c_str(), rs.describe().c_str(), (unsigned long long)seed);
    mok::ref::TensorMap inputs = mok::ref::generate_inputs(cfg, rs, seed);
    if (forward_only) inputs.erase("inputs/d_output");
    mok::ref::EmulateOptions eo;
    eo.backward = !forward_only;
    eo.num_threads = threads;
    eo.intermediates = true;
    mok::ref::TensorMap result = mok::ref::emulate(cfg, inputs, eo);
    const double emulate_s = seconds_since(t0);
    std::fprintf(stderr, "mok-golden: emulated %s in %.1f s\n", forward_only ? "forward" : "forward and backward",
                 emulate_s);
    mok::ref::Golden golden;
    golden.cfg = cfg;
    golden.meta.generator = "mok-golden";
    golden.meta.generator_version = std::string("mok-golden 0.1.0 ") + mok::ref::kGeneratorVersion;
    golden.meta.seed = seed;
    golden.meta.routing = rs.describe();
    if (!no_bounds) {
      const auto t1 = std::chrono::steady_clock::now();
      mok::ref::OracleOptions oo;
      oo.num_threads = threads;
      oo.terms = bound_terms;
      for (auto& [path, t] : mok::ref::oracle_bounds(cfg, inputs, result, oo)) golden.tensors[path] = std::move(t);
      std::fprintf(stderr, "mok-golden: oracle bounds in %.1f s\n", seconds_since(t1));
    }
    if (end_to_end_bounds) {
      const auto t1 = std::chrono::steady_clock::now();
      std::fprintf(stderr, "mok-golden: end-to-end bounds next (about four times the emulation's %.1f s)\n",
                   emulate_s);
      mok::ref::OracleOptions oo;
      oo.num_threads = threads;
      // The oracle names its results like the stage-local pair; the golden keeps them apart.
      for (auto& [path, t] : forward_only ? mok::ref::oracle_forward_end_to_end(cfg, inputs, oo)
                                          : mok::ref::oracle_end_to_end(cfg, inputs, oo)) {
        const std::string checked = mok::ref::checked_path_of_bound(path);
        golden.tensors[path == mok::ref::bound_exact_path(checked) ? mok::ref::end_to_end_exact_path(checked)
                                                                   : mok::ref::end_to_end_radius_path(checked)] =
            std::move(t);
      }
      std::fprintf(stderr, "mok-golden: end-to-end bounds in %.1f s\n", seconds_since(t1));
    }
    for (auto& [path, t] : inputs) golden.tensors[path] = std::move(t);
    for (auto& [path, t] : result)
      if (!(no_intermediates && path.rfind("intermediates/", 0) == 0)) golden.tensors[path] = std::move(t);
    double raw = 0;
    for (const auto& [path, t] : golden.tensors) raw += static_cast<double>(t.size_bytes());
    std::fprintf(stderr, "mok-golden: writing %s (%zu datasets, %s before compression)\n", out.c_str(),
                 golden.tensors.size(), mok::ref::format_bytes_estimate(raw).c_str());
    mok::ref::write_golden(out, golden);
    std::fprintf(stderr, "mok-golden: wrote %s (%zu datasets) in %.1f s\n", out.c_str(), golden.tensors.size(),
                 seconds_since(t0));
    return 0;
  } catch (const mok::ref::AllocationError& e) {
    std::fprintf(stderr, "mok-golden: out of memory making %s (%s); %s\n", out.c_str(), e.what(), kSmallerLayer);
    return 2;
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "mok-golden: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mok-golden: out of memory making %s; %s\n", out.c_str(), kSmallerLayer);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok-golden: error: %s\n", e.what());
    return 2;
  }
}
