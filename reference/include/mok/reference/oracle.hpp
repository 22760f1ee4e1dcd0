// The oracle: exact value and rigorous error radius of every checked element, stage by stage.
#pragma once

#include "mok/reference/sample.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

namespace mok::ref {

struct OracleOptions {
  int num_threads = 0;             // 0 = all cores
  const Sample* sample = nullptr;  // null = every element; else unsampled elements get NaN
};

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
// intermediates (emulate(..., intermediates=true) or a golden's /intermediates).
TensorMap oracle_bounds(const spec::LayerConfig& cfg, const TensorMap& inputs,
                        const TensorMap& reference, const OracleOptions& options = {});

// End to end, the forward only: for every (sampled) element of outputs/output,
//   bounds/output_exact: the layer's output computed from the inputs alone without the profile's
//     roundings: gate and up as exact sums, act = silu(gate) * up in double, y and shared_out as
//     exact sums of act's products, the combine as an exact sum; each stage rounded once to
//     double, the result stored as fp32;
//   bounds/output_bound: a radius such that any implementation of profile bf16-v1 with the Hopper
//     MMA model, fed the same inputs (and nothing of the reference's), lands within it. Each
//     stage's radius carries the earlier stages' radii forward (through |weights| and silu's
//     Lipschitz constant 1.1) and adds its own roundings; silu_f32's own error is taken as
//     2^-18 relative plus 2^-118 (reference/test/test_emulate.cpp sweeps it). reference/README.md
//     ("End to end") writes the analysis out.
// So "within its end-to-end bound" says a backend is right without trusting the emulator's
// intermediates. Unsampled tokens get NaN.
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
