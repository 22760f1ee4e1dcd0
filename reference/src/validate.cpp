// Input validation shared by every backend: schema presence, shapes, dtypes, finite values, routing.
#include "mok/reference/validate.hpp"
#include "mok/reference/sample.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/routing_plan.hpp"

#include <cmath>
#include <cstdio>
#include <iterator>
#include <vector>

namespace mok::ref {
namespace {

std::string dims_string(const TensorSpec& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.dims.size(); ++i) out += (i ? ", " : "") + std::string(dim_symbol(s.dims[i]));
  return out + ")";
}

const char* nonfinite_name(float v) { return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

// Every element of each bf16 tensor of `paths` that `tensors` holds (others are named where they
// are used) is finite; else mok::Error "<prefix><path>: element token=3 h=7 is NaN (bf16 bits
// 0x7fc0)<suffix>" at the first that is not.
void check_finite_bf16(const spec::LayerConfig& cfg, const TensorMap& tensors, const std::vector<const char*>& paths,
                       const Tensor* topk_experts, const std::string& prefix, const std::string& suffix) {
  for (const char* path : paths) {
    const auto it = tensors.find(path);
    if (it == tensors.end() || it->second.dtype() != DType::kBf16) continue;
    const uint16_t* v = it->second.data<uint16_t>();
    for (int64_t i = 0; i < it->second.numel(); ++i) {
      if (spec::bf16_is_finite(v[i])) continue;
      char bits[16];
      std::snprintf(bits, sizeof bits, "0x%04x", static_cast<unsigned>(v[i]));
      throw Error(prefix + path + ": element " + locate(*find_spec(path), cfg, i, topk_experts) + " is " +
                  nonfinite_name(spec::f32_from_bf16(v[i])) + " (bf16 bits " + bits + ")" + suffix);
    }
  }
}

}  // namespace

void validate_inputs(const spec::LayerConfig& cfg, const TensorMap& inputs, bool need_backward,
                     const std::string& origin) {
  const spec::Status status = cfg.validate();
  if (!status.ok) throw Error(origin + ": " + status.message);
  for (const TensorSpec& s : golden_schema()) {
    if (s.role != Role::kInput || !spec_applies(s, cfg)) continue;
    const std::string path = s.path;
    if (path == "inputs/d_output" && !need_backward) continue;
    auto it = inputs.find(path);
    if (it == inputs.end())
      throw Error(origin + ": dataset /" + path + " is missing (" + s.what +
                  "); it is required for this config");
    const Tensor& t = it->second;
    const std::vector<int64_t> want = spec_shape(s, cfg);
    if (t.dtype() != s.dtype)
      throw Error(origin + ": dataset /" + path + ": expected dtype " + dtype_name(s.dtype) +
                  " but found " + dtype_name(t.dtype()));
    if (t.shape() != want) {
      throw Error(origin + ": dataset /" + path + ": expected shape " + format_shape(want) + " " +
                  dims_string(s) + " but found " + t.shape_string());
    }
  }
  check_input_values(cfg, inputs, origin);
}

namespace {

// The schema's dtype and shape for one tensor the schema names (others are skipped).
void check_shape(const spec::LayerConfig& cfg, const std::string& path, const Tensor& t, const std::string& origin) {
  const TensorSpec* s = find_spec(path);
  if (s == nullptr || !spec_applies(*s, cfg)) return;
  const std::vector<int64_t> want = spec_shape(*s, cfg);
  if (t.dtype() != s->dtype)
    throw Error(origin + ": dataset /" + path + ": expected dtype " + dtype_name(s->dtype) + " but found " +
                dtype_name(t.dtype()));
  if (t.shape() != want) {
    throw Error(origin + ": dataset /" + path + ": expected shape " + format_shape(want) + " " + dims_string(*s) +
                " but found " + t.shape_string());
  }
}

}  // namespace

void validate_shapes(const spec::LayerConfig& cfg, const TensorMap& tensors, const std::string& origin) {
  for (const auto& [path, t] : tensors) check_shape(cfg, path, t, origin);
}

void validate_sample(const spec::LayerConfig& cfg, const Sample& sample, const std::string& origin) {
  if (sample.token_mask.size() != static_cast<size_t>(cfg.num_tokens()) ||
      sample.inter_mask.size() != static_cast<size_t>(cfg.intermediate) ||
      sample.shared_mask.size() != static_cast<size_t>(cfg.shared_intermediate))
    throw Error(origin + ": the sample was not prepared for this config (make it with make_sample, or call "
                "Sample::prepare(cfg) after filling it)");
  if (sample.tokens.empty()) throw Error(origin + ": the sample has no tokens, so it would check nothing");
  for (int64_t g : sample.tokens)
    if (g < 0 || g >= cfg.num_tokens() || !sample.token_mask[static_cast<size_t>(g)])
      throw Error(origin + ": sample token " + std::to_string(g) + " is out of range or not prepared (G = " +
                  std::to_string(cfg.num_tokens()) + ")");
  for (int64_t i : sample.inter_cols)
    if (i < 0 || i >= cfg.intermediate || !sample.inter_mask[static_cast<size_t>(i)])
      throw Error(origin + ": sample I column " + std::to_string(i) + " is out of range or not prepared (I = " +
                  std::to_string(cfg.intermediate) + ")");
  for (int64_t j : sample.shared_cols)
    if (j < 0 || j >= cfg.shared_intermediate || !sample.shared_mask[static_cast<size_t>(j)])
      throw Error(origin + ": sample Is column " + std::to_string(j) + " is out of range or not prepared (Is = " +
                  std::to_string(cfg.shared_intermediate) + ")");
}

void check_input_values(const spec::LayerConfig& cfg, const TensorMap& inputs, const std::string& origin,
                        const std::string& hint) {
  // The values are read through the schema's shapes: a present input of another dtype or shape
  // is named here rather than read out of bounds.
  for (const auto& [path, t] : inputs)
    if (path.rfind("inputs/", 0) == 0) check_shape(cfg, path, t, origin);
  const auto topk_it = inputs.find("inputs/topk_experts");
  const Tensor* topk = topk_it == inputs.end() ? nullptr : &topk_it->second;
  check_finite_bf16(cfg, inputs,
                    {"inputs/x", "inputs/w_shared_gate", "inputs/w_shared_up", "inputs/w_shared_down",
                     "inputs/w_routed_gate", "inputs/w_routed_up", "inputs/w_routed_down", "inputs/d_output"},
                    topk, origin + ": dataset /", "; inputs must be finite" + hint);
  if (const auto it = inputs.find("inputs/router_weights"); it != inputs.end()) {
    const float* w = it->second.data<float>();
    for (int64_t i = 0; i < it->second.numel(); ++i)
      if (!std::isfinite(w[i]))
        throw Error(origin + ": dataset /inputs/router_weights: element " +
                    locate(*find_spec("inputs/router_weights"), cfg, i, topk) + " is " + nonfinite_name(w[i]) +
                    "; router weights must be finite" + hint);
  }
  if (!topk) return;
  int64_t bad_token = -1, bad_slot = -1;
  const spec::Status routing = spec::validate_routing(cfg, topk->data<int32_t>(), &bad_token, &bad_slot);
  if (!routing.ok) {
    const int32_t id = topk->data<int32_t>()[bad_token * cfg.top_k + bad_slot];
    throw Error(origin + ": dataset /inputs/topk_experts: token " + std::to_string(bad_token) + " slot " +
                std::to_string(bad_slot) + " holds expert " + std::to_string(id) + " (E = " +
                std::to_string(cfg.num_experts) + "): " + routing.message + hint);
  }
}

void check_oracle_operands(const spec::LayerConfig& cfg, const TensorMap& reference, const Tensor* topk_experts,
                           bool backward, const std::string& prefix, const std::string& fix) {
  static const char* const kForward[] = {"intermediates/y", "intermediates/shared_act"};
  static const char* const kBackward[] = {"intermediates/act",     "intermediates/dy",
                                          "intermediates/d_gate",  "intermediates/d_up",
                                          "intermediates/dx_slot", "intermediates/shared_d_gate",
                                          "intermediates/shared_d_up"};
  std::vector<const char*> paths(std::begin(kForward), std::end(kForward));
  if (backward) paths.insert(paths.end(), std::begin(kBackward), std::end(kBackward));
  check_finite_bf16(cfg, reference, paths, topk_experts, prefix, "; " + fix);
}

}  // namespace mok::ref
