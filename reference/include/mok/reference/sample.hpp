// Sampling: which tokens and columns a check computes when a full pass does not fit two cores.
#pragma once

#include "mok/reference/schema.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace mok::ref {

// A sample covers every expert and every stage:
//  - per-token tensors (output, d_x, d_router_weights, per-slot and per-token intermediates)
//    for the chosen tokens, all their slots and columns;
//  - routed weight gradients for the chosen routed-intermediate columns i (rows i of
//    d_w_routed_gate/up, columns i of d_w_routed_down) of every expert, over all its rows;
//  - shared weight gradients likewise for the chosen shared-intermediate columns.
struct Sample {
  std::vector<int64_t> tokens;        // ascending global token ids
  std::vector<int64_t> inter_cols;    // ascending, in [0, I)
  std::vector<int64_t> shared_cols;   // ascending, in [0, Is)

  // One line for reports: "sampled 64 of 1024 tokens, 8 of 256 I columns, 8 of 256 Is columns".
  std::string describe(const spec::LayerConfig& cfg) const;
  // Whether element flat_idx of the tensor at `path` is computed under this sample.
  bool covers(const std::string& path, const spec::LayerConfig& cfg, int64_t flat_idx) const;

  // Lookup tables, filled by prepare() (called by make_sample and the backends).
  void prepare(const spec::LayerConfig& cfg);
  std::vector<uint8_t> token_mask, inter_mask, shared_mask;
};

// Chooses `num_tokens` tokens (at least one routed to every expert that has rows, then random
// ones) and `num_cols` columns of I and of Is, from a seed. Deterministic.
Sample make_sample(const spec::LayerConfig& cfg, const Tensor& topk_experts, int64_t num_tokens,
                   int64_t num_cols, uint64_t seed);

}  // namespace mok::ref
