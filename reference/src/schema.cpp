// The golden schema v1 table (paths, dtypes, symbolic shapes) and naming of dims and coordinates.
#include "mok/reference/schema.hpp"

#include "mok/reference/error.hpp"

#include <string_view>

namespace mok::ref {

const char* dim_symbol(Dim d) {
  switch (d) {
    case Dim::kTokens: return "G";
    case Dim::kSlots: return "K";
    case Dim::kExperts: return "E";
    case Dim::kRanks: return "R";
    case Dim::kHidden: return "H";
    case Dim::kInter: return "I";
    case Dim::kSharedInter: return "Is";
  }
  return "?";
}

const char* dim_axis_name(Dim d) {
  switch (d) {
    case Dim::kTokens: return "token";
    case Dim::kSlots: return "slot";
    case Dim::kExperts: return "expert";
    case Dim::kRanks: return "rank";
    case Dim::kHidden: return "h";
    case Dim::kInter: return "i";
    case Dim::kSharedInter: return "is";
  }
  return "?";
}

int64_t dim_size(Dim d, const spec::LayerConfig& cfg) {
  switch (d) {
    case Dim::kTokens: return cfg.num_tokens();
    case Dim::kSlots: return cfg.top_k;
    case Dim::kExperts: return cfg.num_experts;
    case Dim::kRanks: return cfg.num_ranks;
    case Dim::kHidden: return cfg.hidden;
    case Dim::kInter: return cfg.intermediate;
    case Dim::kSharedInter: return cfg.shared_intermediate;
  }
  return 0;
}

namespace {

constexpr Dim G = Dim::kTokens;
constexpr Dim K = Dim::kSlots;
constexpr Dim E = Dim::kExperts;
constexpr Dim R = Dim::kRanks;
constexpr Dim H = Dim::kHidden;
constexpr Dim I = Dim::kInter;
constexpr Dim Is = Dim::kSharedInter;

// The checked tensors' bound names use string storage that lives as long as the table.
struct BoundNames {
  std::vector<std::string> paths;
};

std::vector<TensorSpec> build_schema(BoundNames& names) {
  using enum DType;
  using enum Role;
  std::vector<TensorSpec> s = {
      // inputs (global token order; weights of all experts, out-features first)
      {"inputs/x", kBf16, {G, H}, kInput, false, "token activations"},
      {"inputs/topk_experts", kI32, {G, K}, kInput, false, "expert id per slot, -1 = empty slot"},
      {"inputs/router_weights", kF32, {G, K}, kInput, false, "router weight per slot"},
      {"inputs/w_shared_gate", kBf16, {Is, H}, kInput, true, "shared expert gate weight"},
      {"inputs/w_shared_up", kBf16, {Is, H}, kInput, true, "shared expert up weight"},
      {"inputs/w_shared_down", kBf16, {H, Is}, kInput, true, "shared expert down weight"},
      {"inputs/w_routed_gate", kBf16, {E, I, H}, kInput, false, "routed experts' gate weights"},
      {"inputs/w_routed_up", kBf16, {E, I, H}, kInput, false, "routed experts' up weights"},
      {"inputs/w_routed_down", kBf16, {E, H, I}, kInput, false, "routed experts' down weights"},
      {"inputs/d_output", kBf16, {G, H}, kInput, false, "gradient of the layer output (backward)"},
      // outputs
      {"outputs/output", kBf16, {G, H}, kOutput, false, "layer output"},
      // grads
      {"grads/d_x", kBf16, {G, H}, kGrad, false, "gradient of x"},
      {"grads/d_router_weights", kF32, {G, K}, kGrad, false, "gradient of the router weights"},
      {"grads/d_w_routed_gate", kF32, {E, I, H}, kGrad, false, "routed gate weight gradients"},
      {"grads/d_w_routed_up", kF32, {E, I, H}, kGrad, false, "routed up weight gradients"},
      {"grads/d_w_routed_down", kF32, {E, H, I}, kGrad, false, "routed down weight gradients"},
      {"grads/d_w_shared_gate", kF32, {R, Is, H}, kGrad, true, "shared gate weight grad per rank"},
      {"grads/d_w_shared_up", kF32, {R, Is, H}, kGrad, true, "shared up weight grad per rank"},
      {"grads/d_w_shared_down", kF32, {R, H, Is}, kGrad, true, "shared down weight grad per rank"},
      // intermediates, per slot; empty slots hold zeros
      {"intermediates/gate", kF32, {G, K, I}, kIntermediate, false, "x . W_gate^T per slot"},
      {"intermediates/up", kF32, {G, K, I}, kIntermediate, false, "x . W_up^T per slot"},
      {"intermediates/act", kBf16, {G, K, I}, kIntermediate, false, "rn(silu(gate) * up) per slot"},
      {"intermediates/y", kBf16, {G, K, H}, kIntermediate, false, "expert output per slot"},
      {"intermediates/shared_gate", kF32, {G, Is}, kIntermediate, true, "x . W_sg^T"},
      {"intermediates/shared_up", kF32, {G, Is}, kIntermediate, true, "x . W_su^T"},
      {"intermediates/shared_act", kBf16, {G, Is}, kIntermediate, true, "shared activation"},
      {"intermediates/shared_out", kF32, {G, H}, kIntermediate, true, "shared expert output"},
      {"intermediates/dy", kBf16, {G, K, H}, kIntermediate, false, "rn(w * d_output) per slot"},
      {"intermediates/d_act", kF32, {G, K, I}, kIntermediate, false, "dy . W_down per slot"},
      {"intermediates/d_gate", kBf16, {G, K, I}, kIntermediate, false, "gradient at gate per slot"},
      {"intermediates/d_up", kBf16, {G, K, I}, kIntermediate, false, "gradient at up per slot"},
      {"intermediates/dx_slot", kBf16, {G, K, H}, kIntermediate, false, "d_x part per slot"},
      {"intermediates/shared_d_act", kF32, {G, Is}, kIntermediate, true, "shared d_act"},
      {"intermediates/shared_d_gate", kBf16, {G, Is}, kIntermediate, true, "shared grad at gate"},
      {"intermediates/shared_d_up", kBf16, {G, Is}, kIntermediate, true, "shared grad at up"},
      {"intermediates/dx_shared", kF32, {G, H}, kIntermediate, true, "shared part of d_x"},
  };
  // Bound datasets per checked tensor, in this order; reserve first so the c_str() pointers stay
  // valid. The stage-local exact and radius pair is what the oracle always writes; the bound
  // material (mok-golden --bound-terms) and the end-to-end pair (--end-to-end-bounds: from the
  // inputs alone) are optional.
  struct BoundKind {
    std::string (*path)(const std::string&);
    Role role;
    const char* what;
  };
  static const BoundKind kinds[] = {
      {bound_exact_path, kBoundExact, "oracle value (rounded once to f32) of the checked tensor"},
      {bound_radius_path, kBoundRadius, "absolute error radius allowed around the oracle value"},
      {bound_terms_path, kBoundTerms, "sum of |terms| of the last stage (rounded up to f32), the oracle's bound material"},
      {end_to_end_exact_path, kEndToEndExact, "end-to-end oracle value (from the inputs alone, rounded once to f32)"},
      {end_to_end_radius_path, kEndToEndRadius, "end-to-end error radius allowed around that value"},
  };
  std::vector<TensorSpec> checked;
  for (const TensorSpec& t : s) {
    if (t.role == kOutput || t.role == kGrad) checked.push_back(t);
  }
  names.paths.reserve(checked.size() * std::size(kinds));
  // ORDER: per checked tensor the stage-local pair, then every tensor's terms, then per tensor the
  // end-to-end pair (the order golden files were first written in; the writer follows it).
  auto add = [&](const TensorSpec& t, const BoundKind& k) {
    names.paths.push_back(k.path(t.path));
    s.push_back({names.paths.back().c_str(), kF32, t.dims, k.role, t.needs_shared, k.what});
  };
  for (const auto& [first, last] : {std::pair{0, 2}, std::pair{2, 3}, std::pair{3, 5}})
    for (const TensorSpec& t : checked)
      for (int k = first; k < last; ++k) add(t, kinds[k]);
  return s;
}

// "outputs/output" -> "output".
std::string checked_name(const std::string& checked_path) {
  const size_t slash = checked_path.rfind('/');
  return slash == std::string::npos ? checked_path : checked_path.substr(slash + 1);
}

}  // namespace

const std::vector<TensorSpec>& golden_schema() {
  static BoundNames names;
  static const std::vector<TensorSpec> schema = build_schema(names);
  return schema;
}

const TensorSpec* find_spec(const std::string& path) {
  for (const TensorSpec& s : golden_schema()) {
    if (path == s.path) return &s;
  }
  return nullptr;
}

std::vector<int64_t> spec_shape(const TensorSpec& spec, const spec::LayerConfig& cfg) {
  std::vector<int64_t> shape;
  shape.reserve(spec.dims.size());
  for (Dim d : spec.dims) shape.push_back(dim_size(d, cfg));
  return shape;
}

bool spec_applies(const TensorSpec& spec, const spec::LayerConfig& cfg) {
  return !spec.needs_shared || cfg.has_shared();
}

std::string format_config(const spec::LayerConfig& cfg) {
  return "H=" + std::to_string(cfg.hidden) + " I=" + std::to_string(cfg.intermediate) +
         " Is=" + std::to_string(cfg.shared_intermediate) + " E=" + std::to_string(cfg.num_experts) +
         " K=" + std::to_string(cfg.top_k) + " R=" + std::to_string(cfg.num_ranks) +
         " T=" + std::to_string(cfg.tokens_per_rank);
}

double spec_bytes(const TensorSpec& spec, const spec::LayerConfig& cfg) {
  double bytes = static_cast<double>(dtype_size(spec.dtype));
  for (Dim d : spec.dims) bytes *= static_cast<double>(dim_size(d, cfg));
  return bytes;
}

std::string bound_exact_path(const std::string& checked_path) {
  return "bounds/" + checked_name(checked_path) + "_exact";
}

std::string bound_radius_path(const std::string& checked_path) {
  return "bounds/" + checked_name(checked_path) + "_bound";
}

std::string bound_terms_path(const std::string& checked_path) {
  return "bounds/" + checked_name(checked_path) + "_terms";
}

std::string checked_path_of_bound(const std::string& bound_path) {
  for (const TensorSpec& t : golden_schema()) {
    if (t.role != Role::kOutput && t.role != Role::kGrad) continue;
    for (const std::string& b : {bound_exact_path(t.path), bound_radius_path(t.path), bound_terms_path(t.path),
                                 end_to_end_exact_path(t.path), end_to_end_radius_path(t.path)})
      if (b == bound_path) return t.path;
  }
  throw Error("'" + bound_path + "' is not a bound dataset of schema v1");
}

std::string end_to_end_exact_path(const std::string& checked_path) {
  return "bounds/" + checked_name(checked_path) + "_e2e_exact";
}

std::string end_to_end_radius_path(const std::string& checked_path) {
  return "bounds/" + checked_name(checked_path) + "_e2e_bound";
}

std::string locate(const TensorSpec& spec, const spec::LayerConfig& cfg, int64_t flat_idx,
                   const Tensor* topk_experts) {
  const std::vector<int64_t> shape = spec_shape(spec, cfg);
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  if (flat_idx < 0 || flat_idx >= numel) {
    return "index " + std::to_string(flat_idx) + " (outside " + spec.path + ")";
  }
  std::vector<int64_t> coords(shape.size());
  int64_t rest = flat_idx;
  for (size_t a = shape.size(); a-- > 0;) {
    coords[a] = rest % shape[a];
    rest /= shape[a];
  }
  // The expert of a (token, slot) pair, when the routing is at hand and has the right shape.
  const bool token_slot =
      shape.size() >= 2 && spec.dims[0] == Dim::kTokens && spec.dims[1] == Dim::kSlots;
  const bool have_routing = topk_experts != nullptr && topk_experts->dtype() == DType::kI32 &&
                            topk_experts->numel() == cfg.num_tokens() * cfg.top_k;
  std::string out;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (a > 0) out += ' ';
    out += dim_axis_name(spec.dims[a]);
    out += '=';
    out += std::to_string(coords[a]);
    if (a == 1 && token_slot && have_routing) {
      const int32_t e = topk_experts->data<int32_t>()[coords[0] * cfg.top_k + coords[1]];
      out += " expert=" + std::to_string(e);
    }
  }
  return out;
}

}  // namespace mok::ref
