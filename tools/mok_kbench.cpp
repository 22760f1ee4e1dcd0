// mok-kbench: forward and backward time of the fused kernel on a preset or golden case (device
// events, warm-up, median of N). The baselines and FLOP/peak accounting of mok-bench build on it.
#include "mok/kernel/layer.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/golden.hpp"

#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

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

void* zeros(size_t bytes) {
  void* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(bytes, 4)));
  CK(cudaMemset(d, 0, std::max<size_t>(bytes, 4)));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mok-kbench: time the fused MoE kernel (forward, backward) with CUDA events; median of --reps.", "mok-kbench"};
  std::string preset = "dsv3-mini", file, routing = "uniform";
  int reps = 20, warmup = 3, comm = 0, blocks = 0;
  int64_t R = 0, T = 0, H = 0, I = 0, Is = -1, E = 0, K = 0;
  app.add_option("--preset,-p", preset, "configuration preset (ignored with --file)")->capture_default_str();
  app.add_option("--file,-f", file, "take config and inputs from a golden file instead");
  app.add_option("--routing", routing, "routing for generated inputs")->capture_default_str();
  app.add_option("--R", R, "virtual ranks (overrides the preset)");
  app.add_option("--T", T, "tokens per rank (overrides the preset)");
  app.add_option("--H", H, "hidden size (overrides the preset)");
  app.add_option("--I", I, "routed intermediate size");
  app.add_option("--Is", Is, "shared intermediate size (0: none)");
  app.add_option("--E", E, "experts (over all ranks)");
  app.add_option("--K", K, "top-k");
  app.add_option("--reps", reps, "timed repetitions")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed repetitions first")->capture_default_str();
  app.add_option("--comm-sms", comm, "communication blocks per rank (0: blocks per rank / 8)")->capture_default_str();
  app.add_option("--blocks-per-rank", blocks, "blocks per rank (0 = fill the GPU)")->capture_default_str();
  bool no_tma = false;
  app.add_flag("--no-tma", no_tma, "fill every tile with threads (sm_90a)");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string why;
    if (!mok::kernel::gpu_available(&why)) {
      std::fprintf(stderr, "mok-kbench: %s\n", why.c_str());
      return 3;
    }
    mok::spec::LayerConfig cfg;
    mok::ref::TensorMap in;
    if (!file.empty()) {
      mok::ref::ReadOptions ro;
      ro.load_intermediates = ro.load_bounds = false;
      auto g = mok::ref::read_golden(file, ro);
      cfg = g.cfg;
      in = std::move(g.tensors);
    } else {
      cfg = mok::ref::preset_config(preset);
      if (R) cfg.num_ranks = R;
      if (T) cfg.tokens_per_rank = T;
      if (H) cfg.hidden = H;
      if (I) cfg.intermediate = I;
      if (Is >= 0) cfg.shared_intermediate = Is;
      if (E) cfg.num_experts = E;
      if (K) cfg.top_k = K;
      const mok::spec::Status st = cfg.validate();
      if (!st.ok) throw mok::Error(st.message);
      in = mok::ref::generate_inputs(cfg, mok::ref::parse_routing(routing), 1);
    }
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
    const int64_t G = cfg.num_tokens(), Hc = cfg.hidden, Ic = cfg.intermediate, Isc = cfg.shared_intermediate,
                  Ec = cfg.num_experts, Kc = cfg.top_k, Rn = cfg.num_ranks;
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
    mok::kernel::KernelOptions ko;
    ko.comm_blocks_per_rank = comm;
    ko.blocks_per_rank = blocks;
    ko.disable_tma = no_tma;
    mok::kernel::Layer layer(cfg, ko);
    int64_t rows = 0;
    const int32_t* tk = in.at("inputs/topk_experts").data<int32_t>();
    for (int64_t i = 0; i < G * Kc; ++i) rows += tk[i] >= 0;
    const double fwd_flops = 6.0 * rows * Hc * Ic + 6.0 * G * Hc * Isc;
    const double bwd_flops = 12.0 * rows * Hc * Ic + 12.0 * G * Hc * Isc;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    auto time = [&](bool backward_too) {
      std::vector<float> fwd, bwd;
      for (int r = 0; r < warmup + reps; ++r) {
        CK(cudaEventRecord(a));
        layer.forward(di, o);
        CK(cudaEventRecord(b));
        layer.check_errors();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= warmup) fwd.push_back(ms);
        if (!backward_too) continue;
        CK(cudaEventRecord(a));
        layer.backward(di, o);
        CK(cudaEventRecord(b));
        layer.check_errors();
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= warmup) bwd.push_back(ms);
      }
      std::sort(fwd.begin(), fwd.end());
      std::sort(bwd.begin(), bwd.end());
      return std::make_pair(fwd[fwd.size() / 2], bwd.empty() ? 0.0f : bwd[bwd.size() / 2]);
    };
    const auto [f_ms, b_ms] = time(di.d_output != nullptr);
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# mok-kbench %s: G=%lld Hc=%lld Ic=%lld Isc=%lld Ec=%lld Kc=%lld R=%lld, %lld routed rows, %d blocks/rank "
                "(%d comm), TMA %s, median of %d after %d warm-up\n",
                prop.name, (long long)G, (long long)Hc, (long long)Ic, (long long)Isc, (long long)Ec, (long long)Kc,
                (long long)Rn, (long long)rows, layer.blocks_per_rank(), layer.comm_blocks_per_rank(), layer.uses_tma() ? "on" : "off", reps,
                warmup);
    std::printf("%-10s %10s %12s\n", "pass", "ms", "TFLOP/s");
    std::printf("%-10s %10.3f %12.2f\n", "forward", f_ms, fwd_flops / (f_ms * 1e-3) / 1e12);
    if (b_ms > 0) std::printf("%-10s %10.3f %12.2f\n", "backward", b_ms, bwd_flops / (b_ms * 1e-3) / 1e12);
    return 0;
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "mok-kbench: %s\n", e.what());
    return 2;
  }
}
