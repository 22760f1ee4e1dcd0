// Determinism matrix over ranks x role splits x minibatches x runs, with hashes and the first difference.
#include "mok/verify/determinism.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/schema.hpp"

#if defined(MOK_HAVE_CUDA_KERNEL)
#include "mok/kernel/layer.hpp"
#include "mok/kernel/nccl.hpp"
#include "mok/kernel/split_rack.hpp"

#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

namespace mok::verify {

uint64_t tensor_hash(const ref::Tensor& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (size_t i = 0; i < t.size_bytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

#if defined(MOK_HAVE_CUDA_KERNEL)
namespace {

struct Config {
  int ranks;
  int comm;
  int64_t minibatch;  // tokens per pass
  bool own_items;     // KernelOptions::shared_items off (several virtual ranks only)
  std::string name() const {
    return "R=" + std::to_string(ranks) + " comm=" + std::to_string(comm) + " minibatch=" + std::to_string(minibatch) +
           (own_items ? " items=own" : "");
  }
};

// Token-major results ([G, ...]): concatenated over minibatches and compared across every
// configuration. Every intermediate of the schema is token-major (per slot or per token).
bool per_token(const std::string& p) {
  return p == "outputs/output" || p == "grads/d_x" || p == "grads/d_router_weights" ||
         p.rfind("intermediates/", 0) == 0;
}

// Rows [g0, g0 + n) of a token-major tensor.
ref::Tensor rows(const ref::Tensor& t, int64_t g0, int64_t n) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = t.size_bytes() / shape[0];
  shape[0] = n;
  ref::Tensor out(t.dtype(), shape);
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + g0 * row_bytes, n * row_bytes);
  return out;
}

// Runs the layer in passes of `mb` tokens and concatenates per-token results; weight
// gradients are kept only for a single pass over the whole batch.
ref::TensorMap run_config(const ref::Golden& g, const Config& c, bool backward, const std::string& transport) {
  const int64_t G = g.cfg.num_tokens();
  ref::TensorMap all;
  for (int64_t g0 = 0; g0 < G; g0 += c.minibatch) {
    spec::LayerConfig cfg = g.cfg;
    cfg.num_ranks = c.ranks;
    cfg.tokens_per_rank = c.minibatch / c.ranks;
    ref::TensorMap in;
    for (const auto& [p, t] : g.tensors) {
      if (p.rfind("inputs/", 0) != 0) continue;
      const bool token_major = p == "inputs/x" || p == "inputs/topk_experts" || p == "inputs/router_weights" ||
                               p == "inputs/d_output";
      in[p] = token_major ? rows(t, g0, c.minibatch) : t;
    }
    kernel::KernelOptions o;
    o.comm_blocks_per_rank = c.comm;
    o.shared_items = !c.own_items;
    ref::TensorMap part = transport == "nccl"    ? kernel::run_layer_nccl(cfg, in, backward, o)
                          : transport == "split" ? kernel::run_layer_split(cfg, {in}, backward, o).front()
                                                 : kernel::run_layer(cfg, in, backward, o);
    for (auto& [p, t] : part) {
      if (!per_token(p)) {
        if (c.minibatch == G) all[p] = std::move(t);
        continue;
      }
      if (!all.count(p)) {
        std::vector<int64_t> shape = t.shape();
        shape[0] = G;
        all[p] = ref::Tensor(t.dtype(), shape);
      }
      const size_t row_bytes = t.size_bytes() / t.shape()[0];
      std::memcpy(static_cast<char*>(all[p].raw()) + g0 * row_bytes, t.raw(), t.size_bytes());
    }
  }
  return all;
}

}  // namespace
#endif

bool rank_count_fits(const spec::LayerConfig& cfg, int R, const std::vector<int64_t>& minibatches) {
  if (R < 1 || cfg.num_experts % R) return false;
  for (int64_t mb : minibatches.empty() ? std::vector<int64_t>{cfg.num_tokens()} : minibatches)
    if (mb % R) return false;
  return true;
}

void check_determinism_options(const spec::LayerConfig& cfg, const DeterminismOptions& options) {
  const int64_t G = cfg.num_tokens();
  const std::string E = std::to_string(cfg.num_experts);
  if (options.ranks.empty() || options.comm_blocks.empty() || options.items.empty())
    throw Error("determinism: --ranks, --comm-sms and --items each need at least one value");
  for (const std::string& it : options.items)
    if (it != "shared" && it != "own")
      throw Error("determinism: --items takes shared and/or own (comma-separated), got '" + it + "'");
  // A value listed twice would run its configurations twice and count them twice.
  auto once = [](const char* flag, const auto& values) {
    for (size_t i = 0; i < values.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (values[i] == values[j]) {
          std::ostringstream os;
          os << "determinism: " << flag << " lists " << values[i] << " twice; give each value once";
          throw Error(os.str());
        }
  };
  once("--ranks", options.ranks);
  once("--comm-sms", options.comm_blocks);
  once("--items", options.items);
  once("--minibatch", options.minibatches);
  for (int64_t mb : options.minibatches)
    if (mb < 1 || G % mb)
      throw Error("determinism: --minibatch " + std::to_string(mb) + " does not divide the batch (G = R*T = " +
                  std::to_string(G) + " tokens); give divisors of " + std::to_string(G));
  for (int R : options.ranks) {
    if (rank_count_fits(cfg, R, options.minibatches)) continue;  // the rule; below, which part fails
    if (R < 1 || cfg.num_experts % R)
      throw Error("determinism: --ranks " + std::to_string(R) + " does not divide E = " + E +
                  " (each rank owns E/R experts); give divisors of " + E);
    for (int64_t mb : options.minibatches.empty() ? std::vector<int64_t>{G} : options.minibatches)
      if (mb % R)
        throw Error("determinism: --ranks " + std::to_string(R) + " does not divide the minibatch " +
                    std::to_string(mb) + (options.minibatches.empty() ? " (the whole batch)" : "") +
                    " (each rank takes minibatch/R tokens); give rank counts and minibatches that divide");
  }
}

DeterminismResult run_determinism(const ref::Golden& golden, const DeterminismOptions& options) {
  check_determinism_options(golden.cfg, options);  // usage before support
#if !defined(MOK_HAVE_CUDA_KERNEL)
  throw Error("determinism needs the CUDA kernel, and this build has none", ErrorKind::kUnsupported);
#else
  std::string why;
  if (!kernel::gpu_available(&why)) throw Error("determinism needs a GPU: " + why, ErrorKind::kUnsupported);
  const spec::LayerConfig& cfg = golden.cfg;
  const int64_t G = cfg.num_tokens();
  const bool backward = golden.tensors.count("inputs/d_output") > 0;
  std::vector<int64_t> mbs = options.minibatches;
  if (mbs.empty()) mbs.push_back(G);
  std::vector<Config> configs;
  const bool nccl = options.transport == "nccl";
  if (nccl && !kernel::nccl_available(&why)) throw Error("transport nccl: " + why, ErrorKind::kUnsupported);
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const auto wants = [&](const char* v) {
    return std::find(options.items.begin(), options.items.end(), v) != options.items.end();
  };
  const bool want_shared = wants("shared"), want_own = wants("own");
  for (int R : options.ranks) {
    // R | E, minibatch | G and R | minibatch hold (check_determinism_options); too few GPUs for
    // the nccl transport is this machine, not the command line: skipped and said (once per R).
    if (nccl && R > devices) {
      if (options.progress)
        options.progress("skipping R=" + std::to_string(R) + ": the nccl transport needs one GPU per rank (" +
                         std::to_string(devices) + " here)");
      continue;
    }
    for (int comm : options.comm_blocks)
      for (int64_t mb : mbs) {
        // Own items differ from shared ones only where one launch holds several ranks; elsewhere
        // either request runs the one configuration.
        const bool can_own = R > 1 && options.transport == "virtual";
        if (want_shared || !can_own) configs.push_back({R, comm, mb, false});
        if (want_own && can_own) configs.push_back({R, comm, mb, true});
      }
  }
  if (configs.empty())
    throw Error("determinism: every configuration needs more GPUs than the " + std::to_string(devices) +
                    " here (the nccl transport takes one GPU per rank); give --ranks that fit, or run on a node "
                    "with more GPUs",
                ErrorKind::kUnsupported);
  // The block counts of every configuration, before any run (a --comm-sms too large for R's
  // blocks was found only when its configuration ran, in the kernel's words): a launch holds R
  // ranks (virtual) or one (nccl), and shares this GPU's co-resident blocks among them as
  // Layer's constructor does (block_counts.hpp's rules, on the fewest blocks a rank gets); the
  // split rack's R one-rank launches share them with one rank's worth left free (run_layer_split).
  {
    spec::LayerConfig one = cfg;  // one rank of one token: the co-resident blocks do not depend on T,
    one.num_ranks = 1;            // and its workspace is the smallest
    one.tokens_per_rank = 1;
    const int resident = kernel::Layer(one, kernel::KernelOptions{}).launch_blocks();
    for (const Config& c : configs) {
      const bool split = options.transport == "split";
      const int per = resident / (nccl ? 1 : split ? c.ranks + 1 : c.ranks);
      if (kernel::check_block_counts(per, c.comm, 0) == kernel::BlockCountProblem::kNone) continue;
      const std::string at = "at R=" + std::to_string(c.ranks) + " each rank has " + std::to_string(per) +
                             " blocks on this GPU (" + std::to_string(resident) + " co-resident blocks" +
                             (nccl    ? ", one rank per GPU)"
                              : split ? " shared by the R ranks' launches and one rank's worth left free)"
                                      : " shared by the R ranks)");
      if (per < 2)
        throw Error("determinism: --ranks " + std::to_string(c.ranks) + ": " + at +
                    ", and a rank needs at least 2 (1 communication + 1 compute); give fewer ranks");
      throw Error("determinism: --comm-sms " + std::to_string(c.comm) + " " + at + "; --comm-sms takes 1.." +
                  std::to_string(per - 1) + " there (or 0: the kernel's default, " + std::to_string(per - 1) + ")");
    }
  }
  // Shuffle the order in which (configuration, run) pairs execute: state leaking from one run
  // into the next shows up as a difference.
  std::vector<std::pair<size_t, int>> order;
  for (size_t i = 0; i < configs.size(); ++i)
    for (int r = 0; r < options.runs; ++r) order.push_back({i, r});
  ref::Rng rng(options.seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);

  DeterminismResult result;
  result.configurations = static_cast<int64_t>(configs.size());
  std::vector<ref::TensorMap> first(configs.size());  // first run of each configuration
  std::vector<std::map<std::string, uint64_t>> hashes(configs.size());
  // The reference for each tensor: the first configuration (in matrix order) that has it.
  auto compare_maps = [&](const ref::TensorMap& a, const std::string& a_name, const ref::TensorMap& b,
                          const std::string& b_name, const Config& ca, const Config& cb) {
    for (const auto& [p, t] : b) {
      auto it = a.find(p);
      if (it == a.end()) continue;
      const bool shared_grad = p.rfind("grads/d_w_shared", 0) == 0;
      if (!per_token(p) && (ca.minibatch != G || cb.minibatch != G)) continue;
      if (shared_grad && (ca.ranks != cb.ranks || ca.minibatch != cb.minibatch)) continue;
      if (std::memcmp(it->second.raw(), t.raw(), t.size_bytes()) == 0) continue;
      int64_t i = 0;
      while (it->second.bits_at(i) == t.bits_at(i)) ++i;
      const ref::Tensor* topk = &golden.tensors.at("inputs/topk_experts");
      char buf[160];
      std::snprintf(buf, sizeof buf, " (%.9g vs %.9g)", it->second.value_at(i), t.value_at(i));
      result.passed = false;
      if (result.first_difference.empty())
        result.first_difference = p + " differs between [" + a_name + "] and [" + b_name + "] first at " +
                                  ref::locate(*ref::find_spec(p), cfg, i, topk) + buf;
    }
  };
  for (size_t step = 0; step < order.size(); ++step) {
    const auto [ci, run] = order[step];
    const Config& c = configs[ci];
    if (options.progress && (step % std::max<size_t>(1, order.size() / 10) == 0))
      options.progress("run " + std::to_string(step + 1) + " of " + std::to_string(order.size()) + ": " + c.name());
    ref::TensorMap got = run_config(golden, c, backward, options.transport);
    ++result.executions;
    const std::string name = c.name() + " run=" + std::to_string(run);
    if (first[ci].empty()) {
      first[ci] = std::move(got);
      for (const auto& [p, t] : first[ci]) hashes[ci][p] = tensor_hash(t);
      // Compare with every configuration seen so far.
      for (size_t j = 0; j < configs.size(); ++j)
        if (j != ci && !first[j].empty()) compare_maps(first[j], configs[j].name(), first[ci], name, configs[j], c);
    } else {
      compare_maps(first[ci], c.name() + " (its first run)", got, name, c, c);
    }
  }
  char line[256];
  std::snprintf(line, sizeof line, "%-36s %-28s %s\n", "configuration", "tensor", "fnv1a64");
  result.table += line;
  for (size_t i = 0; i < configs.size(); ++i)
    for (const auto& [p, h] : hashes[i]) {
      std::snprintf(line, sizeof line, "%-36s %-28s %016llx\n", configs[i].name().c_str(), p.c_str(),
                    static_cast<unsigned long long>(h));
      result.table += line;
    }
  return result;
#endif
}

}  // namespace mok::verify
