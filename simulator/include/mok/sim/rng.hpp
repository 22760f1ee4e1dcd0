// Deterministic random numbers: xoshiro256** seeded by splitmix64, with hand-written
// distributions so that the same seed gives the same numbers on every platform and library.
#pragma once

#include <cmath>
#include <cstdint>

namespace mok::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : state_) s = splitmix64(x);
  }
  // Derives an independent stream for a sub-task (trial, rank) without touching this one.
  static Rng derive(uint64_t seed, uint64_t stream_idx) {
    uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (stream_idx + 1));
    return Rng(splitmix64(x));
  }
  // The generator's state, for code that advances several streams side by side (it must give
  // the same numbers as next_u64() on each): state() reads it, from_state() resumes from it.
  void state(uint64_t out[4]) const {
    for (int i = 0; i < 4; ++i) out[i] = state_[i];
  }
  static Rng from_state(const uint64_t in[4]) {
    Rng r(0);
    for (int i = 0; i < 4; ++i) r.state_[i] = in[i];
    return r;
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; the tiny bias is irrelevant here
  // and the result is still a pure function of the seed).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  // Gamma(shape, 1) by Marsaglia-Tsang (shape < 1 boosted), for Dirichlet draws.
  double gamma(double shape) {
    if (shape < 1.0) {
      const double u = uniform();
      return gamma(shape + 1.0) * std::pow(u > 0 ? u : 0x1.0p-53, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * (x * x) * (x * x)) return d * v;
      if (std::log(u > 0 ? u : 0x1.0p-53) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }
  // Standard normal by Box-Muller (one value per call; deterministic).
  double normal() {
    double u1 = uniform();
    if (u1 <= 0.0) u1 = 0x1.0p-53;
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_[4];
};

}  // namespace mok::sim
