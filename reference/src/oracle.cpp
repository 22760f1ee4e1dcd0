// The oracle: exact sums (ExactSum) and per-element error radii for every output and gradient.
#include "mok/reference/oracle.hpp"
#include "mok/reference/validate.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/exact_sum.hpp"
#include "mok/reference/parallel.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/mma_model.hpp"
#include "mok/spec/orders.hpp"
#include "mok/spec/routing_plan.hpp"
#include "oracle_scalar.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace mok::ref {
namespace {

using spec::f32_from_bf16;

constexpr double kSlack = 1.0 + 0x1.0p-20;  // covers the double roundings of the bound itself

// The smallest fp32 at or above v (v >= 0 and finite, or +inf).
float round_up_f32(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

int bf16_exp(uint16_t b) {
  const int ef = (b >> 7) & 0xFF;
  return ef == 0 ? -126 : ef - 127;
}

// One element: exact sum of its terms, Σ|terms| and the radius accumulated so far.
class Element {
 public:
  // An MMA dot chain (ORDER: dot-chain), continuing from the current value.
  void mma_chain(const uint16_t* a, int64_t a_stride, const uint16_t* b, int64_t b_stride, int64_t n) {
    for (int64_t k0 = 0; k0 < n; k0 += spec::kMmaK) {
      const int64_t len = std::min<int64_t>(spec::kMmaK, n - k0);
      int max_exp = std::numeric_limits<int>::min();
      int count = 0;
      const double before = abs_sum_ + radius_;  // bounds |running value|
      for (int64_t i = k0; i < k0 + len; ++i) {
        const uint16_t ab = a[i * a_stride], bb = b[i * b_stride];
        const double p = static_cast<double>(f32_from_bf16(ab)) * f32_from_bf16(bb);  // exact
        if (p == 0.0) continue;
        sum_.add(p);
        abs_sum_ += std::fabs(p);
        max_exp = std::max(max_exp, bf16_exp(ab) + bf16_exp(bb));
        ++count;
      }
      if (before > 0) {  // the accumulator is a term too; its exponent is at most log2(before)
        // A subnormal accumulator aligns at -126, above its own magnitude.
        max_exp = std::max({max_exp, std::ilogb(before * kSlack), -126});
        ++count;
      }
      if (count == 0) continue;
      // Zero terms (zero operands, short steps) align at -133 and can raise E that far.
      max_exp = std::max(max_exp, spec::kMmaZeroExp);
      // Term truncation (< one unit of 2^(E-25) per term) plus truncation of the step's
      // result to fp32 (< one ulp of a value bounded by Σ|terms|).
      radius_ += count * std::ldexp(1.0, max_exp - 25) + 0x1.0p-23 * (abs_sum_ + radius_) * kSlack + 0x1.0p-149;
    }
  }
  // One fp32 fma (or add, when weight is 1) with round-to-nearest: error <= half an ulp.
  void rounded_term(double weight, double value) {
    const double p = weight * value;  // exact: fp32 * bf16 fits in 53 bits
    sum_.add(p);
    abs_sum_ += std::fabs(p);
    radius_ += 0x1.0p-24 * (abs_sum_ + radius_) * kSlack + 0x1.0p-150;
  }
  // A plain term that adds no rounding of its own (lane sums account for it separately).
  void exact_term(double p) {
    sum_.add(p);
    abs_sum_ += std::fabs(p);
  }
  void add_radius(double r) { radius_ += r; }
  double exact() const { return sum_.to_double(); }
  // The exact sum rounded to odd in double (truncated, with the last bit set when anything was
  // dropped): rounding that once more to 24 or 8 bits gives the correctly rounded value.
  double exact_odd() const {
    const double d = sum_.to_double();
    ExactSum rest = sum_;
    rest.add(-d);  // exact: d's bits lie within the sum's range
    if (rest.is_zero()) return d;
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    if (bits & 1) return d;  // already odd: the truncation's neighbour with the set last bit
    bool below = false;      // the exact sum lies below d
    uint32_t digits[ExactSum::kLimbs];
    rest.digits(&below, digits);
    return std::nextafter(d, below ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity());
  }
  double radius() const { return radius_; }
  double abs_sum() const { return abs_sum_; }
  // Rounding of the final fp32 value to bf16 (half an ulp of bf16, subnormals included).
  void round_to_bf16() {
    const double v = std::fabs(sum_.to_double()) + radius_;
    radius_ += 0x1.0p-8 * v * kSlack + 0x1.0p-134;
  }
  // exact (this element's exact(), computed once by the caller) rounded once to fp32, and the
  // radius including that storage rounding, rounded up; with terms, Σ|terms| of the last stage
  // rounded up too.
  void finish(double exact, float* exact_out, float* bound_out, float* terms_out = nullptr) const {
    const float e32 = static_cast<float>(exact);
    const double storage = std::fabs(static_cast<double>(e32) - exact) + 0x1.0p-52 * std::fabs(exact);
    *exact_out = e32;
    *bound_out = round_up_f32((radius_ + storage) * kSlack);
    if (terms_out) *terms_out = round_up_f32(abs_sum_ * kSlack);
  }

 private:
  ExactSum sum_;
  double abs_sum_ = 0.0;
  double radius_ = 0.0;
};

const float kNan = std::numeric_limits<float>::quiet_NaN();

// v (finite) rounded once to nearest-even bf16 (8 significant bits, subnormals below 2^-126,
// +-Inf from 2^128 less a quarter ulp up), as bf16 bits.
uint16_t bf16_bits_of(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a == 0.0) return sign;
  const int e = std::max(std::ilogb(a), -126);
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, 7 - e)), e - 7);  // exact in double
  if (r >= 0x1.0p128) return sign | 0x7F80;
  return sign | spec::bf16_from_f32_rne(static_cast<float>(r));  // r fits bf16: exact
}
// v (finite) rounded once to nearest-even fp32.
float f32_of(double v) {
  if (std::fabs(v) >= 0x1.ffffffp127) return std::copysign(std::numeric_limits<float>::infinity(), v);
  return static_cast<float>(v);
}

// What an error about one of the oracle's own values says where it is: the caller's origin and the
// element's coordinates.
struct Naming {
  const std::string* origin;
  const spec::LayerConfig* cfg;
  const Tensor* topk_experts;
};

struct Out {
  float* exact = nullptr;
  float* bound = nullptr;
  float* terms = nullptr;    // null unless OracleOptions::terms
  void* rounded = nullptr;   // null unless OracleOptions::rounded; the tensor's dtype (bf16 bits or fp32)
  bool rounded_bf16 = false;
  const TensorSpec* spec = nullptr;  // the tensor bounded
  const Naming* naming = nullptr;
  void set_rounded(int64_t i, double v) const {
    if (!rounded) return;
    if (rounded_bf16) static_cast<uint16_t*>(rounded)[i] = bf16_bits_of(v);
    else static_cast<float*>(rounded)[i] = f32_of(v);
  }
  // An element of the output or a gradient. The bounds do not cover fp32 overflow: where its
  // value or radius reaches 2^127 the oracle stops with an error naming the element, rather than
  // store a value or radius beyond fp32's range (or one an overflowing implementation would seem
  // to break).
  void finish(const Element& el, int64_t i) const {
    const double v = el.exact();
    if (!(std::fabs(v) + el.radius() < 0x1.0p127)) {
      std::ostringstream os;
      os << *naming->origin << ": " << spec->path << " at " << locate(*spec, *naming->cfg, i, naming->topk_experts)
         << ": the oracle's value is " << v << " with radius " << el.radius()
         << ", reaching fp32's range limit (|value| + radius >= 2^127), which the bounds do not cover: the "
            "layer overflows there (its inputs, or the intermediates the oracle starts from, are too large); scale the "
            "inputs down";
      throw Error(os.str());
    }
    put(el, v, i);
  }
  // An intermediate's element: as finish(), except that a value or radius reaching 2^127 is left
  // NaN (not judged): its operands' own stage is where such a reference fails.
  void finish_in_range(const Element& el, int64_t i) const {
    const double v = el.exact();
    if (std::fabs(v) + el.radius() < 0x1.0p127) put(el, v, i);
  }
  void put(const Element& el, double v, int64_t i) const {
    el.finish(v, exact + i, bound + i, terms ? terms + i : nullptr);
    if (rounded) set_rounded(i, el.exact_odd());
  }
  // An elementwise intermediate's bounded value; the storage rounding of the exact value joins the
  // radius, which is rounded up (as the end-to-end oracle stores its values).
  void store(const oracle_scalar::Bounded& b, int64_t i) const {
    if (!(std::fabs(b.v) + b.r < 0x1.0p127)) return;
    const float v32 = static_cast<float>(b.v);
    exact[i] = v32;
    bound[i] = round_up_f32((b.r + std::fabs(static_cast<double>(v32) - b.v)) * kSlack);
    set_rounded(i, b.v);
  }
  // An element that is exactly 0 (an empty slot's).
  void zero(int64_t i) const {
    exact[i] = 0.0f;
    bound[i] = 0.0f;
    if (terms) terms[i] = 0.0f;
    set_rounded(i, 0.0);
  }
};

bool all_finite_bf16(const uint16_t* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!spec::bf16_is_finite(v[i])) return false;
  return true;
}

}  // namespace

std::string bound_rounded_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  return "bounds/" + (slash == std::string::npos ? path : path.substr(slash + 1)) + "_rounded";
}

ChainBound dot_chain_bound(const uint16_t* a, int64_t a_stride, const uint16_t* b, int64_t b_stride, int64_t n) {
  Element el;
  el.mma_chain(a, a_stride, b, b_stride, n);
  return {el.exact(), el.radius()};
}

TensorMap oracle_bounds(const spec::LayerConfig& cfg, const TensorMap& inputs,
                        const TensorMap& reference, const OracleOptions& options) {
  // The same checks as emulate(): a bad operand is a named error, never an out-of-bounds access.
  const bool need_backward = reference.count("grads/d_x") > 0 || reference.count("intermediates/dy") > 0;
  validate_inputs(cfg, inputs, need_backward, "oracle inputs");
  validate_shapes(cfg, reference, "oracle reference");
  check_oracle_operands(cfg, reference, &at(inputs, "inputs/topk_experts"), need_backward,
                        options.origin + ": " + options.reference_name, options.reference_fix);
  if (options.sample) validate_sample(cfg, *options.sample, "oracle");
  if (options.num_threads < 0 || options.num_threads > 4096)
    throw Error("oracle: num_threads = " + std::to_string(options.num_threads) + "; use 0 (all cores) to 4096");
  const int threads = resolve_threads(options.num_threads);
  const Sample* sample = options.sample;
  const int64_t G = cfg.num_tokens(), H = cfg.hidden, I = cfg.intermediate,
                Is = cfg.shared_intermediate, E = cfg.num_experts, K = cfg.top_k,
                R = cfg.num_ranks, T = cfg.tokens_per_rank;
  const bool shared = Is > 0;
  const bool backward = reference.count("grads/d_x") > 0 || reference.count("intermediates/dy") > 0;
  auto in16 = [&](const char* p) { return at(inputs, p).data<uint16_t>(); };
  auto ref16 = [&](const char* p) { return at(reference, p).data<uint16_t>(); };
  const int32_t* topk = at(inputs, "inputs/topk_experts").data<int32_t>();
  const float* rw = at(inputs, "inputs/router_weights").data<float>();

  const Naming naming{&options.origin, &cfg, &at(inputs, "inputs/topk_experts")};
  TensorMap out;
  // The bound datasets of a checked tensor or intermediate, NaN-filled (not sampled); the terms
  // only for the checked tensors.
  auto make = [&](const std::string& checked) -> Out {
    const TensorSpec* s = find_spec(checked);
    const bool is_checked = s->role == Role::kOutput || s->role == Role::kGrad;
    const auto shape = spec_shape(*s, cfg);
    Tensor ex(DType::kF32, shape), bd(DType::kF32, shape);
    std::fill(ex.data<float>(), ex.data<float>() + ex.numel(), kNan);
    std::fill(bd.data<float>(), bd.data<float>() + bd.numel(), kNan);
    const std::string pe = bound_exact_path(checked), pb = bound_radius_path(checked);
    out[pe] = std::move(ex);
    out[pb] = std::move(bd);
    float* terms = nullptr;
    if (options.terms && is_checked) {
      const std::string pt = bound_terms_path(checked);
      Tensor tm(DType::kF32, shape);
      std::fill(tm.data<float>(), tm.data<float>() + tm.numel(), kNan);
      out[pt] = std::move(tm);
      terms = out[pt].data<float>();
    }
    void* rounded = nullptr;
    if (options.rounded) {
      const std::string pr = bound_rounded_path(checked);
      Tensor rt(s->dtype, shape);
      if (s->dtype == DType::kBf16)
        std::fill(rt.data<uint16_t>(), rt.data<uint16_t>() + rt.numel(), spec::kBf16QuietNanBits);
      else
        std::fill(rt.data<float>(), rt.data<float>() + rt.numel(), kNan);
      out[pr] = std::move(rt);
      rounded = out[pr].raw();
    }
    return {out[pe].data<float>(), out[pb].data<float>(), terms, rounded, s->dtype == DType::kBf16, s, &naming};
  };
  auto token_ok = [&](int64_t g) { return !sample || sample->token_mask[g]; };

  // Forward output: shared chain over Is (from shared_act), then the slot fmas.
  {
    Out o = make("outputs/output");
    const uint16_t* y = ref16("intermediates/y");
    const uint16_t* sa = shared ? ref16("intermediates/shared_act") : nullptr;
    const uint16_t* wsd = shared ? in16("inputs/w_shared_down") : nullptr;
    parallel_for(G, threads, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) {
        if (!token_ok(g)) continue;
        for (int64_t h = 0; h < H; ++h) {
          Element el;
          if (shared) el.mma_chain(sa + g * Is, 1, wsd + h * Is, 1, Is);
          for (int64_t k = 0; k < K; ++k)  // ORDER: combine-slots
            if (topk[g * K + k] >= 0) el.rounded_term(rw[g * K + k], f32_from_bf16(y[(g * K + k) * H + h]));
          el.round_to_bf16();
          o.finish(el, g * H + h);
        }
      }
    }, 8);
  }

  // ---- Intermediates (OracleOptions::intermediates), stage-local like the checked tensors: each
  // from the reference's own earlier intermediates and the inputs. Only those the reference holds,
  // with their operands.
  auto has = [&](std::initializer_list<const char*> paths) {
    for (const char* p : paths)
      if (!reference.count(p)) return false;
    return true;
  };
  auto ref32 = [&](const char* p) { return at(reference, p).data<float>(); };
  using oracle_scalar::Bounded;
  // An elementwise step on exact operands: not judged (NaN) when an operand is not finite or the
  // bound leaves fp32's range (oracle_scalar::rounded throws then).
  auto elementwise = [](const Out& o, int64_t idx, std::initializer_list<double> operands, auto&& f) {
    for (double v : operands)
      if (!std::isfinite(v)) return;
    try {
      o.store(f(), idx);
    } catch (const Error&) {
    }
  };
  // Per-slot dot products over n of a routed slot's operand row (at slot), or per-token ones:
  // body(o, g, k_or_minus1) runs for every sampled token and slot.
  auto per_slot = [&](const std::vector<Out>& outs, int64_t width,
                      const std::function<void(int64_t g, int64_t slot, int64_t e)>& body) {
    parallel_for(G, threads, [&](int64_t b, int64_t e_end) {
      for (int64_t g = b; g < e_end; ++g) {
        if (!token_ok(g)) continue;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t slot = g * K + k;
          if (topk[slot] < 0) {  // an empty slot's intermediates are exactly 0
            for (const Out& o : outs)
              for (int64_t c = 0; c < width; ++c) o.zero(slot * width + c);
            continue;
          }
          body(g, slot, topk[slot]);
        }
      }
    }, 2);
  };
  auto per_token = [&](const std::function<void(int64_t g)>& body) {
    parallel_for(G, threads, [&](int64_t b, int64_t e_end) {
      for (int64_t g = b; g < e_end; ++g)
        if (token_ok(g)) body(g);
    }, 2);
  };
  const uint16_t* xin = in16("inputs/x");
  if (options.intermediates) {
    const uint16_t* w_rg = in16("inputs/w_routed_gate");
    const uint16_t* w_ru = in16("inputs/w_routed_up");
    const uint16_t* w_rd = in16("inputs/w_routed_down");
    // gate, up: x · W_gate[e]ᵀ, x · W_up[e]ᵀ (fp32 chains over H).
    for (const auto& [path, w] : {std::pair{"intermediates/gate", w_rg}, std::pair{"intermediates/up", w_ru}}) {
      if (!has({path})) continue;
      const Out o = make(path);
      per_slot({o}, I, [&, w = w](int64_t g, int64_t slot, int64_t e) {
        for (int64_t i = 0; i < I; ++i) {
          Element el;  // ORDER: dot-chain over H
          el.mma_chain(xin + g * H, 1, w + (e * I + i) * H, 1, H);
          o.finish_in_range(el, slot * I + i);
        }
      });
    }
    // act = rn(silu(g) u).
    if (has({"intermediates/act", "intermediates/gate", "intermediates/up"})) {
      const Out o = make("intermediates/act");
      const float *gt = ref32("intermediates/gate"), *up = ref32("intermediates/up");
      per_slot({o}, I, [&](int64_t, int64_t slot, int64_t) {
        for (int64_t i = slot * I; i < (slot + 1) * I; ++i)
          elementwise(o, i, {gt[i], up[i]}, [&] { return oracle_scalar::act_of({gt[i], 0.0}, {up[i], 0.0}); });
      });
    }
    // y = rn(act · W_down[e]ᵀ) (chain over I).
    if (has({"intermediates/y", "intermediates/act"})) {
      const Out o = make("intermediates/y");
      const uint16_t* act = ref16("intermediates/act");
      per_slot({o}, H, [&](int64_t, int64_t slot, int64_t e) {
        if (!all_finite_bf16(act + slot * I, I)) return;
        for (int64_t h = 0; h < H; ++h) {
          Element el;  // ORDER: dot-chain over I
          el.mma_chain(act + slot * I, 1, w_rd + (e * H + h) * I, 1, I);
          el.round_to_bf16();
          o.finish_in_range(el, slot * H + h);
        }
      });
    }
    if (shared) {
      const uint16_t* w_sg = in16("inputs/w_shared_gate");
      const uint16_t* w_su = in16("inputs/w_shared_up");
      const uint16_t* w_sd = in16("inputs/w_shared_down");
      for (const auto& [path, w] :
           {std::pair{"intermediates/shared_gate", w_sg}, std::pair{"intermediates/shared_up", w_su}}) {
        if (!has({path})) continue;
        const Out o = make(path);
        per_token([&, w = w](int64_t g) {
          for (int64_t j = 0; j < Is; ++j) {
            Element el;
            el.mma_chain(xin + g * H, 1, w + j * H, 1, H);
            o.finish_in_range(el, g * Is + j);
          }
        });
      }
      if (has({"intermediates/shared_act", "intermediates/shared_gate", "intermediates/shared_up"})) {
        const Out o = make("intermediates/shared_act");
        const float *gt = ref32("intermediates/shared_gate"), *up = ref32("intermediates/shared_up");
        per_token([&](int64_t g) {
          for (int64_t i = g * Is; i < (g + 1) * Is; ++i)
            elementwise(o, i, {gt[i], up[i]}, [&] { return oracle_scalar::act_of({gt[i], 0.0}, {up[i], 0.0}); });
        });
      }
      // shared_out = shared_act · W_sdᵀ (fp32, not rounded).
      if (has({"intermediates/shared_out", "intermediates/shared_act"})) {
        const Out o = make("intermediates/shared_out");
        const uint16_t* sa = ref16("intermediates/shared_act");
        per_token([&](int64_t g) {
          if (!all_finite_bf16(sa + g * Is, Is)) return;
          for (int64_t h = 0; h < H; ++h) {
            Element el;
            el.mma_chain(sa + g * Is, 1, w_sd + h * Is, 1, Is);
            o.finish_in_range(el, g * H + h);
          }
        });
      }
    }
  }
  if (!backward) return out;

  // d_x: shared chain over 2*Is (gate half first), then the slot adds.
  {
    Out o = make("grads/d_x");
    const uint16_t* dx_slot = ref16("intermediates/dx_slot");
    const uint16_t* sdg = shared ? ref16("intermediates/shared_d_gate") : nullptr;
    const uint16_t* sdu = shared ? ref16("intermediates/shared_d_up") : nullptr;
    const uint16_t* wsg = shared ? in16("inputs/w_shared_gate") : nullptr;
    const uint16_t* wsu = shared ? in16("inputs/w_shared_up") : nullptr;
    parallel_for(G, threads, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) {
        if (!token_ok(g)) continue;
        for (int64_t h = 0; h < H; ++h) {
          Element el;
          if (shared) {
            el.mma_chain(sdg + g * Is, 1, wsg + h, H, Is);
            el.mma_chain(sdu + g * Is, 1, wsu + h, H, Is);
          }
          for (int64_t k = 0; k < K; ++k)  // ORDER: dx-slots
            if (topk[g * K + k] >= 0) el.rounded_term(1.0, f32_from_bf16(dx_slot[(g * K + k) * H + h]));
          el.round_to_bf16();
          o.finish(el, g * H + h);
        }
      }
    }, 8);
  }

  // d_router_weights: 32 fma lanes then a 31-add butterfly feeding lane 0 (ORDER: router-grad-lanes).
  {
    Out o = make("grads/d_router_weights");
    const uint16_t* y = ref16("intermediates/y");
    const uint16_t* d_out = in16("inputs/d_output");
    parallel_for(G, threads, [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) {
        if (!token_ok(g)) continue;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t idx = g * K + k;
          if (topk[idx] < 0) {  // an empty slot's gradient is exactly 0
            o.zero(idx);
            continue;
          }
          Element el;
          for (int64_t h = 0; h < H; ++h)
            el.exact_term(static_cast<double>(f32_from_bf16(d_out[g * H + h])) * f32_from_bf16(y[(g * K + k) * H + h]));
          // Every fma and every butterfly add rounds once, to within half an ulp of its computed
          // result, and a computed partial sum is bounded by Σ|terms| plus the errors made so far,
          // which are at most the final radius r. So r = ops * (2^-24 (Σ|terms| + r) + 2^-150),
          // taken at its fixed point: r = ops (2^-24 Σ|terms| + 2^-150) / (1 - ops 2^-24).
          const double ops = static_cast<double>(H + spec::kRouterGradLanes - 1);
          const double growth = ops * 0x1.0p-24 * kSlack;
          if (!(growth < 0.5))
            throw Error("oracle: d_router_weights over H = " + std::to_string(H) +
                        " columns is beyond what the radius formula covers (H + 31 fp32 roundings must stay under 2^23)");
          el.add_radius(ops * (0x1.0p-24 * el.abs_sum() * kSlack + 0x1.0p-150) / (1.0 - growth) * kSlack);
          o.finish(el, idx);
        }
      }
    }, 8);
  }

  if (options.intermediates) {
    const uint16_t* w_rg = in16("inputs/w_routed_gate");
    const uint16_t* w_ru = in16("inputs/w_routed_up");
    const uint16_t* w_rd = in16("inputs/w_routed_down");
    const uint16_t* d_out = in16("inputs/d_output");
    // dy = rn(w d_output): the product is exact in double; fp32 then bf16 rounding.
    if (has({"intermediates/dy"})) {
      const Out o = make("intermediates/dy");
      per_slot({o}, H, [&](int64_t g, int64_t slot, int64_t) {
        for (int64_t h = 0; h < H; ++h) {
          const double w = rw[slot], d = f32_from_bf16(d_out[g * H + h]);
          elementwise(o, slot * H + h, {w, d}, [&] {
            return oracle_scalar::rounded(oracle_scalar::rounded(oracle_scalar::times({w, 0.0}, {d, 0.0}), 24), 8);
          });
        }
      });
    }
    // d_act = dy · W_down[e] (fp32 chain over H; column i of [H, I] has stride I).
    if (has({"intermediates/d_act", "intermediates/dy"})) {
      const Out o = make("intermediates/d_act");
      const uint16_t* dy = ref16("intermediates/dy");
      per_slot({o}, I, [&](int64_t, int64_t slot, int64_t e) {
        if (!all_finite_bf16(dy + slot * H, H)) return;
        for (int64_t i = 0; i < I; ++i) {
          Element el;  // ORDER: dot-chain over H
          el.mma_chain(dy + slot * H, 1, w_rd + e * H * I + i, I, H);
          o.finish_in_range(el, slot * I + i);
        }
      });
    }
    // d_gate = rn(rn(da u) silu'(g)) and d_up = rn(da silu(g)) of element i from the golden's own
    // d_act, gate and up (routed or shared), each where the golden holds it.
    auto gate_up_grads = [&](const Out& og, const Out& ou, bool dg, bool du, const float* da, const float* gt,
                             const float* up, int64_t i) {
      const Bounded a{da[i], 0.0}, gv{gt[i], 0.0};
      if (dg) elementwise(og, i, {da[i], gt[i], up[i]}, [&] { return oracle_scalar::d_gate_at(da[i], gt[i], up[i]); });
      if (du) elementwise(ou, i, {da[i], gt[i]}, [&] { return oracle_scalar::d_up_of(a, gv); });
    };
    // d_gate = rn(rn(da u) silu'(g)), d_up = rn(da silu(g)).
    if (has({"intermediates/d_act", "intermediates/gate", "intermediates/up"})) {
      const float *da = ref32("intermediates/d_act"), *gt = ref32("intermediates/gate"), *up = ref32("intermediates/up");
      const bool dg = has({"intermediates/d_gate"}), du = has({"intermediates/d_up"});
      const Out og = dg ? make("intermediates/d_gate") : Out{}, ou = du ? make("intermediates/d_up") : Out{};
      std::vector<Out> outs;
      if (dg) outs.push_back(og);
      if (du) outs.push_back(ou);
      per_slot(outs, I, [&](int64_t, int64_t slot, int64_t) {
        for (int64_t i = slot * I; i < (slot + 1) * I; ++i) gate_up_grads(og, ou, dg, du, da, gt, up, i);
      });
    }
    // dx_slot = rn(d_gate · W_gate[e] + d_up · W_up[e]): one chain over 2I, gate half first.
    if (has({"intermediates/dx_slot", "intermediates/d_gate", "intermediates/d_up"})) {
      const Out o = make("intermediates/dx_slot");
      const uint16_t *dg = ref16("intermediates/d_gate"), *du = ref16("intermediates/d_up");
      per_slot({o}, H, [&](int64_t, int64_t slot, int64_t e) {
        if (!all_finite_bf16(dg + slot * I, I) || !all_finite_bf16(du + slot * I, I)) return;
        for (int64_t h = 0; h < H; ++h) {
          Element el;  // ORDER: dot-chain over 2I
          el.mma_chain(dg + slot * I, 1, w_rg + e * I * H + h, H, I);
          el.mma_chain(du + slot * I, 1, w_ru + e * I * H + h, H, I);
          el.round_to_bf16();
          o.finish_in_range(el, slot * H + h);
        }
      });
    }
    if (shared) {
      const uint16_t* w_sg = in16("inputs/w_shared_gate");
      const uint16_t* w_su = in16("inputs/w_shared_up");
      const uint16_t* w_sd = in16("inputs/w_shared_down");
      // shared_d_act = d_output · W_sd (the shared expert's output gradient is d_output itself).
      if (has({"intermediates/shared_d_act"})) {
        const Out o = make("intermediates/shared_d_act");
        per_token([&](int64_t g) {
          for (int64_t j = 0; j < Is; ++j) {
            Element el;
            el.mma_chain(d_out + g * H, 1, w_sd + j, Is, H);
            o.finish_in_range(el, g * Is + j);
          }
        });
      }
      if (has({"intermediates/shared_d_act", "intermediates/shared_gate", "intermediates/shared_up"})) {
        const float *da = ref32("intermediates/shared_d_act"), *gt = ref32("intermediates/shared_gate"),
                    *up = ref32("intermediates/shared_up");
        const bool dg = has({"intermediates/shared_d_gate"}), du = has({"intermediates/shared_d_up"});
        const Out og = dg ? make("intermediates/shared_d_gate") : Out{},
                  ou = du ? make("intermediates/shared_d_up") : Out{};
        per_token([&](int64_t g) {
          for (int64_t i = g * Is; i < (g + 1) * Is; ++i) gate_up_grads(og, ou, dg, du, da, gt, up, i);
        });
      }
      // dx_shared = shared_d_gate · W_sg + shared_d_up · W_su (fp32, one chain over 2Is).
      if (has({"intermediates/dx_shared", "intermediates/shared_d_gate", "intermediates/shared_d_up"})) {
        const Out o = make("intermediates/dx_shared");
        const uint16_t *sdg = ref16("intermediates/shared_d_gate"), *sdu = ref16("intermediates/shared_d_up");
        per_token([&](int64_t g) {
          if (!all_finite_bf16(sdg + g * Is, Is) || !all_finite_bf16(sdu + g * Is, Is)) return;
          for (int64_t h = 0; h < H; ++h) {
            Element el;
            el.mma_chain(sdg + g * Is, 1, w_sg + h, H, Is);
            el.mma_chain(sdu + g * Is, 1, w_su + h, H, Is);
            o.finish_in_range(el, g * H + h);
          }
        });
      }
    }
  }

  // Weight gradients: chains over canonical row lists (routed) and the rank's tokens (shared).
  std::vector<int64_t> offsets(E + 1);
  std::vector<spec::RowRef> rows(cfg.num_slots());
  std::vector<int32_t> slot_row(cfg.num_slots());
  spec::build_routing_plan(cfg, topk, {offsets.data(), rows.data(), slot_row.data()});
  const uint16_t* x = xin;
  auto col_ok = [&](const std::vector<uint8_t>& mask, int64_t i) { return !sample || mask[i]; };
  {
    Out og = make("grads/d_w_routed_gate"), ou = make("grads/d_w_routed_up"), od = make("grads/d_w_routed_down");
    const uint16_t* act = ref16("intermediates/act");
    const uint16_t* dy = ref16("intermediates/dy");
    const uint16_t* dg = ref16("intermediates/d_gate");
    const uint16_t* du = ref16("intermediates/d_up");
    parallel_for(E * I, threads, [&](int64_t b, int64_t e_end) {
      std::vector<uint16_t> xc, dyc, ac, gc, uc;
      for (int64_t item = b; item < e_end; ++item) {
        const int64_t e = item / I, i = item % I;
        if (sample && !col_ok(sample->inter_mask, i)) continue;
        const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        ac.resize(n); gc.resize(n); uc.resize(n); xc.resize(n); dyc.resize(n);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t slot = int64_t{rows[r0 + r].token_idx} * K + rows[r0 + r].slot_idx;
          ac[r] = act[slot * I + i];
          gc[r] = dg[slot * I + i];
          uc[r] = du[slot * I + i];
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t r = 0; r < n; ++r) {
            const int64_t tok = rows[r0 + r].token_idx;
            const int64_t slot = tok * K + rows[r0 + r].slot_idx;
            xc[r] = x[tok * H + h];
            dyc[r] = dy[slot * H + h];
          }
          Element eg, eu, ed;  // ORDER: weight-grad chain over canonical rows
          eg.mma_chain(gc.data(), 1, xc.data(), 1, n);
          eu.mma_chain(uc.data(), 1, xc.data(), 1, n);
          ed.mma_chain(dyc.data(), 1, ac.data(), 1, n);
          og.finish(eg, (e * I + i) * H + h);
          ou.finish(eu, (e * I + i) * H + h);
          od.finish(ed, (e * H + h) * I + i);
        }
      }
    }, 4);
  }
  if (shared) {
    Out og = make("grads/d_w_shared_gate"), ou = make("grads/d_w_shared_up"), od = make("grads/d_w_shared_down");
    const uint16_t* sa = ref16("intermediates/shared_act");
    const uint16_t* sdg = ref16("intermediates/shared_d_gate");
    const uint16_t* sdu = ref16("intermediates/shared_d_up");
    const uint16_t* d_out = in16("inputs/d_output");
    parallel_for(R * Is, threads, [&](int64_t b, int64_t e_end) {
      std::vector<uint16_t> xc(T), dc(T), ac(T), gc(T), uc(T);
      for (int64_t item = b; item < e_end; ++item) {
        const int64_t rank = item / Is, j = item % Is, g0 = rank * T;
        if (sample && !col_ok(sample->shared_mask, j)) continue;
        for (int64_t t = 0; t < T; ++t) {
          ac[t] = sa[(g0 + t) * Is + j];
          gc[t] = sdg[(g0 + t) * Is + j];
          uc[t] = sdu[(g0 + t) * Is + j];
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t t = 0; t < T; ++t) {
            xc[t] = x[(g0 + t) * H + h];
            dc[t] = d_out[(g0 + t) * H + h];
          }
          Element eg, eu, ed;  // ORDER: shared weight-grad chain over the rank's tokens
          eg.mma_chain(gc.data(), 1, xc.data(), 1, T);
          eu.mma_chain(uc.data(), 1, xc.data(), 1, T);
          ed.mma_chain(dc.data(), 1, ac.data(), 1, T);
          const int64_t gi = (rank * Is + j) * H + h, di = (rank * H + h) * Is + j;
          og.finish(eg, gi);
          ou.finish(eu, gi);
          od.finish(ed, di);
        }
      }
    }, 4);
  }
  return out;
}

}  // namespace mok::ref
