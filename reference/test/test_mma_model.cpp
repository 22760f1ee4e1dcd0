// The MMA model against a brute-force rational evaluation of its own definition, plus crafted cases.
#include "mok/spec/mma_model.hpp"
#include "mok/spec/orders.hpp"

#include <boost/multiprecision/cpp_int.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

namespace {

using boost::multiprecision::cpp_int;
using boost::multiprecision::cpp_rational;
using namespace mok::spec;

cpp_rational pow2(int e) {
  cpp_int one = 1;
  return e >= 0 ? cpp_rational(one << e) : cpp_rational(cpp_int(1), one << -e);
}

// floor(log2(v)) for v > 0, by comparison with powers of two.
int floor_log2(const cpp_rational& v) {
  int e = 0;
  while (v >= pow2(e + 1)) ++e;
  while (v < pow2(e)) --e;
  return e;
}

cpp_rational exact(float f) {
  int e;
  const double m = std::frexp(static_cast<double>(f), &e);
  const int64_t mant = static_cast<int64_t>(std::ldexp(m, 60));  // exact
  return cpp_rational(mant) * pow2(e - 60);
}

cpp_rational trunc_to_multiple(const cpp_rational& v, const cpp_rational& q) {
  const cpp_rational r = v / q;
  const cpp_int t = numerator(r) / denominator(r);  // truncates toward zero
  return cpp_rational(t) * q;
}

// Exponent used for alignment: the encoding's exponent (-126 for subnormals), per the definition.
int encoded_exp_bf16(uint16_t b) {
  const int ef = (b >> 7) & 0xFF;
  return ef == 0 ? -126 : ef - 127;
}
int encoded_exp_f32(float f) {
  const int ef = static_cast<int>((f32_bits(f) >> 23) & 0xFF);
  return ef == 0 ? -126 : ef - 127;
}

// The definition, evaluated with rationals: exact products aligned at e_a + e_b, zero terms
// (including the missing products of a step shorter than 16) aligned at -133, the largest
// exponent E, terms truncated to multiples of 2^(E-25), exact sum, truncation toward zero to
// fp32, +0 for a zero result and Inf from 2^128 up.
float brute_force(float acc, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  std::vector<std::pair<cpp_rational, int>> terms;
  bool zero_term = a.size() < 16 || acc == 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const cpp_rational p = exact(f32_from_bf16(a[i])) * exact(f32_from_bf16(b[i]));
    if (p != 0) terms.push_back({p, encoded_exp_bf16(a[i]) + encoded_exp_bf16(b[i])});
    else zero_term = true;
  }
  if (acc != 0) terms.push_back({exact(acc), encoded_exp_f32(acc)});
  if (terms.empty()) return 0.0f;
  int max_e = zero_term ? -133 : terms[0].second;
  for (auto& t : terms) max_e = std::max(max_e, t.second);
  const cpp_rational q = pow2(max_e - 25);
  cpp_rational sum = 0;
  for (auto& t : terms) sum += trunc_to_multiple(t.first, q);
  if (sum == 0) return 0.0f;
  const bool neg = sum < 0;
  const cpp_rational mag = neg ? cpp_rational(-sum) : sum;
  if (mag >= pow2(128)) return neg ? -INFINITY : INFINITY;
  const int e = floor_log2(mag);
  const cpp_rational t = trunc_to_multiple(mag, pow2(std::max(e - 23, -149)));
  const float r = static_cast<float>(static_cast<double>(t));  // exact: t is an fp32 value
  if (r == 0.0f) return 0.0f;  // a result that truncates to zero is +0
  return neg ? -r : r;
}

uint16_t bf(float f) { return bf16_from_f32_rne(f); }

float step(float acc, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  return mma_bf16_step(kHopperBf16Mma, acc, a.data(), 1, b.data(), 1, static_cast<int>(a.size()));
}

TEST(MmaModel, CraftedCasesFromTheH200Measurements) {
  // Cancellation: a residue 2^-25 below the largest exponent survives, 2^-26 does not.
  EXPECT_EQ(step(0.0f, {bf(1.0f), bf(-1.0f), bf(0x1.0p-25f)}, {bf(1.0f), bf(1.0f), bf(1.0f)}), 0x1.0p-25f);
  EXPECT_EQ(step(0.0f, {bf(1.0f), bf(-1.0f), bf(0x1.0p-26f)}, {bf(1.0f), bf(1.0f), bf(1.0f)}), 0.0f);
  // (1 + 2^-23) + 2^-24 + 2^-25 truncates to 1 + 2^-23 (round-to-nearest would give 1 + 2^-22).
  EXPECT_EQ(step(1.0f + 0x1.0p-23f, {bf(0x1.0p-24f), bf(0x1.0p-25f)}, {bf(1.0f), bf(1.0f)}), 1.0f + 0x1.0p-23f);
  // Unnormalised product exponent: 1.5*1.5 = 2.25 aligns at exponent 0, so its 2^-25 unit
  // keeps a term of 2^-25 from a product at exponent -25.
  EXPECT_EQ(step(0.0f, {bf(1.5f), bf(0x1.0p-25f)}, {bf(1.5f), bf(1.0f)}), 2.25f + 0x1.0p-25f);
  // A term below 2^(E-25) vanishes even when it would matter to round-to-nearest.
  EXPECT_EQ(step(0.0f, {bf(1.0f), bf(0x1.8p-26f)}, {bf(1.0f), bf(1.0f)}), 1.0f);
}

// Edge rules where MMA-Sim's Hopper model decided ours (reference/README.md): zero terms align
// at -133, every zero result is +0, overflow is Inf even under truncation.
TEST(MmaModel, EdgeRulesAgreeWithMmaSim) {
  EXPECT_EQ(f32_bits(step(0.0f, {0x1A00, 0x9500}, {0x1A80, 0x1500})), 0x00000001u);
  EXPECT_EQ(f32_bits(step(-0.0f, std::vector<uint16_t>(16, 0x8000), std::vector<uint16_t>(16, 0x3F80))), 0u);
  EXPECT_EQ(f32_bits(step(0.0f, {0x9780}, {0x1780})), 0u);
  EXPECT_EQ(f32_bits(step(0.0f, {0x7F00, 0x7F00}, {0x4000, 0x4000})), 0x7F800000u);
}

TEST(MmaModel, SpecialValues) {
  const uint16_t inf = 0x7F80, ninf = 0xFF80, nan = 0x7FC0, zero = 0;
  EXPECT_TRUE(std::isnan(step(0.0f, {inf, zero}, {zero, inf})));       // Inf * 0
  EXPECT_TRUE(std::isnan(step(0.0f, {inf, ninf}, {bf(1.0f), bf(1.0f)})));  // Inf - Inf
  EXPECT_TRUE(std::isnan(step(1.0f, {nan}, {bf(1.0f)})));
  EXPECT_EQ(step(0.0f, {inf}, {bf(2.0f)}), INFINITY);
  EXPECT_EQ(step(-INFINITY, {bf(1.0f)}, {bf(2.0f)}), -INFINITY);
  EXPECT_EQ(f32_bits(step(0.0f, {zero}, {zero})), 0u);
}

// Random bf16 values whose exponents cluster (so alignment and cancellation matter), with
// occasional subnormals and zeros.
rc::Gen<uint16_t> bf16_value(int center) {
  return rc::gen::oneOf(
      rc::gen::map(rc::gen::tuple(rc::gen::inRange(0, 2), rc::gen::inRange(center - 12, center + 12), rc::gen::inRange(0, 128)),
                   [](std::tuple<int, int, int> t) {
                     auto [s, e, m] = t;
                     return static_cast<uint16_t>((s << 15) | ((e + 127) << 7) | m);
                   }),
      rc::gen::map(rc::gen::inRange(0, 0x10000), [](int v) {
        return static_cast<uint16_t>(v & 0x807F);  // subnormal or zero
      }));
}

RC_GTEST_PROP(MmaModel, MatchesRationalEvaluationOfTheDefinition, ()) {
  const int n = *rc::gen::inRange(1, 17);
  const int center = *rc::gen::inRange(-100, 100);
  const auto a = *rc::gen::container<std::vector<uint16_t>>(n, bf16_value(center / 2));
  const auto b = *rc::gen::container<std::vector<uint16_t>>(n, bf16_value(center / 2));
  const int acc_exp = *rc::gen::inRange(center - 30, center + 30);
  const uint32_t acc_mant = *rc::gen::inRange<uint32_t>(0, 1u << 23);
  const bool acc_neg = *rc::gen::arbitrary<bool>();
  // One accumulator in eight is zero, one in eight subnormal (exponent field 0, so the
  // definition's subnormal alignment is exercised), the rest normal around the operands' scale.
  const int acc_kind = *rc::gen::inRange(0, 8);
  const uint32_t sign = acc_neg ? 0x80000000u : 0u;
  const float acc = acc_kind == 0   ? 0.0f
                    : acc_kind == 1 ? f32_from_bits(sign | std::max<uint32_t>(acc_mant, 1u))
                                    : f32_from_bits(sign | (static_cast<uint32_t>(std::clamp(acc_exp, -126, 127) + 127) << 23) |
                                                    acc_mant);
  const float got = step(acc, a, b);
  const float want = brute_force(acc, a, b);
  RC_ASSERT(f32_bits(got) == f32_bits(want));
}

// The kernel's fast engine may add steps past K whose products are all zero (+0 or -0
// operands): such a step must return every accumulator a chain can hold unchanged (+0, any
// finite value including subnormals, Inf, the canonical NaN; -0 is never a step's result).
RC_GTEST_PROP(MmaModel, AllZeroStepLeavesReachableAccumulatorsUnchanged, ()) {
  const uint32_t bits = *rc::gen::arbitrary<uint32_t>();
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const float acc = nan ? f32_from_bits(kMmaNanBits) : f32_from_bits(bits == 0x80000000u ? 0u : bits);
  const int n = *rc::gen::inRange(1, 17);
  std::vector<uint16_t> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[i] = *rc::gen::element<uint16_t>(0x0000, 0x8000);
    b[i] = *rc::gen::arbitrary<uint16_t>();
    if ((b[i] & 0x7FFF) >= 0x7F80) b[i] = 0x3F80;  // zero times Inf or NaN is not a zero product
  }
  RC_ASSERT(f32_bits(step(acc, a, b)) == f32_bits(acc));
}

TEST(MmaModel, AllZeroStepKeepsEdgeAccumulators) {
  const std::vector<uint16_t> z(16, 0), one(16, 0x3F80);
  for (uint32_t bits : {0u, 1u, 0x80000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u,
                        0xFF800000u, 0x3F800001u, 0xB3800000u})
    EXPECT_EQ(f32_bits(step(f32_from_bits(bits), z, one)), bits) << std::hex << bits;
  EXPECT_EQ(f32_bits(step(f32_from_bits(kMmaNanBits), z, one)), kMmaNanBits);
}

TEST(MmaModel, ChainIsStepsOf16InIncreasingOrder) {
  // dot_chain_bf16 over 40 elements = three steps (16, 16, 8) continuing one accumulator.
  std::vector<uint16_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) {
    a[i] = bf(std::ldexp(1.0f + i / 64.0f, (i * 7) % 13 - 6) * (i % 3 ? 1 : -1));
    b[i] = bf(std::ldexp(1.0f - i / 128.0f, (i * 5) % 11 - 5));
  }
  float acc = 0.0f;
  acc = mma_bf16_step(kHopperBf16Mma, acc, a.data(), 1, b.data(), 1, 16);
  acc = mma_bf16_step(kHopperBf16Mma, acc, a.data() + 16, 1, b.data() + 16, 1, 16);
  acc = mma_bf16_step(kHopperBf16Mma, acc, a.data() + 32, 1, b.data() + 32, 1, 8);
  EXPECT_EQ(f32_bits(dot_chain_bf16(kHopperBf16Mma, 0.0f, a.data(), 1, b.data(), 1, 40)), f32_bits(acc));
}

}  // namespace
