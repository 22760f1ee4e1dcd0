// mok-verify: checks a backend against an HDF5 golden, or compares two files; exit codes per STYLE.md.
#include "mok/reference/error.hpp"
#include "mok/reference/golden.hpp"
#include "mok/reference/sample.hpp"
#include "mok/reference/schema.hpp"
#include "mok/verify/backends.hpp"
#include "mok/verify/compare.hpp"
#include "mok/verify/determinism.hpp"

#include "mok/cli.hpp"
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>

namespace {

constexpr int kExitPassed = 0, kExitFailed = 1, kExitBadInput = 2, kExitUnsupported = 3;

// Above this many multiply-adds the default is a sample (two CPU cores take about a minute).
constexpr double kFullRunMacLimit = 4e9;

double estimated_macs(const mok::spec::LayerConfig& c) {
  const double slots = static_cast<double>(c.num_slots());
  const double per_slot = 3.0 * c.hidden * c.intermediate;   // gate, up, down
  const double shared = 3.0 * c.num_tokens() * c.hidden * c.shared_intermediate;
  return 3.0 * (slots * per_slot + shared);  // forward + backward (about twice forward)
}

// Writes the report to standard output and makes sure it got there (a full disk, a closed pipe,
// /dev/full): a verdict nobody can read is not a pass. False after printing why on stderr.
bool write_report(const std::string& text) {
  errno = 0;
  const bool wrote = std::fwrite(text.data(), 1, text.size(), stdout) == text.size();
  const bool flushed = std::fflush(stdout) == 0;
  if (wrote && flushed && !std::ferror(stdout)) return true;
  const int err = errno;
  std::fprintf(stderr,
               "mok-verify: cannot write the report to standard output%s%s; send it to a file or pipe that "
               "can be written\n",
               err ? ": " : "", err ? std::strerror(err) : "");
  return false;
}

int finish(const mok::verify::Report& report, bool json) {
  // Under mok-launch every rank computes the same report; rank 0 prints it. MOK_RANK unset or empty
  // (an exported but blank variable) is a single process, which prints.
  const char* rank = std::getenv("MOK_RANK");
  if (rank && *rank && std::string(rank) != "0") return report.passed ? kExitPassed : kExitFailed;
  if (!write_report(json ? mok::verify::format_json(report) : mok::verify::format_table(report))) return kExitBadInput;
  return report.passed ? kExitPassed : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  // A reader that went away (a closed pipe) makes the report's write fail with EPIPE, which
  // write_report names (exit 2), instead of SIGPIPE ending the process without a word.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "mok-verify: check an MoE layer backend against a golden file (HDF5 schema mok-golden v1).\n\n"
      "  mok-verify run FILE [--backend emulate|oracle|cuda|auto]\n"
      "      runs the backend on the file's inputs and compares every output, gradient and\n"
      "      intermediate with the file's: emulate and cuda must match bit for bit; oracle\n"
      "      recomputes exact values and error radii and checks the file's tensors lie within.\n"
      "  mok-verify compare GOLDEN CANDIDATE\n"
      "      compares a candidate file (same schema; e.g. written by another backend) with a golden.\n"
      "  mok-verify determinism FILE --runs 20 --ranks 1,2,4,8 --comm-sms 1,2 [--items shared,own] [--minibatch M,...] [--transport nccl|split]\n"
      "      runs the CUDA kernel on the file's inputs under every configuration, prints one hash per\n"
      "      tensor per configuration, and fails on any difference (the CI gate for GPU nodes).\n\n"
      "Exit codes: 0 passed, 1 a check failed, 2 bad input or usage, or the report could not be written\n"
      "(standard output full or closed), 3 not supported here.",
      "mok-verify"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mok-verify 0.1.0");

  std::string file, backend = "auto", golden_path, candidate_path, criterion = "bitwise";
  bool json = false, full = false, no_bounds = false, end_to_end = false;
  int threads = 0;
  int64_t sample_tokens = 0, sample_cols = 0;
  uint64_t sample_seed = 1;

  auto* run = app.add_subcommand("run", "run a backend on a golden's inputs and check it against the golden");
  run->add_option("FILE", file, "golden HDF5 file (e.g. fixtures/tiny-uniform.h5)")->required();
  run->add_option("--backend,-b", backend,
                  "emulate: CPU emulator, bitwise; oracle: exact values and error radii; cuda: the GPU "
                  "kernel; auto: cuda when built and a GPU is present, else emulate")
      ->capture_default_str();
  run->add_option("--threads,-j", threads, "CPU threads (0 = all cores); results never depend on it")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  run->add_option("--sample-tokens", sample_tokens,
                  "check only this many tokens (at least one per expert) of the per-token tensors")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  run->add_option("--sample-cols", sample_cols, "check only this many I and Is columns of every weight gradient")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  run->add_option("--sample-seed", sample_seed, "seed for choosing the sample (0 to 2^64 - 1)")
      ->capture_default_str()
      ->check(mok::cli::seed());
  run->add_flag("--full", full, "check every element even when the case is large (default: sample above ~4e9 multiply-adds)");
  run->add_flag("--no-bounds", no_bounds,
                "skip the golden's per-element error-bound check (emulate, cuda, auto; not with --backend oracle "
                "or --end-to-end, which are bounds checks: a usage error)");
  auto* e2e_flag = run->add_flag("--end-to-end", end_to_end,
                "also check the output and every gradient against their true values computed from the inputs "
                "alone (exact sums, silu in double) with radii that cover any bf16-v1 implementation, so the "
                "verdict does not rest on the emulator's intermediates (costs a few times an emulation: sample "
                "large cases with --sample-tokens and --sample-cols). A golden made with mok-golden "
                "--end-to-end-bounds stores them, and they are read from it instead");
  bool recompute_e2e = false;
  run->add_flag("--recompute-end-to-end", recompute_e2e,
                "with --end-to-end: compute the bounds now even where the golden stores them (to judge with this "
                "build's oracle rather than the generator's)")
      ->needs(e2e_flag);
  std::string transport = "virtual";
  run->add_option("--transport", transport,
                  "cuda backend: virtual (all R ranks on one GPU, one launch), nccl (one GPU per rank, NCCL symmetric "
                  "memory) or split (one GPU, each rank its own launch on its own stream: the nccl transport's window "
                  "protocol without several GPUs); with --backend auto where cuda is not available, nccl and split exit "
                  "3 and virtual is noted and unused")
      ->check(CLI::IsMember({"virtual", "nccl", "split"}))
      ->capture_default_str();
  run->add_flag("--json", json, "machine-readable report on stdout");

  auto* cmp = app.add_subcommand("compare", "compare a candidate file with a golden file");
  cmp->add_option("GOLDEN", golden_path, "golden HDF5 file")->required();
  cmp->add_option("CANDIDATE", candidate_path, "candidate HDF5 file in the same schema")->required();
  cmp->add_option("--criterion", criterion, "bitwise (default) or bounds (within the golden's oracle radii)")
      ->check(CLI::IsMember({"bitwise", "bounds"}));
  cmp->add_flag("--json", json, "machine-readable report on stdout");

  auto* det = app.add_subcommand("determinism", "same bits across runs, rank counts, role splits and minibatches (GPU)");
  int runs = 20;
  std::vector<int> ranks{1, 2, 4, 8}, comm{1, 2};
  std::vector<int64_t> minibatch;
  uint64_t det_seed = 1;
  det->add_option("FILE", file, "golden or input file (only /inputs is used)")->required();
  det->add_option("--runs,-n", runs, "runs of each configuration")->capture_default_str()->check(CLI::Range(1, 100000));
  det->add_option("--ranks", ranks, "virtual rank counts R (each must divide E and the minibatch, else exit 2; under --transport nccl, counts "
                  "above the GPUs here are skipped, and exit 3 if none is left)")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(1, 4096));
  det->add_option("--comm-sms", comm, "communication blocks per rank (the rest compute; 0: the kernel's default, blocks per rank - 1)")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(0, 4096));
  det->add_option("--minibatch", minibatch,
                  "tokens per pass (default: the whole batch); per-token results must not change")
      ->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  std::vector<std::string> items{"shared", "own"};
  det->add_option("--items", items,
                  "who works the GEMM items of several virtual ranks on one GPU: shared (every block, rank after rank; "
                  "the kernel's default) and/or own (each rank's blocks); R = 1 and --transport nccl or split have one rank a "
                  "launch and run once")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"shared", "own"}));
  det->add_option("--seed", det_seed, "shuffles the order in which configurations run (0 to 2^64 - 1)")
      ->capture_default_str()
      ->check(mok::cli::seed());
  det->add_option("--transport", transport,
                  "virtual (ranks on one GPU, one launch), nccl (one GPU per rank) or split (one GPU, one launch per "
                  "rank: the nccl transport's window protocol)")
      ->check(CLI::IsMember({"virtual", "nccl", "split"}))
      ->capture_default_str();
  det->add_flag("--json", json, "machine-readable summary on stdout");

  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd != "run" && cmd != "compare" && cmd != "determinism") {
      std::fprintf(stderr, "mok-verify: unknown command '%s'; commands: run, compare, determinism (mok-verify --help)\n",
                   cmd.c_str());
      return kExitBadInput;
    }
  }
  if (const auto bad = mok::cli::empty_list_item(argc, argv, {"--ranks", "--comm-sms", "--items", "--minibatch"})) {
    std::fprintf(stderr, "mok-verify: error: %s\n", bad->c_str());
    return kExitBadInput;
  }
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  // The golden's layer output is what every check is about: a file without it is not a golden.
  auto require_output = [](const mok::ref::Golden& g, const std::string& path) {
    if (!g.tensors.count("outputs/output"))
      throw mok::Error(path + ": dataset /outputs/output is missing; a golden holds the layer's output "
                       "(regenerate the file with mok-golden)");
  };

  auto progress = [&](const std::string& line) { std::fprintf(stderr, "mok-verify: %s\n", line.c_str()); };
  try {
    if (*det) {
      mok::verify::DeterminismOptions o;
      o.runs = runs;
      o.ranks = ranks;
      o.comm_blocks = comm;
      o.items = items;
      o.minibatches = minibatch;
      o.seed = det_seed;
      o.transport = transport;
      o.progress = progress;
      progress("reading " + file);
      mok::ref::ReadOptions ro;
      ro.load_intermediates = false;
      ro.load_bounds = false;
      const mok::ref::Golden golden = mok::ref::read_golden(file, ro);
      if (det->count("--ranks") == 0) {
        // The default rank counts are a suggestion, not the user's: keep those this layer takes
        // (dividing E and every minibatch) rather than refuse a count nobody gave.
        std::vector<int> kept;
        const int64_t G = golden.cfg.num_tokens();
        std::string defaults, list;
        for (int R : o.ranks) {
          defaults += (defaults.empty() ? "" : ",") + std::to_string(R);
          if (mok::verify::rank_count_fits(golden.cfg, R, minibatch)) {
            kept.push_back(R);
            list += (list.empty() ? "" : ",") + std::to_string(R);
          }
        }
        if (kept.size() != o.ranks.size()) {
          progress("--ranks defaults to " + defaults + "; this layer (E = " + std::to_string(golden.cfg.num_experts) +
                   ", " + std::to_string(G) + " tokens" + (minibatch.empty() ? "" : ", the minibatches") +
                   ") takes " + list + " of them");
          o.ranks = kept;
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      const mok::verify::DeterminismResult r = mok::verify::run_determinism(golden, o);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string text;
      if (json) {
        nlohmann::json j;
        j["file"] = file;
        j["passed"] = r.passed;
        j["configurations"] = r.configurations;
        j["executions"] = r.executions;
        j["seconds"] = secs;
        j["first_difference"] = r.first_difference.empty() ? nlohmann::json() : nlohmann::json(r.first_difference);
        text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // any file name
      } else {
        text = r.table;
        if (!r.passed) text += "# first difference: " + r.first_difference + "\n";
        char line[256];
        std::snprintf(line, sizeof line, "# %s: %lld configurations x %d runs = %lld executions, %.1f s\n",
                      r.passed ? "PASSED" : "FAILED", (long long)r.configurations, runs, (long long)r.executions, secs);
        text += line;
      }
      if (!write_report(text)) return kExitBadInput;
      return r.passed ? kExitPassed : kExitFailed;
    }
    if (*run) {
      // Usage first, then the file, then whether this machine supports the backend (exit 2 before 3:
      // a bad command line or file stays bad on a machine that has a GPU).
      const mok::verify::Backend b = mok::verify::parse_backend(backend);
      if (run->count("--transport") > 0 && b != mok::verify::Backend::kCuda && b != mok::verify::Backend::kAuto)
        throw mok::Error("--transport chooses how the cuda backend's ranks talk; backend " + backend +
                         " has no transport: drop --transport or use --backend cuda");
      if (full && (sample_tokens > 0 || sample_cols > 0))
        throw mok::Error("--full and --sample-tokens/--sample-cols exclude each other");
      if (no_bounds && b == mok::verify::Backend::kOracle)
        throw mok::Error("--no-bounds with --backend oracle: the oracle backend is a bounds check (it checks that "
                         "the file's tensors lie within recomputed radii); drop --no-bounds, or use --backend emulate");
      if (no_bounds && end_to_end)
        throw mok::Error("--no-bounds with --end-to-end: the end-to-end check is a bounds check; drop one of them");
      progress("reading " + file);
      const mok::ref::Golden golden = mok::ref::read_golden(file);
      require_output(golden, file);
      if (b == mok::verify::Backend::kCuda) {
        std::string why;
        if (!mok::verify::cuda_available(&why)) {
          std::fprintf(stderr, "mok-verify: backend cuda is not supported here: %s\n", why.c_str());
          return kExitUnsupported;
        }
      }
      if (b == mok::verify::Backend::kAuto && run->count("--transport") > 0) {
        // auto resolves to emulate without a GPU: an explicit transport would silently not apply.
        std::string why;
        if (!mok::verify::cuda_available(&why)) {
          if (transport != "virtual") {
            std::fprintf(stderr,
                         "mok-verify: --transport %s needs the cuda backend, which is not supported here (%s), "
                         "and --backend auto would run emulate instead; run on a GPU node, or drop --transport\n",
                         transport.c_str(), why.c_str());
            return kExitUnsupported;
          }
          progress("--transport " + transport + " applies to the cuda backend only; it is unused here");
        }
      }
      std::optional<mok::ref::Sample> sample;
      const bool big = estimated_macs(golden.cfg) > kFullRunMacLimit;
      if (sample_tokens > 0 || sample_cols > 0 || (big && !full)) {
        const int64_t nt = sample_tokens > 0 ? sample_tokens : 64;
        const int64_t nc = sample_cols > 0 ? sample_cols : 8;
        if (big && sample_tokens == 0 && sample_cols == 0)
          progress("large case (about " + std::to_string(static_cast<long long>(estimated_macs(golden.cfg) / 1e9)) +
                   "e9 multiply-adds): checking a sample; --full checks everything");
        sample = mok::ref::make_sample(golden.cfg, golden.tensors.at("inputs/topk_experts"), nt, nc, sample_seed);
      }
      mok::verify::RunOptions ro;
      ro.backend = b;
      ro.num_threads = threads;
      ro.sample = sample ? &*sample : nullptr;
      ro.check_bounds = !no_bounds;
      ro.end_to_end = end_to_end;
      ro.recompute_end_to_end = recompute_e2e;
      ro.transport = transport;
      ro.progress = progress;
      ro.golden_name = file;
      mok::verify::Report report;
      // Out of memory while running (past the up-front estimate): the layer is too large here.
      auto out_of_memory = [&](const std::string& what) {
        return mok::Error(file + ": out of memory running the " + backend + " backend on this layer (" + what +
                          "); run on a machine with more memory, or use a smaller layer");
      };
      try {
        report = mok::verify::run_backend(golden, ro);
      } catch (const mok::ref::AllocationError& e) {
        throw out_of_memory(e.what());
      } catch (const std::bad_alloc&) {
        throw out_of_memory("an allocation failed");
      } catch (const mok::Error& e) {
        // A problem with the file's content found while running (a missing tensor the backend
        // needs): name the file.
        const std::string what = e.what();
        if (e.kind() != mok::ErrorKind::kBadInput || what.rfind(file, 0) == 0) throw;
        throw mok::Error(file + ": " + what);
      }
      report.golden_path = file;
      return finish(report, json);
    }
    // compare
    const auto t0 = std::chrono::steady_clock::now();
    const mok::ref::Golden golden = mok::ref::read_golden(golden_path);
    require_output(golden, golden_path);
    mok::ref::ReadOptions candidate_options;
    candidate_options.require_inputs = false;
    const mok::ref::Golden candidate = mok::ref::read_golden(candidate_path, candidate_options);
    {
      // Files of one case: the same layer. R may differ (the same tokens split otherwise); tensors
      // whose shape depends on R then fail as shape differences.
      const auto& c = candidate.cfg;
      const auto& g = golden.cfg;
      std::string diff;
      auto field = [&](const char* name, int64_t cv, int64_t gv) {
        if (cv != gv) diff += std::string(diff.empty() ? "" : ", ") + name + " " + std::to_string(cv) + " (golden " + std::to_string(gv) + ")";
      };
      field("H", c.hidden, g.hidden);
      field("I", c.intermediate, g.intermediate);
      field("Is", c.shared_intermediate, g.shared_intermediate);
      field("E", c.num_experts, g.num_experts);
      field("K", c.top_k, g.top_k);
      field("R*T", c.num_tokens(), g.num_tokens());
      if (!diff.empty())
        throw mok::Error(candidate_path + ": its /config differs from " + golden_path + "'s: " + diff +
                         "; compare files of the same case");
    }
    {
      // A candidate that carries inputs other than the golden's (another seed, say) fails almost
      // everywhere for that reason alone: say so before the report.
      std::string differ;
      for (const auto& [path, t] : candidate.tensors) {
        if (path.rfind("inputs/", 0) != 0) continue;
        const auto g = golden.tensors.find(path);
        if (g == golden.tensors.end()) continue;
        if (g->second.dtype() != t.dtype() || g->second.shape() != t.shape() ||
            std::memcmp(g->second.raw(), t.raw(), t.size_bytes()) != 0)
          differ += std::string(differ.empty() ? "" : ", ") + "/" + path;
      }
      if (!differ.empty())
        progress("note: " + candidate_path + "'s inputs differ from " + golden_path + "'s (" + differ +
                 "): its results come from other inputs, so they are not expected to match");
    }
    if (criterion == "bounds") {
      // The bounds criterion judges every output and gradient by the golden's stored radii: a golden
      // without them (mok-golden --no-bounds) has nothing to judge with, which is bad input, not a
      // failed check.
      std::string missing;
      for (const auto& [path, tensor] : golden.tensors) {
        const mok::ref::TensorSpec* s = mok::ref::find_spec(path);
        if (!s || (s->role != mok::ref::Role::kOutput && s->role != mok::ref::Role::kGrad)) continue;
        if (golden.tensors.count(mok::ref::bound_exact_path(path)) && golden.tensors.count(mok::ref::bound_radius_path(path)))
          continue;
        missing += std::string(missing.empty() ? "" : ", ") + "/" + mok::ref::bound_exact_path(path) + " and /" +
                   mok::ref::bound_radius_path(path);
      }
      if (!missing.empty())
        throw mok::Error(golden_path + ": --criterion bounds needs the golden's error bounds for its output and "
                         "gradients, and it lacks " + missing +
                         "; regenerate the golden with mok-golden without --no-bounds, or use --criterion bitwise");
    }
    mok::verify::CompareOptions co;
    co.criterion = criterion == "bounds" ? mok::verify::Criterion::kWithinBounds : mok::verify::Criterion::kBitwise;
    co.golden_name = golden_path;
    mok::verify::Report report = mok::verify::compare(golden, candidate.tensors, co);
    report.golden_path = golden_path;
    report.backend = "file " + candidate_path;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return finish(report, json);
  } catch (const mok::Error& e) {
    // Bad input -> 2; not supported here -> 3; a failure while running (a kernel timeout, a CUDA
    // error) means the check did not pass -> 1.
    std::fprintf(stderr, "mok-verify: %s\n", e.what());
    switch (e.kind()) {
      case mok::ErrorKind::kUnsupported: return kExitUnsupported;
      case mok::ErrorKind::kInternal: return kExitFailed;
      default: return kExitBadInput;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok-verify: error: %s\n", e.what());
    return kExitBadInput;
  }
}
