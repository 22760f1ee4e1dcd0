// Layer shapes (H, I, Is, E, K, R, T), their validation, and the contiguous expert placement.
#pragma once

#include "mok/spec/common.hpp"

namespace mok::spec {

// Elements per MMA step along any reduction dimension (DESIGN section 4).
inline constexpr int kMmaK = 16;
// Largest accepted dimension, so that every index product fits in int64 and row ids in int32.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;
// Largest accepted rank count R.
inline constexpr int64_t kMaxRanks = 4096;
// Largest accepted expert count E and top-k K.
inline constexpr int64_t kMaxExperts = int64_t{1} << 20;
inline constexpr int64_t kMaxTopK = 64;

struct LayerConfig {
  int64_t hidden = 0;              // H
  int64_t intermediate = 0;        // I (routed experts)
  int64_t shared_intermediate = 0; // Is, 0 = no shared expert
  int64_t num_experts = 0;         // E
  int64_t top_k = 0;               // K
  int64_t num_ranks = 1;           // R
  int64_t tokens_per_rank = 0;     // T

  MOK_HD int64_t num_tokens() const { return num_ranks * tokens_per_rank; }           // G
  MOK_HD int64_t experts_per_rank() const { return num_experts / num_ranks; }          // E_local
  MOK_HD int64_t num_slots() const { return num_tokens() * top_k; }                    // G*K
  MOK_HD bool has_shared() const { return shared_intermediate > 0; }
  // Expert placement: contiguous blocks, expert e on rank e / E_local.
  MOK_HD int64_t owner_rank(int64_t expert_idx) const { return expert_idx / experts_per_rank(); }
  MOK_HD int64_t first_expert(int64_t rank_idx) const { return rank_idx * experts_per_rank(); }
  MOK_HD int64_t token_rank(int64_t global_token_idx) const {
    return global_token_idx / tokens_per_rank;
  }

  // Checks every shape rule; the message names the field and the fix.
  MOK_HD Status validate() const {
    if (hidden <= 0 || hidden > kMaxDim) return Status::fail("config.H (hidden) must be in [16, 2^24]");
    if (hidden % kMmaK != 0) return Status::fail("config.H (hidden) must be a multiple of 16 (the MMA step)");
    if (intermediate <= 0 || intermediate > kMaxDim)
      return Status::fail("config.I (intermediate) must be in [16, 2^24]");
    if (intermediate % kMmaK != 0)
      return Status::fail("config.I (intermediate) must be a multiple of 16 (the MMA step)");
    if (shared_intermediate < 0 || shared_intermediate > kMaxDim)
      return Status::fail("config.Is (shared intermediate) must be 0 (no shared expert) or in [16, 2^24]");
    if (shared_intermediate % kMmaK != 0)
      return Status::fail("config.Is (shared intermediate) must be a multiple of 16 (the MMA step)");
    if (num_experts <= 0 || num_experts > kMaxExperts)
      return Status::fail("config.E (experts) must be in [1, 2^20]");
    if (top_k <= 0 || top_k > num_experts)
      return Status::fail("config.K (top-k) must be in [1, E]");
    if (top_k > kMaxTopK) return Status::fail("config.K (top-k) must be at most 64");
    if (num_ranks <= 0 || num_ranks > kMaxRanks) return Status::fail("config.R (ranks) must be in [1, 4096]");
    if (num_experts % num_ranks != 0)
      return Status::fail("config.E (experts) must be divisible by config.R (ranks): experts are placed in equal contiguous blocks");
    if (tokens_per_rank <= 0 || tokens_per_rank > kMaxDim)
      return Status::fail("config.T (tokens per rank) must be in [1, 2^24]");
    if (num_tokens() * top_k > (int64_t{1} << 31) - 1)
      return Status::fail("config: R*T*K (routed slots) must fit in int32");
    return Status::success();
  }
};

}  // namespace mok::spec
