// The routing plan: canonical order, completeness, and routing validation.
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/spec/routing_plan.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace mok;

RC_GTEST_PROP(RoutingPlan, CanonicalOrderAndCompleteness, ()) {
  const spec::LayerConfig cfg = test::gen_config();
  const ref::TensorMap in = ref::generate_inputs(cfg, test::gen_routing(), *rc::gen::arbitrary<uint64_t>());
  const int32_t* topk = in.at("inputs/topk_experts").data<int32_t>();
  std::vector<int64_t> off(cfg.num_experts + 1);
  std::vector<spec::RowRef> rows(cfg.num_slots());
  std::vector<int32_t> slot_row(cfg.num_slots());
  spec::build_routing_plan(cfg, topk, {off.data(), rows.data(), slot_row.data()});
  int64_t non_empty = 0;
  for (int64_t i = 0; i < cfg.num_slots(); ++i) non_empty += topk[i] >= 0;
  RC_ASSERT(off[0] == 0 && off[cfg.num_experts] == non_empty);
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    for (int64_t r = off[e]; r < off[e + 1]; ++r) {
      const spec::RowRef row = rows[r];
      RC_ASSERT(topk[row.token_idx * cfg.top_k + row.slot_idx] == e);
      RC_ASSERT(slot_row[row.token_idx * cfg.top_k + row.slot_idx] == r);
      if (r > off[e]) {  // ascending token, then slot
        const spec::RowRef prev = rows[r - 1];
        RC_ASSERT(prev.token_idx < row.token_idx || (prev.token_idx == row.token_idx && prev.slot_idx < row.slot_idx));
      }
    }
  }
  for (int64_t i = 0; i < cfg.num_slots(); ++i) RC_ASSERT((slot_row[i] < 0) == (topk[i] < 0));
  // Without the slot table (a null slot_row, as the simulator builds it): the same offsets and rows.
  std::vector<int64_t> off2(cfg.num_experts + 1, -7);
  std::vector<spec::RowRef> rows2(cfg.num_slots(), spec::RowRef{-7, -7});
  spec::build_routing_plan(cfg, topk, {off2.data(), rows2.data(), nullptr});
  RC_ASSERT(off2 == off);
  for (int64_t r = 0; r < off[cfg.num_experts]; ++r)
    RC_ASSERT(rows2[r].token_idx == rows[r].token_idx && rows2[r].slot_idx == rows[r].slot_idx);
}

TEST(RoutingValidation, RejectsOutOfRangeAndDuplicates) {
  spec::LayerConfig cfg{16, 16, 0, 4, 2, 1, 2};
  int64_t t = -1, k = -1;
  const int32_t good[] = {0, 3, -1, 2};
  EXPECT_TRUE(spec::validate_routing(cfg, good).ok);
  const int32_t out_of_range[] = {0, 4, 1, 2};
  EXPECT_FALSE(spec::validate_routing(cfg, out_of_range, &t, &k).ok);
  EXPECT_EQ(t, 0);
  EXPECT_EQ(k, 1);
  const int32_t negative[] = {0, 1, -2, 2};
  EXPECT_FALSE(spec::validate_routing(cfg, negative, &t, &k).ok);
  EXPECT_EQ(t, 1);
  const int32_t dup[] = {0, 1, 2, 2};
  const spec::Status st = spec::validate_routing(cfg, dup, &t, &k);
  EXPECT_FALSE(st.ok);
  EXPECT_NE(std::string(st.message).find("twice"), std::string::npos);
  EXPECT_EQ(t, 1);
  EXPECT_EQ(k, 1);
  const int32_t empties[] = {-1, -1, -1, -1};  // empty slots may repeat
  EXPECT_TRUE(spec::validate_routing(cfg, empties).ok);
}

TEST(ConfigValidation, NamesTheField) {
  spec::LayerConfig c{64, 32, 32, 8, 2, 3, 8};
  spec::Status st = c.validate();
  EXPECT_FALSE(st.ok);
  EXPECT_NE(std::string(st.message).find("divisible by config.R"), std::string::npos);
  c.num_ranks = 2;
  EXPECT_TRUE(c.validate().ok);
  c.hidden = 60;
  EXPECT_NE(std::string(c.validate().message).find("config.H"), std::string::npos);
  c.hidden = 64;
  c.top_k = 9;
  EXPECT_FALSE(c.validate().ok);
}

TEST(Generate, SameSeedSameBytesAndSkewBiasesTheHomeRank) {
  const spec::LayerConfig cfg{32, 16, 16, 16, 4, 4, 64};
  ref::RoutingSpec r = ref::parse_routing("uniform");
  const auto a = ref::generate_inputs(cfg, r, 9), b = ref::generate_inputs(cfg, r, 9), c = ref::generate_inputs(cfg, r, 10);
  for (const auto& [p, t] : a) EXPECT_EQ(0, std::memcmp(t.raw(), b.at(p).raw(), t.size_bytes())) << p;
  EXPECT_NE(0, std::memcmp(a.at("inputs/x").raw(), c.at("inputs/x").raw(), a.at("inputs/x").size_bytes()));
  r.rank_skew = 0.9;
  const auto s = ref::generate_inputs(cfg, r, 9);
  const int32_t* tk = s.at("inputs/topk_experts").data<int32_t>();
  int64_t home = 0;
  for (int64_t g = 0; g < cfg.num_tokens(); ++g)
    for (int64_t k = 0; k < cfg.top_k; ++k) home += cfg.owner_rank(tk[g * cfg.top_k + k]) == cfg.token_rank(g);
  EXPECT_GT(home, cfg.num_slots() * 3 / 4);  // uniform would give about 1/4
  EXPECT_THROW(ref::parse_routing("zipf"), mok::Error);
  EXPECT_THROW(ref::parse_routing("zipf:x"), mok::Error);
  EXPECT_THROW(ref::parse_routing("gauss:1"), mok::Error);
}

// Rng::advance(n) lands where n calls of next() do, and advances compose.
RC_GTEST_PROP(Generate, AdvanceEqualsThatManySteps, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const uint64_t n = *rc::gen::inRange<uint64_t>(0, 3000);
  ref::Rng stepped(seed), jumped(seed);
  for (uint64_t i = 0; i < n; ++i) stepped.next();
  jumped.advance(n);
  for (int i = 0; i < 4; ++i) RC_ASSERT(stepped.next() == jumped.next());
  const uint64_t a = *rc::gen::inRange<uint64_t>(0, uint64_t{1} << 62), b = *rc::gen::inRange<uint64_t>(0, uint64_t{1} << 62);
  ref::Rng ab(seed), sum(seed);
  ab.advance(a);
  ab.advance(b);
  sum.advance(a + b);
  RC_ASSERT(ab.next() == sum.next());
  ref::Rng moved(seed), still(seed);
  moved.advance(*rc::gen::inRange<uint64_t>(1, uint64_t{1} << 62));
  RC_ASSERT(moved.next() != still.next());  // a 2^256 - 1 period: a short jump never comes back
}

// The blocked fill (blocks on threads, each from an advanced generator) writes the serial fill's
// bytes and leaves the generator where the serial fill does.
RC_GTEST_PROP(Generate, BlockedFillEqualsTheSerialFill, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const int64_t n = *rc::gen::inRange<int64_t>(0, 3000);
  const int64_t block = *rc::gen::inRange<int64_t>(1, 200);
  std::vector<uint16_t> serial(static_cast<size_t>(n) + 1, 0x7fff), blocked(static_cast<size_t>(n) + 1, 0x7fff);
  ref::Rng rs(seed), rb(seed);
  ref::detail::fill_bell_bf16(serial.data(), n, rs, 0.5f, n + 1);
  ref::detail::fill_bell_bf16(blocked.data(), n, rb, 0.5f, block);
  RC_ASSERT(serial == blocked);  // the sentinel past the end too
  RC_ASSERT(rs.next() == rb.next());
}

TEST(Generate, BlockedFillRejectsAnEmptyBlock) {
  uint16_t v[4] = {};
  ref::Rng rng(5);
  EXPECT_THROW(ref::detail::fill_bell_bf16(v, 4, rng, 1.0f, 0), mok::Error);
  EXPECT_THROW(ref::detail::fill_bell_bf16(v, 4, rng, 1.0f, -3), mok::Error);
}

// generate_inputs' bytes for a layer whose x, d_output and routed weights span several parallel
// blocks (2^18 elements each), pinned to the serial generator's (main e3c2ac0, before the blocked
// fill): FNV-1a 64 of each tensor. A change here changes every golden: bump kGeneratorVersion.
TEST(Generate, BytesOfALargeLayerArePinned) {
  const spec::LayerConfig cfg{512, 512, 256, 4, 2, 1, 600};
  const ref::TensorMap m = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 20261206);
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {"inputs/d_output", 0x26c6bf7f40a2136bull},       {"inputs/router_weights", 0xffd0dd42a42898bdull},
      {"inputs/topk_experts", 0xc8e20f3641ef5701ull},   {"inputs/w_routed_down", 0x38ece875706a230eull},
      {"inputs/w_routed_gate", 0x56dc828753e9b76dull},  {"inputs/w_routed_up", 0x728c7bba29616837ull},
      {"inputs/w_shared_down", 0xcce9be58e86e2a34ull},  {"inputs/w_shared_gate", 0x3d25513857db2cbbull},
      {"inputs/w_shared_up", 0x7e625f789b56ab7cull},    {"inputs/x", 0x4f0e621357d3e922ull}};
  ASSERT_EQ(m.size(), want.size());
  EXPECT_STREQ(ref::kGeneratorVersion, "gen-v2");
  for (const auto& [path, digest] : want) {
    const ref::Tensor& t = m.at(path);
    uint64_t h = 1469598103934665603ull;
    const auto* b = static_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.size_bytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
    EXPECT_EQ(h, digest) << path;
  }
}

}  // namespace
