// Workload generators and the routing plan: validity, skew ordering, statistics, file input.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mok/sim/error.hpp"
#include "mok/sim/workload.hpp"

namespace mok::sim {
namespace {

spec::LayerConfig small_cfg(int64_t ranks = 4, int64_t tokens = 512) {
  spec::LayerConfig cfg;
  cfg.hidden = 64;
  cfg.intermediate = 32;
  cfg.num_experts = 8 * ranks;
  cfg.top_k = 4;
  cfg.num_ranks = ranks;
  cfg.tokens_per_rank = tokens;
  return cfg;
}

TEST(Workload, GeneratedRoutingIsValidAndEachExpertsRowsAreCounted) {
  for (auto kind : {RoutingKind::kUniform, RoutingKind::kPowerLaw, RoutingKind::kHot, RoutingKind::kDirichlet}) {
    RoutingSpec s;
    s.kind = kind;
    s.exponent = 1.5;
    s.per_rank_skew = 0.3;
    s.seed = 7;
    s.empty_slot_fraction = kind == RoutingKind::kHot ? 0.1 : 0.0;
    const Workload w = generate_workload(small_cfg(), s);
    // generate_workload skips from_topk's check (valid by construction): check it here.
    int64_t bad_token = -1, bad_slot = -1;
    EXPECT_TRUE(spec::validate_routing(w.cfg, w.topk_experts.data(), &bad_token, &bad_slot).ok)
        << "token " << bad_token << " slot " << bad_slot;
    if (s.empty_slot_fraction == 0) {
      EXPECT_EQ(w.expert_offsets.back(), w.cfg.num_slots());
    }
    // Each expert's rows are counted as the spec's routing plan counts them.
    std::vector<int64_t> offsets(w.cfg.num_experts + 1);
    std::vector<spec::RowRef> rows(w.cfg.num_slots());
    spec::build_routing_plan(w.cfg, w.topk_experts.data(),
                             spec::RoutingPlanView{offsets.data(), rows.data(), nullptr});
    EXPECT_EQ(w.expert_offsets, offsets) << "kind " << static_cast<int>(kind);
  }
}

// Without skew and empty slots, ranks are drawn four at a time where the CPU allows (four RNG
// streams side by side); a layer of three ranks draws each alone. Both must give every rank
// the same routing, the exact draws after 64 rejections (exponent 9, hot 1e8) included.
TEST(Workload, RanksDrawnFourAtATimeMatchRanksDrawnAlone) {
  for (int variant = 0; variant < 4; ++variant) {
    RoutingSpec s;
    s.kind = variant == 0 ? RoutingKind::kUniform : variant == 3 ? RoutingKind::kHot : RoutingKind::kPowerLaw;
    s.exponent = variant == 1 ? 1.2 : 9.0;
    s.hot_factor = 1e8;
    s.seed = 5 + variant;
    spec::LayerConfig alone = small_cfg(3, 1500), together = small_cfg(4, 1500);
    alone.num_experts = together.num_experts = 24;
    const Workload a = generate_workload(alone, s);
    const Workload b = generate_workload(together, s);
    ASSERT_EQ(a.topk_experts.size() * 4, b.topk_experts.size() * 3);
    for (size_t i = 0; i < a.topk_experts.size(); ++i)
      ASSERT_EQ(a.topk_experts[i], b.topk_experts[i]) << "variant " << variant << " slot " << i;
    // Nine ranks: two groups of four and rank 8 alone; twelve: rank 8 in the third group.
    spec::LayerConfig nine = small_cfg(9, 700), twelve = small_cfg(12, 700);
    nine.num_experts = twelve.num_experts = 36;
    const Workload c = generate_workload(nine, s);
    const Workload d = generate_workload(twelve, s);
    for (size_t i = 0; i < c.topk_experts.size(); ++i)
      ASSERT_EQ(c.topk_experts[i], d.topk_experts[i]) << "variant " << variant << " slot " << i << " (9 / 12 ranks)";
  }
}

// generate_workload(..., threads): ranks drawn on several threads and rows counted by token
// ranges give the same routing and the same row counts, byte for byte, as one thread: every
// kind, with and without per-rank skew and empty slots (the two drawing paths), rank counts that
// are and are not multiples of four (groups of four and single ranks), and more threads than
// ranks.
RC_GTEST_PROP(WorkloadProps, ThreadsGiveTheSameWorkload, ()) {
  const int64_t ranks = *rc::gen::inRange<int64_t>(1, 12);
  const int64_t tokens = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t k = *rc::gen::inRange<int64_t>(1, 6);
  spec::LayerConfig cfg = small_cfg(ranks, tokens);
  cfg.top_k = k;
  cfg.num_experts = ranks * *rc::gen::inRange<int64_t>((k + ranks - 1) / ranks, 10);
  RoutingSpec s;
  s.kind = *rc::gen::element(RoutingKind::kUniform, RoutingKind::kPowerLaw, RoutingKind::kHot, RoutingKind::kDirichlet);
  s.exponent = *rc::gen::element(1.01, 1.2, 1.5, 9.0);
  s.hot_factor = *rc::gen::element(8.0, 1e8);
  s.alpha = 0.5;
  s.per_rank_skew = *rc::gen::element(0.0, 0.0, 0.3);
  s.empty_slot_fraction = *rc::gen::element(0.0, 0.0, 0.05);
  s.seed = *rc::gen::arbitrary<uint32_t>();
  const int threads = *rc::gen::inRange(2, 6);
  const Workload one = generate_workload(cfg, s);
  const Workload many = generate_workload(cfg, s, threads);
  RC_ASSERT(many.topk_experts == one.topk_experts);
  RC_ASSERT(many.expert_offsets == one.expert_offsets);
}

// An error inside one rank's draws (here every rank's: one expert with positive popularity,
// top-2, with empty slots, the per-rank path) reaches the caller with the message one thread
// gives, whatever the threads.
TEST(Workload, ThreadsReportTheErrorOneThreadReports) {
  spec::LayerConfig cfg = small_cfg(6, 64);
  cfg.top_k = 2;
  RoutingSpec s;
  s.kind = RoutingKind::kHot;
  s.num_hot = cfg.num_experts - 1;
  s.hot_factor = 0.0;  // the hot experts can never be drawn
  s.empty_slot_fraction = 0.1;
  auto message = [&](int threads) {
    try {
      generate_workload(cfg, s, threads);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string one = message(1);
  EXPECT_NE(one.find("fewer than K experts"), std::string::npos) << one;
  for (int threads : {2, 3, 8}) EXPECT_EQ(message(threads), one) << threads << " threads";
}

TEST(Workload, PowerLawSkewGrowsWithTheExponent) {
  double last_gini = -1;
  for (double exponent : {0.0, 0.6, 1.01, 1.2, 1.5}) {
    RoutingSpec s;
    s.kind = RoutingKind::kPowerLaw;
    s.exponent = exponent;
    const Workload w = generate_workload(small_cfg(8, 1024), s);
    std::vector<int64_t> rows(w.cfg.num_experts);
    for (int64_t e = 0; e < w.cfg.num_experts; ++e) rows[e] = w.expert_rows(e);
    const double gini = load_stats(rows).gini;
    EXPECT_GT(gini, last_gini) << "exponent " << exponent;
    last_gini = gini;
  }
}

TEST(Workload, SameSeedSameRoutingDifferentSeedDifferentRouting) {
  RoutingSpec s;
  s.kind = RoutingKind::kDirichlet;
  s.alpha = 0.5;
  s.seed = 11;
  const Workload a = generate_workload(small_cfg(), s);
  const Workload b = generate_workload(small_cfg(), s);
  EXPECT_EQ(a.topk_experts, b.topk_experts);
  s.seed = 12;
  EXPECT_NE(generate_workload(small_cfg(), s).topk_experts, a.topk_experts);
}

TEST(Workload, FromTopkNamesTheBadTokenAndSlot) {
  spec::LayerConfig cfg = small_cfg(2, 4);
  std::vector<int32_t> topk(cfg.num_slots(), -1);
  topk[5 * 4 + 2] = 3;
  topk[5 * 4 + 3] = 3;  // duplicate in token 5
  try {
    Workload::from_topk(cfg, topk, "test");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global token 5, slot 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Workload::from_topk(cfg, std::vector<int32_t>(3, 0), "short"), Error);
}

TEST(Workload, TopkFileRoundTrips) {
  spec::LayerConfig cfg = small_cfg(2, 16);
  RoutingSpec s;
  const Workload w = generate_workload(cfg, s);
  const std::string path = ::testing::TempDir() + "/topk.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(w.topk_experts.data()), w.topk_experts.size() * 4);
  }
  RoutingSpec f;
  f.kind = RoutingKind::kTopkFile;
  f.topk_file = path;
  EXPECT_EQ(generate_workload(cfg, f).topk_experts, w.topk_experts);
  cfg.tokens_per_rank = 17;
  EXPECT_THROW(generate_workload(cfg, f), Error);
  // A file of the right size with an expert id out of range: the error names the field, the
  // file, and the token and slot (audit 2026-12-05: it named only the token and slot).
  cfg.tokens_per_rank = 16;
  std::vector<int32_t> bad = w.topk_experts;
  bad[3 * cfg.top_k + 1] = static_cast<int32_t>(cfg.num_experts);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bad.data()), bad.size() * 4);
  }
  try {
    generate_workload(cfg, f);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("/workload/topk_file '" + path + "': ", 0), 0u) << what;
    EXPECT_NE(what.find("global token 3, slot 1"), std::string::npos) << what;
  }
  std::remove(path.c_str());
}

TEST(LoadStats, KnownValues) {
  const LoadStats even = load_stats({5, 5, 5, 5});
  EXPECT_DOUBLE_EQ(even.gini, 0.0);
  EXPECT_DOUBLE_EQ(even.max_over_mean, 1.0);
  const LoadStats one = load_stats({0, 0, 0, 8});
  EXPECT_DOUBLE_EQ(one.gini, 0.75);
  EXPECT_DOUBLE_EQ(one.max_over_mean, 4.0);
  EXPECT_DOUBLE_EQ(one.p99, 8.0);
  // Nearest rank: p99 of 1..200 is the value at rank ceil(198) = 198.
  std::vector<int64_t> ramp(200);
  for (int64_t i = 0; i < 200; ++i) ramp[i] = 200 - i;
  const LoadStats r = load_stats(ramp);
  EXPECT_DOUBLE_EQ(r.p99, 198.0);
  EXPECT_DOUBLE_EQ(r.mean, 100.5);
  EXPECT_DOUBLE_EQ(r.max, 200.0);
  // No load at all: nothing to be imbalanced (0, not 1 or NaN).
  const LoadStats none = load_stats({0, 0, 0});
  EXPECT_DOUBLE_EQ(none.gini, 0.0);
  EXPECT_DOUBLE_EQ(none.max_over_mean, 0.0);
}

// The generators' laws, measured on fresh seeds with top-1 routing (no repeats to reject, so each
// slot is one draw from the popularity): 8 ranks x 8,192 tokens, tolerances of 6 standard deviations
// or more of the counts (a failure prints the seed).
spec::LayerConfig top1_cfg(int64_t experts) {
  spec::LayerConfig cfg = small_cfg(8, 8192);
  cfg.num_experts = experts;
  cfg.top_k = 1;
  return cfg;
}
// A routing spec of `kind` with a fresh random seed (each test names the seed on failure).
RoutingSpec fresh_spec(RoutingKind kind) {
  RoutingSpec s;
  s.kind = kind;
  s.seed = std::random_device{}() | uint64_t{1} << 40;
  return s;
}
// Each expert's rows, largest first (shuffle_experts permutes which ids are popular).
std::vector<int64_t> rows_descending(const Workload& w) {
  std::vector<int64_t> rows(w.cfg.num_experts);
  for (int64_t e = 0; e < w.cfg.num_experts; ++e) rows[e] = w.expert_rows(e);
  std::sort(rows.rbegin(), rows.rend());
  return rows;
}

TEST(Workload, PowerLawExpertsFollowOneOverRankToTheExponent) {
  // p(rank i) = i^-s / H over ranks i = 1..E: the two most popular experts in the ratio 2^s,
  // the most popular one with a share 1/H.
  for (double s_exp : {1.2, 1.5}) {
    RoutingSpec s = fresh_spec(RoutingKind::kPowerLaw);
    s.exponent = s_exp;
    const Workload w = generate_workload(top1_cfg(16), s);
    const std::vector<int64_t> rows = rows_descending(w);
    double h = 0;
    for (int i = 1; i <= 16; ++i) h += std::pow(i, -s_exp);
    const double n = static_cast<double>(w.cfg.num_slots());
    EXPECT_NEAR(static_cast<double>(rows[0]) / static_cast<double>(rows[1]), std::pow(2.0, s_exp), 0.12 * std::pow(2.0, s_exp))
        << "exponent " << s_exp << ", seed " << s.seed;
    EXPECT_NEAR(static_cast<double>(rows[0]) / n, 1.0 / h, 0.05 / h) << "exponent " << s_exp << ", seed " << s.seed;
  }
}

TEST(Workload, HotExpertsAreHotFactorTimesAsPopular) {
  // 3 hot experts of 32, each 8 times as popular as a cold one.
  RoutingSpec s = fresh_spec(RoutingKind::kHot);
  s.num_hot = 3;
  s.hot_factor = 8;
  const std::vector<int64_t> rows = rows_descending(generate_workload(top1_cfg(32), s));
  double cold = 0;
  for (size_t i = 3; i < rows.size(); ++i) cold += static_cast<double>(rows[i]);
  cold /= static_cast<double>(rows.size() - 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(static_cast<double>(rows[i]) / cold, 8.0, 0.8) << "hot " << i << ", seed " << s.seed;
  EXPECT_LT(static_cast<double>(rows[3]) / cold, 1.5) << "a fourth hot expert, seed " << s.seed;
}

TEST(Workload, DirichletAlphaSetsTheSkew) {
  // Dir(alpha) popularity over 64 experts: alpha 0.05 puts nearly all mass on a few experts
  // (Gini ~0.9), alpha 1000 is uniform up to sampling noise (Gini ~0.02); alpha 1 sits between.
  for (auto [alpha, lo, hi] : {std::tuple{0.05, 0.7, 1.0}, std::tuple{1.0, 0.3, 0.7}, std::tuple{1000.0, 0.0, 0.1}}) {
    RoutingSpec s = fresh_spec(RoutingKind::kDirichlet);
    s.alpha = alpha;
    const double gini = load_stats(rows_descending(generate_workload(top1_cfg(64), s))).gini;
    EXPECT_GE(gini, lo) << "alpha " << alpha << ", seed " << s.seed;
    EXPECT_LE(gini, hi) << "alpha " << alpha << ", seed " << s.seed;
  }
}

TEST(Workload, PerRankSkewWeighsTheRanksOwnPreference) {
  // Uniform popularity mixed with each rank's own Dir(0.2) preference at weight per_rank_skew:
  // a rank's own experts are nearly even at 0.05 and concentrated at 0.95 (Gini of the rank's
  // counts over 64 experts, 8,192 draws each).
  for (auto [skew, lo, hi] : {std::tuple{0.05, 0.0, 0.2}, std::tuple{0.95, 0.5, 1.0}}) {
    RoutingSpec s = fresh_spec(RoutingKind::kUniform);
    s.per_rank_skew = skew;
    const Workload w = generate_workload(top1_cfg(64), s);
    const int64_t T = w.cfg.tokens_per_rank;
    for (int64_t r = 0; r < w.cfg.num_ranks; ++r) {
      std::vector<int64_t> own(64, 0);
      for (int64_t t = 0; t < T; ++t) ++own[w.topk_experts[r * T + t]];
      const double gini = load_stats(own).gini;
      EXPECT_GE(gini, lo) << "skew " << skew << ", rank " << r << ", seed " << s.seed;
      EXPECT_LE(gini, hi) << "skew " << skew << ", rank " << r << ", seed " << s.seed;
    }
  }
}

TEST(Workload, EmptySlotFractionEmptiesThatShareOfSlots) {
  for (double f : {0.1, 0.5}) {
    RoutingSpec s = fresh_spec(RoutingKind::kPowerLaw);
    s.empty_slot_fraction = f;
    const Workload w = generate_workload(small_cfg(8, 2048), s);  // 65,536 slots, top-4
    const auto empty = std::count(w.topk_experts.begin(), w.topk_experts.end(), -1);
    EXPECT_NEAR(static_cast<double>(empty) / static_cast<double>(w.cfg.num_slots()), f, 0.015) << "seed " << s.seed;
    EXPECT_EQ(w.expert_offsets.back(), w.cfg.num_slots() - empty) << "seed " << s.seed;
  }
}

}  // namespace
}  // namespace mok::sim
