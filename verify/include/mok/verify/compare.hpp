// Tensor-by-tensor comparison of a candidate against a golden: bitwise counts, ULP distances, bounds.
#pragma once

#include "mok/reference/golden.hpp"
#include "mok/reference/sample.hpp"
#include "mok/reference/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace mok::verify {

// What a tensor must satisfy to pass.
enum class Criterion {
  kBitwise,       // every compared element bit-identical (emulator, CUDA kernel)
  kWithinBounds,  // every element within its oracle radius (bounds/*); bits may differ
};

struct TensorReport {
  std::string path;
  int64_t compared = 0;          // elements compared (the sample's, or all)
  int64_t equal = 0;             // bit-identical elements
  uint64_t max_ulp = 0;          // largest ULP distance (NaN against a number counts as max)
  int64_t worst_idx = -1;        // flat index of the largest ULP distance (-1: all equal)
  int64_t first_idx = -1;        // flat index of the first element whose bits differ (-1: none)
  std::string first_location;    // its coordinates
  int64_t first_outside_idx = -1;  // the first element outside its radius (-1: none)
  std::string first_outside_location;
  std::string worst_location;    // "token=5 slot=2 expert=17 h=40"
  double worst_expected = 0, worst_actual = 0;
  // Bound check (when the golden holds bounds/<name>_exact and _bound).
  bool has_bounds = false;
  int64_t bound_checked = 0, outside_bound = 0;
  double worst_bound_ratio = 0;  // max |actual - exact| / bound
  std::string worst_bound_location;
  bool passed = true;
};

struct Report {
  std::string golden_path;
  std::string backend;
  std::string criterion;         // "bitwise" or "within-bounds"
  std::string sample;            // empty: every element
  std::string end_to_end;        // empty: not asked; "stored" or "computed": where its bounds came from
  std::vector<TensorReport> tensors;
  std::string first_bad_stage;   // first tensor in stage order that failed, with its location
  bool passed = true;
  double seconds = 0;
};

struct CompareOptions {
  Criterion criterion = Criterion::kBitwise;
  bool check_bounds = true;          // also check bounds when the golden has them
  const ref::Sample* sample = nullptr;
  std::string golden_name = "golden";  // names the golden in errors about its content (its path)
};

// Compares every tensor of `candidate` that the golden also holds (outputs, grads and
// intermediates), in stage order. Inputs are never compared. An output or gradient of the golden
// that the candidate lacks fails; so does a tensor of another dtype or shape. Throws Error (bad
// input) on bounds that cannot be right (a negative or infinite radius, a non-finite exact value).
// The oracles never give such bounds: where a value of theirs reaches fp32's range limit they
// throw instead, naming the element.
Report compare(const ref::Golden& golden, const ref::TensorMap& candidate, const CompareOptions& options);

// ULP distance between two values of the same dtype given as widened bit patterns.
uint64_t ulp_distance(ref::DType dtype, uint64_t a_bits, uint64_t b_bits);

// Position of a schema path in stage order (forward, then backward, then weight gradients).
int stage_rank(const std::string& path);

std::string format_table(const Report& report);
std::string format_json(const Report& report);

}  // namespace mok::verify
