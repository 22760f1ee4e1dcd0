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

// Fused multiply-add with a single rounding: a*b + c.
MOK_HD float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

}  // namespace mok::spec
