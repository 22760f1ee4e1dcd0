// Every floating-point reduction order of profile bf16-v1, written once for the kernel and the emulator.
#pragma once

#include "mok/spec/bf16.hpp"
#include "mok/spec/config.hpp"
#include "mok/spec/fp_ops.hpp"
#include "mok/spec/math.hpp"
#include "mok/spec/mma_model.hpp"

namespace mok::spec {

// ORDER: dot-chain. One accumulator chain over n elements, kMmaK (16) per MMA step in
// increasing index order, continuing from `acc` (0 for a fresh dot product). A step shorter
// than 16 (n not a multiple of 16, only in weight gradients over row lists) behaves like zero
// padding, which the tensor cores see as zero products aligned at kMmaZeroExp.
MOK_HD float dot_chain_bf16(const MmaModel& model, float acc, const uint16_t* a, int64_t a_stride,
                            const uint16_t* b, int64_t b_stride, int64_t n) {
  for (int64_t k0 = 0; k0 < n; k0 += kMmaK) {
    const int len = static_cast<int>(n - k0 < kMmaK ? n - k0 : kMmaK);
    acc = mma_bf16_step(model, acc, a + k0 * a_stride, a_stride, b + k0 * b_stride, b_stride, len);
  }
  return acc;
}

// ORDER: router-grad-lanes. d_router_weights[t,k] = sum_h d_output[t,h] * y[t,k,h]:
// lane j of 32 accumulates h = j, j+32, ... with fma starting from 0, then an xor butterfly
// over offsets 16, 8, 4, 2, 1 (every lane ends with the same value; lane 0's is returned).
inline constexpr int kRouterGradLanes = 32;
MOK_HD float router_grad_dot(const uint16_t* d_output, const uint16_t* y, int64_t hidden) {
  float lanes[kRouterGradLanes];
  for (int j = 0; j < kRouterGradLanes; ++j) {
    float acc = 0.0f;
    for (int64_t h = j; h < hidden; h += kRouterGradLanes)
      acc = ffma(f32_from_bf16(d_output[h]), f32_from_bf16(y[h]), acc);
    lanes[j] = acc;
  }
  for (int offset = kRouterGradLanes / 2; offset >= 1; offset /= 2) {
    float next[kRouterGradLanes];
    for (int j = 0; j < kRouterGradLanes; ++j) next[j] = fadd(lanes[j], lanes[j ^ offset]);
    for (int j = 0; j < kRouterGradLanes; ++j) lanes[j] = next[j];
  }
  return lanes[0];
}

// ORDER: combine-slots. output = rn(s + w0*y0 + w1*y1 + ...), one fma per non-empty slot in
// slot order starting from the shared expert's fp32 value (0 without a shared expert).
MOK_HD float combine_step(float acc, float router_weight, uint16_t y) {
  return ffma(router_weight, f32_from_bf16(y), acc);
}

// ORDER: dx-slots. d_x = rn(dx_shared + dx_0 + dx_1 + ...), one add per non-empty slot in slot order.
MOK_HD float dx_step(float acc, uint16_t dx_slot) { return fadd(acc, f32_from_bf16(dx_slot)); }

// Elementwise steps of the profile (forward 2, backward 1 and 3). The _pre forms take silu(g)
// and silu'(g) already computed (silu_and_grad_f32), as the kernel's backward does; each
// function of g is written once, through them.
MOK_HD uint16_t swiglu_act_pre(float silu_gate, float up) { return bf16_from_f32_rne(fmul(silu_gate, up)); }
MOK_HD uint16_t swiglu_act(float gate, float up) { return swiglu_act_pre(silu_f32(gate), up); }
MOK_HD uint16_t scale_grad(float router_weight, uint16_t d_output) {
  return bf16_from_f32_rne(fmul(router_weight, f32_from_bf16(d_output)));
}
// dg = rn((da * u) * silu'(g)), du = rn(da * silu(g)).
MOK_HD uint16_t swiglu_grad_gate_pre(float d_act, float up, float silu_grad_gate) {
  return bf16_from_f32_rne(fmul(fmul(d_act, up), silu_grad_gate));
}
MOK_HD uint16_t swiglu_grad_up_pre(float d_act, float silu_gate) { return bf16_from_f32_rne(fmul(d_act, silu_gate)); }
MOK_HD uint16_t swiglu_grad_gate(float d_act, float gate, float up) {
  return swiglu_grad_gate_pre(d_act, up, silu_grad_f32(gate));
}
MOK_HD uint16_t swiglu_grad_up(float d_act, float gate) { return swiglu_grad_up_pre(d_act, silu_f32(gate)); }

}  // namespace mok::spec
