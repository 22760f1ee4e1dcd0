// Backend dispatch for mok-verify run: emulator, oracle and (when built) the CUDA kernel.
#include "mok/verify/backends.hpp"

#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/spec/bf16.hpp"

#if defined(MOK_HAVE_CUDA_KERNEL)
#include "mok/kernel/layer.hpp"
#include "mok/kernel/nccl.hpp"
#include "mok/kernel/split_rack.hpp"
#endif

#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

namespace mok::verify {
namespace {

bool has_group(const ref::TensorMap& m, const std::string& prefix) {
  for (const auto& [path, t] : m)
    if (path.rfind(prefix, 0) == 0) return true;
  return false;
}

ref::TensorMap inputs_of(const ref::Golden& g) {
  ref::TensorMap in;
  for (const auto& [path, t] : g.tensors)
    if (path.rfind("inputs/", 0) == 0) in[path] = t;
  return in;
}

// Refuses, before any work, a run whose results cannot fit in the memory available
// (ref::available_memory_bytes(): after loading the golden where a process limit binds, else a
// machine or container total). The estimate is a lower bound (a copy of the inputs and the results the backend
// returns: its outputs, gradients and intermediates; for the oracle, two fp32 bounds and a
// rounded value per element too), so a run that would fit is never refused.
void check_memory(const ref::Golden& golden, Backend backend, const std::string& golden_name, bool backward) {
  double need = 0;
  // A backward pass computes every gradient, also for a golden that holds none (backward
  // intermediates alone): those count as if the golden held them.
  std::vector<std::string> paths;
  for (const auto& [path, t] : golden.tensors) paths.push_back(path);
  if (backward)
    for (const ref::TensorSpec& s : ref::golden_schema())
      if (s.role == ref::Role::kGrad && ref::spec_applies(s, golden.cfg) && !golden.tensors.count(s.path))
        paths.push_back(s.path);
  for (const std::string& path : paths) {
    const ref::TensorSpec* s = ref::find_spec(path);
    if (!s) continue;
    const double bytes = ref::spec_bytes(*s, golden.cfg);
    if (s->role == ref::Role::kInput) need += bytes;  // the backend's copy
    if (s->role != ref::Role::kOutput && s->role != ref::Role::kGrad && s->role != ref::Role::kIntermediate) continue;
    need += bytes;
    if (backend == Backend::kOracle) need += bytes / static_cast<double>(ref::dtype_size(s->dtype)) * 8.0;  // two fp32 bounds
  }
  const std::optional<uint64_t> available = ref::available_memory_bytes();
  if (!available || need <= static_cast<double>(*available)) return;
  throw Error(golden_name + ": the " + backend_name(backend) + " backend needs at least " +
              ref::format_bytes_estimate(need) + " more memory for this layer (" +
              ref::format_config(golden.cfg) + "), but at most " + ref::format_bytes(*available) +
              " is available here (the tightest of: this process's memory limits less what it already uses, the "
              "container's limit, the machine's memory and swap); run on a machine with more memory, or use a "
              "smaller layer");
}

}  // namespace

Backend parse_backend(const std::string& name) {
  if (name == "emulate") return Backend::kEmulate;
  if (name == "oracle") return Backend::kOracle;
  if (name == "cuda") return Backend::kCuda;
  if (name == "auto") return Backend::kAuto;
  throw Error("unknown backend '" + name + "'; choose emulate, oracle, cuda or auto");
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kEmulate: return "emulate";
    case Backend::kOracle: return "oracle";
    case Backend::kCuda: return "cuda";
    case Backend::kAuto: return "auto";
  }
  return "?";
}

bool cuda_available(std::string* why) {
#if defined(MOK_HAVE_CUDA_KERNEL)
  return kernel::gpu_available(why);
#else
  if (why) *why = "this build has no CUDA kernel (configure where a CUDA toolkit is found, with MOK_ENABLE_CUDA=AUTO or ON)";
  return false;
#endif
}

Report run_backend(const ref::Golden& golden, const RunOptions& options) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto say = [&](const std::string& s) { if (options.progress) options.progress(s); };
  Backend backend = options.backend;
  std::string why;
  // Asked once: auto resolves by it, and an explicit cuda is refused by it.
  const bool have_cuda = (backend == Backend::kAuto || backend == Backend::kCuda) && cuda_available(&why);
  if (backend == Backend::kAuto) {
    backend = have_cuda ? Backend::kCuda : Backend::kEmulate;
    if (!have_cuda) say("--backend auto: the GPU kernel is not available here (" + why + "); running the CPU emulator");
  }
  if (backend == Backend::kCuda && !have_cuda)
    throw Error("backend cuda is not supported here: " + why, ErrorKind::kUnsupported);

  // The backward pass runs for a golden with gradients, or with backward intermediates alone
  // (d_act, dy, ...: a forward-only golden that kept them), which would otherwise go unchecked.
  bool backward = has_group(golden.tensors, "grads/");
  for (const auto& [path, tensor] : golden.tensors)
    if (ref::is_backward_intermediate(path)) backward = true;
  const bool intermediates = has_group(golden.tensors, "intermediates/");
  check_memory(golden, backend, options.golden_name, backward);
  const ref::TensorMap inputs = inputs_of(golden);
  Report report;
  // The backend's tensors that the end-to-end oracle covers (the output; every gradient when the
  // golden has them), kept for that check.
  static const char* const kEndToEnd[] = {"outputs/output",        "grads/d_router_weights", "grads/d_x",
                                          "grads/d_w_routed_gate", "grads/d_w_routed_up",    "grads/d_w_routed_down",
                                          "grads/d_w_shared_gate", "grads/d_w_shared_up",    "grads/d_w_shared_down"};
  ref::TensorMap kept;
  auto keep = [&](const ref::TensorMap& m) -> const ref::TensorMap& {
    if (!options.end_to_end) return m;  // copies only where the end-to-end check needs them
    for (const char* p : kEndToEnd)
      if (auto it = m.find(p); it != m.end() && golden.tensors.count(p)) kept[p] = it->second;
    return m;
  };
  // emulate and cuda: every tensor bit-identical to the golden (and within its bounds).
  auto compare_bitwise = [&](const ref::TensorMap& candidate) {
    say("comparing");
    CompareOptions co;
    co.criterion = Criterion::kBitwise;
    co.check_bounds = options.check_bounds;
    co.sample = options.sample;
    co.golden_name = options.golden_name;
    return compare(golden, candidate, co);
  };
  if (backend == Backend::kEmulate) {
    say("emulating the layer on the CPU" + std::string(backward ? " (forward and backward)" : " (forward)") +
        (options.sample ? ", " + options.sample->describe(golden.cfg) : std::string()));
    ref::EmulateOptions eo;
    eo.backward = backward;
    eo.intermediates = intermediates;
    eo.num_threads = options.num_threads;
    eo.sample = options.sample;
    report = compare_bitwise(keep(ref::emulate(golden.cfg, inputs, eo)));
  } else if (backend == Backend::kOracle) {
    ref::OracleOptions oo;
    oo.num_threads = options.num_threads;
    oo.sample = options.sample;
    oo.intermediates = intermediates;
    oo.rounded = true;
    // The oracle's bounds do not cover overflow: it names a non-finite operand by the golden's
    // dataset, or as emulated, with the fix that fits.
    oo.origin = options.golden_name;
    if (intermediates) {
      oo.reference_name = "dataset /";
      oo.reference_fix =
          "the oracle bounds the output and gradients from the golden's intermediates, and its bounds need finite "
          "operands (they do not cover overflow): regenerate the file with mok-golden; where the emulator is not "
          "finite there either, the inputs overflow bf16-v1: scale them down";
    } else {
      oo.reference_name = "the emulated ";
      oo.reference_fix =
          "the inputs overflow bf16-v1 there, and the oracle's bounds do not cover overflow: scale the inputs down";
    }
    // The operands: the golden's intermediates, and the emulator's for those it lacks (all of them
    // for a golden without intermediates; some for one that kept only some, where each stage
    // whose operands the file lacks is then judged against the emulator's). Only the file's own
    // intermediates are judged (below).
    ref::TensorMap reference = golden.tensors;
    std::vector<std::string> missing;
    for (const ref::TensorSpec& s : ref::golden_schema())
      if (s.role == ref::Role::kIntermediate && ref::spec_applies(s, golden.cfg) &&
          (backward || !ref::is_backward_intermediate(s.path)) && !golden.tensors.count(s.path))
        missing.push_back(s.path);
    if (!missing.empty()) {
      if (intermediates) {
        std::string names;
        for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m.substr(m.find('/') + 1);
        say("the golden lacks intermediates " + names + ": emulating them as the oracle's operands (the stages "
            "that take them are judged against the emulator's values there)");
      } else {
        say("the golden has no intermediates: emulating them for the oracle's operands");
      }
      ref::EmulateOptions eo;
      eo.backward = backward;
      eo.num_threads = options.num_threads;
      eo.sample = options.sample;
      ref::TensorMap emulated = ref::emulate(golden.cfg, inputs, eo);
      for (const std::string& m : missing)
        if (auto it = emulated.find(m); it != emulated.end()) reference[m] = std::move(it->second);
    }
    // With the golden's own intermediates as operands, those intermediates are judged too (each
    // stage from the golden's earlier stages, or the emulator's where the file lacks them); a
    // golden without intermediates has nothing more to judge.
    say(std::string("oracle: exact sums and radii for every checked element") +
        (intermediates ? " and every intermediate" : ""));
    const ref::TensorMap bounds = ref::oracle_bounds(golden.cfg, inputs, reference, oo);
    // Judge the golden's own tensors (the candidate) against freshly computed bounds. The
    // reference side of the bitwise columns is the oracle's value rounded to each tensor's dtype,
    // so compared/equal/max_ulp say how many elements equal the correctly rounded value and how
    // far the rest lie from it (verify/README.md).
    ref::Golden judged;
    judged.meta = golden.meta;
    judged.cfg = golden.cfg;
    ref::TensorMap candidate;
    for (const auto& [path, t] : golden.tensors) {
      const ref::TensorSpec* s = ref::find_spec(path);
      if (!s) continue;
      if (s->role == ref::Role::kInput) judged.tensors[path] = t;
      const bool judge = s->role == ref::Role::kOutput || s->role == ref::Role::kGrad ||
                         (s->role == ref::Role::kIntermediate && bounds.count(ref::bound_radius_path(path)));
      if (!judge) continue;
      candidate[path] = t;
      judged.tensors[path] = bounds.at(ref::bound_rounded_path(path));
    }
    for (const auto& [path, t] : bounds)
      if (path.size() < 8 || path.compare(path.size() - 8, 8, "_rounded") != 0) judged.tensors[path] = t;
    CompareOptions co;
    co.criterion = Criterion::kWithinBounds;
    co.sample = options.sample;
    co.golden_name = options.golden_name + " (bounds computed now by the oracle)";
    report = compare(judged, keep(candidate), co);
    // compare() names the reference side "golden" and the candidate "got"; here the candidate is
    // the golden, so the worst element's values are swapped back: golden = the file's value, got =
    // the oracle's rounded value.
    for (TensorReport& t : report.tensors) std::swap(t.worst_expected, t.worst_actual);
  } else {
#if defined(MOK_HAVE_CUDA_KERNEL)
    const bool nccl = options.transport == "nccl";
    if (std::string nccl_why; nccl && !kernel::nccl_available(&nccl_why))
      throw Error("transport nccl: " + nccl_why, ErrorKind::kUnsupported);
    const bool split = options.transport == "split";
    say("running the CUDA kernel (R=" + std::to_string(golden.cfg.num_ranks) +
        (nccl    ? " ranks, one GPU each, NCCL transport)"
         : split ? " ranks on one GPU, a launch each: the split rack)"
                 : " virtual ranks on one GPU)") +
        (backward ? ", forward and backward" : ", forward"));
    // Under mok-launch each process runs one rank; otherwise one thread per GPU of this process.
    report = compare_bitwise(keep(
        split ? kernel::run_layer_split(golden.cfg, {inputs}, backward).front()
        : !nccl ? kernel::run_layer(golden.cfg, inputs, backward, {}, intermediates)
        : kernel::launched_by_mok_launch() ? kernel::run_layer_nccl_process(golden.cfg, inputs, backward)
                                           : kernel::run_layer_nccl(golden.cfg, inputs, backward)));
#else
    throw Error("backend cuda is not supported here: this build has no CUDA kernel", ErrorKind::kUnsupported);
#endif
  }
  if (options.end_to_end) {
    if (!kept.count("outputs/output")) throw Error("end-to-end check: the backend returned no outputs/output");
    ref::Golden judged;
    judged.meta = golden.meta;
    judged.cfg = golden.cfg;
    // compare() reads only the routing of the golden's inputs (to name an element's token and expert).
    judged.tensors["inputs/topk_experts"] = inputs.at("inputs/topk_experts");
    for (const auto& [path, t] : kept) judged.tensors[path] = golden.tensors.at(path);
    // Stored end-to-end bounds (mok-golden --end-to-end-bounds) serve when they cover every
    // tensor judged; compare() finds them under the stage-local names.
    // The oracle backend judges the golden's own results, so it never takes the golden's word
    // for the bounds either.
    bool stored = !options.recompute_end_to_end && backend != Backend::kOracle;
    for (const auto& [path, t] : kept)
      stored = stored && golden.tensors.count(ref::end_to_end_exact_path(path)) &&
               golden.tensors.count(ref::end_to_end_radius_path(path));
    if (stored) {
      say("end to end: true values and radii stored in the golden (mok-golden --end-to-end-bounds)");
      for (const auto& [path, t] : kept) {
        const std::string pe = ref::end_to_end_exact_path(path), pr = ref::end_to_end_radius_path(path);
        const ref::Tensor &ex = golden.tensors.at(pe), &rad = golden.tensors.at(pr);
        // mok-golden stores every element (no sampling), so a NaN here is a broken file, not "not
        // sampled"; checked here, where the error can name the stored dataset.
        for (int64_t i = 0; i < ex.numel(); ++i) {
          const double x = ex.value_at(i), r = rad.value_at(i);
          if (!std::isfinite(x) || !(r >= 0) || std::isinf(r)) {
            const ref::TensorSpec& s = *ref::find_spec(path);
            throw Error(options.golden_name + ": " + (std::isfinite(x) ? pr : pe) + " at " +
                        ref::locate(s, golden.cfg, i, &inputs.at("inputs/topk_experts")) + " is " +
                        std::to_string(std::isfinite(x) ? r : x) +
                        "; stored end-to-end bounds must be finite (radius >= 0) at every element. Regenerate the "
                        "golden with mok-golden --end-to-end-bounds, or pass --recompute-end-to-end");
          }
        }
        judged.tensors[ref::bound_exact_path(path)] = ex;
        judged.tensors[ref::bound_radius_path(path)] = rad;
      }
    } else {
      say(std::string("end to end: true values and radii from the inputs alone (the output") +
          (backward ? " and every gradient), computed now" : "), computed now"));
      ref::OracleOptions oo;
      oo.num_threads = options.num_threads;
      oo.sample = options.sample;
      for (auto& [path, t] : backward ? ref::oracle_end_to_end(golden.cfg, inputs, oo)
                                      : ref::oracle_forward_end_to_end(golden.cfg, inputs, oo))
        judged.tensors[path] = std::move(t);
    }
    CompareOptions co;
    co.criterion = Criterion::kWithinBounds;
    co.sample = options.sample;
    co.golden_name = options.golden_name + (stored ? " (end-to-end bounds stored in the golden)"
                                                   : " (end-to-end bounds computed now)");
    // The oracle backend's candidate is the golden itself: its bitwise columns compare it with the
    // end-to-end value rounded to the tensor's dtype (from its fp32 storage), not with itself.
    if (backend == Backend::kOracle) {
      for (const auto& [path, t] : kept) {
        const ref::Tensor& ex = judged.tensors.at(ref::bound_exact_path(path));
        ref::Tensor rounded(t.dtype(), t.shape());
        for (int64_t i = 0; i < ex.numel(); ++i) {
          const float v = ex.data<float>()[i];
          if (t.dtype() == ref::DType::kBf16) rounded.data<uint16_t>()[i] = spec::bf16_from_f32_rne(v);
          else rounded.data<float>()[i] = v;
        }
        judged.tensors[path] = std::move(rounded);
      }
    }
    Report e2e = compare(judged, kept, co);
    if (backend == Backend::kOracle)
      for (TensorReport& t : e2e.tensors) std::swap(t.worst_expected, t.worst_actual);
    report.end_to_end = stored ? "stored" : "computed";
    for (TensorReport t : e2e.tensors) {
      t.path += " (end to end)";
      if (!t.passed && report.passed) report.first_bad_stage = "end to end: " + e2e.first_bad_stage;
      report.passed = report.passed && t.passed;
      report.tensors.push_back(std::move(t));
    }
  }
  report.backend = backend_name(backend);
  if (backend == Backend::kCuda) report.backend += " (" + options.transport + " transport)";
  report.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return report;
}

}  // namespace mok::verify
