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

}  // namespace mok::kernel
