// The spec's fp32 exp/sigmoid/silu/silu': accuracy against double, special values, exact rules.
#include "mok/spec/math.hpp"
#include "mok/spec/orders.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

namespace {

using namespace mok::spec;

double ulp_error(float got, double want) {
  if (want == 0) return got == 0 ? 0 : INFINITY;
  const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
  return std::fabs(got - want) / ulp;
}

TEST(SpecMath, ExpSpecialValues) {
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(exp_f32(NAN)));
  EXPECT_EQ(exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(100.0f), INFINITY);
  EXPECT_EQ(exp_f32(-200.0f), 0.0f);
  EXPECT_GT(exp_f32(-100.0f), 0.0f);  // subnormal results are produced, not flushed
}

TEST(SpecMath, ExpWithinTwoUlpOnAGrid) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.5f; x += 0.0137f) worst = std::max(worst, ulp_error(exp_f32(x), std::exp(static_cast<double>(x))));
  EXPECT_LE(worst, 2.0);
}

RC_GTEST_PROP(SpecMath, ExpWithinTwoUlp, ()) {
  const float x = *rc::gen::map(rc::gen::inRange(-870000, 885000), [](int v) { return v / 10000.0f; });
  RC_ASSERT(ulp_error(exp_f32(x), std::exp(static_cast<double>(x))) <= 2.0);
}

RC_GTEST_PROP(SpecMath, SiluAndGradAccurate, ()) {
  const float x = *rc::gen::map(rc::gen::inRange(-300000, 300000), [](int v) { return v / 10000.0f; });
  const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
  const double silu = x * s;
  const double grad = s * (1.0 + x * (1.0 - s));
  // A handful of roundings on the way; relative error stays within a few fp32 ulps except
  // near the zeros of silu' (x ~ -1.28), where cancellation is inherent, and where s is near 1:
  // 1 - s then carries s's own rounding (a few ulps of s, absolute), which x multiplies (x =
  // 16.611: 1 + e^-x rounds up to 1 + 2^-23, so 1 - s is 2^-23 against 6.2e-8, an error of
  // 9.5e-7 in silu'). Hence the bound's last term, |x| s^2: s's error is relative to s, and
  // silu' multiplies it by s x.
  RC_ASSERT(std::fabs(silu_f32(x) - silu) <= 8 * 0x1.0p-24 * std::fabs(silu) + 1e-37);
  RC_ASSERT(std::fabs(silu_grad_f32(x) - grad) <=
            16 * 0x1.0p-24 * (std::fabs(s) + std::fabs(s * x * (1 - s)) + std::fabs(x) * s * s) + 1e-37);
}

// The kernel computes silu(g) and silu'(g) from one sigmoid (the forward for act, the backward
// again from the stored g) and feeds them to the _pre forms in the backward: every fp32 bit
// pattern (NaN, Inf, subnormal included) must give the bits of the one-function-at-a-time
// definitions.
RC_GTEST_PROP(SpecMath, SiluPairAndPreFormsGiveTheDefinitionsBits, ()) {
  const float g = f32_from_bits(*rc::gen::arbitrary<uint32_t>());
  const float u = f32_from_bits(*rc::gen::arbitrary<uint32_t>());
  const float d = *rc::gen::map(rc::gen::inRange(-2000000, 2000000), [](int v) { return v / 1000.0f; });
  const SiluPair p = silu_and_grad_f32(g);
  RC_ASSERT(f32_bits(p.silu) == f32_bits(silu_f32(g)));
  RC_ASSERT(f32_bits(p.grad) == f32_bits(silu_grad_f32(g)));
  RC_ASSERT(swiglu_act_pre(p.silu, u) == swiglu_act(g, u));
  RC_ASSERT(swiglu_grad_gate_pre(d, u, p.grad) == swiglu_grad_gate(d, g, u));
  RC_ASSERT(swiglu_grad_up_pre(d, p.silu) == swiglu_grad_up(d, g));
}

// The device's forward epilogue uses the forms without range tests on tiles whose gate values
// all pass silu_normal_range: there they must give the general forms' bits (mok-recip-probe
// checks every such fp32 value on the GPU; here, arbitrary values in the range and a sweep).
RC_GTEST_PROP(SpecMath, SiluNormalRangeFormGivesTheGeneralBits, ()) {
  const uint32_t mag = *rc::gen::inRange<uint32_t>(0u, 0x42AE0001u);  // |x| in [0, 87]
  const float x = f32_from_bits(mag | (*rc::gen::arbitrary<bool>() ? 0x80000000u : 0u));
  RC_ASSERT(silu_normal_range(x));
  const SiluPair a = silu_and_grad_f32_normal(x), b = silu_and_grad_f32(x);
  RC_ASSERT(f32_bits(a.silu) == f32_bits(b.silu));
  RC_ASSERT(f32_bits(a.grad) == f32_bits(b.grad));
  RC_ASSERT(f32_bits(exp_f32_normal(-x)) == f32_bits(exp_f32(-x)));
}

// The N-value form (one range test for all): the bits of silu_and_grad_f32 on each value, whether
// the values are all in the normal range (the branch-free path) or any one is not.
RC_GTEST_PROP(SpecMath, SiluPairOfFourGivesEachValuesBits, ()) {
  float x[4];
  for (float& v : x) {
    const uint32_t mag = *rc::gen::inRange<uint32_t>(0u, 0x42AE0001u);
    const uint32_t in_range = mag | (*rc::gen::arbitrary<bool>() ? 0x80000000u : 0u);
    v = f32_from_bits(*rc::gen::arbitrary<bool>() ? in_range : *rc::gen::arbitrary<uint32_t>());
  }
  SiluPair s[4];
  silu_and_grad_f32_n(x, s);
  for (int q = 0; q < 4; ++q) {
    const SiluPair want = silu_and_grad_f32(x[q]);
    RC_ASSERT(f32_bits(s[q].silu) == f32_bits(want.silu));
    RC_ASSERT(f32_bits(s[q].grad) == f32_bits(want.grad));
  }
}

TEST(SpecMath, SiluNormalRangeEdges) {
  for (uint32_t bits = 0x42AD0000u; bits <= 0x42AE0000u; bits += 7) {  // up to 87 itself
    for (float x : {f32_from_bits(bits), -f32_from_bits(bits)}) {
      ASSERT_TRUE(silu_normal_range(x)) << x;
      ASSERT_EQ(f32_bits(silu_and_grad_f32_normal(x).grad), f32_bits(silu_and_grad_f32(x).grad)) << x;
      ASSERT_EQ(f32_bits(exp_f32_normal(-x)), f32_bits(exp_f32(-x))) << x;
    }
  }
  for (float x : {87.00001f, -87.00001f, 88.0f, -100.0f, NAN, INFINITY, -INFINITY}) EXPECT_FALSE(silu_normal_range(x)) << x;
}

TEST(SpecMath, SiluIsTheFixedOperationSequence) {
  // The bits are defined by the sequence x * (1 / (1 + exp(-x))), every step rounded.
  for (float x : {-5.5f, -1.0f, -0.1f, 0.0f, 0.3f, 2.0f, 9.75f}) {
    const float e = exp_f32(-x);
    const float s = 1.0f / (1.0f + e);
    EXPECT_EQ(f32_bits(silu_f32(x)), f32_bits(x * s)) << x;
    EXPECT_EQ(f32_bits(silu_grad_f32(x)), f32_bits(s * std::fma(x, 1.0f - s, 1.0f))) << x;
  }
}

}  // namespace

// The worst ratio of |f32(x) - want| to allowed over every 97th fp32 bit pattern (44 million
// finite values, both signs), {want, allowed} = ref(x) in long double; prints it with its x.
template <class F32, class Ref>
long double worst_over_fp32_sweep(const char* name, F32 f32, Ref ref) {
  int64_t checked = 0;
  long double worst = 0;
  float worst_x = 0;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 97) {
    float x;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b, 4);
    if (!std::isfinite(x)) continue;
    const auto [want, allowed] = ref(static_cast<long double>(x));
    const long double ratio = std::fabs(static_cast<long double>(f32(x)) - want) / allowed;
    if (ratio > worst) {
      worst = ratio;
      worst_x = x;
    }
    ++checked;
  }
  std::printf("%s against long double: worst error %.3Lg of the allowance, at x = %.9g\n", name, worst, worst_x);
  EXPECT_GT(checked, 40'000'000);
  return worst;
}

// The end-to-end oracle (reference/src/oracle_end_to_end.cpp) takes silu_f32's error against the
// real silu as at most 2^-18 relative plus 2^-118 absolute (the absolute part covers the range
// where exp(-x) overflows and silu_f32 returns -0 while the real silu is about x e^x). The
// assumption has margin: the worst case must use well under half of it.
TEST(SpecMath, SiluErrorWithinTheEndToEndOraclesAssumption) {
  const long double worst =
      worst_over_fp32_sweep("silu_f32", [](float x) { return silu_f32(x); }, [](long double x) {
        const long double w = x / (1.0L + std::exp(-x));
        return std::pair{w, 0x1.0p-18L * std::fabs(w) + 0x1.0p-118L};
      });
  EXPECT_LT(worst, 0.5L);
}

// The same for silu_grad_f32 = s (1 + x (1 - s)): its inner sum cancels near silu's minimum
// (x = -1.278), so the allowance is relative to the magnitudes of its parts, s + |x| s (1 - s).
TEST(SpecMath, SiluGradErrorWithinTheEndToEndOraclesAssumption) {
  const long double worst =
      worst_over_fp32_sweep("silu_grad_f32", [](float x) { return silu_grad_f32(x); }, [](long double x) {
        const long double s = 1.0L / (1.0L + std::exp(-x));
        return std::pair{s * (1.0L + x * (1.0L - s)), 0x1.0p-18L * (s + std::fabs(x) * s * (1.0L - s)) + 0x1.0p-118L};
      });
  EXPECT_LT(worst, 0.5L);
}
