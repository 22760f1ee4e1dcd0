// Emulator properties: batch invariance, permutation equivariance, R-split identity, oracle bounds, sampling.
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/reference/sample.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/orders.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace {

using namespace mok;
using ref::Tensor;
using ref::TensorMap;

// Rows [first, first+count) of a tensor whose leading axis is tokens.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row_bytes = static_cast<int64_t>(t.size_bytes()) / shape[0];
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out(t.dtype(), shape);
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * row_bytes, static_cast<const char*>(t.raw()) + rows[r] * row_bytes, row_bytes);
  return out;
}

bool token_tensor(const std::string& path) {
  return path == "inputs/x" || path == "inputs/topk_experts" || path == "inputs/router_weights" ||
         path == "inputs/d_output";
}

TensorMap with_tokens(const TensorMap& in, const std::vector<int64_t>& rows) {
  TensorMap out;
  for (const auto& [p, t] : in) out[p] = token_tensor(p) ? take_rows(t, rows) : t;
  return out;
}

// The per-token results (forward output, d_x, d_router_weights) that must be batch-invariant.
const char* kPerToken[] = {"outputs/output", "grads/d_x", "grads/d_router_weights"};

void expect_rows_equal(const Tensor& a, const std::vector<int64_t>& a_rows, const Tensor& b,
                       const std::vector<int64_t>& b_rows, const std::string& what) {
  const int64_t row_bytes = static_cast<int64_t>(a.size_bytes()) / a.shape()[0];
  for (size_t r = 0; r < a_rows.size(); ++r) {
    const bool same = std::memcmp(static_cast<const char*>(a.raw()) + a_rows[r] * row_bytes,
                                  static_cast<const char*>(b.raw()) + b_rows[r] * row_bytes, row_bytes) == 0;
    RC_ASSERT_FALSE(!same && (RC_LOG() << what << " differs at token row " << a_rows[r] << "\n", true));
  }
}

struct Case {
  spec::LayerConfig cfg;
  TensorMap inputs;
  uint64_t seed;
};

Case gen_case() {
  Case c;
  c.cfg = test::gen_config();
  c.seed = *rc::gen::arbitrary<uint64_t>();
  c.inputs = ref::generate_inputs(c.cfg, test::gen_routing(), c.seed);
  RC_LOG() << test::describe(c.cfg) << " seed=" << c.seed << "\n";
  return c;
}

// Every output and gradient of the emulator within its oracle radius; returns the count checked.
// With check_tightness, also that each radius is a few roundings, not a blanket tolerance.
int64_t check_within_bounds(const Case& c, bool check_tightness) {
  const TensorMap emu = ref::emulate(c.cfg, c.inputs);
  const TensorMap bounds = ref::oracle_bounds(c.cfg, c.inputs, emu);
  int64_t checked = 0;
  for (const auto& [p, t] : emu) {
    const ref::TensorSpec* s = ref::find_spec(p);
    if (s->role != ref::Role::kOutput && s->role != ref::Role::kGrad) continue;
    const Tensor& ex = bounds.at(ref::bound_exact_path(p));
    const Tensor& bd = bounds.at(ref::bound_radius_path(p));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double err = std::fabs(t.value_at(i) - ex.value_at(i));
      const double r = bd.value_at(i);
      RC_ASSERT(std::isfinite(r));
      RC_ASSERT_FALSE(!(err <= r) && (RC_LOG() << p << " " << ref::locate(*s, c.cfg, i) << " err " << err
                                                 << " bound " << r << "\n", true));
      if (check_tightness) RC_ASSERT(r <= 0x1.0p-6 * std::fabs(ex.value_at(i)) + 1e-3);
      ++checked;
    }
  }
  return checked;
}

RC_GTEST_PROP(Emulate, BatchInvariant, ()) {
  const Case c = gen_case();
  const TensorMap full = ref::emulate(c.cfg, c.inputs);
  // A random sub-batch, as a one-rank case of its own.
  const int64_t G = c.cfg.num_tokens();
  const int64_t must = *rc::gen::inRange<int64_t>(0, G);
  const auto coin = *rc::gen::container<std::vector<bool>>(G, rc::gen::arbitrary<bool>());
  std::vector<int64_t> rows;
  for (int64_t g = 0; g < G; ++g)
    if (g == must || coin[g]) rows.push_back(g);
  spec::LayerConfig sub = c.cfg;
  sub.num_ranks = 1;
  sub.tokens_per_rank = static_cast<int64_t>(rows.size());
  const TensorMap part = ref::emulate(sub, with_tokens(c.inputs, rows));
  std::vector<int64_t> iota(rows.size());
  std::iota(iota.begin(), iota.end(), 0);
  for (const char* p : kPerToken) expect_rows_equal(full.at(p), rows, part.at(p), iota, p);
}

RC_GTEST_PROP(Emulate, EquivariantUnderTokenPermutation, ()) {
  const Case c = gen_case();
  const int64_t G = c.cfg.num_tokens();
  std::vector<int64_t> perm(G);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = G - 1; i > 0; --i) std::swap(perm[i], perm[*rc::gen::inRange<int64_t>(0, i + 1)]);
  const TensorMap a = ref::emulate(c.cfg, c.inputs);
  const TensorMap b = ref::emulate(c.cfg, with_tokens(c.inputs, perm));
  std::vector<int64_t> iota(G);
  std::iota(iota.begin(), iota.end(), 0);
  // Row r of the permuted run is token perm[r] of the original.
  for (const char* p : kPerToken) expect_rows_equal(a.at(p), perm, b.at(p), iota, p);
}

// The emulator computes globally, so for it this mostly guards the per-rank pieces (shared
// gradients, plan and sizes); the kernel's counterpart (test_kernel) is where R changes the work.
RC_GTEST_PROP(Emulate, IdenticalForEverySplitIntoRanks, ()) {
  Case c = gen_case();
  const int64_t G = c.cfg.num_tokens(), E = c.cfg.num_experts;
  // Every R that divides both the global batch and the expert count.
  std::vector<int64_t> splits;
  for (int64_t r = 1; r <= std::min<int64_t>(G, 16); ++r)
    if (G % r == 0 && E % r == 0) splits.push_back(r);
  spec::LayerConfig base = c.cfg;
  base.num_ranks = 1;
  base.tokens_per_rank = G;
  const TensorMap one = ref::emulate(base, c.inputs);
  for (int64_t r : splits) {
    spec::LayerConfig cfg = base;
    cfg.num_ranks = r;
    cfg.tokens_per_rank = G / r;
    const TensorMap split = ref::emulate(cfg, c.inputs);
    for (const auto& [p, t] : one) {
      if (p.find("shared") != std::string::npos && p.rfind("grads/", 0) == 0) continue;  // per-rank by contract
      RC_ASSERT(split.count(p) == 1);
      const bool same = std::memcmp(t.raw(), split.at(p).raw(), t.size_bytes()) == 0;
      RC_ASSERT_FALSE(!same && (RC_LOG() << p << " differs between R=1 and R=" << r << "\n", true));
    }
    // Shared-expert weight gradients are per rank: rank q's equal a one-rank run on its tokens.
    if (cfg.has_shared()) {
      const int64_t q = *rc::gen::inRange<int64_t>(0, r);
      std::vector<int64_t> rows(cfg.tokens_per_rank);
      std::iota(rows.begin(), rows.end(), q * cfg.tokens_per_rank);
      spec::LayerConfig alone = base;
      alone.tokens_per_rank = cfg.tokens_per_rank;
      const TensorMap part = ref::emulate(alone, with_tokens(c.inputs, rows));
      for (const char* p : {"grads/d_w_shared_gate", "grads/d_w_shared_up", "grads/d_w_shared_down"}) {
        const Tensor& whole = split.at(p);
        const size_t per_rank = whole.size_bytes() / r;
        RC_ASSERT(std::memcmp(static_cast<const char*>(whole.raw()) + q * per_rank, part.at(p).raw(), per_rank) == 0);
      }
    }
  }
}

RC_GTEST_PROP(Emulate, WithinTheOracleBoundsEverywhere, ()) {
  const Case c = gen_case();
  const int64_t checked = check_within_bounds(c, /*check_tightness=*/true);
  RC_ASSERT(checked > 0);
}

// Every bf16 value divided by 2^shift (exponent field lowered; values that would leave the
// normal range become 0), so that products and chains reach fp32's subnormal range.
void scale_down(Tensor& t, int shift) {
  uint16_t* v = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int ef = (v[i] >> 7) & 0xFF;
    v[i] = ef > shift ? static_cast<uint16_t>(v[i] - (shift << 7)) : static_cast<uint16_t>(v[i] & 0x8000);
  }
}

RC_GTEST_PROP(Emulate, WithinTheOracleBoundsForTinyValues, ()) {
  Case c = gen_case();
  const int shift = *rc::gen::inRange(55, 76);  // products from about 2^-115 down to 2^-155
  for (auto& [p, t] : c.inputs)
    if (t.dtype() == ref::DType::kBf16) scale_down(t, shift);
  check_within_bounds(c, /*check_tightness=*/false);
}

// A subnormal accumulator aligns at -126 (far above its magnitude), so the next step truncates
// tiny products coarsely; the radius must cover that (found in review, 2026-12-02).
TEST(OracleBound, SubnormalAccumulatorIsCovered) {
  std::vector<uint16_t> a(32, 0), b(32, 0);
  a[0] = b[0] = 0x1C80;                                  // 2^-70: step 1 leaves 2^-140 (subnormal)
  for (int i = 16; i < 32; ++i) {
    a[i] = 0x1CFF;                                       // 255/128 * 2^-70
    b[i] = 0x1CF9;                                       // 249/128 * 2^-70
  }
  const float got = spec::dot_chain_bf16(spec::kHopperBf16Mma, 0.0f, a.data(), 1, b.data(), 1, 32);
  const ref::ChainBound cb = ref::dot_chain_bound(a.data(), 1, b.data(), 1, 32);
  EXPECT_LE(std::fabs(got - cb.exact), cb.radius) << "error " << std::fabs(got - cb.exact) / 0x1p-149 << " x 2^-149";
}

RC_GTEST_PROP(OracleBound, ChainsOfTinyValuesStayWithinTheRadius, ()) {
  const int64_t n = 16 * *rc::gen::inRange(1, 5);
  const int center = *rc::gen::inRange(-80, -55);
  auto value = rc::gen::map(rc::gen::tuple(rc::gen::inRange(0, 2), rc::gen::inRange(-4, 5), rc::gen::inRange(0, 128)),
                            [center](std::tuple<int, int, int> t) {
                              auto [sgn, e, m] = t;
                              return static_cast<uint16_t>((sgn << 15) | ((center + e + 127) << 7) | m);
                            });
  const auto a = *rc::gen::container<std::vector<uint16_t>>(n, value);
  const auto b = *rc::gen::container<std::vector<uint16_t>>(n, value);
  const float got = spec::dot_chain_bf16(spec::kHopperBf16Mma, 0.0f, a.data(), 1, b.data(), 1, n);
  const ref::ChainBound cb = ref::dot_chain_bound(a.data(), 1, b.data(), 1, n);
  RC_ASSERT(std::fabs(got - cb.exact) <= cb.radius);
}

RC_GTEST_PROP(Emulate, ThreadCountAndSamplingDoNotChangeBits, ()) {
  const Case c = gen_case();
  ref::EmulateOptions one;
  one.num_threads = 1;
  ref::EmulateOptions many;
  many.num_threads = 3;
  const TensorMap a = ref::emulate(c.cfg, c.inputs, one);
  const TensorMap b = ref::emulate(c.cfg, c.inputs, many);
  for (const auto& [p, t] : a) RC_ASSERT(std::memcmp(t.raw(), b.at(p).raw(), t.size_bytes()) == 0);
  const ref::Sample sample = ref::make_sample(c.cfg, c.inputs.at("inputs/topk_experts"), 2, 1, c.seed);
  ref::EmulateOptions so;
  so.sample = &sample;
  const TensorMap s = ref::emulate(c.cfg, c.inputs, so);
  int64_t covered = 0;
  for (const auto& [p, t] : a) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!sample.covers(p, c.cfg, i)) continue;
      ++covered;
      RC_ASSERT_FALSE(t.bits_at(i) != s.at(p).bits_at(i) &&
                      (RC_LOG() << p << " " << ref::locate(*ref::find_spec(p), c.cfg, i) << "\n", true));
    }
  }
  RC_ASSERT(covered > 0);
}

TEST(Emulate, RejectsBadInputsBeforeWork) {
  const spec::LayerConfig cfg{32, 16, 16, 4, 2, 2, 4};
  TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 3);
  TensorMap bad = in;
  bad.at("inputs/topk_experts").data<int32_t>()[5] = 4;
  EXPECT_THROW(ref::emulate(cfg, bad), Error);
  bad = in;
  bad.at("inputs/w_routed_up").data<uint16_t>()[7] = 0x7FC0;
  try {
    ref::emulate(cfg, bad);
    FAIL() << "NaN weight accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_routed_up"), std::string::npos) << e.what();
  }
  bad = in;
  bad.erase("inputs/w_shared_gate");
  EXPECT_THROW(ref::emulate(cfg, bad), Error);
  bad = in;
  bad["inputs/x"] = Tensor(ref::DType::kBf16, {8, 16});
  EXPECT_THROW(ref::emulate(cfg, bad), Error);
}

TEST(Emulate, EmptySlotsContributeNothing) {
  const spec::LayerConfig cfg{32, 16, 0, 4, 2, 1, 6};
  ref::RoutingSpec r = ref::parse_routing("uniform");
  TensorMap in = ref::generate_inputs(cfg, r, 5);
  int32_t* tk = in.at("inputs/topk_experts").data<int32_t>();
  for (int64_t k = 0; k < 2; ++k) tk[0 * 2 + k] = -1;  // token 0 has no expert at all
  const TensorMap out = ref::emulate(cfg, in);
  for (int64_t h = 0; h < 32; ++h) {
    EXPECT_EQ(out.at("outputs/output").data<uint16_t>()[h], 0);
    EXPECT_EQ(out.at("grads/d_x").data<uint16_t>()[h], 0);
  }
  EXPECT_EQ(out.at("grads/d_router_weights").data<float>()[0], 0.0f);
}

}  // namespace
