// Golden schema v1: every dataset's path, dtype and symbolic shape, and what its axes mean.
#pragma once

#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mok::ref {

inline constexpr const char* kGoldenFormat = "mok-golden";
inline constexpr int kGoldenVersion = 1;
inline constexpr const char* kProfileBf16V1 = "bf16-v1";

// Symbolic dimensions; an axis's symbol also says how to name an index in reports.
enum class Dim : uint8_t {
  kTokens,        // G (global token id)
  kSlots,         // K (slot)
  kExperts,       // E (expert id)
  kRanks,         // R (rank)
  kHidden,        // H (hidden column)
  kInter,         // I (routed intermediate column)
  kSharedInter,   // Is (shared intermediate column)
};

const char* dim_symbol(Dim d);   // "G", "K", ...
const char* dim_axis_name(Dim d);  // "token", "slot", "expert", "rank", "h", "i", "is"
int64_t dim_size(Dim d, const spec::LayerConfig& cfg);

// A layer config for messages, under the names of its /config attributes:
// "H=7168 I=2048 Is=2048 E=256 K=8 R=8 T=4096".
std::string format_config(const spec::LayerConfig& cfg);

enum class Role : uint8_t {
  kInput,
  kOutput,
  kGrad,
  kIntermediate,
  kBoundExact,       // stage-local oracle value (oracle_bounds)
  kBoundRadius,      // stage-local radius
  kEndToEndExact,    // end-to-end oracle value (oracle_end_to_end), optional
  kEndToEndRadius,   // end-to-end radius, optional
  kBoundTerms,       // stage-local sum of |terms| of the last stage, optional
};

// Whether a path names an intermediate of the backward pass: under intermediates/, dy, d_act,
// d_gate, d_up, dx_slot, dx_shared and the shared expert's shared_d_*.
inline bool is_backward_intermediate(std::string_view path) {
  constexpr std::string_view kGroup = "intermediates/";
  if (path.substr(0, kGroup.size()) != kGroup) return false;
  const std::string_view name = path.substr(kGroup.size());
  return name.substr(0, 1) == "d" || name.find("_d_") != std::string_view::npos;
}

// Any of the five bound roles (stage-local value, radius and terms; end-to-end value and radius).
constexpr bool is_bound_role(Role r) {
  return r == Role::kBoundExact || r == Role::kBoundRadius || r == Role::kEndToEndExact || r == Role::kEndToEndRadius ||
         r == Role::kBoundTerms;
}

struct TensorSpec {
  const char* path;          // e.g. "inputs/x"
  DType dtype;
  std::vector<Dim> dims;
  Role role;
  bool needs_shared;         // present only when Is > 0
  const char* what;          // one line for docs and messages
};

// Every dataset of schema v1 (bounds included), in a fixed order.
const std::vector<TensorSpec>& golden_schema();
// The spec for a path, or nullptr.
const TensorSpec* find_spec(const std::string& path);
// Shape of a spec under a config.
std::vector<int64_t> spec_shape(const TensorSpec& spec, const spec::LayerConfig& cfg);
// True when this spec applies to the config (shared tensors need Is > 0).
bool spec_applies(const TensorSpec& spec, const spec::LayerConfig& cfg);
// Bytes a dataset of this spec takes under a config (its elements times its dtype's size), as a
// double so that no config overflows it: the memory estimates made before anything is allocated
// (the golden reader, mok-golden, mok-verify run) count with it.
double spec_bytes(const TensorSpec& spec, const spec::LayerConfig& cfg);

// The checked tensors (outputs and grads) and the two bound datasets of each:
// bounds/<name>_exact (the oracle's value, f32) and bounds/<name>_bound (absolute radius, f32).
std::string bound_exact_path(const std::string& checked_path);
std::string bound_radius_path(const std::string& checked_path);
// The optional bound material: bounds/<name>_terms (sum of |terms| of the last stage).
std::string bound_terms_path(const std::string& checked_path);
// The optional end-to-end pair: bounds/<name>_e2e_exact and bounds/<name>_e2e_bound.
std::string end_to_end_exact_path(const std::string& checked_path);
std::string end_to_end_radius_path(const std::string& checked_path);
// The checked tensor a bound dataset belongs to ("bounds/d_x_e2e_bound" -> "grads/d_x"); throws
// mok::Error for any other path.
std::string checked_path_of_bound(const std::string& bound_path);

// Formats a flat index of a tensor as named coordinates, adding the expert id of a (token, slot)
// pair when topk_experts is given: "token=5 slot=2 expert=17 h=40".
std::string locate(const TensorSpec& spec, const spec::LayerConfig& cfg, int64_t flat_idx,
                   const Tensor* topk_experts = nullptr);

}  // namespace mok::ref
