// Shared helpers for simulator tests: a simple topology with round numbers and small layers.
#pragma once

#include <vector>

#include "mok/sim/layer_sim.hpp"
#include "mok/sim/topology.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim::testing {

// 100 GB/s ports, 1 us one-way latency, fast SMs: the port is the only bottleneck.
inline Topology simple_topology(int gpus) {
  Topology t;
  t.name = "test";
  t.num_sms = 100;
  t.hbm_gbps = 1e5;
  t.bf16_dense_tflops = 1000;
  t.gemm_efficiency = 0.5;
  t.sm_store_gbps = 1000;
  t.sm_tma_store_gbps = 1000;
  t.sm_load_gbps = 1000;
  t.sm_tma_load_gbps = 1000;
  t.sm_store_inflight_bytes = 1e9;
  t.sm_load_inflight_bytes = 1e9;
  t.sm_tma_load_inflight_bytes = 1e9;
  t.gpus_per_domain = gpus;
  t.num_switch_chips = 4;
  t.nvlink_gbps = 100;
  t.nvlink_efficiency = 1.0;
  t.nvlink_latency_ns = 1000;
  t.num_domains = 1;
  t.nic_gbps = 50;
  t.nic_efficiency = 1.0;
  t.nic_latency_ns = 3000;
  t.uplink_oversubscription = 1;
  t.fence_overhead_ns = 100;
  t.local_fence_ns = 50;
  t.atomic_service_ns = 10;
  t.local_poll_ns = 100;
  validate_topology(t, "simple_topology");
  return t;
}

// Rank 0's `tokens` tokens (top-1) all go to `expert`; every other slot is empty: one flow.
inline Workload rank0_to_expert(const spec::LayerConfig& cfg, int32_t expert, int64_t tokens, const char* name) {
  std::vector<int32_t> topk(cfg.num_slots(), -1);
  for (int64_t t = 0; t < tokens; ++t) topk[t] = expert;
  return Workload::from_topk(cfg, topk, name);
}

// A dispatch-only push with the given signaling (and comm SMs, 0 keeping the default).
inline ProtocolConfig push_dispatch(Signaling signaling, int comm_sms = 0) {
  ProtocolConfig p;
  p.dispatch = Direction::kPush;
  p.phases = Phases::kDispatch;
  p.signaling = signaling;
  if (comm_sms > 0) p.comm_sms = comm_sms;
  return p;
}

inline spec::LayerConfig layer(int64_t ranks, int64_t tokens, int64_t experts_per_rank, int64_t top_k) {
  spec::LayerConfig cfg;
  cfg.hidden = 1024;
  cfg.intermediate = 256;
  cfg.num_experts = experts_per_rank * ranks;
  cfg.top_k = top_k;
  cfg.num_ranks = ranks;
  cfg.tokens_per_rank = tokens;
  return cfg;
}

// All-to-all routing on n ranks with one expert each (E = R = n, K = n - 1): token t of rank r
// goes to every other rank's expert, in ascending expert order.
inline std::vector<int32_t> all_to_all_topk(int n, int64_t tokens) {
  std::vector<int32_t> topk(static_cast<size_t>(n * tokens * (n - 1)));
  for (int r = 0; r < n; ++r)
    for (int64_t t = 0; t < tokens; ++t) {
      int k = 0;
      for (int e = 0; e < n; ++e)
        if (e != r) topk[static_cast<size_t>((r * tokens + t) * (n - 1) + k++)] = e;
    }
  return topk;
}

}  // namespace mok::sim::testing
