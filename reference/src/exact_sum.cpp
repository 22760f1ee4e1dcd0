// Exact fixed-point accumulation of doubles with a single final round-to-nearest-even.
#include "mok/reference/exact_sum.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace mok::ref {

void ExactSum::add(double v) {
  if (v == 0.0) return;
  if (!std::isfinite(v)) throw std::domain_error("ExactSum: non-finite term");
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  uint64_t mant = static_cast<uint64_t>(std::ldexp(m, 53));  // exact 53-bit integer
  int lsb = e - 53;                                 // |v| = mant * 2^lsb
  if (lsb < kMinExp) {
    // A term near the bottom of the range may have fewer significant bits than 53: what
    // matters is its lowest set bit, not the lowest bit a full mantissa would have (e.g.
    // (2^33 - 1) * 2^-333 is exact here although frexp puts its 53rd bit at 2^-353).
    const int drop = std::min(__builtin_ctzll(mant), kMinExp - lsb);
    mant >>= drop;
    lsb += drop;
  }
  if (lsb < kMinExp || e > kMaxExp - 64) throw std::domain_error("ExactSum: term out of range");
  const int pos = lsb - kMinExp;
  const int idx = pos / 32, shift = pos % 32;
  const unsigned __int128 wide = static_cast<unsigned __int128>(mant) << shift;  // < 2^85
  const int64_t sign = v < 0 ? -1 : 1;
  limb_[idx] += sign * static_cast<int64_t>(static_cast<uint64_t>(wide) & 0xFFFFFFFFu);
  limb_[idx + 1] += sign * static_cast<int64_t>(static_cast<uint64_t>(wide >> 32) & 0xFFFFFFFFu);
  limb_[idx + 2] += sign * static_cast<int64_t>(static_cast<uint64_t>(wide >> 64));
  // Each limb grows by < 2^32 per add: normalise well before int64 could overflow.
  if (++pending_ >= (1 << 28)) normalise();
}

// Carries so that every limb but the top lies in [0, 2^32); the top limb carries the sign.
void ExactSum::normalise() const {
  for (int i = 0; i + 1 < kLimbs; ++i) {
    const int64_t carry = limb_[i] >> 32;  // arithmetic shift: floor division
    limb_[i] -= carry * (int64_t{1} << 32);
    limb_[i + 1] += carry;
  }
  pending_ = 0;
}

void ExactSum::digits(bool* negative, uint32_t out[kLimbs]) const {
  normalise();
  int64_t tmp[kLimbs];
  std::memcpy(tmp, limb_, sizeof tmp);
  *negative = tmp[kLimbs - 1] < 0;
  if (*negative) {  // magnitude = -(value): negate every limb and re-normalise
    for (auto& l : tmp) l = -l;
    for (int i = 0; i + 1 < kLimbs; ++i) {
      const int64_t carry = tmp[i] >> 32;
      tmp[i] -= carry * (int64_t{1} << 32);
      tmp[i + 1] += carry;
    }
  }
  for (int i = 0; i < kLimbs; ++i) out[i] = static_cast<uint32_t>(tmp[i]);
}

bool ExactSum::is_zero() const {
  normalise();
  for (int64_t l : limb_)
    if (l != 0) return false;
  return true;
}

double ExactSum::to_double() const {
  bool negative = false;
  uint32_t d[kLimbs];
  digits(&negative, d);
  int hi = kLimbs - 1;
  while (hi >= 0 && d[hi] == 0) --hi;
  if (hi < 0) return 0.0;
  // Take the top three digits (65..96 significant bits) and fold every lower bit into a
  // sticky bit 0; with at least 65 bits the sticky bit lies below the rounding position, so the
  // one correctly rounded int128 -> double conversion rounds the exact sum correctly.
  unsigned __int128 window = 0;
  int low = hi - 2;
  for (int i = hi; i >= low; --i) window = (window << 32) | (i >= 0 ? d[i] : 0u);
  bool sticky = false;
  for (int i = 0; i < low; ++i) sticky = sticky || d[i] != 0;
  if (sticky) window |= 1;
  const double mag = std::ldexp(static_cast<double>(window), kMinExp + 32 * low);
  return negative ? -mag : mag;
}

}  // namespace mok::ref
