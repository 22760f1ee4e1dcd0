// bf16 <-> fp32 conversions of profile bf16-v1: round-to-nearest-even, exact NaN/Inf/subnormal rules.
#pragma once

#include "mok/spec/common.hpp"

#include <string.h>

namespace mok::spec {

// The canonical quiet NaN that a conversion of any NaN produces (sign kept). This matches
// ml_dtypes/Eigen and PyTorch's c10::BFloat16 and is what the GPU kernel must store.
inline constexpr uint16_t kBf16QuietNanBits = 0x7FC0;

MOK_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MOK_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Round an fp32 value to the nearest bf16, ties to even. Subnormal inputs round in the same
// bit-level way (bf16 shares fp32's exponent range), overflow goes to +-Inf, NaN -> quiet NaN.
MOK_HD uint16_t bf16_from_f32_rne(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | kBf16QuietNanBits);
  }
  const uint32_t lsb = (u >> 16) & 1u;
  const uint32_t rounded = u + 0x7FFFu + lsb;  // carries into the exponent give Inf exactly
  return static_cast<uint16_t>(rounded >> 16);
}

MOK_HD float f32_from_bf16(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// rn() of the profile: fp32 -> bf16 -> fp32.
MOK_HD float round_bf16(float f) { return f32_from_bf16(bf16_from_f32_rne(f)); }

MOK_HD bool bf16_is_finite(uint16_t b) { return (b & 0x7F80u) != 0x7F80u; }

}  // namespace mok::spec
