// Scalar bound arithmetic shared by the oracles (private to reference/src): a true value with a
// radius, one rounding to fp32 or bf16, products, and silu / silu' as the spec's fp32 code computes
// them. The end-to-end oracle (oracle_end_to_end.cpp) carries operand radii through them; the
// stage-local oracle (oracle.cpp) uses them with exact operands (radius 0) for the elementwise
// intermediates (act, d_gate, d_up, dy and the shared expert's). reference/README.md ("End to
// end") writes the analysis out.
#pragma once

#include "mok/reference/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace mok::ref::oracle_scalar {

constexpr double kSlack = 1.0 + 0x1.0p-20;  // covers the double roundings of the radii themselves
constexpr double kSiluLipschitz = 1.1;      // sup |silu'(x)| = 1.0998... (at x = 2.3994...)

// Half an ulp of any value of magnitude at most m, rounded to nearest with `bits` significand bits
// (24: fp32, 8: bf16), subnormals included (their ulp is that of 2^-126).
inline double half_ulp(double m, int bits) {
  return std::ldexp(1.0, std::max(m > 0 ? std::ilogb(m * kSlack) : -126, -126) - bits);
}

// The bounds do not cover fp32 overflow (a profile result of 2^128 or more is Inf): a value
// whose magnitude bound reaches 2^127 ends the oracle with a named error instead of a radius
// that an overflowing implementation would seem to break.
// The callers add where it was met and the fix (oracle_end_to_end.cpp).
struct RangeError : Error {
  using Error::Error;
};
inline double in_range(double magnitude) {
  if (!(magnitude < 0x1.0p127)) {
    char m[32];
    std::snprintf(m, sizeof m, "%.3g", magnitude);
    throw RangeError(std::string("a value may reach fp32's range limit (|value| + radius = ") + m + " >= 2^127)");
  }
  return magnitude;
}

// A true value (here rounded to double) and a radius: |any implementation's value - v| <= r.
struct Bounded {
  double v = 0.0, r = 0.0;
  double max() const { return std::fabs(v) + r; }
};

// silu, silu' and silu'' bounds in double: the values the oracle calls true.
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
inline double silu_grad(double x) {
  const double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
constexpr double kSiluGradLipschitz = 0.51;  // sup |silu''(x)| = 0.5 (at x = 0)

// The spec's fp32 silu and silu' against the real functions (spec/math.hpp; test_spec_math sweeps
// both against long double): silu_f32 within 2^-18 |silu(x)| + 2^-118; silu_grad_f32, whose
// 1 + x (1 - s) cancels near silu's minimum, within 2^-18 (s + |x| s (1 - s)) + 2^-118.
inline double silu_allowance(double x_max_silu) { return 0x1.0p-18 * x_max_silu + 0x1.0p-118; }

// a * b for bounded a and b: the true product and the radius of the implementation's exact
// product of its own a and b (before any rounding).
inline Bounded times(const Bounded& a, const Bounded& b) {
  return {a.v * b.v, (a.r * b.max() + std::fabs(a.v) * b.r + 0x1.0p-52 * std::fabs(a.v * b.v)) * kSlack};
}
// One rounding to fp32 (bits 24) or bf16 (8) of a bounded value.
inline Bounded rounded(Bounded x, int bits) {
  x.r = (x.r + half_ulp(in_range(x.max()), bits)) * kSlack;
  return x;
}

// silu(g) at the implementation's g (within g.r of g.v), as silu_f32 computes it.
inline Bounded silu_of(const Bounded& g) {
  const double s = silu(g.v);
  const double s_true = std::fabs(s) * (1 + 0x1.0p-40);  // |silu| at the real g.v (double evaluation)
  const double s_impl = s_true + kSiluLipschitz * g.r;    // |silu| at the implementation's g
  return {s, (kSiluLipschitz * g.r + silu_allowance(s_impl) + 0x1.0p-44 * std::fabs(s)) * kSlack};
}
// silu'(g) as silu_grad_f32 computes it.
inline Bounded silu_grad_of(const Bounded& g) {
  const double d = silu_grad(g.v);
  const double gmax = std::fabs(g.v) + g.r;
  // s + |x| s (1 - s) over the implementation's g: s <= 1 and s (1 - s) <= 1/4.
  const double parts = 1.0 + 0.25 * gmax;
  return {d, (kSiluGradLipschitz * g.r + 0x1.0p-18 * parts + 0x1.0p-118 + 0x1.0p-44 * (1 + std::fabs(g.v))) * kSlack};
}

// silu'(g) at an exact g (the stage-local oracle's operands): the same allowance for silu_grad_f32,
// 2^-18 (s + |g| s (1 - s)) + 2^-118, with its parts evaluated at g instead of bounded by
// 1 + |g|/4 (which grows without limit in |g|). silu' is evaluated as s (1 + g sigmoid(-g)), with
// 1 - s taken as sigmoid(-g), so no cancellation: its double error is below 2^-49 of the same parts
// (2^-44 is allowed), and the parts' own double error is under 2^-40 of them. Where exp overflows
// or underflows the parts are below 2^-1000, inside the 2^-118.
inline Bounded silu_grad_at(double g) {
  const double s = sigmoid(g), t = sigmoid(-g);
  const double parts = (s + std::fabs(g) * s * t) * (1 + 0x1.0p-40);
  return {s * (1.0 + g * t), (0x1.0p-18 * parts + 0x1.0p-118 + 0x1.0p-44 * parts) * kSlack};
}

// The SwiGLU's elementwise steps (spec/orders.hpp) on bounded operands:
// act = rn_bf16(rn(silu_f32(g) * u)),
inline Bounded act_of(const Bounded& g, const Bounded& u) { return rounded(rounded(times(silu_of(g), u), 24), 8); }
// dg = rn_bf16(rn(rn(da * u) * silu'(g))),
inline Bounded d_gate_of(const Bounded& da, const Bounded& g, const Bounded& u) {
  return rounded(rounded(times(rounded(times(da, u), 24), silu_grad_of(g)), 24), 8);
}
// The same at exact operands (the stage-local oracle), with silu'(g) from silu_grad_at.
inline Bounded d_gate_at(double da, double g, double u) {
  return rounded(rounded(times(rounded(times({da, 0.0}, {u, 0.0}), 24), silu_grad_at(g)), 24), 8);
}
// du = rn_bf16(rn(da * silu(g))).
inline Bounded d_up_of(const Bounded& da, const Bounded& g) { return rounded(rounded(times(da, silu_of(g)), 24), 8); }

}  // namespace mok::ref::oracle_scalar
