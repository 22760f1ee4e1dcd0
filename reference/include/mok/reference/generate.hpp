// Case generation for goldens: config presets, routing generators and fresh random inputs.
#pragma once

#include "mok/reference/tensor.hpp"
#include "mok/spec/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace mok::ref {

// Version of the generators below: bumped whenever a seed would produce different bytes.
inline constexpr const char* kGeneratorVersion = "gen-v2";

// Deterministic 64-bit generator (xoshiro256**, seeded through splitmix64); no libm.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();                      // [0, 1), 53 random bits
  uint64_t below(uint64_t n);            // [0, n), unbiased
  float bell();                          // mean 0, variance 1 (Irwin-Hall of 4 uniforms)
  // The state next() would reach after `steps` calls, in at most 64 products of a 256 x 256 bit
  // matrix with the state (the generator's step is linear over GF(2)); lets a long fill be split
  // into blocks that start at known states and run on several threads with the serial bytes.
  void advance(uint64_t steps);

 private:
  uint64_t s_[4];
};

struct Preset {
  const char* name;
  spec::LayerConfig cfg;
  const char* what;
};
const std::vector<Preset>& presets();
// Throws mok::Error listing the preset names when `name` is unknown.
spec::LayerConfig preset_config(const std::string& name);

// Routing recipe, parsed from "uniform" | "zipf:S" | "hot:N[:F]" plus options.
struct RoutingSpec {
  enum class Kind { kUniform, kZipf, kHot } kind = Kind::kUniform;
  double zipf_s = 1.0;        // zipf:S, popularity of the r-th expert ~ 1/(r+1)^S
  int64_t hot_count = 0;      // hot:N, N hot experts ...
  double hot_factor = 16.0;   // ... each F times as likely as a cold one
  double rank_skew = 0.0;     // probability that a slot picks among its own rank's experts
  double empty_prob = 0.0;    // probability that a slot is empty (-1)

  std::string describe() const;  // canonical text, stored in the golden's `routing` attribute
};
// Parses the distribution part ("uniform", "zipf:1.2", "hot:4", "hot:4:8"); mok::Error on bad text.
RoutingSpec parse_routing(const std::string& text);
// mok::Error (bad input) when the routing cannot be drawn for this layer (more hot experts than
// E, a value out of range); generate_inputs() checks the same, this lets a tool check first.
void check_routing(const spec::LayerConfig& cfg, const RoutingSpec& routing);

// Fresh random inputs for a config: x, d_output ~ bell; weights ~ bell/sqrt(fan_in); routing by
// `routing`; router weights = softmax over the token's non-empty slots of random logits
// (spec::exp_f32, so the bytes do not depend on libm). Every value is rounded through the
// stored dtype. Returns "inputs/..." tensors. Deterministic in (cfg, routing, seed).
// A tensor of more than 2^18 elements is filled in blocks on up to hardware-concurrency threads,
// each block from its own advanced copy of the one generator: the bytes are the serial fill's.
TensorMap generate_inputs(const spec::LayerConfig& cfg, const RoutingSpec& routing, uint64_t seed);

namespace detail {
// v[i] = bf16(bell() * scale) for i in [0, n), draws 4i .. 4i+3 of rng, which ends 4n draws on;
// blocks of `block` (>= 1, else mok::Error) elements go to parallel_for when n > block. For tests.
void fill_bell_bf16(uint16_t* v, int64_t n, Rng& rng, float scale, int64_t block);
}  // namespace detail

}  // namespace mok::ref
