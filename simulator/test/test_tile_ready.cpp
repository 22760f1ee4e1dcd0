// The engine's GEMM tiles: fed per (token chunk, expert) run, in token order with the experts of
// a chunk in any order, TileReady must give every tile the rows and the ready time that cutting
// the spec's canonical row lists (spec::build_routing_plan) gives.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "mok/spec/routing_plan.hpp"
#include "tile_ready.hpp"

namespace mok::sim {
namespace {

using Tiles = std::vector<std::pair<int64_t, int32_t>>;

struct Layer {
  spec::LayerConfig cfg;
  std::vector<int32_t> topk;
  int64_t chunk = 1, num_chunks = 1;
  std::vector<int64_t> known;  // [owner * num_chunks + chunk]
};

Layer random_layer(std::mt19937_64& rng, int64_t ranks, int64_t tokens, int64_t k, int64_t experts_per_rank,
                   int64_t chunk, double empty) {
  Layer l;
  l.cfg.hidden = 64;
  l.cfg.intermediate = 32;
  l.cfg.num_ranks = ranks;
  l.cfg.tokens_per_rank = tokens;
  l.cfg.top_k = k;
  l.cfg.num_experts = ranks * experts_per_rank;
  l.chunk = chunk;
  l.num_chunks = (tokens + chunk - 1) / chunk;
  std::vector<int32_t> ids(l.cfg.num_experts);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t g = 0; g < l.cfg.num_tokens(); ++g) {
    std::shuffle(ids.begin(), ids.end(), rng);  // K distinct experts per token
    for (int64_t s = 0; s < k; ++s) l.topk.push_back(u(rng) < empty ? -1 : ids[s]);
  }
  // Few distinct times, so that ties between a tile's rows are common.
  std::uniform_int_distribution<int64_t> t(0, 6);
  for (int64_t i = 0; i < ranks * l.num_chunks; ++i) l.known.push_back(t(rng) * 100);
  return l;
}

// Tiles of GPU `gpu` from the plan: tile i of local expert e holds canonical rows [i*TR, (i+1)*TR).
Tiles tiles_from_plan(const Layer& l, int gpu, int64_t tile_rows) {
  std::vector<int64_t> offsets(l.cfg.num_experts + 1);
  std::vector<spec::RowRef> rows(l.cfg.num_slots());
  spec::build_routing_plan(l.cfg, l.topk.data(), spec::RoutingPlanView{offsets.data(), rows.data(), nullptr});
  const int64_t T = l.cfg.tokens_per_rank;
  auto known_of = [&](int64_t g) { return l.known[(g / T) * l.num_chunks + (g % T) / l.chunk]; };
  return detail::tiles_from_plan(offsets.data(), rows.data(), l.cfg.first_expert(gpu), l.cfg.experts_per_rank(),
                                 tile_rows, known_of);
}

// The engine's way: token owners ascending, chunks ascending, each chunk's experts of `gpu` in a
// random order, each (chunk, expert) run handed over whole or in random parts. `drop` leaves
// one row out.
Tiles tiles_from_runs(const Layer& l, int gpu, int64_t tile_rows, std::mt19937_64& rng, bool drop, bool* exact) {
  const int64_t T = l.cfg.tokens_per_rank, K = l.cfg.top_k, n = l.cfg.experts_per_rank();
  const int64_t first = l.cfg.first_expert(gpu);
  std::vector<int64_t> expert_rows(n, 0);
  for (int32_t e : l.topk)
    if (e >= first && e < first + n) ++expert_rows[e - first];
  Tiles out;
  detail::TileReady tiles;
  tiles.begin(expert_rows.data(), static_cast<int>(n), tile_rows, &out);
  bool dropped = false;
  for (int64_t o = 0; o < l.cfg.num_ranks; ++o)
    for (int64_t c = 0; c < l.num_chunks; ++c) {
      std::vector<int64_t> count(n, 0);
      for (int64_t t = c * l.chunk; t < std::min(T, (c + 1) * l.chunk); ++t)
        for (int64_t s = 0; s < K; ++s) {
          const int32_t e = l.topk[(o * T + t) * K + s];
          if (e >= first && e < first + n) ++count[e - first];
        }
      std::vector<int> order(n);
      for (int e = 0; e < n; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (int e : order) {
        int64_t left = count[e];
        if (drop && !dropped && left > 0) {
          --left;
          dropped = true;
        }
        while (left > 0) {
          const int64_t part = std::uniform_int_distribution<int64_t>(1, left)(rng);
          tiles.add(e, part, l.known[o * l.num_chunks + c]);
          left -= part;
        }
      }
    }
  *exact = tiles.finish();
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return out;
}

RC_GTEST_PROP(TileReadyProps, RunsGiveThePlansTiles, ()) {
  const int64_t ranks = *rc::gen::inRange<int64_t>(1, 6);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t per_rank = *rc::gen::inRange<int64_t>((k + ranks - 1) / ranks, 6);
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 200);
  const int64_t chunk = *rc::gen::inRange<int64_t>(1, 70);
  const int64_t tile_rows = *rc::gen::inRange<int64_t>(1, 50);
  const double empty = *rc::gen::element(0.0, 0.0, 0.2);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  const Layer l = random_layer(rng, ranks, tokens, k, per_rank, chunk, empty);
  for (int gpu = 0; gpu < ranks; ++gpu) {
    bool exact = false;
    const Tiles got = tiles_from_runs(l, gpu, tile_rows, rng, false, &exact);
    RC_ASSERT(exact);
    RC_ASSERT(got == tiles_from_plan(l, gpu, tile_rows));
  }
}

// finish() notices rows that never came (the engine then stops with an internal error).
TEST(TileReady, MissingRowIsReported) {
  std::mt19937_64 rng(11);
  const Layer l = random_layer(rng, 3, 300, 4, 2, 32, 0.0);
  bool exact = true;
  tiles_from_runs(l, 1, 16, rng, true, &exact);
  EXPECT_FALSE(exact);
  tiles_from_runs(l, 1, 16, rng, false, &exact);
  EXPECT_TRUE(exact);
}

// A hand-checked case: one expert, tiles of 3 rows, runs of 2, 2 and 2 rows known at 5, 1, 9:
// tiles (rows 0-2: max(5, 5, 1) = 5), (rows 3-5: max(1, 9, 9) = 9).
TEST(TileReady, SmallExample) {
  const int64_t rows = 6;
  Tiles out;
  detail::TileReady tiles;
  tiles.begin(&rows, 1, 3, &out);
  tiles.add(0, 2, 5);
  tiles.add(0, 2, 1);
  tiles.add(0, 2, 9);
  EXPECT_TRUE(tiles.finish());
  EXPECT_EQ(out, (Tiles{{5, 0}, {9, 1}}));
}

}  // namespace
}  // namespace mok::sim
