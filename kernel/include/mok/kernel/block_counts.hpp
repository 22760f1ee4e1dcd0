// The block counts of KernelOptions, from the options alone, without a GPU: the conditions
// Layer's constructor (kernel/src/layer.cu) enforces once it knows the blocks per rank, and the
// counts it derives where an option is 0. mok-bench applies the same checks before it looks for a GPU.
#pragma once

#include <algorithm>

namespace mok::kernel {

// The forward's gathering blocks per rank when the bulk gather runs and
// KernelOptions::forward_comm_blocks_per_rank is 0 (measured on the H200: BENCHMARKS.md).
inline constexpr int kDefaultBulkGatherBlocks = 16;

enum class BlockCountProblem {
  kNone,
  kTooFewBlocks,               // blocks_per_rank below 2 (1 communication + 1 compute)
  kCommNotBelowBlocks,         // comm_blocks_per_rank given but not in [1, blocks_per_rank)
  kForwardCommNotBelowBlocks,  // forward_comm_blocks_per_rank given but not in [1, blocks_per_rank)
};

// blocks_per_rank: the count a rank runs with (as given, or as resolved on the GPU); the other two
// as in KernelOptions, where 0 means derived (below), which always fits once blocks_per_rank is 2
// or more (test_row_tiles.cpp checks it).
constexpr BlockCountProblem check_block_counts(int blocks_per_rank, int comm_blocks_per_rank,
                                               int forward_comm_blocks_per_rank) {
  if (blocks_per_rank < 2) return BlockCountProblem::kTooFewBlocks;
  if (comm_blocks_per_rank != 0 && (comm_blocks_per_rank < 1 || comm_blocks_per_rank >= blocks_per_rank))
    return BlockCountProblem::kCommNotBelowBlocks;
  if (forward_comm_blocks_per_rank != 0 &&
      (forward_comm_blocks_per_rank < 1 || forward_comm_blocks_per_rank >= blocks_per_rank))
    return BlockCountProblem::kForwardCommNotBelowBlocks;
  return BlockCountProblem::kNone;
}

// The communication blocks a rank runs with: as given, or with 0 every block but one (measured
// fastest on the H200 for dsv3 and qwen3: BENCHMARKS.md).
constexpr int resolve_comm_blocks(int blocks_per_rank, int comm_blocks_per_rank) {
  return comm_blocks_per_rank != 0 ? comm_blocks_per_rank : blocks_per_rank - 1;
}
// The forward's gathering blocks: as given, or with 0 kDefaultBulkGatherBlocks (or the resolved
// communication count if fewer) where the bulk gather runs, since 16 blocks move the rows as fast
// as 131 and leave the others to the GEMMs (BENCHMARKS.md, twelfth session); with thread copies
// (as across GPUs) every communication block.
constexpr int resolve_forward_comm_blocks(int resolved_comm_blocks, int forward_comm_blocks_per_rank,
                                          bool bulk_gather) {
  if (forward_comm_blocks_per_rank != 0) return forward_comm_blocks_per_rank;
  return bulk_gather ? std::min(kDefaultBulkGatherBlocks, resolved_comm_blocks) : resolved_comm_blocks;
}

}  // namespace mok::kernel
