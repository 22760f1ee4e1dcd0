// The end-to-end forward oracle: the layer's output from the inputs alone, without the
// profile's roundings, and a radius that covers every implementation of bf16-v1 fed only the
// inputs (the error analysis is written out in reference/README.md, "End to end").
#include "mok/reference/oracle.hpp"
#include "mok/reference/validate.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/exact_sum.hpp"
#include "mok/reference/parallel.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/mma_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mok::ref {
namespace {

using spec::f32_from_bf16;

constexpr double kSlack = 1.0 + 0x1.0p-20;  // covers the double roundings of the radii themselves
constexpr double kSiluLipschitz = 1.1;      // sup |silu'(x)| = 1.0998... (at x = 2.3994...)

int bf16_exp(uint16_t b) {
  const int ef = (b >> 7) & 0xFF;
  return ef == 0 ? -126 : ef - 127;
}

// Half an ulp of any value of magnitude at most m, rounded to nearest with `bits` significand bits
// (24: fp32, 8: bf16), subnormals included (their ulp is that of 2^-126).
double half_ulp(double m, int bits) {
  return std::ldexp(1.0, std::max(m > 0 ? std::ilogb(m * kSlack) : -126, -126) - bits);
}

// Adds a * b to s: the rounded product and its error (an fma recovers it exactly unless it
// underflows). Pieces below 2^-300 are dropped, since ExactSum holds bits down to 2^-352 only;
// that is at most 2^-299 per product, which the callers' radii add (kDropped), far below fp32's
// smallest subnormal (2^-149).
constexpr double kDropped = 0x1.0p-299;
void add_product(ExactSum& s, double a, double b) {
  const double p = a * b;
  if (!(std::fabs(p) >= 0x1.0p-300)) return;
  s.add(p);
  const double e = std::fma(a, b, -p);
  if (std::fabs(e) >= 0x1.0p-300) s.add(e);
}

struct Chain {
  double value;   // the exact sum of the true operands' products, rounded to double
  double radius;  // |any implementation's chain - value|
  double abs;     // a bound on the sum of the implementation's |products|
};

// A dot chain (ORDER: dot-chain, kMmaK products per MMA step) whose A operand is known only as a
// true value a[i] with a radius ra[i] (the implementation's bf16 operand lies within it), and
// whose B operand is an exact bf16 input. The radius adds (1) the operands' radii times |b|,
// (2) each MMA step's truncations as the oracle's Element bounds them, with the step's largest
// alignment exponent and the running magnitude taken from the operands' bounds, and (3) the
// rounding of the exact sum to double.
Chain bounded_chain(const double* a, const double* ra, const uint16_t* b, int64_t b_stride, int64_t n) {
  ExactSum sum;
  double propagated = 0.0, arith = 0.0, abs_bound = 0.0;
  int64_t products = 0;
  for (int64_t k0 = 0; k0 < n; k0 += spec::kMmaK) {
    const int64_t len = std::min<int64_t>(spec::kMmaK, n - k0);
    int max_exp = std::numeric_limits<int>::min();
    int count = 0;
    const double before = abs_bound + arith;  // bounds the implementation's running value
    for (int64_t i = k0; i < k0 + len; ++i) {
      const uint16_t bb = b[i * b_stride];
      const double bv = f32_from_bf16(bb);
      const double amax = std::fabs(a[i]) + ra[i];  // the implementation's |a| is at most this
      if (bv == 0.0 || amax == 0.0) continue;
      add_product(sum, a[i], bv);
      ++products;
      propagated += ra[i] * std::fabs(bv);
      abs_bound += amax * std::fabs(bv);
      // A bf16 operand below amax has an exponent field of at most ilogb(amax); subnormals align at -126.
      max_exp = std::max(max_exp, std::max(std::ilogb(amax * kSlack), -126) + bf16_exp(bb));
      ++count;
    }
    if (before > 0) {
      max_exp = std::max({max_exp, std::ilogb(before * kSlack), -126});
      ++count;
    }
    if (count == 0) continue;
    max_exp = std::max(max_exp, spec::kMmaZeroExp);
    arith += count * std::ldexp(1.0, max_exp - 25) + 0x1.0p-23 * (abs_bound + arith) * kSlack + 0x1.0p-149;
  }
  const double value = sum.to_double();
  const double radius = (propagated + arith + 0x1.0p-52 * std::fabs(value) + products * kDropped) * kSlack;
  return {value, radius, abs_bound + arith};
}

// An MMA chain over two exact bf16 operands (gate and up over H): the exact sum and the same
// per-step radius, as bounded_chain with zero operand radii.
Chain exact_chain(const uint16_t* a, const uint16_t* b, int64_t n, std::vector<double>& av, std::vector<double>& zero) {
  av.resize(n);
  zero.assign(n, 0.0);
  for (int64_t i = 0; i < n; ++i) av[i] = f32_from_bf16(a[i]);
  return bounded_chain(av.data(), zero.data(), b, 1, n);
}

// silu in double: the value the oracle calls true.
double silu(double x) { return x / (1.0 + std::exp(-x)); }

// act = rn_bf16(rn(silu_f32(g) * u)) for g, u within (rg, ru) of their true values: the true
// product silu(g) * u and a radius for the implementation's act.
//  - silu_f32 (spec/math.hpp) within 2^-18 relative plus 2^-118 of the real silu (the
//    reference's tests sweep it against long double);
//  - silu is 1.1-Lipschitz, so g's radius moves it by at most 1.1 rg;
//  - one fp32 rounding of the product, one bf16 rounding, and the double evaluation here.
void act_bound(double g, double rg, double u, double ru, double* act, double* radius) {
  const double s = silu(g);
  const double t = s * u;
  const double s_true = std::fabs(s) * (1 + 0x1.0p-40);        // |silu(g)| for the real g
  const double s_impl = s_true + kSiluLipschitz * rg;           // |silu| at the implementation's g
  const double u_impl = std::fabs(u) + ru;
  const double silu_err = 0x1.0p-18 * s_impl + 0x1.0p-118;      // silu_f32 against the real silu
  double r = (silu_err + kSiluLipschitz * rg) * u_impl + s_true * ru + 0x1.0p-44 * std::fabs(t);
  r += half_ulp(std::fabs(t) + r, 24);  // fmul
  r += half_ulp(std::fabs(t) + r, 8);   // bf16
  *act = t;
  *radius = r * kSlack;
}

}  // namespace

TensorMap oracle_forward_end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs,
                                    const OracleOptions& options) {
  validate_inputs(cfg, inputs, /*backward=*/false, "end-to-end oracle inputs");
  if (options.sample) validate_sample(cfg, *options.sample, "end-to-end oracle");
  if (options.num_threads < 0 || options.num_threads > 4096)
    throw Error("end-to-end oracle: num_threads = " + std::to_string(options.num_threads) +
                "; use 0 (all cores) to 4096");
  const int threads = resolve_threads(options.num_threads);
  const Sample* sample = options.sample;
  const int64_t G = cfg.num_tokens(), H = cfg.hidden, I = cfg.intermediate, Is = cfg.shared_intermediate,
                K = cfg.top_k;
  const bool shared = Is > 0;
  auto in16 = [&](const char* p) { return at(inputs, p).data<uint16_t>(); };
  const uint16_t* x = in16("inputs/x");
  const uint16_t* wrg = in16("inputs/w_routed_gate");
  const uint16_t* wru = in16("inputs/w_routed_up");
  const uint16_t* wrd = in16("inputs/w_routed_down");
  const uint16_t* wsg = shared ? in16("inputs/w_shared_gate") : nullptr;
  const uint16_t* wsu = shared ? in16("inputs/w_shared_up") : nullptr;
  const uint16_t* wsd = shared ? in16("inputs/w_shared_down") : nullptr;
  const int32_t* topk = at(inputs, "inputs/topk_experts").data<int32_t>();
  const float* rw = at(inputs, "inputs/router_weights").data<float>();

  const std::string checked = "outputs/output";
  const std::vector<int64_t> shape = spec_shape(*find_spec(checked), cfg);
  Tensor ex(DType::kF32, shape), bd(DType::kF32, shape);
  float* exact_out = ex.data<float>();
  float* bound_out = bd.data<float>();
  std::fill(exact_out, exact_out + ex.numel(), std::numeric_limits<float>::quiet_NaN());
  std::fill(bound_out, bound_out + bd.numel(), std::numeric_limits<float>::quiet_NaN());

  parallel_for(G, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> av, zero, act, act_r, y(K * H), y_r(K * H), so(H), so_r(H);
    // The SwiGLU of one row over n columns: gate and up chains over H from x, then act_bound.
    auto swiglu = [&](const uint16_t* x_row, const uint16_t* wg, const uint16_t* wu, int64_t n) {
      act.resize(n);
      act_r.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        const Chain g = exact_chain(x_row, wg + j * H, H, av, zero);
        const Chain u = exact_chain(x_row, wu + j * H, H, av, zero);
        act_bound(g.value, g.radius, u.value, u.radius, &act[j], &act_r[j]);
      }
    };
    for (int64_t g = begin; g < end; ++g) {
      if (sample && !sample->token_mask[g]) continue;
      const uint16_t* x_row = x + g * H;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = topk[g * K + k];
        if (e < 0) continue;
        swiglu(x_row, wrg + e * I * H, wru + e * I * H, I);
        for (int64_t h = 0; h < H; ++h) {
          const Chain c = bounded_chain(act.data(), act_r.data(), wrd + (e * H + h) * I, 1, I);
          y[k * H + h] = c.value;
          // y is stored as bf16 (and the true value's double rounding is inside c.radius).
          y_r[k * H + h] = (c.radius + half_ulp(std::fabs(c.value) + c.radius, 8)) * kSlack;
        }
      }
      if (shared) {
        swiglu(x_row, wsg, wsu, Is);
        for (int64_t h = 0; h < H; ++h) {
          const Chain c = bounded_chain(act.data(), act_r.data(), wsd + h * Is, 1, Is);
          so[h] = c.value;  // shared_out stays fp32: no rounding past the chain's own
          so_r[h] = c.radius;
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        // ORDER: combine-slots: acc = shared_out, then one fp32 fma per non-empty slot, then bf16.
        ExactSum sum;
        double r = 0.0, mag = 0.0;
        if (shared) {
          add_product(sum, so[h], 1.0);
          r = kDropped;
          r += so_r[h];
          mag = std::fabs(so[h]);
        }
        for (int64_t k = 0; k < K; ++k) {
          if (topk[g * K + k] < 0) continue;
          const double w = rw[g * K + k];
          add_product(sum, w, y[k * H + h]);
          r += std::fabs(w) * y_r[k * H + h] + kDropped;
          mag += std::fabs(w * y[k * H + h]);
          r += half_ulp(mag + r, 24);  // the fma's rounding
        }
        const double value = sum.to_double();
        r += 0x1.0p-52 * std::fabs(value);
        r += half_ulp(std::fabs(value) + r, 8);  // the output's bf16 rounding
        // Stored as fp32: the storage rounding joins the radius, which is rounded up.
        const float v32 = static_cast<float>(value);
        const double rr = (r + std::fabs(static_cast<double>(v32) - value)) * kSlack;
        float b32 = static_cast<float>(rr);
        if (static_cast<double>(b32) < rr) b32 = std::nextafter(b32, std::numeric_limits<float>::infinity());
        exact_out[g * H + h] = v32;
        bound_out[g * H + h] = b32;
      }
    }
  }, 1);

  TensorMap out;
  out[bound_exact_path(checked)] = std::move(ex);
  out[bound_radius_path(checked)] = std::move(bd);
  return out;
}

}  // namespace mok::ref
