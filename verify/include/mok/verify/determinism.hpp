// The determinism matrix: the same global inputs under many rank counts, role splits, minibatch
// sizes and repeated runs must give identical bits; any difference is located.
#pragma once

#include "mok/reference/golden.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mok::verify {

struct DeterminismOptions {
  int runs = 20;
  std::vector<int> ranks{1, 2, 4, 8};
  std::vector<int> comm_blocks{1, 2};   // communication blocks per rank ("comm SMs")
  std::vector<int64_t> minibatches;      // tokens per pass; empty = the whole batch only
  uint64_t seed = 1;                     // shuffles the order in which configurations run
  std::string transport = "virtual";     // "virtual", "nccl" (R GPUs for R ranks) or "split" (one GPU, a launch a rank)
  std::vector<std::string> items{"shared", "own"};  // GEMM items of several virtual ranks: worked by every
                                                   // block ("shared") or by each rank's own ("own"); R = 1
                                                   // and the nccl and split transports run one launch a rank:
                                                   // "shared" only
  std::function<void(const std::string&)> progress;
};

struct DeterminismResult {
  bool passed = true;
  int64_t configurations = 0;  // distinct (R, comm, minibatch, items), each run `runs` times
  int64_t executions = 0;
  std::string table;           // one line per configuration and tensor: its 64-bit hash
  std::string first_difference;
};

// Needs the CUDA kernel and a GPU (mok::Error of kind kUnsupported otherwise). Per-token tensors
// (output, d_x, d_router_weights, y, dx_slot) are compared across every configuration; routed
// weight gradients across configurations with the whole batch; shared-expert weight gradients
// (per rank by contract) across configurations with the same R and minibatch.
// Every rank count must divide E and every minibatch (the whole batch G by default), and every
// minibatch must divide G: otherwise mok::Error of kind kBadInput naming the value (a usage error, checked
// before whether this machine can run the matrix). Configurations with more NCCL ranks than GPUs
// are skipped with a progress line; when that leaves none, kUnsupported.
void check_determinism_options(const spec::LayerConfig& cfg, const DeterminismOptions& options);
// Whether R ranks can run this layer in passes of these minibatches (empty: the whole batch): R
// divides E (each rank owns E/R experts) and every minibatch (each rank takes minibatch/R tokens).
bool rank_count_fits(const spec::LayerConfig& cfg, int R, const std::vector<int64_t>& minibatches);
DeterminismResult run_determinism(const ref::Golden& golden, const DeterminismOptions& options);

// FNV-1a 64-bit hash of a tensor's bytes.
uint64_t tensor_hash(const ref::Tensor& t);

}  // namespace mok::verify
