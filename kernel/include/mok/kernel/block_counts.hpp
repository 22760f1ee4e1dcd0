// The block counts of KernelOptions checked from the options alone, without a GPU: the conditions
// Layer's constructor (kernel/src/layer.cu) enforces once it knows the blocks per rank.
#pragma once

namespace mok::kernel {

enum class BlockCountProblem {
  kNone,
  kTooFewBlocks,               // blocks_per_rank below 2 (1 communication + 1 compute)
  kCommNotBelowBlocks,         // comm_blocks_per_rank given but not in [1, blocks_per_rank)
  kForwardCommNotBelowBlocks,  // forward_comm_blocks_per_rank given but not in [1, blocks_per_rank)
};

// blocks_per_rank: the count a rank runs with (as given, or as resolved on the GPU); the other two
// as in KernelOptions, where 0 means derived from blocks_per_rank, which always fits once it is 2
// or more (comm: blocks_per_rank - 1; forward: min(kDefaultBulkGatherBlocks, comm) or comm).
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

}  // namespace mok::kernel
