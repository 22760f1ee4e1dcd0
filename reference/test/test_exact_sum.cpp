// ExactSum against Boost.Multiprecision rationals: exact accumulation, one correct rounding.
#include "mok/reference/exact_sum.hpp"

#include <boost/multiprecision/cpp_int.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace {

using boost::multiprecision::cpp_int;
using boost::multiprecision::cpp_rational;
using mok::ref::ExactSum;

cpp_rational exact(double d) {
  int e;
  const double m = std::frexp(d, &e);
  const int64_t mant = static_cast<int64_t>(std::ldexp(m, 60));
  cpp_int one = 1;
  return e - 60 >= 0 ? cpp_rational(cpp_int(mant) << (e - 60)) : cpp_rational(cpp_int(mant), one << (60 - e));
}

// Correct rounding to nearest-even of a rational, via the two neighbouring doubles.
double round_rational(const cpp_rational& r) {
  const double approx = static_cast<double>(r);  // close; fix up by comparison
  double lo = approx, hi = approx;
  while (exact(lo) > r) lo = std::nextafter(lo, -INFINITY);
  hi = lo;
  while (exact(hi) < r) hi = std::nextafter(hi, INFINITY);
  if (exact(lo) == r) return lo;
  if (exact(hi) == r) return hi;
  const cpp_rational dlo = r - exact(lo), dhi = exact(hi) - r;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  int64_t bits;
  std::memcpy(&bits, &lo, sizeof bits);
  return (bits & 1) ? hi : lo;
}

TEST(ExactSum, CancellationKeepsTinyResidues) {
  ExactSum s;
  s.add(0x1.0p200);
  s.add(0x1.0p-280);
  s.add(-0x1.0p200);
  EXPECT_EQ(s.to_double(), 0x1.0p-280);
  ExactSum t;
  t.add(1.0);
  t.add(0x1.0p-53);  // exactly halfway between 1 and its successor: ties to even (1.0)
  EXPECT_EQ(t.to_double(), 1.0);
  t.add(0x1.0p-250);  // now just above halfway: rounds up
  EXPECT_EQ(t.to_double(), 1.0 + 0x1.0p-52);
}

// A term near the bottom of the range with fewer than 53 significant bits: its lowest set bit
// decides whether it fits, not where frexp's 53rd bit would fall (found by MatchesRationalSum
// with RC_PARAMS max_success=20000: (2^33 - 1) * 2^-333 was refused). A set bit below 2^kMinExp
// is still refused.
TEST(ExactSum, ShortMantissaNearTheBottomFits) {
  const double v = std::ldexp(8589934591.0, -333);  // (2^33 - 1) * 2^-333, |v| < 2^-300
  ExactSum s;
  s.add(v);
  s.add(-0x1.0p-280);
  EXPECT_EQ(s.to_double(), round_rational(exact(v) + exact(-0x1.0p-280)));
  EXPECT_EQ(s.to_double(), v - 0x1.0p-280);  // exact in double too: the bits span 53 places
  ExactSum t;
  EXPECT_THROW(t.add(std::ldexp(9007199254740991.0, -400)), std::domain_error);  // lowest bit 2^-400
}

RC_GTEST_PROP(ExactSum, MatchesRationalSum, ()) {
  const int n = *rc::gen::inRange(1, 200);
  const int center = *rc::gen::inRange(-250, 250);
  cpp_rational want = 0;
  ExactSum s;
  for (int i = 0; i < n; ++i) {
    const int64_t mant = *rc::gen::inRange<int64_t>(-(int64_t{1} << 53), int64_t{1} << 53);
    const int e = std::clamp(center + *rc::gen::inRange(-60, 60), -280, 230);
    const double v = std::ldexp(static_cast<double>(mant), e - 53);
    s.add(v);
    want += exact(v);
  }
  RC_ASSERT(s.to_double() == round_rational(want));
}

}  // namespace
