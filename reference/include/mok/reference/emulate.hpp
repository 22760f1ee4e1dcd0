// The CPU emulator: the whole MoE layer, forward and backward, bit for bit as profile bf16-v1 defines it.
#pragma once

#include "mok/reference/sample.hpp"
#include "mok/reference/tensor.hpp"
#include "mok/reference/validate.hpp"
#include "mok/spec/config.hpp"
#include "mok/spec/mma_model.hpp"

#include <string>

namespace mok::ref {

struct EmulateOptions {
  bool backward = true;           // also compute grads/* (needs inputs/d_output)
  bool intermediates = true;      // also return intermediates/*
  int num_threads = 0;            // 0 = all cores; results never depend on it
  const Sample* sample = nullptr; // null = every element
  const spec::MmaModel* mma_model = &spec::kHopperBf16Mma;
};

// Runs the layer on global inputs (schema paths "inputs/..."), validating shapes, dtypes and
// routing first (mok::Error on bad input). Returns "outputs/output", "grads/..." and, when
// asked, "intermediates/...". Every bit is a function of the inputs and the MMA model alone:
// not of R's split, thread count or sample (sampled elements equal the full run's).
TensorMap emulate(const spec::LayerConfig& cfg, const TensorMap& inputs,
                  const EmulateOptions& options = {});



}  // namespace mok::ref
