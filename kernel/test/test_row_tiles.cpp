// CPU tests of the kernel's row-tile search (mok/kernel/row_tiles.hpp): every routed row tile of
// random expert row counts, some experts empty, is found in the expert that a walk over the
// experts in order finds, the way the kernel mapped row tiles before its shared-memory table; and
// the grouped item order (grouped_tile) visits every (row tile, column tile) once, with its 32-bit
// form giving the 64-bit form's answers. Also the block-count rules (mok/kernel/block_counts.hpp),
// which Layer's constructor and mok-bench share: what they refuse, and that the counts derived
// from a 0 always fit.
#include "mok/kernel/block_counts.hpp"
#include "mok/kernel/row_tiles.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using mok::kernel::BlockCountProblem;
using mok::kernel::check_block_counts;
using mok::kernel::expert_of_row_tile;
using mok::kernel::grouped_tile;
using mok::kernel::grouped_tile_wide;
using mok::kernel::row_tiles_of;

std::vector<int64_t> first_tiles(const std::vector<int64_t>& rows) {
  std::vector<int64_t> first(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e) first[e + 1] = first[e] + row_tiles_of(rows[e]);
  return first;
}

// The walk: subtract each expert's tiles until rt falls inside one.
int64_t walk(const std::vector<int64_t>& rows, int64_t rt) {
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rt < row_tiles_of(rows[e])) return static_cast<int64_t>(e);
    rt -= row_tiles_of(rows[e]);
  }
  return -1;
}

TEST(RowTiles, TilesOfRows) {
  EXPECT_EQ(row_tiles_of(0), 0);
  EXPECT_EQ(row_tiles_of(1), 1);
  EXPECT_EQ(row_tiles_of(128), 1);
  EXPECT_EQ(row_tiles_of(129), 2);
  EXPECT_EQ(row_tiles_of(2048), 16);
}

TEST(RowTiles, EmptyExpertsAtBothEndsAndBetween) {
  const std::vector<int64_t> rows = {0, 0, 300, 0, 0, 128, 1, 0};  // tiles 0, 0, 3, 0, 0, 1, 1, 0
  const std::vector<int64_t> first = first_tiles(rows);
  const int64_t E = static_cast<int64_t>(rows.size());
  ASSERT_EQ(first[E], 5);
  const int64_t expected[] = {2, 2, 2, 5, 6};
  for (int64_t rt = 0; rt < first[E]; ++rt) EXPECT_EQ(expert_of_row_tile(first.data(), E, rt), expected[rt]) << rt;
}

RC_GTEST_PROP(RowTiles, SearchFindsTheExpertTheWalkFinds, ()) {
  const auto E = *rc::gen::inRange<int64_t>(1, 300);
  std::vector<int64_t> rows(static_cast<size_t>(E));
  for (auto& r : rows)  // a third of the experts empty, the rest 1 .. 700 rows
    r = *rc::gen::weightedOneOf<int64_t>({{1, rc::gen::just<int64_t>(0)}, {2, rc::gen::inRange<int64_t>(1, 701)}});
  const std::vector<int64_t> first = first_tiles(rows);
  RC_PRE(first[E] > 0);
  const std::vector<int32_t> first32(first.begin(), first.end());  // the kernel's int32 table
  for (int64_t rt = 0; rt < first[E]; ++rt) {
    const int64_t e = expert_of_row_tile(first.data(), E, rt);
    RC_ASSERT(e == walk(rows, rt));
    RC_ASSERT(expert_of_row_tile(first32.data(), E, rt) == e);
    RC_ASSERT(rows[e] > 0);
    RC_ASSERT(first[e] <= rt && rt < first[e + 1]);
  }
}

RC_GTEST_PROP(RowTiles, GroupedOrderVisitsEveryTileOnceAndBothFormsAgree, ()) {
  const auto rows = *rc::gen::inRange<int64_t>(1, 300);
  const auto cols = *rc::gen::inRange<int64_t>(1, 40);
  const auto group = *rc::gen::inRange<int64_t>(1, 65);  // KernelOptions::group_rows' range
  std::vector<int> seen(static_cast<size_t>(rows * cols), 0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    int64_t rt = -1, col = -1, rt_w = -1, col_w = -1;
    grouped_tile(i, rows, cols, group, rt, col);
    grouped_tile_wide(i, rows, cols, group, rt_w, col_w);
    RC_ASSERT(rt == rt_w);
    RC_ASSERT(col == col_w);
    RC_ASSERT(rt >= 0 && rt < rows && col >= 0 && col < cols);
    RC_ASSERT(rt / group == i / (group * cols));  // groups go in order, each whole before the next
    ++seen[static_cast<size_t>(rt * cols + col)];
  }
  for (int n : seen) RC_ASSERT(n == 1);
}

TEST(RowTiles, GroupedOrderIsColumnMajorInsideAGroup) {
  // 5 row tiles in groups of 2 (the last group holds one), 3 column tiles.
  const int64_t want[][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}, {2, 0}, {3, 0}, {2, 1},
                             {3, 1}, {2, 2}, {3, 2}, {4, 0}, {4, 1}, {4, 2}};
  for (int64_t i = 0; i < 15; ++i) {
    int64_t rt = -1, col = -1;
    grouped_tile(i, 5, 3, 2, rt, col);
    EXPECT_EQ(rt, want[i][0]) << "item " << i;
    EXPECT_EQ(col, want[i][1]) << "item " << i;
  }
  int64_t rt = -1, col = -1;  // past 2^32: the 64-bit form
  grouped_tile(int64_t{1} << 33, int64_t{1} << 30, 64, 8, rt, col);
  EXPECT_EQ(rt, ((int64_t{1} << 33) / (8 * 64)) * 8 + ((int64_t{1} << 33) % (8 * 64)) % 8);
  EXPECT_EQ(col, ((int64_t{1} << 33) % (8 * 64)) / 8);
}

// Each count the constructor is given: 0 (derived) or a value that may lie anywhere around the
// valid range [1, blocks).
RC_GTEST_PROP(BlockCounts, RefusesWhatDoesNotFitAndDerivedCountsFit, ()) {
  const int blocks = *rc::gen::inRange(-2, 300);
  const int top = std::max(blocks, 2);  // inRange's upper bound is exclusive and above its lower one
  const auto count = [top] {
    return *rc::gen::oneOf(rc::gen::just(0), rc::gen::inRange(-3, top + 4), rc::gen::inRange(1, top));
  };
  const int comm = count(), fwd = count();
  const bool bulk = *rc::gen::arbitrary<bool>();
  const BlockCountProblem got = check_block_counts(blocks, comm, fwd);
  const auto fits = [blocks](int n) { return n >= 1 && n < blocks; };
  // The first rule broken is the one named, in the constructor's order.
  if (blocks < 2) {
    RC_ASSERT(got == BlockCountProblem::kTooFewBlocks);
  } else if (comm != 0 && !fits(comm)) {
    RC_ASSERT(got == BlockCountProblem::kCommNotBelowBlocks);
  } else if (fwd != 0 && !fits(fwd)) {
    RC_ASSERT(got == BlockCountProblem::kForwardCommNotBelowBlocks);
  } else {
    RC_ASSERT(got == BlockCountProblem::kNone);
    // Accepted counts resolve to counts that fit: what the constructor no longer re-checks.
    const int c = mok::kernel::resolve_comm_blocks(blocks, comm);
    const int f = mok::kernel::resolve_forward_comm_blocks(c, fwd, bulk);
    RC_ASSERT(fits(c));
    RC_ASSERT(fits(f));
    if (comm != 0) RC_ASSERT(c == comm);
    if (fwd != 0) RC_ASSERT(f == fwd);
    if (fwd == 0) RC_ASSERT(f == (bulk ? std::min(mok::kernel::kDefaultBulkGatherBlocks, c) : c));
  }
}

TEST(BlockCounts, Examples) {
  EXPECT_EQ(check_block_counts(1, 0, 0), BlockCountProblem::kTooFewBlocks);
  EXPECT_EQ(check_block_counts(2, 0, 0), BlockCountProblem::kNone);
  EXPECT_EQ(check_block_counts(4, 4, 0), BlockCountProblem::kCommNotBelowBlocks);
  EXPECT_EQ(check_block_counts(4, -1, 0), BlockCountProblem::kCommNotBelowBlocks);
  EXPECT_EQ(check_block_counts(4, 1, 4), BlockCountProblem::kForwardCommNotBelowBlocks);
  EXPECT_EQ(check_block_counts(132, 0, 0), BlockCountProblem::kNone);
  EXPECT_EQ(mok::kernel::resolve_comm_blocks(132, 0), 131);
  EXPECT_EQ(mok::kernel::resolve_forward_comm_blocks(131, 0, true), 16);
  EXPECT_EQ(mok::kernel::resolve_forward_comm_blocks(131, 0, false), 131);
  EXPECT_EQ(mok::kernel::resolve_forward_comm_blocks(3, 0, true), 3);
}

}  // namespace
