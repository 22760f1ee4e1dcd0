// CPU tests of how a launch's blocks are dealt to its local ranks (rank_block_of in
// mok/kernel/params.hpp): every rank gets a contiguous run of blocks numbered 0 .. count - 1, the
// first `wide` ranks one more than the others, no block is left over or served twice, and the
// per-block count rows (block_counts_stride) have room for the largest rank.
#include "mok/kernel/params.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <vector>

namespace {

using mok::kernel::block_counts_stride;
using mok::kernel::rank_block_count;
using mok::kernel::rank_block_of;

TEST(RankBlocks, TheH100AndH200WithEightRanks) {
  // 132 SMs, 8 ranks: four ranks of 17 blocks, then four of 16.
  EXPECT_EQ(rank_block_of(0, 16, 4).local, 0);
  EXPECT_EQ(rank_block_of(16, 16, 4).block, 16);
  EXPECT_EQ(rank_block_of(16, 16, 4).count, 17);
  EXPECT_EQ(rank_block_of(17, 16, 4).local, 1);
  EXPECT_EQ(rank_block_of(67, 16, 4).local, 3);
  EXPECT_EQ(rank_block_of(68, 16, 4).local, 4);
  EXPECT_EQ(rank_block_of(68, 16, 4).block, 0);
  EXPECT_EQ(rank_block_of(68, 16, 4).count, 16);
  EXPECT_EQ(rank_block_of(131, 16, 4).local, 7);
  EXPECT_EQ(rank_block_of(131, 16, 4).block, 15);
  EXPECT_EQ(block_counts_stride(16), 20);
  EXPECT_EQ(block_counts_stride(15), 16);
}

TEST(RankBlocks, EvenDivisionIsTheOldLayout) {
  // wide = 0: block b serves rank b / per as block b % per, as before uneven ranks existed.
  for (int per : {2, 16, 33, 66, 132})
    for (int b = 0; b < 4 * per; ++b) {
      const auto rb = rank_block_of(b, per, 0);
      EXPECT_EQ(rb.local, b / per);
      EXPECT_EQ(rb.block, b % per);
      EXPECT_EQ(rb.count, per);
    }
}

RC_GTEST_PROP(RankBlocks, EveryRankGetsItsRunOfBlocksInOrder, ()) {
  const int L = *rc::gen::inRange(1, 73);
  const int per = *rc::gen::inRange(1, 200);
  const int wide = *rc::gen::inRange(0, L);  // wide < L
  const int blocks = L * per + wide;
  std::vector<int> seen(L, 0);
  int prev_local = 0;
  for (int b = 0; b < blocks; ++b) {
    const auto rb = rank_block_of(b, per, wide);
    RC_ASSERT(rb.local >= 0);
    RC_ASSERT(rb.local < L);
    RC_ASSERT(rb.local >= prev_local);          // ranks in launch order
    RC_ASSERT(rb.block == seen[rb.local]);      // a rank's blocks numbered 0, 1, ... in order
    RC_ASSERT(rb.count == rank_block_count(rb.local, per, wide));
    RC_ASSERT(rb.count == per + (rb.local < wide ? 1 : 0));
    ++seen[rb.local];
    prev_local = rb.local;
  }
  for (int l = 0; l < L; ++l) RC_ASSERT(seen[l] == rank_block_count(l, per, wide));  // none left over
  const int64_t stride = block_counts_stride(per);
  RC_ASSERT(stride >= per + 1);
  RC_ASSERT(stride % 4 == 0);
  RC_ASSERT(stride < per + 1 + 4);
}

}  // namespace
