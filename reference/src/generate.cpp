// Presets, routing generators and random inputs for golden cases (deterministic per seed).
#include "mok/reference/generate.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/parallel.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/math.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace mok::ref {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256**'s state update (linear over GF(2): Rng::advance relies on it).
void xoshiro_step(uint64_t (&s)[4]) {
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
}

double parse_number(const std::string& text, const std::string& whole) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  // strtod would also skip leading blanks and take a '+': the text is a plain number (a '-' is
  // taken, so that the caller's range check names a negative value as out of range).
  const size_t at = !text.empty() && text[0] == '-' ? 1 : 0;
  const bool plain = text.size() > at && (std::isdigit(static_cast<unsigned char>(text[at])) || text[at] == '.');
  if (!plain || *end != '\0' || !std::isfinite(v))
    throw Error("routing '" + whole + "': '" + text + "' is not a number; examples: uniform, zipf:1.2, hot:4, hot:4:8");
  return v;
}

// Elements per parallel block of a fill: a 16M-element tensor is 64 blocks, and a tensor of at
// most one block (every shipped fixture's) is filled serially, with no thread started.
constexpr int64_t kFillBlock = int64_t{1} << 18;

void fill_bell_bf16(Tensor& t, Rng& rng, float scale) {
  detail::fill_bell_bf16(t.data<uint16_t>(), t.numel(), rng, scale, kFillBlock);
}

// xoshiro256**'s state update as a 256 x 256 matrix over GF(2), stored by columns: column j is
// the update applied to the state with only bit j set (bit j of word j / 64).
struct Bits256 {
  uint64_t w[4];
};
using Matrix256 = std::vector<Bits256>;  // 256 columns

Bits256 times(const Matrix256& m, const Bits256& v) {
  Bits256 r{};
  for (int j = 0; j < 256; ++j)
    if ((v.w[j >> 6] >> (j & 63)) & 1)
      for (int q = 0; q < 4; ++q) r.w[q] ^= m[j].w[q];
  return r;
}

// M^(2^k) for k = 0 .. 63, built once (about 64 matrix squarings).
const std::vector<Matrix256>& step_powers() {
  static const std::vector<Matrix256> powers = [] {
    std::vector<Matrix256> p(64, Matrix256(256));
    for (int j = 0; j < 256; ++j) {
      uint64_t s[4] = {0, 0, 0, 0};
      s[j >> 6] = uint64_t{1} << (j & 63);
      xoshiro_step(s);  // Rng::next's update, without its output
      p[0][j] = Bits256{{s[0], s[1], s[2], s[3]}};
    }
    for (int k = 1; k < 64; ++k)
      for (int j = 0; j < 256; ++j) p[k][j] = times(p[k - 1], p[k - 1][j]);
    return p;
  }();
  return powers;
}

}  // namespace

namespace detail {
void fill_bell_bf16(uint16_t* v, int64_t n, Rng& rng, float scale, int64_t block) {
  if (block < 1) throw Error("fill_bell_bf16: block must be at least 1 element", ErrorKind::kInternal);
  if (n <= block) {
    for (int64_t i = 0; i < n; ++i) v[i] = spec::bf16_from_f32_rne(rng.bell() * scale);
    return;
  }
  // Block b starts 4 * block * b draws on: its generator is the previous block's, advanced.
  const int64_t blocks = (n + block - 1) / block;
  std::vector<Rng> start;
  start.reserve(static_cast<size_t>(blocks));
  start.push_back(rng);
  for (int64_t b = 1; b < blocks; ++b) {
    start.push_back(start.back());
    start.back().advance(4 * static_cast<uint64_t>(block));
  }
  parallel_for(blocks, 0, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      Rng g = start[static_cast<size_t>(b)];
      const int64_t end = std::min(n, (b + 1) * block);
      for (int64_t i = b * block; i < end; ++i) v[i] = spec::bf16_from_f32_rne(g.bell() * scale);
    }
  });
  rng.advance(4 * static_cast<uint64_t>(n));
}
}  // namespace detail

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  xoshiro_step(s_);
  return result;
}

void Rng::advance(uint64_t steps) {
  const std::vector<Matrix256>& powers = step_powers();
  Bits256 v{{s_[0], s_[1], s_[2], s_[3]}};
  for (int k = 0; k < 64; ++k)
    if ((steps >> k) & 1) v = times(powers[k], v);
  for (int q = 0; q < 4; ++q) s_[q] = v.w[q];
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t Rng::below(uint64_t n) {
  if (n == 0) throw Error("Rng::below(0): no value lies in [0, 0)", ErrorKind::kInternal);
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  uint64_t v;
  do v = next(); while (v >= limit);
  return v % n;
}

float Rng::bell() {
  // Sum of four uniforms: mean 2, variance 1/3; centred and scaled to variance 1.
  const double s = uniform() + uniform() + uniform() + uniform();
  return static_cast<float>((s - 2.0) * 1.7320508075688772);
}

const std::vector<Preset>& presets() {
  //                                  H     I     Is   E    K   R   T
  static const std::vector<Preset> list = {
      {"tiny", {64, 32, 32, 8, 2, 2, 8}, "smallest case with every feature: 2 ranks, shared expert"},
      {"small", {128, 64, 64, 16, 4, 4, 32}, "a few hundred routed rows over 4 ranks"},
      {"dsv3-mini", {512, 128, 128, 64, 8, 8, 64},
       "DeepSeek-V3 ratios scaled down: 64 experts, top-8, one shared expert, 8 ranks"},
      {"qwen3-mini", {256, 96, 0, 32, 8, 4, 64}, "Qwen3-MoE ratios scaled down: no shared expert, top-8"},
  };
  return list;
}

spec::LayerConfig preset_config(const std::string& name) {
  std::string names;
  for (const Preset& p : presets()) {
    if (name == p.name) return p.cfg;
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  throw Error("unknown preset '" + name + "'; choose one of: " + names);
}

// Shortest text that reads back as the same double (e.g. "0.2", not "0.20000000000000001").
std::string shortest(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

std::string RoutingSpec::describe() const {
  std::ostringstream out;
  switch (kind) {
    case Kind::kUniform: out << "uniform"; break;
    case Kind::kZipf: out << "zipf:" << shortest(zipf_s); break;
    case Kind::kHot: out << "hot:" << hot_count << ":" << shortest(hot_factor); break;
  }
  if (rank_skew > 0) out << ",rank-skew:" << shortest(rank_skew);
  if (empty_prob > 0) out << ",empty:" << shortest(empty_prob);
  return out.str();
}

RoutingSpec parse_routing(const std::string& text) {
  RoutingSpec r;
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (head == "uniform" && colon == std::string::npos) {
    r.kind = RoutingSpec::Kind::kUniform;
  } else if (head == "zipf" && !rest.empty()) {
    r.kind = RoutingSpec::Kind::kZipf;
    r.zipf_s = parse_number(rest, text);
    if (r.zipf_s <= 0 || r.zipf_s > 8)
      throw Error("routing '" + text + "': the Zipf exponent S is " + rest + "; it must be in (0, 8], e.g. zipf:1.2");
  } else if (head == "hot" && !rest.empty()) {
    r.kind = RoutingSpec::Kind::kHot;
    const auto c2 = rest.find(':');
    const double n = parse_number(rest.substr(0, c2), text);
    if (n < 1 || n > (1 << 20) || n != static_cast<double>(static_cast<int64_t>(n)))
      throw Error("routing '" + text + "': hot:N needs a whole number N of hot experts in [1, 2^20], not " +
                  rest.substr(0, c2) + "; e.g. hot:4");
    r.hot_count = static_cast<int64_t>(n);
    if (c2 != std::string::npos) r.hot_factor = parse_number(rest.substr(c2 + 1), text);
    // Past 1e12 a cold expert is never drawn in any layer this tool can hold; a larger F (N x F
    // overflowing a double at 1e308) made every draw pick the last expert instead of a random one.
    if (r.hot_count < 1 || !(r.hot_factor >= 1 && r.hot_factor <= 1e12))
      throw Error("routing '" + text + "': hot:N:F needs a factor F in [1, 1e12] (how many times as likely a hot "
                  "expert is as a cold one), not " + rest.substr(c2 + 1) + "; e.g. hot:4:8");
  } else {
    throw Error("unknown routing '" + text + "'; use uniform, zipf:S (e.g. zipf:1.2), hot:N or hot:N:F");
  }
  return r;
}

void check_routing(const spec::LayerConfig& cfg, const RoutingSpec& routing) {
  // The same ranges parse_routing() enforces, for a RoutingSpec built in code (NaN included:
  // every comparison with it is false, so each test is written to fail for it).
  if (routing.kind == RoutingSpec::Kind::kZipf && !(routing.zipf_s > 0 && routing.zipf_s <= 8))
    throw Error("routing zipf:S: the exponent S must be in (0, 8]");
  if (routing.kind == RoutingSpec::Kind::kHot &&
      !(routing.hot_count >= 1 && routing.hot_factor >= 1 && std::isfinite(routing.hot_factor)))
    throw Error("routing hot:N:F: N must be at least 1 and F a finite factor of at least 1");
  if (routing.kind == RoutingSpec::Kind::kHot && routing.hot_count > cfg.num_experts)
    throw Error("routing " + routing.describe() + ": " + std::to_string(routing.hot_count) +
                " hot experts but the layer has E = " + std::to_string(cfg.num_experts) + "; lower N to at most " +
                std::to_string(cfg.num_experts));
  if (!(routing.rank_skew >= 0 && routing.rank_skew <= 1 && routing.empty_prob >= 0 && routing.empty_prob <= 1))
    throw Error("routing: rank skew and empty-slot probability must be in [0, 1]");
}

TensorMap generate_inputs(const spec::LayerConfig& cfg, const RoutingSpec& routing, uint64_t seed) {
  const spec::Status status = cfg.validate();
  if (!status.ok) throw Error(status.message);
  check_routing(cfg, routing);
  const int64_t G = cfg.num_tokens(), H = cfg.hidden, I = cfg.intermediate,
                Is = cfg.shared_intermediate, E = cfg.num_experts, K = cfg.top_k;
  Rng rng(seed);
  TensorMap m;

  // Expert popularity: a seeded permutation decides which experts are hot.
  std::vector<double> weight(E, 1.0);
  std::vector<int64_t> perm(E);
  for (int64_t e = 0; e < E; ++e) perm[e] = e;
  for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[rng.below(e + 1)]);
  for (int64_t r = 0; r < E; ++r) {
    const int64_t e = perm[r];
    if (routing.kind == RoutingSpec::Kind::kZipf) weight[e] = 1.0 / std::pow(static_cast<double>(r + 1), routing.zipf_s);
    if (routing.kind == RoutingSpec::Kind::kHot) weight[e] = r < routing.hot_count ? routing.hot_factor : 1.0;
  }

  Tensor topk(DType::kI32, {G, K});
  Tensor rw(DType::kF32, {G, K});
  int32_t* tk = topk.data<int32_t>();
  float* w = rw.data<float>();
  const int64_t e_local = cfg.experts_per_rank();
  std::vector<double> avail(E);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t home = cfg.token_rank(g) % cfg.num_ranks;
    for (int64_t e = 0; e < E; ++e) avail[e] = weight[e];
    for (int64_t k = 0; k < K; ++k) {
      const bool local = routing.rank_skew > 0 && rng.uniform() < routing.rank_skew;
      // Sample without replacement, proportional to the remaining weights of the pool.
      const int64_t lo = local ? home * e_local : 0, hi = local ? lo + e_local : E;
      double total = 0;
      for (int64_t e = lo; e < hi; ++e) total += avail[e];
      int64_t pick = -1;
      if (total > 0) {
        double u = rng.uniform() * total;
        for (int64_t e = lo; e < hi; ++e) {
          if (avail[e] <= 0) continue;
          pick = e;
          if (u < avail[e]) break;
          u -= avail[e];
        }
      }
      if (pick < 0) {  // the local pool is used up: fall back to the whole pool
        double all = 0;
        for (int64_t e = 0; e < E; ++e) all += avail[e];
        double u = rng.uniform() * all;
        for (int64_t e = 0; e < E; ++e) {
          if (avail[e] <= 0) continue;
          pick = e;
          if (u < avail[e]) break;
          u -= avail[e];
        }
      }
      avail[pick] = 0;
      tk[g * K + k] = static_cast<int32_t>(pick);
    }
    for (int64_t k = 0; k < K; ++k)
      if (routing.empty_prob > 0 && rng.uniform() < routing.empty_prob) tk[g * K + k] = -1;
    // Router weights: softmax of random logits over the non-empty slots (fp32, spec exp).
    float logits[64], total = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      logits[k] = spec::exp_f32(rng.bell());
      if (tk[g * K + k] >= 0) total = spec::fadd(total, logits[k]);
    }
    for (int64_t k = 0; k < K; ++k) w[g * K + k] = tk[g * K + k] >= 0 ? spec::fdiv(logits[k], total) : 0.0f;
  }

  Tensor x(DType::kBf16, {G, H});
  fill_bell_bf16(x, rng, 1.0f);
  const float scale_h = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  const float scale_i = static_cast<float>(1.0 / std::sqrt(static_cast<double>(I)));
  Tensor wrg(DType::kBf16, {E, I, H}), wru(DType::kBf16, {E, I, H}), wrd(DType::kBf16, {E, H, I});
  fill_bell_bf16(wrg, rng, scale_h);
  fill_bell_bf16(wru, rng, scale_h);
  fill_bell_bf16(wrd, rng, scale_i);
  m["inputs/x"] = std::move(x);
  m["inputs/topk_experts"] = std::move(topk);
  m["inputs/router_weights"] = std::move(rw);
  m["inputs/w_routed_gate"] = std::move(wrg);
  m["inputs/w_routed_up"] = std::move(wru);
  m["inputs/w_routed_down"] = std::move(wrd);
  if (Is > 0) {
    const float scale_s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Is)));
    Tensor sg(DType::kBf16, {Is, H}), su(DType::kBf16, {Is, H}), sd(DType::kBf16, {H, Is});
    fill_bell_bf16(sg, rng, scale_h);
    fill_bell_bf16(su, rng, scale_h);
    fill_bell_bf16(sd, rng, scale_s);
    m["inputs/w_shared_gate"] = std::move(sg);
    m["inputs/w_shared_up"] = std::move(su);
    m["inputs/w_shared_down"] = std::move(sd);
  }
  Tensor d_out(DType::kBf16, {G, H});
  fill_bell_bf16(d_out, rng, 1.0f);
  m["inputs/d_output"] = std::move(d_out);
  return m;
}

}  // namespace mok::ref
