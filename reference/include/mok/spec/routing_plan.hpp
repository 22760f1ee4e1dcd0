// The routing plan: routing validation and the per-expert canonical row lists (one deterministic builder).
#pragma once

#include "mok/spec/config.hpp"

namespace mok::spec {

// One routed row: the global token id and the slot k of topk_experts[g, k].
struct RowRef {
  int32_t token_idx;
  int32_t slot_idx;
};

// Views over caller-owned arrays (host or device memory):
//   expert_offsets[E+1]: rows of expert e are rows[expert_offsets[e] .. expert_offsets[e+1])
//   rows[G*K]: filled up to expert_offsets[E] (the number of non-empty slots)
//   slot_row[G*K]: for slot (g,k), its index in rows, or -1 for an empty slot; may be null
//     when the caller does not need it (then nothing is written there)
struct RoutingPlanView {
  int64_t* expert_offsets;
  RowRef* rows;
  int32_t* slot_row;
};

// Validates topk_experts[G,K]: ids in [-1, E) and no id twice in one row. On failure the
// message is static; *bad_token and *bad_slot (when non-null) locate the first bad entry.
MOK_HD Status validate_routing(const LayerConfig& cfg, const int32_t* topk_experts,
                               int64_t* bad_token = nullptr, int64_t* bad_slot = nullptr) {
  const int64_t G = cfg.num_tokens();
  const int64_t K = cfg.top_k;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = topk_experts[g * K + k];
      if (e < -1 || e >= cfg.num_experts) {
        if (bad_token) *bad_token = g;
        if (bad_slot) *bad_slot = k;
        return Status::fail("topk_experts: expert id out of range (must be -1 for an empty slot or in [0, E))");
      }
      if (e < 0) continue;
      for (int64_t j = 0; j < k; ++j) {
        if (topk_experts[g * K + j] == e) {
          if (bad_token) *bad_token = g;
          if (bad_slot) *bad_slot = k;
          return Status::fail("topk_experts: the same expert id appears twice in one token's row");
        }
      }
    }
  }
  return Status::success();
}

// Builds the plan with a counting sort. ORDER: canonical row order = ascending global token id,
// then ascending slot (DESIGN section 4); the scan below visits (g, k) in exactly that order,
// so each expert's list comes out sorted without a comparison sort. Routing must be valid.
MOK_HD void build_routing_plan(const LayerConfig& cfg, const int32_t* topk_experts,
                               RoutingPlanView plan) {
  const int64_t G = cfg.num_tokens();
  const int64_t K = cfg.top_k;
  const int64_t E = cfg.num_experts;
  for (int64_t e = 0; e <= E; ++e) plan.expert_offsets[e] = 0;
  for (int64_t i = 0; i < G * K; ++i) {
    const int32_t e = topk_experts[i];
    if (e >= 0) ++plan.expert_offsets[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) plan.expert_offsets[e + 1] += plan.expert_offsets[e];
  // expert_offsets[e] now serves as expert e's write cursor.
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = topk_experts[g * K + k];
      if (e < 0) {
        if (plan.slot_row) plan.slot_row[g * K + k] = -1;
        continue;
      }
      const int64_t pos = plan.expert_offsets[e]++;
      plan.rows[pos] = RowRef{static_cast<int32_t>(g), static_cast<int32_t>(k)};
      if (plan.slot_row) plan.slot_row[g * K + k] = static_cast<int32_t>(pos);
    }
  }
  // Cursors now hold each expert's end; shift back to get the starts.
  for (int64_t e = E; e > 0; --e) plan.expert_offsets[e] = plan.expert_offsets[e - 1];
  plan.expert_offsets[0] = 0;
}

}  // namespace mok::spec
