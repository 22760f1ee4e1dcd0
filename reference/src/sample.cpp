// Sample selection (tokens covering every expert, then random ones; random columns) and coverage tests.
#include "mok/reference/sample.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"

#include <algorithm>
#include <sstream>

namespace mok::ref {
namespace {

std::vector<int64_t> pick_columns(int64_t n, int64_t count, Rng& rng) {
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  count = std::min(count, n);
  for (int64_t i = 0; i < count; ++i) std::swap(all[i], all[i + rng.below(n - i)]);
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

void Sample::prepare(const spec::LayerConfig& cfg) {
  token_mask.assign(cfg.num_tokens(), 0);
  inter_mask.assign(cfg.intermediate, 0);
  shared_mask.assign(cfg.shared_intermediate, 0);
  for (int64_t g : tokens) {
    if (g < 0 || g >= cfg.num_tokens()) throw Error("sample: token id out of range");
    token_mask[g] = 1;
  }
  for (int64_t i : inter_cols) {
    if (i < 0 || i >= cfg.intermediate) throw Error("sample: I column out of range");
    inter_mask[i] = 1;
  }
  for (int64_t j : shared_cols) {
    if (j < 0 || j >= cfg.shared_intermediate) throw Error("sample: Is column out of range");
    shared_mask[j] = 1;
  }
}

std::string Sample::describe(const spec::LayerConfig& cfg) const {
  std::ostringstream out;
  out << "sampled " << tokens.size() << " of " << cfg.num_tokens() << " tokens (one at least per expert that has any), "
      << inter_cols.size() << " of " << cfg.intermediate << " I columns";
  if (cfg.has_shared()) out << ", " << shared_cols.size() << " of " << cfg.shared_intermediate << " Is columns";
  out << " of every expert's weight gradients";
  return out.str();
}

bool Sample::covers(const std::string& path, const spec::LayerConfig& cfg, int64_t flat_idx) const {
  const TensorSpec* s = find_spec(path);
  if (!s) return false;
  if (s->role == Role::kInput) return true;
  const std::vector<int64_t> shape = spec_shape(*s, cfg);
  // Unravel the flat index and test the axes that the sample restricts.
  std::vector<int64_t> idx(shape.size());
  for (size_t a = shape.size(); a-- > 0;) {
    idx[a] = flat_idx % shape[a];
    flat_idx /= shape[a];
  }
  const bool weight_grad = s->dims.size() == 3 && (s->dims[0] == Dim::kExperts || s->dims[0] == Dim::kRanks);
  for (size_t a = 0; a < idx.size(); ++a) {
    switch (s->dims[a]) {
      case Dim::kTokens:
        if (!token_mask[idx[a]]) return false;
        break;
      case Dim::kInter:
        if (weight_grad && !inter_mask[idx[a]]) return false;
        break;
      case Dim::kSharedInter:
        if (weight_grad && !shared_mask[idx[a]]) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

Sample make_sample(const spec::LayerConfig& cfg, const Tensor& topk_experts, int64_t num_tokens,
                   int64_t num_cols, uint64_t seed) {
  const spec::Status status = cfg.validate();
  if (!status.ok) throw Error(std::string("make_sample: ") + status.message);
  if (num_tokens < 1 || num_cols < 0)
    throw Error("make_sample: num_tokens must be at least 1 and num_cols at least 0 (got " + std::to_string(num_tokens) +
                ", " + std::to_string(num_cols) + ")");
  if (topk_experts.dtype() != DType::kI32 || topk_experts.shape() != std::vector<int64_t>{cfg.num_tokens(), cfg.top_k})
    throw Error("make_sample: topk_experts must be i32 [G, K] = [" + std::to_string(cfg.num_tokens()) + ", " +
                std::to_string(cfg.top_k) + "], found " + std::string(dtype_name(topk_experts.dtype())) +
                topk_experts.shape_string());
  Rng rng(seed ^ 0x5A4D504C45ull);
  const int64_t G = cfg.num_tokens(), K = cfg.top_k;
  const int32_t* tk = topk_experts.data<int32_t>();
  for (int64_t i = 0; i < G * K; ++i)
    if (tk[i] < -1 || tk[i] >= cfg.num_experts)
      throw Error("make_sample: topk_experts holds expert id " + std::to_string(tk[i]) + " at token " + std::to_string(i / K) +
                  " slot " + std::to_string(i % K) + " (E = " + std::to_string(cfg.num_experts) + "; -1 is an empty slot)");
  std::vector<uint8_t> chosen(G, 0);
  // First, for every expert, one token routed to it (a random one among its tokens).
  std::vector<std::vector<int64_t>> tokens_of(cfg.num_experts);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = 0; k < K; ++k)
      if (tk[g * K + k] >= 0) tokens_of[tk[g * K + k]].push_back(g);
  for (const auto& list : tokens_of)
    if (!list.empty()) chosen[list[rng.below(list.size())]] = 1;
  // Then random tokens up to the requested count.
  int64_t count = std::count(chosen.begin(), chosen.end(), 1);
  const int64_t target = std::min(G, std::max(num_tokens, count));
  while (count < target) {
    const int64_t g = static_cast<int64_t>(rng.below(G));
    if (!chosen[g]) {
      chosen[g] = 1;
      ++count;
    }
  }
  Sample s;
  for (int64_t g = 0; g < G; ++g)
    if (chosen[g]) s.tokens.push_back(g);
  s.inter_cols = pick_columns(cfg.intermediate, num_cols, rng);
  s.shared_cols = pick_columns(cfg.shared_intermediate, num_cols, rng);
  s.prepare(cfg);
  return s;
}

}  // namespace mok::ref
