// The 8-bit float formats (spec/fp8.hpp) against a definition written out independently here:
// every code decoded from sign, exponent and mantissa fields, and every encoding checked to be
// the nearest code (ties to the even mantissa) by search over all 256 decoded values. The Python
// cross-check against ml_dtypes (xcheck/check_fp8_ml_dtypes.py) skips where ml_dtypes is missing;
// this test runs everywhere.
#include "mok/spec/fp8.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using namespace mok::spec;

struct Format {
  const char* name;
  int ebits, mbits;
  bool ieee;  // e5m2: Inf and NaN in the top exponent; e4m3fn: only S.1111.111 is NaN
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};

const Format kFormats[] = {{"e4m3fn", 4, 3, false, e4m3_from_f32_rne, f32_from_e4m3},
                           {"e5m2", 5, 2, true, e5m2_from_f32_rne, f32_from_e5m2}};

// The value a code stands for, from the format's definition (NaN for NaN codes).
double defined_value(const Format& f, uint8_t code) {
  const int sign = code >> 7, ef = (code >> f.mbits) & ((1 << f.ebits) - 1), m = code & ((1 << f.mbits) - 1);
  const int bias = (1 << (f.ebits - 1)) - 1;
  const int top = (1 << f.ebits) - 1;
  if (f.ieee && ef == top) return m == 0 ? (sign ? -INFINITY : INFINITY) : std::numeric_limits<double>::quiet_NaN();
  if (!f.ieee && ef == top && m == (1 << f.mbits) - 1) return std::numeric_limits<double>::quiet_NaN();
  const double mag = ef == 0 ? std::ldexp(m, 1 - bias - f.mbits) : std::ldexp((1 << f.mbits) + m, ef - bias - f.mbits);
  return sign ? -mag : mag;
}

TEST(Fp8, EveryCodeDecodesToItsDefinition) {
  for (const Format& f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double want = defined_value(f, static_cast<uint8_t>(c));
      const float got = f.decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << f.name << " code " << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << f.name << " code " << c << " (the sign of zero too)";
      }
    }
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (const Format& f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double v = defined_value(f, static_cast<uint8_t>(c));
      if (std::isnan(v)) continue;
      EXPECT_EQ(f.encode(static_cast<float>(v)), c) << f.name << " code " << c;
    }
}

// Nearest code by search: the finite code closest to x, ties to the code with an even
// mantissa; past the largest finite value by half a quantum or more, Inf for e5m2 and NaN for
// e4m3fn (which has no Inf).
uint8_t nearest_by_search(const Format& f, float x) {
  const bool neg = std::signbit(x);
  const double a = std::fabs(static_cast<double>(x));
  int best = -1;
  double best_d = INFINITY, largest = 0;
  int largest_code = 0;
  for (int c = 0; c < 128; ++c) {
    const double v = defined_value(f, static_cast<uint8_t>(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    if (v > largest) {
      largest = v;
      largest_code = c;
    }
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = c;
    }
  }
  const int bias = (1 << (f.ebits - 1)) - 1;
  const double quantum = std::ldexp(1.0, ((largest_code >> f.mbits) - bias) - f.mbits);
  if (a >= largest + quantum / 2 && !(a == largest + quantum / 2 && (largest_code & 1) == 0))
    return static_cast<uint8_t>((neg ? 0x80 : 0) | (f.ieee ? 0x7C : 0x7F));
  return static_cast<uint8_t>((neg ? 0x80 : 0) | best);
}

RC_GTEST_PROP(Fp8, EncodingIsTheNearestCode, ()) {
  const Format& f = kFormats[*rc::gen::inRange(0, 2)];
  // Magnitudes around the format's range (subnormals to past the largest value), and exact
  // midpoints between neighbouring codes.
  float x;
  if (*rc::gen::arbitrary<bool>()) {
    const int e = *rc::gen::inRange(-22, 18);
    x = std::ldexp(1.0f + static_cast<float>(*rc::gen::inRange(0, 1 << 20)) / (1 << 20), e);
  } else {
    const int c = *rc::gen::inRange(0, 126);
    const double lo = defined_value(f, static_cast<uint8_t>(c)), hi = defined_value(f, static_cast<uint8_t>(c + 1));
    RC_PRE(std::isfinite(lo) && std::isfinite(hi));
    x = static_cast<float>((lo + hi) / 2);
  }
  if (*rc::gen::arbitrary<bool>()) x = -x;
  const uint8_t want = nearest_by_search(f, x);
  const uint8_t got = f.encode(x);
  RC_ASSERT(static_cast<int>(got) == static_cast<int>(want));
}

}  // namespace
