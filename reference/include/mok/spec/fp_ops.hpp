// Explicitly rounded fp32 operations: one IEEE operation each, never contracted, same bits on host and device.
#pragma once

#include "mok/spec/common.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace mok::spec {

// Host code that includes this header must be compiled with -ffp-contract=off (the build
// sets it for every target); the device side uses the _rn intrinsics, which nvcc never fuses.
MOK_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MOK_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

MOK_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

MOK_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// frcp_ge1 (below) for b in [1, 2^126] (and only there): its first branch alone, with no range test.
MOK_HD float frcp_ge1_normal(float b) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(b));
  return __fmaf_rn(__fmaf_rn(-b, y, 1.0f), y, y);
#else
  return 1.0f / b;
#endif
}

// 1 / b rounded to nearest even, for b >= 1 (and NaN): the same bits as fdiv(1.0f, b). The
// sigmoid's only division; the device computes it without the IEEE division routine (whose range
// check and slow-path call sit in every epilogue that uses it): the hardware reciprocal estimate
// and one Newton step with fma for b <= 2^126, and for larger b (1/b subnormal) the estimate of
// b * 2^-64 rounded onto the subnormal grid, then moved one step where the exact sign of
// 1 - b * (midpoint) says the nearest neighbour lies (no ties: 1/b is never a midpoint).
// mok-recip-probe checks every fp32 b in [1, +Inf] against the IEEE reciprocal on the GPU
// present (ctest label gpu).
MOK_HD float frcp_ge1(float b) {
#if defined(__CUDA_ARCH__)
  if (b <= 0x1p126f) return frcp_ge1_normal(b);
  float y;
  if (b != b || b == __int_as_float(0x7F800000)) return b != b ? b : 0.0f;
  const float bs = __fmul_rn(b, 0x1p-64f);  // exact: [2^62, 2^64)
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(bs));
  y = __fmaf_rn(__fmaf_rn(-bs, y, 1.0f), y, y);  // 1 / bs, within an ulp
  float q = __fmul_rn(y, 0x1p-64f);              // on the subnormal grid (2^-149), within one step
  const float qs = __fmul_rn(q, 0x1p64f);        // exact; its grid is 2^-85, midpoints 2^-86 apart
  if (__fmaf_rn(-bs, __fadd_rn(qs, 0x1p-86f), 1.0f) > 0.0f) {
    q = __fadd_rn(q, 0x1p-149f);  // 1/bs lies above the upper midpoint
  } else if (__fmaf_rn(-bs, __fsub_rn(qs, 0x1p-86f), 1.0f) < 0.0f) {
    q = __fsub_rn(q, 0x1p-149f);  // below the lower one
  }
  return q;
#else
  return 1.0f / b;
#endif
}

// Fused multiply-add with a single rounding: a*b + c.
MOK_HD float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

}  // namespace mok::spec
