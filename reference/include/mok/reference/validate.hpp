// Input validation shared by every backend and the golden reader: structure, then values.
#pragma once

#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <string>

namespace mok::ref {

// Value checks of the inputs that are present: every bf16 input (x, weights, d_output) and the
// router weights finite, topk_experts valid (ids in [-1, E), distinct in a row). Throws
// mok::Error "ORIGIN: dataset /inputs/x: element token=3 h=7 is NaN (bf16 bits 0x7fc0); inputs
// must be finite" + `hint`.
void check_input_values(const spec::LayerConfig& cfg, const TensorMap& inputs, const std::string& origin,
                        const std::string& hint = "");

// Structure (presence, dtype, shape of every input the config needs) and then values, for the
// backends. Throws mok::Error naming `origin` and the dataset.
void validate_inputs(const spec::LayerConfig& cfg, const TensorMap& inputs, bool need_backward,
                     const std::string& origin = "inputs");

// Every tensor of `tensors` that the schema names has the schema's dtype and shape for `cfg`
// (the oracle's reference operands: outputs, grads, intermediates). Throws mok::Error naming
// `origin` and the dataset.
void validate_shapes(const spec::LayerConfig& cfg, const TensorMap& tensors, const std::string& origin);

// The intermediates the oracle takes as operands of the output and the gradients (y and
// shared_act; with `backward` also act, dy, d_gate, d_up, dx_slot, shared_d_gate, shared_d_up),
// those `reference` holds, are finite: the oracle's bounds do not cover overflow. Throws
// mok::Error "<prefix>intermediates/act: element token=1 slot=1 expert=0 i=1 is NaN (bf16 bits
// 0x7fc0); <fix>" at the first that is not. oracle_bounds calls it (prefix and fix from
// OracleOptions::origin, reference_name and reference_fix).
void check_oracle_operands(const spec::LayerConfig& cfg, const TensorMap& reference, const Tensor* topk_experts,
                           bool backward, const std::string& prefix, const std::string& fix);

struct Sample;
// A sample the backends can use: prepared for this config (Sample::prepare or make_sample), its
// columns in range, and at least one token (an empty sample would check nothing). Throws
// mok::Error (bad input).
void validate_sample(const spec::LayerConfig& cfg, const Sample& sample, const std::string& origin);

}  // namespace mok::ref
