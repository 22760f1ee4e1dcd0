// The oracle: exact value and rigorous error radius of every checked element, stage by stage.
#pragma once

#include "mok/reference/sample.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <string>

namespace mok::ref {

struct OracleOptions {
  int num_threads = 0;             // 0 = all cores
  const Sample* sample = nullptr;  // null = every element; else unsampled elements get NaN
  // oracle_bounds only: also give bounds/<name>_terms, the sum of |terms| of each element's last
  // stage (DESIGN's bound material; rounded up to fp32), from which other error models follow.
  bool terms = false;
  // oracle_bounds only: also bound every intermediate the reference holds (reference/README.md,
  // "Intermediates"): bounds/<name>_exact and _bound of intermediates/<name> (bound_exact_path and
  // bound_radius_path of its path), each from the reference's own earlier intermediates and the
  // inputs, as the checked tensors are. mok-verify's oracle backend judges a golden's
  // intermediates with them. Off by default: what mok-golden stores stays as it was.
  bool intermediates = false;
  // oracle_bounds only: also give bound_rounded_path(N) for every tensor N bounded, in N's dtype:
  // the oracle's value rounded to N's dtype (nearest-even). For a dot product (and the output,
  // d_x, d_router_weights) that is the exact value rounded once (correctly rounded: the exact sum
  // is first rounded to odd in double, which a second rounding to 24 or 8 bits cannot spoil); for
  // an elementwise intermediate (act, dy, d_gate, d_up and the shared ones) it is the double
  // evaluation (silu within about 2^-44 relative) rounded once. NaN where the element is not
  // bounded. mok-verify's oracle backend reports each tensor's elements equal to it and the
  // largest ULP distance from it.
  bool rounded = false;
  // oracle_bounds only: how its errors about the reference's operands say where they came from.
  // The bounds do not cover overflow, so an operand of the output or a gradient that is not finite
  // (check_oracle_operands) is an error "<origin>: <reference_name>intermediates/act: element
  // token=1 slot=1 expert=0 i=1 is NaN (bf16 bits 0x7fc0); <reference_fix>". mok-verify gives
  // the golden's path, and "dataset /" for the golden's own intermediates or "the emulated " for
  // ones it emulated, each with its own advice.
  std::string origin = "oracle";
  std::string reference_name = "reference ";
  std::string reference_fix =
      "the oracle's bounds need finite operands (they do not cover overflow): give finite intermediates, or scale "
      "the inputs down where the emulator overflows";
};

// bounds/<name>_rounded: the OracleOptions::rounded tensor of a checked tensor or intermediate. Not a
// dataset of the golden schema (mok-golden never stores it).
std::string bound_rounded_path(const std::string& path);

// For every checked tensor N (outputs/output and grads/*), computes
//   bounds/N_exact: the exact value of N's last stage (rounded to double, then stored as fp32;
//     both roundings are inside the radius), where every
//     product is exact and every sum is exact (ExactSum), taking as operands the inputs and
//     the reference's rounded intermediates (y, shared_act, dx_slot, d_gate, ...);
//   bounds/N_bound: a rigorous radius such that any implementation of profile bf16-v1 with
//     the Hopper MMA model (kHopperBf16Mma), fed the same operands, lands within
//     |value - exact| <= bound. It covers each MMA step's truncation of terms at 2^(E-25)
//     and of the result to fp32, each fp32 fma/add rounding, the final bf16 rounding and
//     the fp32 storage of the exact value.
// The bounds are stage-local: they judge the arithmetic of the last stage of each element,
// given its rounded operands (see reference/README.md). `reference` must hold those
// intermediates (emulate(..., intermediates=true) or a golden's /intermediates). The bounds do not
// cover fp32 overflow: where an element's value plus radius reaches 2^127 the oracle throws
// mok::Error "<origin>: outputs/output at token=3 h=0: the oracle's value is 6.8e+38 with radius
// ...; scale the inputs down" (OracleOptions::origin) instead of storing it.
// With OracleOptions::intermediates, the same for every intermediate the reference holds (and
// whose operands it holds): a dot product (gate, up, y, d_act, dx_slot and the shared expert's
// shared_gate, shared_up, shared_out, shared_d_act, dx_shared) with the MMA chain's radius, plus
// the final bf16 rounding for y and dx_slot; an elementwise step (act, dy, d_gate, d_up,
// shared_act, shared_d_gate, shared_d_up) with the end-to-end oracle's scalar rule for silu,
// silu', products and roundings, its operands taken as exact. An empty slot's intermediates are
// exactly 0 (radius 0). An element whose operands in the reference are not finite, or whose value
// or radius would reach 2^127 (the bounds do not cover overflow), is left NaN (not judged): its
// operand's own stage is where such a reference fails.
TensorMap oracle_bounds(const spec::LayerConfig& cfg, const TensorMap& inputs,
                        const TensorMap& reference, const OracleOptions& options = {});

// End to end: for every (sampled) element of outputs/output and, when the inputs hold d_output,
// of every gradient (d_router_weights, d_x, the routed and shared weight gradients),
//   bounds/<name>_exact: the value computed from the inputs alone without the profile's
//     roundings: every dot product an exact sum of exact products (a double operand's product
//     split exactly in two by an fma), silu, silu' and the SwiGLU products in double; each stage
//     rounded once to double, the result stored as fp32;
//   bounds/<name>_bound: a radius such that any implementation of profile bf16-v1 with the Hopper
//     MMA model, fed the same inputs (and nothing of the reference's), lands within it. Each
//     stage's radius carries its operands' radii forward (through |weights|, silu's Lipschitz
//     constant 1.1 and silu''s 0.51) and adds its own roundings; dy = rn(w d_output), which every
//     implementation computes exactly from the inputs, enters through the exact signed sum of its
//     errors; the spec's silu_f32 and silu_grad_f32 are taken to be within 2^-18 (of |silu|; of
//     s + |x| s (1 - s)) plus 2^-118 of the real functions (test_spec_math sweeps both).
//     reference/README.md ("End to end") writes the analysis out.
// So "within its end-to-end bound" says a backend is right without trusting the emulator's
// intermediates. Unsampled elements (tokens; columns of I and Is for the weight gradients) get NaN.
TensorMap oracle_end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs, const OracleOptions& options = {});
// The same for outputs/output alone (d_output, if present, is ignored).
TensorMap oracle_forward_end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs,
                                    const OracleOptions& options = {});

// One bf16 MMA dot chain from 0 (ORDER: dot-chain): its exact value (rounded to double) and the
// radius that every output element's bound is built from. Exposed for tests.
struct ChainBound {
  double exact;
  double radius;
};
ChainBound dot_chain_bound(const uint16_t* a, int64_t a_stride, const uint16_t* b, int64_t b_stride, int64_t n);

}  // namespace mok::ref
