// ExactSum: an exact fixed-point accumulator for sums of doubles, rounded once at the end.
#pragma once

#include <cstdint>

namespace mok::ref {

// Holds a sum of finite doubles in [2^kMinExp, 2^kMaxExp) without any rounding: 32-bit digits
// in int64 limbs (carry-save), normalised lazily. Adding is O(1); to_double() rounds the exact
// sum once, to nearest-even. The oracle feeds it products that are exact in double (bf16*bf16,
// fp32*bf16), so every dot product is exact until the one final rounding. This fixed-point
// form is much faster than Boost.Multiprecision floats; the tests check it against
// boost::multiprecision::cpp_rational.
class ExactSum {
 public:
  static constexpr int kMinExp = -352;   // weight of the lowest bit (products reach 2^-282)
  static constexpr int kLimbs = 22;      // 22 * 32 = 704 bits: up to 2^352
  static constexpr int kMaxExp = kMinExp + 32 * kLimbs;

  // v finite with every set bit in [2^kMinExp, 2^(kMaxExp - 64)), else std::domain_error.
  void add(double v);
  double to_double() const;              // the exact sum rounded once to nearest-even
  bool is_zero() const;
  // The exact sum as sign and 32-bit digits (least significant first), for tests.
  void digits(bool* negative, uint32_t out[kLimbs]) const;

 private:
  void normalise() const;
  mutable int64_t limb_[kLimbs] = {};
  mutable int32_t pending_ = 0;          // additions since the last normalisation
};

}  // namespace mok::ref
