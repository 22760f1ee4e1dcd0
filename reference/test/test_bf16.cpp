// bf16 conversion against a brute-force definition of round-to-nearest-even.
#include "mok/spec/bf16.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>

namespace {

using mok::spec::bf16_from_f32_rne;
using mok::spec::f32_from_bf16;
using mok::spec::f32_bits;
using mok::spec::f32_from_bits;

// Brute force: among all finite bf16 values and +-Inf, pick the nearest (in exact double
// arithmetic); on a tie, the one with an even last bit. Inf wins only past the halfway point
// between the largest finite bf16 and 2^128 (IEEE overflow rule).
uint16_t brute_force(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>((f32_bits(f) >> 16 & 0x8000) | 0x7FC0);
  const double v = f;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(v);
  // Candidates: the bf16 magnitudes just below and above a (truncation and its successor).
  const uint16_t lo = static_cast<uint16_t>((f32_bits(static_cast<float>(a)) >> 16) & 0x7FFF);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double lo_v = f32_from_bf16(lo);
  const double hi_v = hi == 0x7F80 ? std::ldexp(1.0, 128) : static_cast<double>(f32_from_bf16(hi));
  if (a == lo_v) return sign | lo;
  const double dlo = a - lo_v, dhi = hi_v - a;
  uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return sign | pick;
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(bf16_from_f32_rne(INFINITY), 0x7F80);
  EXPECT_EQ(bf16_from_f32_rne(-INFINITY), 0xFF80);
  EXPECT_EQ(bf16_from_f32_rne(NAN) & 0x7FFF, 0x7FC0);
  EXPECT_EQ(bf16_from_f32_rne(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_f32_rne(3.4028235e38f), 0x7F80);            // FLT_MAX rounds up to Inf
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x7F7F7FFF)), 0x7F7F); // just below the halfway point
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x7F7F8000)), 0x7F80); // halfway, odd -> up to Inf
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x00008000)), 0x0000); // subnormal tie to even (0)
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x00018000)), 0x0002); // subnormal tie to even (2)
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x0000C000)), 0x0001);
  EXPECT_EQ(bf16_from_f32_rne(f32_from_bits(0x007FFFFF)), 0x0080); // largest subnormal -> min normal
}

// Every bf16 upper half with the low halves that decide rounding.
TEST(Bf16, ExhaustiveUpperHalvesMatchBruteForce) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF};
  int64_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) {
      const float f = f32_from_bits(hi << 16 | lo);
      if (std::isnan(f)) continue;
      ASSERT_EQ(bf16_from_f32_rne(f), brute_force(f)) << "input bits 0x" << std::hex << (hi << 16 | lo);
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000);
}

TEST(Bf16, RoundTripOfEveryBf16IsIdentity) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f32_from_bf16(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16_from_f32_rne(f), b);
  }
}

RC_GTEST_PROP(Bf16, RandomFloatsMatchBruteForce, (uint32_t bits)) {
  const float f = f32_from_bits(bits);
  RC_PRE(!std::isnan(f));
  RC_ASSERT(bf16_from_f32_rne(f) == brute_force(f));
}

RC_GTEST_PROP(Bf16, RoundingIsMonotone, (uint32_t a_bits, uint32_t b_bits)) {
  const float a = f32_from_bits(a_bits), b = f32_from_bits(b_bits);
  RC_PRE(!std::isnan(a) && !std::isnan(b) && a <= b);
  RC_ASSERT(f32_from_bf16(bf16_from_f32_rne(a)) <= f32_from_bf16(bf16_from_f32_rne(b)));
}

}  // namespace
