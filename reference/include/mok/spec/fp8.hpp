// 8-bit float formats for later MXFP8 work: OCP e4m3fn and e5m2 (round-to-nearest-even) and the
// e8m0fnu scale format, as ml_dtypes defines them (cross-checked over every code and millions of
// floats by reference/test/xcheck/check_fp8_ml_dtypes.py).
#pragma once

#include "mok/spec/bf16.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace mok::spec {

namespace detail {

// Round-to-nearest-even encoding of an fp32 value into a small float with `ebits` exponent and
// `mbits` mantissa bits. e5m2 (`ieee_specials`) has Inf and overflows to it; e4m3fn has no Inf,
// its all-ones code is NaN, and a value that rounds past 448 becomes NaN.
MOK_HD uint8_t small_float_from_f32(float f, int ebits, int mbits, bool ieee_specials) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << 7);
  const uint8_t nan_code = ieee_specials ? 0x7E : 0x7F;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | nan_code);
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return static_cast<uint8_t>(sign | (ieee_specials ? 0x7C : 0x7F));
  const double a = fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  const int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
  int ex = 0;
  frexp(a, &ex);                      // a = fr * 2^ex, fr in [0.5, 1): floor(log2 a) = ex - 1
  int e = ex - 1 < emin ? emin : ex - 1;
  const double q = ldexp(1.0, e - mbits);  // the quantum at this magnitude
  const double n = a / q;                  // exact: a has at most 24 significant bits
  double fl = floor(n);
  const double diff = n - fl;
  if (diff > 0.5 || (diff == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  uint32_t mant = static_cast<uint32_t>(fl);
  if (e == emin && mant < (1u << mbits)) return static_cast<uint8_t>(sign | mant);  // subnormal (or zero)
  if (mant == (2u << mbits)) {  // rounding carried into the next binade
    mant >>= 1;
    ++e;
  }
  const int ef = e + bias;
  const uint32_t code = (static_cast<uint32_t>(ef) << mbits) | (mant - (1u << mbits));
  if (ieee_specials) {
    if (ef >= (1 << ebits) - 1) return static_cast<uint8_t>(sign | 0x7C);  // overflow: Inf
  } else if (code >= 0x7F) {
    return static_cast<uint8_t>(sign | 0x7F);  // past 448: NaN
  }
  return static_cast<uint8_t>(sign | code);
}

MOK_HD float small_float_to_f32(uint8_t b, int ebits, int mbits, bool ieee_specials) {
  const bool neg = (b & 0x80) != 0;
  const int ef = (b >> mbits) & ((1 << ebits) - 1);
  const int mant = b & ((1 << mbits) - 1);
  const int bias = (1 << (ebits - 1)) - 1;
  const uint32_t sign = neg ? 0x80000000u : 0u;
  if (ieee_specials && ef == (1 << ebits) - 1)
    return f32_from_bits(sign | (mant ? 0x7FC00000u : 0x7F800000u));
  if (!ieee_specials && (b & 0x7F) == 0x7F) return f32_from_bits(sign | 0x7FC00000u);
  const double mag = ef == 0 ? ldexp(static_cast<double>(mant), 1 - bias - mbits)
                             : ldexp(static_cast<double>(mant + (1 << mbits)), ef - bias - mbits);
  return static_cast<float>(neg ? -mag : mag);  // exact
}

}  // namespace detail

MOK_HD uint8_t e4m3_from_f32_rne(float f) { return detail::small_float_from_f32(f, 4, 3, false); }
MOK_HD uint8_t e5m2_from_f32_rne(float f) { return detail::small_float_from_f32(f, 5, 2, true); }
MOK_HD float f32_from_e4m3(uint8_t b) { return detail::small_float_to_f32(b, 4, 3, false); }
MOK_HD float f32_from_e5m2(uint8_t b) { return detail::small_float_to_f32(b, 5, 2, true); }

// e8m0fnu: an unsigned power of two 2^(code - 127), code 0xFF = NaN, no zero. Zero, negative and
// non-finite inputs give NaN; otherwise the nearest power of two with halves rounding up (in
// linear terms: 1.5 * 2^e -> 2^(e+1)); below 2^-127 clamps to 2^-127, 2^128 and up is NaN.
MOK_HD uint8_t e8m0_from_f32(float f) {
  const uint32_t u = f32_bits(f);
  if ((u >> 31) != 0 || (u & 0x7FFFFFFFu) == 0 || (u & 0x7F800000u) == 0x7F800000u) return 0xFF;
  const uint32_t ef = (u >> 23) & 0xFF, mant = u & 0x7FFFFFu;
  int e;
  bool up;
  if (ef != 0) {
    e = static_cast<int>(ef) - 127;
    up = (mant >> 22) & 1u;
  } else {  // subnormal: value = mant * 2^-149
    int p = 22;
    while (!((mant >> p) & 1u)) --p;
    e = p - 149;
    up = p > 0 && ((mant >> (p - 1)) & 1u);
  }
  const int biased = e + (up ? 1 : 0) + 127;
  if (biased < 0) return 0x00;
  if (biased >= 255) return 0xFF;
  return static_cast<uint8_t>(biased);
}

MOK_HD float f32_from_e8m0(uint8_t b) {
  if (b == 0xFF) return f32_from_bits(0x7FC00000u);
  if (b == 0) return f32_from_bits(0x00400000u);  // 2^-127, an fp32 subnormal
  return f32_from_bits(static_cast<uint32_t>(b) << 23);
}

}  // namespace mok::spec
