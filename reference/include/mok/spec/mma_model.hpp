// The tensor-core MMA arithmetic model: how one MMA step turns products plus an accumulator into fp32.
#pragma once

#include "mok/spec/bf16.hpp"
#include "mok/spec/config.hpp"

namespace mok::spec {

enum class MmaRounding : uint8_t { kTruncate, kNearestEven };

// Parameters of one family of MMA arithmetic. A model computes, for one output element,
// d = acc + sum_i a_i*b_i over one MMA step (at most 16 products), as follows:
//  1. every product is exact; its alignment exponent is e_a + e_b (unnormalised, the Hopper
//     behaviour) or the exponent of the normalised product;
//  2. E = the largest alignment exponent among the terms (the accumulator is a term); a zero
//     term (a zero operand, a zero accumulator, or a missing product of a step shorter than
//     16) aligns at kMmaZeroExp = -133 (which raises E only when every non-zero term is
//     smaller, e.g. products of tiny values);
//  3. every term is cut to a multiple of 2^(E - align_frac_bits) (term_rounding);
//  4. the cut terms are summed exactly, and the sum is rounded to fp32 (final_rounding);
//     a zero result is +0, a result of 2^128 or more is Inf.
struct MmaModel {
  const char* name;
  int align_frac_bits;
  bool normalise_products;
  MmaRounding term_rounding;
  MmaRounding final_rounding;
};

// Hopper (sm_90) bf16 -> fp32, wgmma and mma.sync: 25 fractional bits, truncation, products
// not renormalised (DESIGN section 6; checked on the H200 by the kernel's probes).
inline constexpr MmaModel kHopperBf16Mma{"hopper-bf16-v1", 25, false, MmaRounding::kTruncate,
                                        MmaRounding::kTruncate};

inline constexpr uint32_t kMmaNanBits = 0x7FFFFFFFu;  // the canonical NaN the tensor core writes
inline constexpr int kMmaZeroExp = -133;               // alignment exponent of a zero term

namespace detail {

struct Term {
  int64_t sig;  // signed integer significand, value = sig * 2^lsb_exp
  int lsb_exp;
  int align_exp;
};

MOK_HD int msb_index(uint64_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return 63 - __clzll(static_cast<long long>(v));
#else
  return 63 - __builtin_clzll(v);
#endif
}

// |v| shifted right by s with the chosen rounding, sign restored.
MOK_HD int64_t shift_right_rounded(int64_t v, int s, MmaRounding mode) {
  if (s <= 0) return v;
  const bool neg = v < 0;
  uint64_t m = neg ? static_cast<uint64_t>(-v) : static_cast<uint64_t>(v);
  uint64_t q = s >= 64 ? 0 : (m >> s);
  if (mode == MmaRounding::kNearestEven) {
    const uint64_t rem = s >= 64 ? m : (m & ((uint64_t{1} << s) - 1));
    const uint64_t half = s >= 65 ? ~uint64_t{0} : (uint64_t{1} << (s - 1));
    if (s <= 64 && (rem > half || (rem == half && (q & 1)))) ++q;
  }
  return neg ? -static_cast<int64_t>(q) : static_cast<int64_t>(q);
}

// Rounds sig * 2^exp (sig != 0, |sig| < 2^62) to fp32 bits with the chosen rounding.
MOK_HD uint32_t to_f32_bits(int64_t sig, int exp, MmaRounding mode) {
  const uint32_t sign = sig < 0 ? 0x80000000u : 0u;
  uint64_t m = sig < 0 ? static_cast<uint64_t>(-sig) : static_cast<uint64_t>(sig);
  int p = msb_index(m);
  int value_exp = p + exp;  // exponent of the leading bit
  // Quantum of the target format at this magnitude: 2^(value_exp-23), never below 2^-149.
  int quantum_exp = value_exp - 23;
  if (quantum_exp < -149) quantum_exp = -149;
  const int s = quantum_exp - exp;
  int64_t q = shift_right_rounded(static_cast<int64_t>(m), s, mode);
  uint64_t mq = static_cast<uint64_t>(q);
  if (s < 0) mq <<= -s;  // exact: fewer than 24 significant bits
  if (mq == 0) return 0u;  // a result that truncates to zero is +0
  // Rounding up may have carried to 2^24: renormalise.
  int qexp = quantum_exp;
  if (mq >> 24) {
    mq >>= 1;
    ++qexp;
  }
  if (mq < (uint64_t{1} << 23)) {  // subnormal (qexp == -149)
    return sign | static_cast<uint32_t>(mq);
  }
  const int biased = qexp + 23 + 127;
  if (biased >= 255) {
    // Overflow gives Inf under either rounding (the tensor core's behaviour, MMA-Sim's model):
    // the sum is cut to 24 bits first, and a value of 2^128 or more has no finite encoding.
    return sign | 0x7F800000u;
  }
  return sign | (static_cast<uint32_t>(biased) << 23) | (static_cast<uint32_t>(mq) & 0x7FFFFFu);
}

}  // namespace detail

// Decoded bf16: value = sig * 2^(exp - 7), sig in [0, 255], exp = unbiased exponent (-126 for
// subnormals and zero).
MOK_HD void decode_bf16(uint16_t b, int64_t* sig, int* exp) {
  const int ef = (b >> 7) & 0xFF;
  const int64_t mant = b & 0x7F;
  const int64_t s = ef == 0 ? mant : (mant | 0x80);
  *sig = (b & 0x8000) ? -s : s;
  *exp = ef == 0 ? -126 : ef - 127;
}

// One MMA step for one output element: d = acc + sum_{i<n} a[i*a_stride] * b[i*b_stride],
// n <= 16, a and b bf16 bit patterns, following `model`. Special values: any NaN, Inf*0 or
// Inf-Inf gives the canonical NaN; otherwise an Inf term gives that Inf.
MOK_HD float mma_bf16_step(const MmaModel& model, float acc, const uint16_t* a, int64_t a_stride,
                           const uint16_t* b, int64_t b_stride, int n) {
  detail::Term terms[17];
  int num_terms = 0;
  bool pos_inf = false, neg_inf = false, nan = false;
  bool has_zero_term = n < kMmaK;  // missing products of a short step are zeros
  for (int i = 0; i < n; ++i) {
    const uint16_t ab = a[i * a_stride], bb = b[i * b_stride];
    const bool a_inf = (ab & 0x7FFF) == 0x7F80, b_inf = (bb & 0x7FFF) == 0x7F80;
    const bool a_nan = (ab & 0x7FFF) > 0x7F80, b_nan = (bb & 0x7FFF) > 0x7F80;
    const bool a_zero = (ab & 0x7FFF) == 0, b_zero = (bb & 0x7FFF) == 0;
    const bool neg = ((ab ^ bb) & 0x8000) != 0;
    if (a_nan || b_nan || (a_inf && b_zero) || (b_inf && a_zero)) {
      nan = true;
      continue;
    }
    if (a_inf || b_inf) {
      (neg ? neg_inf : pos_inf) = true;
      continue;
    }
    if (a_zero || b_zero) {
      has_zero_term = true;
      continue;
    }
    int64_t sa, sb;
    int ea, eb;
    decode_bf16(ab, &sa, &ea);
    decode_bf16(bb, &sb, &eb);
    detail::Term t;
    t.sig = sa * sb;
    t.lsb_exp = ea + eb - 14;
    if (model.normalise_products) {
      const uint64_t m = static_cast<uint64_t>(t.sig < 0 ? -t.sig : t.sig);
      t.align_exp = detail::msb_index(m) + t.lsb_exp;
    } else {
      t.align_exp = ea + eb;
    }
    terms[num_terms++] = t;
  }
  const uint32_t acc_bits = f32_bits(acc);
  const uint32_t acc_abs = acc_bits & 0x7FFFFFFFu;
  if (acc_abs > 0x7F800000u) nan = true;
  else if (acc_abs == 0x7F800000u) (acc_bits >> 31 ? neg_inf : pos_inf) = true;
  else if (acc_abs == 0) has_zero_term = true;
  else {
    const int ef = static_cast<int>(acc_abs >> 23);
    const int64_t mant = acc_abs & 0x7FFFFF;
    detail::Term t;
    const int64_t s = ef == 0 ? mant : (mant | 0x800000);
    t.sig = (acc_bits >> 31) ? -s : s;
    t.align_exp = ef == 0 ? -126 : ef - 127;
    t.lsb_exp = t.align_exp - 23;
    if (model.normalise_products && ef == 0) {
      t.align_exp = detail::msb_index(static_cast<uint64_t>(s)) + t.lsb_exp;
    }
    terms[num_terms++] = t;
  }
  if (nan || (pos_inf && neg_inf)) return f32_from_bits(kMmaNanBits);
  if (pos_inf) return f32_from_bits(0x7F800000u);
  if (neg_inf) return f32_from_bits(0xFF800000u);
  if (num_terms == 0) return 0.0f;
  int max_exp = terms[0].align_exp;
  for (int i = 1; i < num_terms; ++i)
    if (terms[i].align_exp > max_exp) max_exp = terms[i].align_exp;
  if (has_zero_term && max_exp < kMmaZeroExp) max_exp = kMmaZeroExp;
  const int unit_exp = max_exp - model.align_frac_bits;
  int64_t sum = 0;  // exact, in units of 2^unit_exp: each term < 2^28 units, 17 terms < 2^33
  for (int i = 0; i < num_terms; ++i) {
    const detail::Term& t = terms[i];
    const int s = unit_exp - t.lsb_exp;
    sum += s >= 0 ? detail::shift_right_rounded(t.sig, s, model.term_rounding) : t.sig * (int64_t{1} << -s);
  }
  if (sum == 0) return 0.0f;
  return f32_from_bits(detail::to_f32_bits(sum, unit_exp, model.final_rounding));
}

}  // namespace mok::spec
