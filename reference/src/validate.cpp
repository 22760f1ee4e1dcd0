// Input validation shared by every backend: schema presence, shapes, dtypes, finite values, routing.
#include "mok/reference/emulate.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/routing_plan.hpp"

#include <cmath>
#include <sstream>

namespace mok::ref {
namespace {

std::string dims_string(const TensorSpec& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.dims.size(); ++i) out += (i ? ", " : "") + std::string(dim_symbol(s.dims[i]));
  return out + ")";
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
      Tensor probe(s.dtype, want);
      throw Error(origin + ": dataset /" + path + ": expected shape " + probe.shape_string() + " " +
                  dims_string(s) + " but found " + t.shape_string());
    }
    // Values: every bf16 input and the router weights must be finite.
    if (s.dtype == DType::kBf16) {
      const uint16_t* v = t.data<uint16_t>();
      for (int64_t i = 0; i < t.numel(); ++i)
        if (!spec::bf16_is_finite(v[i]))
          throw Error(origin + ": dataset /" + path + ": non-finite value (" +
                      (std::isnan(t.value_at(i)) ? "NaN" : "Inf") + ") at " + locate(s, cfg, i) +
                      "; inputs must be finite");
    } else if (s.dtype == DType::kF32) {
      const float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i)
        if (!std::isfinite(v[i]))
          throw Error(origin + ": dataset /" + path + ": non-finite value at " + locate(s, cfg, i) +
                      "; router weights must be finite");
    }
  }
  int64_t bad_token = -1, bad_slot = -1;
  const spec::Status routing = spec::validate_routing(
      cfg, at(inputs, "inputs/topk_experts").data<int32_t>(), &bad_token, &bad_slot);
  if (!routing.ok) {
    const int32_t id = at(inputs, "inputs/topk_experts").data<int32_t>()[bad_token * cfg.top_k + bad_slot];
    std::ostringstream msg;
    msg << origin << ": dataset /inputs/topk_experts: " << routing.message << " at token=" << bad_token
        << " slot=" << bad_slot << " (expert id " << id << ", E=" << cfg.num_experts << ")";
    throw Error(msg.str());
  }
}

}  // namespace mok::ref
