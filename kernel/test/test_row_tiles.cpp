// CPU tests of the kernel's row-tile search (mok/kernel/row_tiles.hpp): every routed row tile of
// random expert row counts, some experts empty, is found in the expert that a walk over the
// experts in order finds, the way the kernel mapped row tiles before its shared-memory table.
#include "mok/kernel/row_tiles.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using mok::kernel::expert_of_row_tile;
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

}  // namespace
