// The unfused MoE pipeline users run with DeepEP + DeepGEMM-style pieces on one GPU: gather,
// cuBLAS grouped GEMMs, SwiGLU, weighted combine, and the backward pass (baseline for mok-bench).
#pragma once

#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <memory>

namespace mok::bench {

// Not bit-exact with profile bf16-v1 (cuBLAS picks its own kernels and orders); it is the
// speed baseline. The routing layout (sort by expert) is computed once on the host when the
// object is built and is not timed, as a dispatch library would hand it over.
class UnfusedBaseline {
 public:
  UnfusedBaseline(const spec::LayerConfig& cfg, const ref::TensorMap& inputs);
  ~UnfusedBaseline();
  void forward();   // enqueues on the default stream
  void backward();  // needs forward() first
  // output [G, H] bf16, for a sanity comparison with the fused kernel.
  ref::Tensor output() const;
  // "grouped" (cublasGemmGroupedBatchedEx) or "per-expert" (its fallback), once a pass ran.
  const char* gemm_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mok::bench
