// Internal part of the engine (mok::sim::detail), in a header so that tests can drive it: which
// rows make up each expert GEMM tile of one GPU, and when each tile is ready.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "mok/spec/routing_plan.hpp"

namespace mok::sim::detail {

// One GPU's routed tiles. Expert e's rows in canonical order (ascending global token, then slot:
// spec::build_routing_plan's order) are cut into tiles of `tile_rows`, tile i holding rows
// [i * tile_rows, (i + 1) * tile_rows); tiles are numbered expert by expert (local expert
// ascending, then i), as the kernel's GEMM schedule numbers them. A tile is ready at the largest
// known time of its rows.
//
// The rows themselves are never listed: the caller hands each expert's rows over in canonical
// order as runs, a run being consecutive rows of one expert that share a known time (one token
// chunk's rows of that expert, carried by one piece). Runs of different experts may interleave in
// any way, so the engine can walk its pieces in token order and feed every expert at once. The
// work is per run rather than per row (by our arithmetic for uniform routing: at 72 GPUs, 8192
// tokens each, top-8 of 288 experts, an expert's 16 k rows come in ~4.5 k runs; at 576 GPUs
// runs are nearly rows), and no routing plan is needed: listing the rows took a counting sort
// over every slot of the layer.
class TileReady {
 public:
  // Starts a GPU: expert_rows[e] rows for each local expert e; tiles are appended to `out` as
  // (ready ns, tile index) pairs, in no particular order.
  void begin(const int64_t* expert_rows, int num_experts, int64_t tile_rows,
             std::vector<std::pair<int64_t, int32_t>>* out) {
    tile_rows_ = tile_rows;
    out_ = out;
    state_.resize(static_cast<size_t>(num_experts));
    int64_t next = 0;
    for (int e = 0; e < num_experts; ++e) {
      state_[e] = State{kNone, static_cast<int32_t>(next), 0, expert_rows[e]};
      next += (expert_rows[e] + tile_rows - 1) / tile_rows;
    }
  }
  // The next `rows` rows of local expert `expert`, all known at `known_ns`.
  void add(int expert, int64_t rows, int64_t known_ns) {
    State& s = state_[expert];
    s.left -= rows;
    while (rows > 0) {
      const int64_t take = std::min(rows, tile_rows_ - s.in_tile);
      s.ready = std::max(s.ready, known_ns);
      s.in_tile += take;
      rows -= take;
      if (s.in_tile == tile_rows_) {
        out_->emplace_back(s.ready, s.next_tile++);
        s.ready = kNone;
        s.in_tile = 0;
      }
    }
  }
  // Appends every expert's last, partial tile. Returns false when some expert received a number
  // of rows other than begin()'s (the tiles are then wrong).
  bool finish() {
    bool exact = true;
    for (State& s : state_) {
      if (s.in_tile > 0) out_->emplace_back(s.ready, s.next_tile++);
      exact = exact && s.left == 0;
      s.in_tile = 0;
    }
    return exact;
  }

 private:
  static constexpr int64_t kNone = INT64_MIN;  // below every known time
  struct State {
    int64_t ready;      // largest known time in the open tile
    int32_t next_tile;  // index of the open tile
    int64_t in_tile;    // rows in the open tile
    int64_t left;       // rows still to come
  };
  int64_t tile_rows_ = 1;
  std::vector<State> state_;
  std::vector<std::pair<int64_t, int32_t>>* out_ = nullptr;
};

// The plain cut TileReady must equal (tests and SimOptions::check_tiles): the tiles of experts
// [first_expert, first_expert + num_experts) straight from spec::build_routing_plan's offsets and
// rows, as (ready ns, tile index) in tile order; known_of(global token) gives a row's known time.
template <class KnownOf>
std::vector<std::pair<int64_t, int32_t>> tiles_from_plan(const int64_t* offsets, const spec::RowRef* rows,
                                                         int64_t first_expert, int64_t num_experts,
                                                         int64_t tile_rows, KnownOf&& known_of) {
  std::vector<std::pair<int64_t, int32_t>> out;
  for (int64_t e = first_expert; e < first_expert + num_experts; ++e)
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += tile_rows) {
      int64_t ready = INT64_MIN;
      for (int64_t r = r0; r < std::min(offsets[e + 1], r0 + tile_rows); ++r)
        ready = std::max(ready, known_of(static_cast<int64_t>(rows[r].token_idx)));
      out.emplace_back(ready, static_cast<int32_t>(out.size()));
    }
  return out;
}

}  // namespace mok::sim::detail
