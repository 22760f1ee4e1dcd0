// mok-bench: forward and backward time of the fused kernel (virtual ranks on one GPU, or one rank
// per GPU through NCCL) against the unfused cuBLAS pipeline and the PyTorch pipeline
// (tools/moe_torch_baseline.py, started by this program with the same shape), with the bf16
// matrix peak and copy bandwidth measured in the same run (device events, warm-up, median of N),
// and the bytes a pass must move at least.
#include "mok/kernel/block_counts.hpp"
#include "mok/kernel/layer.hpp"
#include "mok/kernel/nccl.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/golden.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/bf16.hpp"
#include "unfused_baseline.hpp"

#include "mok/cli.hpp"
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <new>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

// The program's name in its help and messages: this file also builds mok-bench-atomics.
#if defined(MOK_ATOMICS_VARIANT)
constexpr const char* kProgram = "mok-bench-atomics";
#else
constexpr const char* kProgram = "mok-bench";
#endif

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) throw mok::Error(std::string(#x ": ") + cudaGetErrorString(e_), mok::ErrorKind::kInternal); \
  } while (0)

void* upload(const mok::ref::TensorMap& m, const char* p) {
  auto it = m.find(p);
  if (it == m.end()) return nullptr;
  void* d = nullptr;
  CK(cudaMalloc(&d, it->second.size_bytes()));
  CK(cudaMemcpy(d, it->second.raw(), it->second.size_bytes(), cudaMemcpyHostToDevice));
  return d;
}

// One shell word: single-quoted, embedded quotes escaped.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Runs the PyTorch baseline script with --json (stderr merged); `ok` says whether it exited 0.
std::string run_torch(const std::vector<std::string>& argv, bool* ok) {
  std::string cmd;
  for (const std::string& a : argv) cmd += shell_quote(a) + " ";
  cmd += "--json 2>&1";
  *ok = false;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *ok = pclose(f) == 0;
  return out;
}

// uniform, or zipf:S with S a plain decimal number: the routings the PyTorch script takes.
bool torch_routing(const std::string& r) {
  if (r == "uniform") return true;
  if (r.rfind("zipf:", 0) != 0 || r.size() == 5) return false;
  return r.find_first_not_of("0123456789.", 5) == std::string::npos;
}

// One traced pass (KernelOptions::trace): where the blocks' time went, in ms from the first
// block's start (marks) and per block (sums), min / mean / max over the blocks.
void print_trace(const char* pass, const std::vector<uint64_t>& tr, int comm_per_rank, int blocks_per_rank,
                 int wide_ranks) {
  using namespace mok::kernel;
  const size_t nb = tr.size() / kTraceSlots;
  if (nb == 0) return;
  auto at = [&](size_t b, int s) { return tr[b * kTraceSlots + s]; };
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (size_t b = 0; b < nb; ++b) t0 = std::min(t0, at(b, kTrStart)), t1 = std::max(t1, at(b, kTrEnd));
  std::printf("# trace %s: %zu blocks, first start to last end %.3f ms (times in ms)\n", pass, nb, (t1 - t0) * 1e-6);
  std::printf("%-34s %9s %9s %9s\n", "", "min", "mean", "max");
  auto row = [&](const char* name, bool mark, int slot, bool comm_only, double scale = 1e-6) {
    double lo = 1e300, hi = -1e300, sum = 0;
    size_t n = 0;
    for (size_t b = 0; b < nb; ++b) {
      if (comm_only && rank_block_of(static_cast<int>(b), blocks_per_rank, wide_ranks).block >= comm_per_rank) continue;
      const double v = (mark ? static_cast<double>(at(b, slot) - t0) : static_cast<double>(at(b, slot))) * scale;
      lo = std::min(lo, v), hi = std::max(hi, v), sum += v, ++n;
    }
    if (n) std::printf("%-34s %9.3f %9.3f %9.3f\n", name, lo, sum / n, hi);
  };
  row("mark: plan built", true, kTrPlanned, false);
  row("mark: gathering done (gatherers)", true, kTrGathered, true);
  row("mark: last GEMM item done", true, kTrItemsDone, false);
  row("mark: reduction starts", true, kTrReduceStart, false);
  row("mark: reduction done", true, kTrReduceDone, false);
  row("mark: end", true, kTrEnd, false);
  row("sum: wait for gathered rows", false, kTrWaitRows, false);
  row("sum: phase-1 GEMMs + epilogue", false, kTrPhase1, false);
  row("sum: wait for phase-1 tiles", false, kTrWaitTile, false);
  row("sum: phase-2 GEMMs + epilogue", false, kTrPhase2, false);
  row("sum: publish (fences, counters)", false, kTrPublish, false);
  row("sum: between items (claims, mapping)", false, kTrBetween, false);
  row("count: GEMM items", false, kTrItems, false, 1.0);
  row("count: phase-2 items", false, kTrItems2, false, 1.0);
  // Inside the fast engine's calls (GemmLaps: builds configured with -DMOK_GEMM_LAPS=ON; all
  // zero otherwise, and then not printed).
  const char* laps[kLapWords] = {"entry to barrier", "barrier to loads issued", "issued to first full stage",
                                 "main loop", "epilogue"};
  const struct { const char* name; int slot; } groups[3] = {{"phase 1", kTrLaps1}, {"phase 2", kTrLaps2}, {"wgrad", kTrLapsW}};
  for (const auto& gr : groups) {
    bool any = false;
    for (size_t b = 0; b < nb; ++b) any = any || at(b, gr.slot + 3) > 0;
    if (!any) continue;
    for (int k = 0; k < kLapWords; ++k) {
      const std::string name = std::string("sum: ") + gr.name + " " + laps[k];
      row(name.c_str(), false, gr.slot + k, false);
    }
  }
  row("count: weight-gradient tiles", false, kTrWgradItems, false, 1.0);
  // The backward's weight gradients run from a block's "reduction done" mark to its end.
  bool wgrad = false;
  for (size_t b = 0; b < nb; ++b) wgrad = wgrad || at(b, kTrWgradItems) > 0;
  if (wgrad) {
    row("mark: d_x done (router grads next)", true, kTrDxDone, false);
    double lo = 1e300, hi = -1e300, sum = 0;
    for (size_t b = 0; b < nb; ++b) {
      const double v = static_cast<double>(at(b, kTrEnd) - at(b, kTrReduceDone)) * 1e-6;
      lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
    }
    std::printf("%-34s %9.3f %9.3f %9.3f\n", "span: weight gradients", lo, sum / static_cast<double>(nb), hi);
  }
}

// Empty when `path` is a regular file (executable too, when asked), else why not.
std::string file_problem(const std::string& path, bool executable) {
  struct stat st {};
  if (path.empty()) return "is empty";
  if (stat(path.c_str(), &st) != 0) return "no such file";
  if (!S_ISREG(st.st_mode)) return S_ISDIR(st.st_mode) ? "is a directory, not a file" : "is not a regular file";
  if (executable && access(path.c_str(), X_OK) != 0) return "is not executable";
  return {};
}

// An interpreter named without a slash is looked up on PATH, as the shell that runs it does.
std::string program_problem(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return file_problem(name, true);
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = end > at ? dirs.substr(at, end - at) : ".";
    if (file_problem(dir + "/" + name, true).empty()) return {};
    at = end + 1;
  }
  return "not found on PATH";
}

void* zeros(size_t bytes) {
  void* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(bytes, 4)));
  CK(cudaMemset(d, 0, std::max<size_t>(bytes, 4)));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  // A pipe whose reader has gone (`mok-bench ... | head -1` once head has ended) makes the
  // report's write fail with EPIPE, which stdout_ok reports (exit 2), instead of SIGPIPE ending the
  // process without a word (exit 141). Ignored here, not in mok::cli::parse: an ignored signal
  // stays ignored across exec, and the ranks mok-launch starts must not inherit that. The PyTorch
  // script run_torch starts does inherit it, which changes nothing: Python ignores SIGPIPE itself,
  // and its output comes to this process.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> preset_list;
  std::string preset_names;
  for (const mok::ref::Preset& p : mok::ref::presets()) {
    preset_names += (preset_list.empty() ? "" : ", ") + std::string(p.name);
    preset_list.emplace_back(p.name);
  }
  const std::string prog = kProgram;
  CLI::App app{prog + ": time the fused MoE kernel (forward, backward) against the unfused cuBLAS pipeline, with the\n"
               "bf16 matrix peak (an 8192^3 cublasGemmEx) and the copy bandwidth measured in the same run;\n"
               "CUDA events, median of --reps after --warmup. Exit 3 without a GPU.\n\n"
#if defined(MOK_ATOMICS_VARIANT)
               "This build's kernel does the combine, d_x and weight gradients by fp32 atomics (a benchmark\n"
               "build, not the product); otherwise it is mok-bench.\n\n"
#endif
               "--transport virtual (default): the R ranks share one GPU in one launch. --transport nccl: one rank\n"
               "per GPU through NCCL symmetric memory, on the first R GPUs of this process (one thread each), or\n"
               "one process per GPU when started by mok-launch (mok-launch -n R -- " + prog + " --transport nccl ...);\n"
               "each rank times its passes with CUDA events from a common start, and a case's time is the median\n"
               "over reps of the slowest rank's time; % of peak is against R times the one GPU's measured peak.\n"
               "The baselines (cuBLAS unfused, PyTorch) run the whole layer on one GPU: they run with the virtual\n"
               "transport, and with nccl only at R=1 (skipped, and said so, at R>1). Asking for nccl in a build\n"
               "without NCCL exits 3; with more ranks than visible GPUs, 2; both name the fix.\n\n"
               "Examples:\n"
               "  " + prog + " --case dsv3 --reps 10                  the dsv3 layer against both baselines\n"
               "  " + prog + " --case qwen3 --R 8 --passes forward    8 virtual ranks, forwards only\n"
               "  " + prog + " --case dsv3 --R 8 --show-config        the layer a run would time (no GPU needed)\n"
               "  " + prog + " --file fixtures/small-zipf.h5 --no-baseline --trace\n\n"
               "Exit codes: 0 measured, 1 a run failed, 2 bad usage (checked before the GPU) or output that\n"
               "cannot be written, 3 no GPU or NCCL here.", prog};
  std::string preset = "dsv3-mini", file, routing = "uniform", transport = "virtual";
  int reps = 20, warmup = 3, comm = 0, blocks = 0;
  int64_t R = 0, T = 0, H = 0, I = 0, Is = -1, E = 0, K = 0;
  auto* preset_opt = app.add_option("--preset,-p", preset, "configuration preset: " + preset_names + " (ignored with --file)")
                         ->check(CLI::IsMember(preset_list))
                         ->capture_default_str();
  auto* file_opt = app.add_option("--file,-f", file, "take config and inputs from a golden file instead");
  std::string bench_case;
  bool show_config = false;
  app.add_flag("--show-config", show_config,
               "print the layer the other options describe (H, I, Is, E, K, R, T) and exit, without a GPU");
  app.add_option("--case", bench_case,
                 "one of BENCHMARKS.md's cases, instead of a preset: dsv3 (H 7168, I 2048, shared I 2048, 32 experts, "
                 "top-8, 8192 tokens), qwen3 (H 2048, I 768, no shared expert, 128 experts, top-8, 16384 tokens) or "
                 "small (dsv3 with 256 tokens). The tokens are the whole layer's: --R N splits them over N ranks (virtual, "
                 "or GPUs with --transport nccl; T = tokens / N, as BENCHMARKS.md's R = 8 lines do); --T, --H, --E and the rest still override")
      ->check(CLI::IsMember({"dsv3", "qwen3", "small"}))
      ->excludes(preset_opt)
      ->excludes(file_opt);
  app.add_option("--routing", routing, "routing for generated inputs")->capture_default_str();
  // Sizes start at 1 (--Is at 0); 0 (-1 for --Is) inside means "not given". A golden file fixes
  // the layer and the inputs, so none of these go with --file.
  using mok::cli::layer_size_range;
  auto* routing_opt = app.get_option("--routing");
  std::vector<CLI::Option*> shape_opts{
      app.add_option("--R", R, "ranks (overrides the preset): virtual ranks on one GPU, or GPUs with --transport nccl")
          ->check(layer_size_range('R')),
      app.add_option("--T", T, "tokens per rank (overrides the preset; R*T*K must fit in int32)")
          ->check(layer_size_range('T')),
      app.add_option("--H", H, "hidden size, a multiple of 16 (overrides the preset)")->check(layer_size_range('H')),
      app.add_option("--I", I, "routed intermediate size, a multiple of 16")->check(layer_size_range('I')),
      app.add_option("--Is", Is, "shared intermediate size, a multiple of 16 (0: none)")->check(layer_size_range('s')),
      app.add_option("--E", E, "experts (over all ranks, a multiple of R)")->check(layer_size_range('E')),
      app.add_option("--K", K, "top-k (at most E)")->check(layer_size_range('K')),
      routing_opt};
  for (CLI::Option* o : shape_opts) file_opt->excludes(o);
  app.add_option("--transport", transport,
                 "virtual: all R ranks on one GPU; nccl: one GPU per rank (NCCL symmetric memory; baselines only "
                 "at R=1)")
      ->check(CLI::IsMember({"virtual", "nccl"}))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed repetitions first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--comm-sms", comm, "communication blocks per rank: they gather rows, then compute (0: blocks per rank - 1)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("--blocks-per-rank", blocks, "blocks per rank (0 = fill the GPU)")->capture_default_str()->check(CLI::Range(0, 4096));
  bool no_tma = false, no_baseline = false, trace = false;
  std::string torch_script = "auto", python = "python3";
  app.add_flag("--no-baseline", no_baseline, "time only the fused kernel (no cuBLAS, no PyTorch)");
  double sustain_ms = 500;
  app.add_option("--sustain-ms", sustain_ms,
                 "also run the peak GEMM back to back for about this long and report its settled rate (the H200 "
                 "holds long dense work at its power limit, below a short burst's clock), with the fused passes' "
                 "percent of it; it runs after the baselines; 0 skips, else at least 100")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double v = -1;
            try {
              v = std::stod(text);
            } catch (const std::exception&) {
            }
            // Below ~100 ms the second half holds a few GEMMs from before the clock settles.
            return v == 0 || (v >= 100 && v <= 600000) ? std::string()
                                                       : "must be 0 (skip the sustained run) or 100 to 600000 ms";
          },
          "0 or 100..600000"));
  app.add_option("--torch", torch_script,
                 "PyTorch baseline script run in the same call with the same shape; auto: $MOK_TORCH_BASELINE, "
                 "else ./tools/moe_torch_baseline.py, else the source tree's (\"\": skip it)")
      ->capture_default_str();
  auto* python_opt = app.add_option("--python", python, "interpreter for --torch (needs torch with torch._grouped_mm)")
                         ->capture_default_str();
  app.add_flag("--no-tma", no_tma, "fill every tile with threads (sm_90a)");
  std::string gather = "bulk";
  int fwd_comm = 0;
  app.add_option("--fwd-comm-sms", fwd_comm,
                 "the forward's communication blocks per rank (0: with --gather bulk 16, or --comm-sms if fewer; "
                 "with threads --comm-sms)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("--gather", gather,
                 "how the forward's communication blocks move x rows: bulk (TMA bulk copies through shared memory; "
                 "fast engine, ranks on one GPU; elsewhere threads run) or threads (loads and stores)")
      ->check(CLI::IsMember({"threads", "bulk"}))
      ->capture_default_str();
  int gather_stores = 1, gather_batch = 4;
  app.add_option("--gather-stores", gather_stores,
                 "bulk gather: stores each gathering warp lets run before reusing the oldest one's slot (the "
                 "warp's other slots hold loads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4));
  app.add_option("--gather-batch", gather_batch, "bulk gather: rows whose ready flags go up after one fence")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  std::string x_rows = "auto";
  app.add_option("--x-rows", x_rows,
                 "where the forward's expert GEMMs read routed x rows: gathered (the communication blocks copy them "
                 "into one tensor first), direct (every block copies its tiles' rows from each token's x, and "
                 "the first column tile writes them to that tensor for the backward; fast engine, ranks on one GPU) or "
                 "auto (direct where H <= " +
                     std::to_string(mok::kernel::kDirectRowsMaxHidden) +
                     ", where it measured faster); the same bits either way")
      ->check(CLI::IsMember({"auto", "gathered", "direct"}))
      ->capture_default_str();
  std::string swiglu = "auto";
  app.add_option("--swiglu", swiglu,
                 "the forward's gate/up epilogue: fragments (each thread on its accumulators), staged (the tile "
                 "through shared memory, a warp per row, 16-byte stores; fast engine), or auto (staged where H <= " +
                     std::to_string(mok::kernel::kStagedSwigluMaxHidden) +
                     ", where it measured faster); the same bits either way")
      ->check(CLI::IsMember({"auto", "fragments", "staged"}))
      ->capture_default_str();
  int group_rows = 8;
  app.add_option("--group-rows", group_rows,
                 "GEMM work items go in groups of this many row tiles, column-major inside a group, so that blocks "
                 "running together share A rows and weight columns in L2 (1..64; the order changes no bit)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  std::string items = "shared";
  app.add_option("--items", items,
                 "with several virtual ranks on one GPU: shared (every block works every rank's GEMM items, one rank "
                 "after another, so L2 holds one rank's operands at a time) or own (each rank's blocks work its items "
                 "only, as on separate GPUs); the same bits either way")
      ->check(CLI::IsMember({"shared", "own"}))
      ->capture_default_str();
  std::string passes = "both";
  app.add_option("--passes", passes,
                 "which passes each repetition times: both (a forward, then a backward of the same inputs, as in "
                 "training), or forward (forwards back to back: a forward-only change measured without the "
                 "backward's power and clock between them; the baselines then time their forwards only)")
      ->check(CLI::IsMember({"both", "forward"}))
      ->capture_default_str();
  std::string timing = "sync";
  app.add_option("--timing", timing,
                 "how a pass is timed: sync (each pass starts on an idle GPU, after the last one's error check: its "
                 "events also bracket the host's work to launch it, e.g. encoding the TMA maps), or queued (every "
                 "repetition enqueued back to back, errors checked once at the end: the host prepares a launch while "
                 "the one before runs, so a pass's events bracket its device time, as in a training step's stream); "
                 "the baselines are timed as before either way")
      ->check(CLI::IsMember({"sync", "queued"}))
      ->capture_default_str();
  app.add_flag("--trace", trace,
               "after the timed runs, one profiled forward and backward in a second workspace (twice the workspace "
               "memory while it runs): per-block marks and sums of waiting, GEMM and publishing time "
               "(KernelOptions::trace); with --transport nccl one table per rank, from that GPU's own clock");
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  const bool nccl = transport == "nccl";
  // Transport requests this build or machine cannot honour are usage errors, named with their fix.
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", kProgram, msg.c_str());
    return mok::cli::kExitBadInput;
  };
  if (app.get_option("--file")->count() > 0 && file.empty())
    return usage_error("--file is empty; give a golden file (mok-golden makes them), or leave --file out to generate "
                       "the inputs");
  if (nccl && timing == "queued")
    return usage_error("--timing queued times the virtual transport only (the NCCL driver times each rank from a "
                       "common start, with barriers); drop --timing or use --transport virtual");
  if (!bench_case.empty()) {
    struct Case {
      int64_t H, I, Is, E, K, tokens;
    };
    const Case k = bench_case == "qwen3"   ? Case{2048, 768, 0, 128, 8, 16384}
                   : bench_case == "small" ? Case{7168, 2048, 2048, 32, 8, 256}
                                           : Case{7168, 2048, 2048, 32, 8, 8192};
    if (!R) R = 1;
    if (!T && k.tokens % R != 0)
      return usage_error("--case " + bench_case + " has " + std::to_string(k.tokens) + " tokens, which --R " +
                         std::to_string(R) + " does not divide; choose --R among its divisors (1, 2, 4, 8, ...) or "
                         "give the tokens per rank with --T");
    if (!T) T = k.tokens / R;
    if (!H) H = k.H;
    if (!I) I = k.I;
    if (Is < 0) Is = k.Is;
    if (!E) E = k.E;
    if (!K) K = k.K;
  }
  // The layer of generated inputs: the preset (or --case) with the shape options over it.
  auto generated_config = [&] {
    mok::spec::LayerConfig c = bench_case.empty() ? mok::ref::preset_config(preset) : mok::spec::LayerConfig{};
    if (R) c.num_ranks = R;
    if (T) c.tokens_per_rank = T;
    if (H) c.hidden = H;
    if (I) c.intermediate = I;
    if (Is >= 0) c.shared_intermediate = Is;
    if (E) c.num_experts = E;
    if (K) c.top_k = K;
    return c;
  };
  // Everything the options say is checked here, before the GPU is probed, so a usage error is
  // exit 2 on any machine; what only the machine can say (a usable GPU, NCCL, enough GPUs for
  // --R) is left to the run. --show-config prints the layer a run would time and stops here.
  std::optional<mok::ref::Golden> golden_in;
  mok::spec::LayerConfig cfg_opts;
  try {
    if (!file.empty()) {
      mok::ref::ReadOptions ro;
      ro.load_intermediates = ro.load_bounds = false;
      golden_in = mok::ref::read_golden(file, ro);
      cfg_opts = golden_in->cfg;
    } else {
      const mok::ref::RoutingSpec rs = mok::ref::parse_routing(routing);
      cfg_opts = generated_config();
      if (rs.kind == mok::ref::RoutingSpec::Kind::kHot && rs.hot_count > cfg_opts.num_experts)
        return usage_error("--routing " + routing + ": " + std::to_string(rs.hot_count) + " hot experts but the layer has " +
                           std::to_string(cfg_opts.num_experts) + "; lower N");
    }
  } catch (const mok::Error& e) {
    // A golden of another numerics profile or MMA model is "not supported here" (3), as in
    // mok-verify; anything else wrong with the file or the options is usage (2).
    if (e.kind() == mok::ErrorKind::kUnsupported) {
      std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
      return 3;
    }
    return usage_error(e.what());
  }
  // The block counts the kernel would refuse on the GPU (kernel/src/layer.cu), from the options.
  // With --blocks-per-rank 0 the count comes from the GPU, so only the run can check it.
  if (blocks > 0) {
    using mok::kernel::BlockCountProblem;
    const std::string given = "--blocks-per-rank " + std::to_string(blocks);
    switch (mok::kernel::check_block_counts(blocks, comm, fwd_comm)) {
      case BlockCountProblem::kNone: break;
      case BlockCountProblem::kTooFewBlocks:
        return usage_error(given + ": each rank needs at least 2 blocks (1 communication + 1 compute); give 2 or "
                           "more, or 0 to fill the GPU");
      case BlockCountProblem::kCommNotBelowBlocks:
        return usage_error("--comm-sms " + std::to_string(comm) + " with " + given +
                           ": the communication blocks must be fewer than the blocks per rank; give --comm-sms 1 to " +
                           std::to_string(blocks - 1) + " (0: blocks per rank - 1) or raise --blocks-per-rank");
      case BlockCountProblem::kForwardCommNotBelowBlocks:
        return usage_error("--fwd-comm-sms " + std::to_string(fwd_comm) + " with " + given +
                           ": the forward's communication blocks must be fewer than the blocks per rank; give "
                           "--fwd-comm-sms 1 to " + std::to_string(blocks - 1) + " (0: derived) or raise "
                           "--blocks-per-rank");
    }
  }
  {
    const mok::spec::LayerConfig& c = cfg_opts;
    const std::string line = mok::ref::format_config(c);
    const mok::spec::Status st = c.validate();  // bounds R and T, so R * T below cannot overflow
    if (!st.ok)
      return usage_error(std::string("the options describe ") + line + ", which is not a valid layer: " + st.message);
    // The inputs are drawn on the host before the GPU is asked for: a layer whose inputs cannot
    // fit here is refused now (as mok-golden does), not by a failed allocation or the OOM killer.
    if (file.empty()) {
      double need = 0;
      for (const mok::ref::TensorSpec& spec : mok::ref::golden_schema())
        if (spec.role == mok::ref::Role::kInput && mok::ref::spec_applies(spec, c)) need += mok::ref::spec_bytes(spec, c);
      if (const auto available = mok::ref::available_memory_bytes(); available && need > static_cast<double>(*available))
        return usage_error("the layer " + line + " needs at least " + mok::ref::format_bytes_estimate(need) +
                           " of host memory for its inputs alone, but only " + mok::ref::format_bytes(*available) +
                           " can be allocated here; lower --H, --I, --Is, --E or --T");
    }
    if (show_config) {
      std::printf("%s (G=%lld tokens)\n", line.c_str(), (long long)c.num_tokens());
      if (!mok::cli::stdout_ok()) return usage_error("cannot write to standard output; check where it goes");
      return 0;
    }
  }
  // Whether the PyTorch baseline would run (as decided after the fused passes), so that its script
  // and interpreter are checked before the GPU.
  const bool torch_runs = !torch_script.empty() && !no_baseline && file.empty() && (!nccl || cfg_opts.num_ranks == 1) &&
                          torch_routing(routing);
  if (torch_runs && torch_script != "auto")
    if (const std::string why = file_problem(torch_script, false); !why.empty())
      return usage_error("--torch " + torch_script + ": " + why + "; give the PyTorch baseline script "
                         "(tools/moe_torch_baseline.py) or \"\" to skip it");
  if (std::string why; nccl && !mok::kernel::nccl_available(&why)) {  // environment missing: 3, as mok-verify
    std::fprintf(stderr, "%s: --transport nccl: %s; or use --transport virtual (all ranks on one GPU)\n", kProgram,
                 why.c_str());
    return 3;
  }
  // Under mok-launch each process is one rank of an NCCL job; rank 0 prints the report.
  const bool per_process = nccl && mok::kernel::launched_by_mok_launch();
  const int my_rank = per_process ? std::atoi(std::getenv("MOK_RANK")) : 0;
  if (torch_script == "auto") {
    const char* env = std::getenv("MOK_TORCH_BASELINE");
    if (env && *env) {
      torch_script = env;
      if (const std::string why = torch_runs ? file_problem(torch_script, false) : ""; !why.empty())
        return usage_error("MOK_TORCH_BASELINE=" + torch_script + ": " + why + "; point it at " +
                           "tools/moe_torch_baseline.py, unset it, or give --torch \"\" to skip the PyTorch baseline");
    } else if (FILE* f = std::fopen("tools/moe_torch_baseline.py", "r")) {
      std::fclose(f);
      torch_script = "tools/moe_torch_baseline.py";
    } else {
      torch_script = MOK_TORCH_BASELINE;
    }
  }
  // The default interpreter is left to the run (a machine without it gets a note, as before).
  if (torch_runs && python_opt->count() > 0)
    if (const std::string why = program_problem(python); !why.empty())
      return usage_error("--python '" + python + "': " + why + "; give an interpreter with PyTorch, or --torch \"\" to "
                         "skip the PyTorch baseline");
  try {
    std::string why;
    if (!mok::kernel::gpu_available(&why)) {
      std::fprintf(stderr, "%s: %s\n", kProgram, why.c_str());
      return 3;
    }
    // With nccl, R ranks need R GPUs: one per thread here, or one per mok-launch process.
    auto transport_fits = [&](int64_t ranks) -> std::optional<std::string> {
      if (!nccl) return std::nullopt;
      if (per_process) {
        const int world = std::atoi(std::getenv("MOK_WORLD_SIZE"));
        if (world != ranks)
          return "--transport nccl under mok-launch: mok-launch started " + std::to_string(world) +
                 " processes (one per rank) but R is " + std::to_string(ranks) + "; use mok-launch -n " +
                 std::to_string(ranks) + " or --R " + std::to_string(world);
        return std::nullopt;
      }
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
      if (ranks > devices)
        return "--transport nccl runs one rank per GPU: R=" + std::to_string(ranks) + " needs " +
               std::to_string(ranks) + " GPUs and this process sees " + std::to_string(devices) +
               " (CUDA_VISIBLE_DEVICES); lower --R to at most " + std::to_string(devices) +
               ", or use --transport virtual to run the " + std::to_string(ranks) + " ranks on one GPU";
      return std::nullopt;
    };
    mok::spec::LayerConfig cfg;
    mok::ref::TensorMap in;
    if (golden_in) {
      cfg = golden_in->cfg;
      in = std::move(golden_in->tensors);
      if (const auto msg = transport_fits(cfg.num_ranks)) return usage_error(*msg);
    } else {
      cfg = cfg_opts;  // generated_config(), validated with the options
      if (const auto msg = transport_fits(cfg.num_ranks)) return usage_error(*msg);
      in = mok::ref::generate_inputs(cfg, mok::ref::parse_routing(routing), 1);
    }
    const int64_t G = cfg.num_tokens(), Hc = cfg.hidden, Ic = cfg.intermediate, Isc = cfg.shared_intermediate,
                  Ec = cfg.num_experts, Kc = cfg.top_k, Rn = cfg.num_ranks;
    const bool backward = in.count("inputs/d_output") > 0 && passes == "both";
    mok::kernel::KernelOptions ko;
    ko.comm_blocks_per_rank = comm;
    ko.blocks_per_rank = blocks;
    ko.disable_tma = no_tma;
    ko.bulk_gather = gather == "bulk";
    ko.bulk_gather_stores = gather_stores;
    ko.bulk_gather_batch = gather_batch;
    ko.x_rows = x_rows == "direct"     ? mok::kernel::XRows::kDirect
                : x_rows == "gathered" ? mok::kernel::XRows::kGathered
                                       : mok::kernel::XRows::kAuto;
    ko.swiglu = swiglu == "staged"      ? mok::kernel::SwigluEpilogue::kStaged
                : swiglu == "fragments" ? mok::kernel::SwigluEpilogue::kFragments
                                        : mok::kernel::SwigluEpilogue::kAuto;
    ko.forward_comm_blocks_per_rank = fwd_comm;
    ko.group_rows = group_rows;
    ko.shared_items = items == "shared";
    const int32_t* tk = in.at("inputs/topk_experts").data<int32_t>();
    ko.row_capacity = std::max<int64_t>(1, mok::kernel::rows_per_rank(cfg, tk));  // workspace for this routing
    int64_t rows = 0;
    for (int64_t i = 0; i < G * Kc; ++i) rows += tk[i] >= 0;
    const double fwd_flops = 6.0 * rows * Hc * Ic + 6.0 * G * Hc * Isc;
    const double bwd_flops = 12.0 * rows * Hc * Ic + 12.0 * G * Hc * Isc;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    // The fused kernel: median pass times, its launch shape and its output (for the sanity check).
    float f_ms = 0, b_ms = 0;
    int blocks_per_rank = 0, wide_ranks = 0, comm_per_rank = 0;
    bool tma_on = false;
    mok::ref::Tensor fused(mok::ref::DType::kBf16, {G, Hc});
    std::string per_rank_line;
    if (!nccl) {
      mok::kernel::DeviceInputs di;
      di.x = static_cast<const uint16_t*>(upload(in, "inputs/x"));
      di.topk_experts = static_cast<const int32_t*>(upload(in, "inputs/topk_experts"));
      di.router_weights = static_cast<const float*>(upload(in, "inputs/router_weights"));
      di.w_shared_gate = static_cast<const uint16_t*>(upload(in, "inputs/w_shared_gate"));
      di.w_shared_up = static_cast<const uint16_t*>(upload(in, "inputs/w_shared_up"));
      di.w_shared_down = static_cast<const uint16_t*>(upload(in, "inputs/w_shared_down"));
      di.w_routed_gate = static_cast<const uint16_t*>(upload(in, "inputs/w_routed_gate"));
      di.w_routed_up = static_cast<const uint16_t*>(upload(in, "inputs/w_routed_up"));
      di.w_routed_down = static_cast<const uint16_t*>(upload(in, "inputs/w_routed_down"));
      di.d_output = static_cast<const uint16_t*>(upload(in, "inputs/d_output"));
      mok::kernel::DeviceOutputs o;
      o.output = static_cast<uint16_t*>(zeros(G * Hc * 2));
      o.d_x = static_cast<uint16_t*>(zeros(G * Hc * 2));
      o.d_router_weights = static_cast<float*>(zeros(G * Kc * 4));
      o.d_w_routed_gate = static_cast<float*>(zeros(Ec * Ic * Hc * 4));
      o.d_w_routed_up = static_cast<float*>(zeros(Ec * Ic * Hc * 4));
      o.d_w_routed_down = static_cast<float*>(zeros(Ec * Ic * Hc * 4));
      o.d_w_shared_gate = static_cast<float*>(zeros(Rn * Isc * Hc * 4));
      o.d_w_shared_up = static_cast<float*>(zeros(Rn * Isc * Hc * 4));
      o.d_w_shared_down = static_cast<float*>(zeros(Rn * Isc * Hc * 4));
      mok::kernel::Layer layer(cfg, ko);
      std::vector<float> fwd, bwd;
      // Each pass between its own two events. sync: the error check after every pass waits for the
      // GPU, so the next pass starts on an idle GPU and its events also bracket the host's launch
      // work. queued: errors checked once at the end; while a pass runs the host enqueues the next,
      // so a pass's events bracket its device time (the first pass's also the host's first launch:
      // the warm-up repetitions take it).
      const bool sync_each = timing == "sync";
      const int n = warmup + reps;
      std::vector<cudaEvent_t> ev(static_cast<size_t>(n) * 4);
      for (cudaEvent_t& e : ev) CK(cudaEventCreate(&e));
      for (int r = 0; r < n; ++r) {
        CK(cudaEventRecord(ev[4 * r]));
        layer.forward(di, o);
        CK(cudaEventRecord(ev[4 * r + 1]));
        if (sync_each) layer.check_errors();
        if (!backward) continue;
        CK(cudaEventRecord(ev[4 * r + 2]));
        layer.backward(di, o);
        CK(cudaEventRecord(ev[4 * r + 3]));
        if (sync_each) layer.check_errors();
      }
      layer.check_errors();
      for (int r = warmup; r < n; ++r) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[4 * r], ev[4 * r + 1]));
        fwd.push_back(ms);
        if (!backward) continue;
        CK(cudaEventElapsedTime(&ms, ev[4 * r + 2], ev[4 * r + 3]));
        bwd.push_back(ms);
      }
      for (cudaEvent_t& e : ev) CK(cudaEventDestroy(e));
      std::sort(fwd.begin(), fwd.end());
      std::sort(bwd.begin(), bwd.end());
      f_ms = fwd[fwd.size() / 2];
      b_ms = bwd.empty() ? 0.0f : bwd[bwd.size() / 2];
      blocks_per_rank = layer.blocks_per_rank();
      wide_ranks = layer.wide_ranks();
      comm_per_rank = layer.comm_blocks_per_rank();
      tma_on = layer.uses_tma();
      // The last forward's output (a backward pass does not write it).
      CK(cudaMemcpy(fused.raw(), o.output, fused.size_bytes(), cudaMemcpyDeviceToHost));
      if (trace) {
        mok::kernel::KernelOptions kt = ko;
        kt.trace = true;
        mok::kernel::Layer traced(cfg, kt);
        traced.forward(di, o);  // warm: maps, caches
        traced.forward(di, o);
        traced.check_errors();
        print_trace("forward", traced.trace(), traced.forward_comm_blocks_per_rank(), traced.blocks_per_rank(),
                    traced.wide_ranks());
        if (backward) {
          traced.backward(di, o);
          traced.check_errors();
          print_trace("backward", traced.trace(), traced.comm_blocks_per_rank(), traced.blocks_per_rank(),
                      traced.wide_ranks());
        }
      }
    } else {
      mok::kernel::KernelOptions kn = ko;
      kn.trace = trace;  // a traced pass after the timed ones, by a second layer (NcclTimes::trace_forward)
      const mok::kernel::NcclTimes t =
          per_process ? mok::kernel::time_layer_nccl_process(cfg, in, backward, warmup, reps, kn)
                      : mok::kernel::time_layer_nccl(cfg, in, backward, warmup, reps, kn);
      if (my_rank != 0) return 0;  // every process has every rank's times; rank 0 reports
      for (int r = 0; trace && r < t.num_ranks; ++r) {  // each rank's marks from its own GPU's first block
        const std::string f = "forward, rank " + std::to_string(r), b = "backward, rank " + std::to_string(r);
        print_trace(f.c_str(), t.trace_forward[r], t.forward_comm_blocks_per_rank, t.blocks_per_rank, 0);
        if (backward) print_trace(b.c_str(), t.trace_backward[r], t.comm_blocks_per_rank, t.blocks_per_rank, 0);
      }
      f_ms = mok::kernel::median_of_slowest_rank(t.forward_ms, t.num_ranks, t.reps);
      b_ms = mok::kernel::median_of_slowest_rank(t.backward_ms, t.num_ranks, t.reps);
      blocks_per_rank = t.blocks_per_rank;
      comm_per_rank = t.comm_blocks_per_rank;
      tma_on = t.uses_tma;
      fused = t.output;
      // Each rank's own median, to show imbalance between ranks.
      for (int r = 0; r < t.num_ranks; ++r) {
        auto median = [&](const std::vector<float>& ms) {  // rank r's slice, as a one-rank layer
          if (ms.empty()) return 0.0f;
          const auto first = ms.begin() + static_cast<ptrdiff_t>(r) * t.reps;
          return mok::kernel::median_of_slowest_rank(std::vector<float>(first, first + t.reps), 1, t.reps);
        };
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s%d: %.3f / %.3f", r ? ", " : "", r, median(t.forward_ms), median(t.backward_ms));
        per_rank_line += buf;
      }
    }
    auto median_of = [&](auto&& fn) {
      std::vector<float> v;
      for (int r = 0; r < warmup + reps; ++r) {
        CK(cudaEventRecord(a));
        fn();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= warmup) v.push_back(ms);
      }
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // The ceilings, measured now on this process's first GPU: a large bf16 GEMM and a
    // device-to-device copy. With nccl the layer runs on R such GPUs: the ceilings are R times these.
    double peak_tflops = 0, copy_gbps = 0, sustained_tflops = 0;
    float sustain_total_ms = 0, burst_ms = 0;
    int sustain_count = 0, sustain_median_of = 0;
    // The peak GEMM's operands and handle stay until the sustained run, which comes after the
    // baselines (a board just out of a second at its power cap would slow them).
    const int n = 8192;
    void *A = zeros(size_t{2} * n * n), *B = zeros(size_t{2} * n * n), *C = zeros(size_t{2} * n * n);
    cublasHandle_t h = nullptr;
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero, C,
                   CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    {
      std::vector<uint16_t> fill(size_t{n} * n);
      mok::ref::Rng rng(7);
      for (auto& v : fill) v = mok::spec::bf16_from_f32_rne(rng.bell());
      CK(cudaMemcpy(A, fill.data(), fill.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(B, fill.data(), fill.size() * 2, cudaMemcpyHostToDevice));
      if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw mok::Error("cublasCreate failed", mok::ErrorKind::kInternal);
      burst_ms = median_of(gemm);
      peak_tflops = 2.0 * n * n * double(n) / (burst_ms * 1e-3) / 1e12;
      const size_t bytes = size_t{1} << 31;
      void *src = zeros(bytes), *dst = zeros(bytes);
      const float cms = median_of([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
      copy_gbps = 2.0 * bytes / (cms * 1e-3) / 1e9;  // read + write
      CK(cudaFree(src));
      CK(cudaFree(dst));
    }
    auto sustained_run = [&] {
      // The same GEMM back to back for --sustain-ms: long dense work runs at the board's power
      // limit, below the clock a short burst gets (dsv3's passes read ~1530 MHz where the burst
      // above ran at up to 1980), so the fused passes are also put against this rate.
      if (sustain_ms > 0) {
        const int count = std::max(4, static_cast<int>(std::ceil(sustain_ms / burst_ms)));
        std::vector<cudaEvent_t> ev(static_cast<size_t>(count) + 1);
        for (auto& e : ev) CK(cudaEventCreate(&e));
        CK(cudaEventRecord(ev[0]));
        for (int i = 0; i < count; ++i) {
          gemm();
          CK(cudaEventRecord(ev[static_cast<size_t>(i) + 1]));
        }
        CK(cudaEventSynchronize(ev.back()));
        std::vector<float> last;  // the second half: the clock has settled by then
        for (int i = count / 2; i < count; ++i) {
          float t = 0;
          CK(cudaEventElapsedTime(&t, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
          last.push_back(t);
        }
        CK(cudaEventElapsedTime(&sustain_total_ms, ev.front(), ev.back()));
        for (auto& e : ev) CK(cudaEventDestroy(e));
        std::sort(last.begin(), last.end());
        sustained_tflops = 2.0 * n * n * double(n) / (last[last.size() / 2] * 1e-3) / 1e12;
        sustain_count = count;
        sustain_median_of = static_cast<int>(last.size());
      }
      cublasDestroy(h);
      CK(cudaFree(A));
      CK(cudaFree(B));
      CK(cudaFree(C));
    };
    const int gpus = nccl ? static_cast<int>(Rn) : 1;  // GPUs the fused layer ran on
    // The baselines run the whole layer on one GPU: against the virtual transport, or nccl at R=1.
    const bool baselines = !no_baseline && (!nccl || Rn == 1);
    std::string baseline_note;
    if (!no_baseline && !baselines)
      baseline_note = "baselines skipped: with --transport nccl and R=" + std::to_string(Rn) + " the layer runs on " +
                      std::to_string(Rn) + " GPUs, and the cuBLAS and PyTorch baselines run on one (compare at --R 1, "
                      "or with --transport virtual)";
    float base_f = 0, base_b = 0;
    double agree = -1;
    std::string gemm_path = "-";
    if (baselines) {
      mok::bench::UnfusedBaseline base(cfg, in);
      base_f = median_of([&] { base.forward(); });
      if (backward) base_b = median_of([&] { base.backward(); });
      // Sanity: the baseline's output against the fused kernel's (not bit-exact by design).
      const mok::ref::Tensor other = base.output();
      int64_t close = 0;
      for (int64_t i = 0; i < fused.numel(); ++i) {
        const double x = fused.value_at(i), y = other.value_at(i);
        close += std::fabs(x - y) <= 0x1.0p-6 * std::max(std::fabs(x), std::fabs(y)) + 1e-3;
      }
      agree = 100.0 * close / fused.numel();
      gemm_path = base.gemm_path();
    }
    // PyTorch, same global shape (one GPU: T = G), same routing family (its own random draw).
    double torch_f = 0, torch_fb = 0;
    std::string torch_note;
    if (baselines && !torch_script.empty() && file.empty()) {
      if (!torch_routing(routing)) {
        torch_note = "PyTorch baseline skipped: its script takes uniform or zipf:S routing only";
      } else {
        bool ok = false;
        std::vector<std::string> torch_args = {
            python, torch_script, "--H", std::to_string(Hc), "--I", std::to_string(Ic), "--Is", std::to_string(Isc),
            "--E", std::to_string(Ec), "--K", std::to_string(Kc), "--T", std::to_string(G), "--routing", routing,
            "--reps", std::to_string(reps), "--warmup", std::to_string(warmup)};
        if (!backward) torch_args.push_back("--no-backward");  // --passes forward: its forwards only
        const std::string out = run_torch(torch_args, &ok);
        try {
          if (!ok) throw std::runtime_error("exit status");
          const auto j = nlohmann::json::parse(out.substr(std::min(out.find('{'), out.size())));
          torch_f = j.at("forward_ms").get<double>();
          if (!j.at("forward_backward_ms").is_null()) torch_fb = j.at("forward_backward_ms").get<double>();
          torch_note = "PyTorch " + j.at("torch").get<std::string>() + ", fastest variant " +
                       j.at("chosen").get<std::string>() + "; its backward is forward+backward minus forward";
        } catch (const std::exception&) {
          std::string last = out;  // the script's last message says why
          while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
          last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
          torch_note = "PyTorch baseline did not run (" + python + " " + torch_script + ": " +
                       (last.empty() ? std::string("no output") : last) + "); --torch \"\" skips it";
        }
      }
    }
    sustained_run();
    // Bytes a pass must move at least, whatever the pipeline: its inputs, every weight once, its
    // outputs (forward: x, routing, weights -> output; backward: x, d_output, routing, weights ->
    // d_x, d_router_weights, fp32 weight gradients).
    // (the shared expert's weights are one copy; its gradients are one per rank)
    const double w_elems = 3.0 * Ec * Ic * Hc + 3.0 * Isc * Hc, wg_elems = 3.0 * Ec * Ic * Hc + 3.0 * Rn * Isc * Hc;
    const double fwd_bytes = 2.0 * G * Hc + 8.0 * G * Kc + 2.0 * w_elems + 2.0 * G * Hc;
    const double bwd_bytes = 4.0 * G * Hc + 8.0 * G * Kc + 2.0 * w_elems + 2.0 * G * Hc + 4.0 * G * Kc + 4.0 * wg_elems;
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    const std::string wide_note =
        wide_ranks > 0 ? " (" + std::to_string(blocks_per_rank + 1) + " on the first " + std::to_string(wide_ranks) + ")"
                       : std::string();
    std::printf("# mok-bench %s%s: G=%lld H=%lld I=%lld Is=%lld E=%lld K=%lld R=%lld, %lld routed rows, %d blocks/rank%s "
                "(%d comm), TMA %s, SwiGLU epilogue %s, x rows %s, item groups of %d row tiles, median of %d after %d "
                "warm-up, %s\n",
                nccl ? (std::to_string(gpus) + " x ").c_str() : "", prop.name, (long long)G, (long long)Hc,
                (long long)Ic, (long long)Isc, (long long)Ec, (long long)Kc, (long long)Rn, (long long)rows,
                blocks_per_rank, wide_note.c_str(), comm_per_rank, tma_on ? "on" : "off",
                !tma_on ? "fragments (no fast engine)"
                : mok::kernel::resolve_swiglu(ko.swiglu, Hc) == mok::kernel::SwigluEpilogue::kStaged
                    ? (swiglu == "auto" ? "staged (auto)" : "staged")
                    : (swiglu == "auto" ? "fragments (auto)" : "fragments"),
                // as Layer resolves it: direct needs the fast engine and one GPU
                !tma_on || nccl ? "gathered"
                : mok::kernel::resolve_x_rows(ko.x_rows, Hc) == mok::kernel::XRows::kDirect
                    ? (x_rows == "auto" ? "direct (auto)" : "direct")
                    : (x_rows == "auto" ? "gathered (auto)" : "gathered"),
                group_rows, reps, warmup,
                backward ? "each repetition a forward then a backward"
                : passes == "forward" ? "forwards only (--passes forward)"
                                      : "forwards only (the golden file has no inputs/d_output)");
    if (!nccl) {
      std::printf("# timing %s\n", timing == "queued"
                                       ? "queued: passes enqueued back to back, each pass's events around its device "
                                         "time (the host launches the next while one runs)"
                                       : "sync: each pass started on an idle GPU, its events around the host's "
                                         "launch work too (--timing queued: device time only)");
      std::printf("# transport virtual: the %lld ranks share one GPU in one launch per pass%s; fused times are the "
                  "median over reps of each pass\n",
                  (long long)Rn,
                  Rn < 2            ? ""
                  : ko.shared_items ? ", every block working every rank's GEMM items in rank order (--items shared)"
                                    : ", each rank's blocks working its own GEMM items (--items own)");
    } else {
      std::printf("# transport nccl: R=%lld, one rank per GPU (%s), NCCL symmetric memory; fused times are the median "
                  "over reps of the SLOWEST RANK's pass, each rank timed with CUDA events from a common start (an "
                  "untimed barrier), its pass including the copy of its inputs into its window and the entry wait\n",
                  (long long)Rn, per_process ? "one process each, started by mok-launch" : "one thread each, in this process");
      std::printf("# per-rank medians, forward / backward ms: %s\n", per_rank_line.c_str());
    }
#if defined(MOK_ATOMICS_VARIANT)
    std::printf("# ATOMICS VARIANT (benchmark build): combine, d_x and weight gradients by fp32 atomics, not "
                "deterministic; d_router_weights reads y slots this variant's forward does not write (same cost)\n");
#endif
    std::printf("# measured now: bf16 GEMM peak %.0f TFLOP/s (8192^3 cublasGemmEx), copy %.0f GB/s (read+write)%s\n",
                peak_tflops, copy_gbps, gpus > 1 ? " on GPU 0; % peak and floors use the R GPUs' sum" : "");
    const double all_peak = gpus * peak_tflops, all_copy = gpus * copy_gbps;
    std::printf("# floors at the measured rates: forward %.3f ms of FLOPs, %.3f ms of bytes (%.2f GB); backward %.3f ms "
                "of FLOPs, %.3f ms of bytes (%.2f GB)\n",
                fwd_flops / (all_peak * 1e12) * 1e3, fwd_bytes / (all_copy * 1e9) * 1e3, fwd_bytes / 1e9,
                bwd_flops / (all_peak * 1e12) * 1e3, bwd_bytes / (all_copy * 1e9) * 1e3, bwd_bytes / 1e9);
    std::printf("%-22s %10s %10s %9s %10s\n", "pipeline / pass", "ms", "TFLOP/s", "% peak", "GB/s");
    // (the baselines run only where the fused layer ran on one GPU, so one peak serves every row)
    auto row = [&](const char* name, double ms, double flops, double bytes) {
      if (ms > 0) std::printf("%-22s %10.3f %10.2f %8.1f%% %10.0f\n", name, ms, flops / (ms * 1e-3) / 1e12,
                              100.0 * flops / (ms * 1e-3) / 1e12 / all_peak, bytes / (ms * 1e-3) / 1e9);
    };
    row("fused forward", f_ms, fwd_flops, fwd_bytes);
    row("fused backward", b_ms, bwd_flops, bwd_bytes);
    row("unfused forward", base_f, fwd_flops, fwd_bytes);
    row("unfused backward", base_b, bwd_flops, bwd_bytes);
    row("pytorch forward", torch_f, fwd_flops, fwd_bytes);
    row("pytorch backward", backward && torch_fb > torch_f ? torch_fb - torch_f : 0.0, bwd_flops, bwd_bytes);
    // A figure of a pass that did not run (--passes forward) is said to be missing, not printed as 0.
    auto figure = [](bool have, const char* fmt, double v) -> std::string {
      if (!have) return "not run";
      char buf[32];
      std::snprintf(buf, sizeof buf, fmt, v);
      return buf;
    };
    if (sustained_tflops > 0)
      std::printf("# sustained: bf16 GEMM %.0f TFLOP/s, median of the last %d of %d back-to-back 8192^3 GEMMs (%.0f ms); "
                  "the fused passes against it: forward %s, backward %s (%% peak above: the burst rate)\n",
                  sustained_tflops, sustain_median_of, sustain_count, sustain_total_ms,
                  figure(f_ms > 0, "%.1f%%", 100.0 * fwd_flops / (f_ms * 1e-3) / 1e12 / (gpus * sustained_tflops)).c_str(),
                  figure(b_ms > 0, "%.1f%%", 100.0 * bwd_flops / (b_ms * 1e-3) / 1e12 / (gpus * sustained_tflops)).c_str());
    if (!baseline_note.empty()) std::printf("# %s\n", baseline_note.c_str());
    if (base_f > 0) std::printf("# unfused GEMMs: %s\n", gemm_path.c_str());
    if (base_f > 0) std::printf("# fused / unfused speed: forward %.2fx, backward %s; outputs agree within 2^-6 relative on %.1f%% of elements\n",
                                base_f / f_ms, figure(b_ms > 0 && base_b > 0, "%.2fx", base_b / b_ms).c_str(), agree);
    if (!torch_note.empty()) std::printf("# %s\n", torch_note.c_str());
    if (torch_f > 0)
      std::printf("# fused / PyTorch speed: forward %.2fx, forward+backward %s\n", torch_f / f_ms,
                  figure(backward && torch_fb > 0 && b_ms > 0, "%.2fx", torch_fb / (f_ms + b_ms)).c_str());
    if (!mok::cli::stdout_ok()) return usage_error("cannot write the report to standard output; check where it goes");
    return 0;
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    // What this machine lacks (too few GPUs, no NVLink team or symmetric memory for NCCL) is an
    // environment problem, 3 as in mok-verify; a CUDA or kernel failure while running is 1; the
    // rest is bad input, 2.
    return e.kind() == mok::ErrorKind::kUnsupported ? 3 : e.kind() == mok::ErrorKind::kInternal ? 1 : 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of host memory while running (the layer's inputs and baselines live in "
                         "host memory too); use a smaller --T or --case\n", kProgram);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
