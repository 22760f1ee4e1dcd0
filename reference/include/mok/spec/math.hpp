// The profile's scalar functions (exp, sigmoid, silu, silu') as fixed sequences of IEEE fp32 operations.
#pragma once

#include "mok/spec/bf16.hpp"
#include "mok/spec/fp_ops.hpp"

namespace mok::spec {

// 2^n as an fp32 value for n in [-149, 127] (exact: subnormal powers of two are representable).
MOK_HD float exp2_int(int n) {
  if (n >= -126) return f32_from_bits(static_cast<uint32_t>(n + 127) << 23);
  return f32_from_bits(1u << (n + 149));
}

// exp(x) in fp32, built from fma/mul/add only so host and device give identical bits.
// Cody-Waite reduction x = n*ln2 + r with |r| <= ln2/2, then a degree-7 polynomial for e^r
// (Horner, explicit fma), then one exact-or-singly-rounded scaling by 2^n.
// Max error about 1.5 ulp over the normal range; exp(x) = 0 for x < -104, +Inf for x > 88.8.
// exp_reduce returns p = e^r in [0.70, 1.42] and sets n (for x in [-104, 88.8]).
MOK_HD float exp_reduce(float x, int& n) {
  constexpr float kLog2e = 1.44269502162933349609375f;
  constexpr float kLn2Hi = 0.693145751953125f;           // 16 significant bits: n*kLn2Hi exact
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  // n = round-to-nearest of x*log2(e); 12582912 = 1.5*2^23 forces rounding to an integer.
  const float shifted = fadd(fmul(x, kLog2e), 12582912.0f);
  const float nf = fsub(shifted, 12582912.0f);
  n = static_cast<int>(nf);
  float r = ffma(-nf, kLn2Hi, x);
  r = ffma(-nf, kLn2Lo, r);
  // Taylor coefficients 1/k! rounded to fp32 (|r| <= 0.3466: truncation error < 2^-26).
  float p = 1.98412698e-4f;                  // 1/5040
  p = ffma(p, r, 1.38888889e-3f);            // 1/720
  p = ffma(p, r, 8.33333377e-3f);            // 1/120
  p = ffma(p, r, 4.16666679e-2f);            // 1/24
  p = ffma(p, r, 1.66666672e-1f);            // 1/6
  p = ffma(p, r, 0.5f);
  p = ffma(p, r, 1.0f);
  return ffma(p, r, 1.0f);
}
MOK_HD float exp_f32(float x) {
  if (x != x) return x;                      // NaN propagates
  if (x > 88.72283935546875f) return f32_from_bits(0x7F800000u);  // > ln(FLT_MAX)
  if (x < -104.0f) return 0.0f;
  int n;
  const float p = exp_reduce(x, n);
  // Scale by 2^n where every step but the last is exact.
  if (n > 127) return fmul(fmul(p, 2.0f), exp2_int(n - 1));
  if (n < -149) return fmul(fmul(p, 0.5f), exp2_int(n + 1));
  return fmul(p, exp2_int(n));  // 2^n is exact even when subnormal: one rounding
}

// sigmoid(x) = 1 / (1 + exp(-x)), IEEE division (frcp_ge1: the divisor is at least 1 or NaN).
MOK_HD float sigmoid_f32(float x) { return frcp_ge1(fadd(1.0f, exp_f32(-x))); }

// silu(x) = x * sigmoid(x).
MOK_HD float silu_f32(float x) { return fmul(x, sigmoid_f32(x)); }

// silu'(x) = s * (1 + x * (1 - s)) with s = sigmoid(x); the inner 1 + x*(1-s) is one fma.
MOK_HD float silu_grad_from_sigmoid(float x, float s) { return fmul(s, ffma(x, fsub(1.0f, s), 1.0f)); }
MOK_HD float silu_grad_f32(float x) { return silu_grad_from_sigmoid(x, sigmoid_f32(x)); }

// silu(x) and silu'(x) from one sigmoid: the same bits as silu_f32 and silu_grad_f32. The
// kernel's forward computes the pair for act and stores g; its backward computes the pair again
// from g with this code, so both passes see the same bits (kernel/README.md, "Backward phase 1").
struct SiluPair {
  float silu;
  float grad;
};
MOK_HD SiluPair silu_and_grad_f32(float x) {
  const float s = sigmoid_f32(x);
  return {fmul(x, s), silu_grad_from_sigmoid(x, s)};
}

// The same functions for |x| <= 87 without a range test or branch (the device's forward
// epilogue runs them on a whole tile at once when every gate value is in that range, the
// backward's on four values at once, so the compiler can interleave the elements' chains;
// kernel/README.md, "Forward phase 1"). In that
// range exp_f32(-x) takes no early return and 2^n is normal (|x * log2(e)| <= 125.6, so n lies in
// [-126, 126]), and 1 + exp(-x) <= 1 + e^87 < 2^126, where frcp_ge1 takes its first branch: every
// operation is the one the general form performs, on the same values, so the bits are the same
// (test_math.cpp: SiluNormalRangeFormGivesTheGeneralBits, and mok-recip-probe on the GPU).
MOK_HD bool silu_normal_range(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x) <= 87.0f;  // false for NaN
#else
  return (x < 0.0f ? -x : x) <= 87.0f;
#endif
}
MOK_HD float exp_f32_normal(float x) {
  int n;
  const float p = exp_reduce(x, n);
  return fmul(p, f32_from_bits(static_cast<uint32_t>(n + 127) << 23));
}
MOK_HD SiluPair silu_and_grad_f32_normal(float x) {
  const float s = frcp_ge1_normal(fadd(1.0f, exp_f32_normal(-x)));
  return {fmul(x, s), silu_grad_from_sigmoid(x, s)};
}
// silu_and_grad_f32 of N values with one range test: the branch-free form for all of them when
// every one is in silu_normal_range, else the general form for each; the bits are
// silu_and_grad_f32's either way. The kernel's backward epilogue derives silu(g) and silu'(g)
// from the stored g four at a time with it (kernel/README.md, "Backward phase 1"), so that the
// compiler can interleave the four chains.
template <int N>
MOK_HD void silu_and_grad_f32_n(const float (&x)[N], SiluPair (&s)[N]) {
  bool normal = true;
  for (int q = 0; q < N; ++q) normal = normal && silu_normal_range(x[q]);
  if (normal) {
    for (int q = 0; q < N; ++q) s[q] = silu_and_grad_f32_normal(x[q]);
  } else {
    for (int q = 0; q < N; ++q) s[q] = silu_and_grad_f32(x[q]);
  }
}

}  // namespace mok::spec
