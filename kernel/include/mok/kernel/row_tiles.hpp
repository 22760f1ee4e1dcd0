// Row tiles of the fused kernel's work items, as pure functions shared by the kernel
// (kernel/device/moe.cuh) and its CPU tests (kernel/test/test_row_tiles.cpp).
//
// A rank's routed rows are grouped by local expert (expert_offsets[e] .. expert_offsets[e + 1]
// in canonical order) and cut into tiles of up to 128 rows per expert; routed row tile rt is
// counted over the experts in order. first_tile[e] is the number of row tiles of experts
// 0 .. e - 1 (first_tile[0] = 0, first_tile[E] = all routed row tiles).
#pragma once

#include "mok/spec/common.hpp"

#include <stdint.h>

namespace mok::kernel {

inline constexpr int64_t kRowTileRows = 128;

MOK_HD int64_t row_tiles_of(int64_t rows) { return (rows + kRowTileRows - 1) / kRowTileRows; }

// The expert that holds routed row tile rt, for 0 <= rt < first_tile[E] and E >= 1: the last e
// with first_tile[e] <= rt (an expert with no rows shares its first tile with the next expert,
// so it is never the last such). Binary search: log2(E) steps.
template <class Int>  // int64_t, or int32_t where the table must be small
MOK_HD int64_t expert_of_row_tile(const Int* first_tile, int64_t E, int64_t rt) {
  int64_t lo = 0, hi = E - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (first_tile[mid] <= rt)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Item i of a GEMM phase over `rows` row tiles x `cols` column tiles, in groups of `group`
// (LaunchParams::group_rows, default 8) row tiles, column-major inside a group: blocks that run
// at the same time share a few A row tiles and a few B (weight) column tiles in L2, instead of
// one A tile and every column tile of an expert's weights (which, with 16 blocks per rank at
// R = 8, streamed the weights from DRAM once per row tile). The order changes no bit: every
// item's result is a function of its tile alone. For 0 <= i < rows * cols, every item gets its
// own (rt, col), rt < rows, col < cols.
//
// Item numbers and group sizes fit in 32 bits in any launch that fits in memory, and then the
// mapping runs on 32-bit unsigned divisions (a few instructions each on the GPU, where a 64-bit
// division is a subroutine call; the thirty-fifth session's two A/B sittings of this change
// disagreed, so no speed effect is shown: kernel/README.md); the 64-bit form serves the rest.
MOK_HD void grouped_tile_wide(int64_t i, int64_t rows, int64_t cols, int64_t group, int64_t& rt, int64_t& col) {
  const int64_t per_group = group * cols, g = i / per_group, in = i % per_group;
  const int64_t n = (group < rows - g * group ? group : rows - g * group);  // row tiles in this group
  rt = g * group + in % n;
  col = in / n;
}
MOK_HD void grouped_tile(int64_t i, int64_t rows, int64_t cols, int64_t group, int64_t& rt, int64_t& col) {
  const int64_t per_group = group * cols;
  if (((i | per_group | rows) >> 32) != 0) return grouped_tile_wide(i, rows, cols, group, rt, col);
  const uint32_t i32 = static_cast<uint32_t>(i), pg = static_cast<uint32_t>(per_group), gr = static_cast<uint32_t>(group);
  const uint32_t g = i32 / pg, in = i32 - g * pg, first = g * gr, left = static_cast<uint32_t>(rows) - first;
  const uint32_t n = gr < left ? gr : left;  // row tiles in this group
  const uint32_t c = in / n;
  rt = first + (in - c * n);
  col = c;
}

}  // namespace mok::kernel
