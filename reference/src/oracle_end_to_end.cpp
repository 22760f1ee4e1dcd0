// The end-to-end oracle: the layer's output and gradients from the inputs alone, without the
// profile's roundings, and radii that cover every implementation of bf16-v1 fed only the inputs
// (the error analysis is written out in reference/README.md, "End to end").
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

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mok::ref {
namespace {

using namespace oracle_scalar;
using spec::f32_from_bf16;

int bf16_exp(uint16_t b) {
  const int ef = (b >> 7) & 0xFF;
  return ef == 0 ? -126 : ef - 127;
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


// A dot chain (ORDER: dot-chain, kMmaK products per MMA step, one accumulator across add()
// calls) whose A operand is known only as a true value a[i] with a radius ra[i] (the
// implementation's bf16 operand lies within it), and whose B operand is an exact bf16 input.
// The radius adds (1) the operands' radii times |b|, (2) each MMA step's truncations as the
// oracle's Element bounds them, with the step's largest alignment exponent and the running
// magnitude taken from the operands' bounds, and (3) the rounding of the exact sum to double.
class BoundedChain {
 public:
  void add(const double* a, const double* ra, const uint16_t* b, int64_t b_stride, int64_t n) {
    steps(n, [&](int64_t i) -> TermBound {
      const uint16_t bb = b[i * b_stride];
      const double bv = f32_from_bf16(bb);
      const double amax = std::fabs(a[i]) + ra[i];  // the implementation's |a| is at most this
      if (bv == 0.0 || amax == 0.0) return {};
      add_product(sum_, a[i], bv);
      ++products_;
      propagated_ += ra[i] * std::fabs(bv);
      // A bf16 operand below amax has an exponent of at most ilogb(amax); subnormals align at -126.
      return {amax * std::fabs(bv), std::max(std::ilogb(amax * kSlack), -126) + bf16_exp(bb)};
    });
  }
  // As add(), for an operand that every implementation computes exactly from the inputs (impl[i]:
  // dy = rn_bf16(rn(w * d_output))), with true value a[i]. Its contribution to the radius is then
  // the exact |sum of (impl - a) b| (the signed errors partly cancel) rather than the sum of
  // |impl - a| |b|. impl - a is exact in double (a bf16 value against an fp32-by-bf16 product).
  void add_known(const double* a, const double* impl, const uint16_t* b, int64_t b_stride, int64_t n) {
    steps(n, [&](int64_t i) -> TermBound {
      const uint16_t bb = b[i * b_stride];
      const double bv = f32_from_bf16(bb);
      if (bv == 0.0) return {};
      add_product(sum_, a[i], bv);
      add_product(diff_, impl[i] - a[i], bv);
      products_ += 2;
      if (impl[i] == 0.0) return {};
      return {std::fabs(impl[i] * bv), std::max(std::ilogb(impl[i]), -126) + bf16_exp(bb)};
    });
  }
  // As add(), for a B operand that every implementation computes exactly from the inputs (its
  // bf16 bits b_impl: dy) but whose true value b_true differs; A is bounded as in add(). The
  // radius adds the bounded |a| part against b_impl, and the exact |sum of a (b_impl - b_true)|.
  void add_mixed(const double* a, const double* ra, const uint16_t* b_impl, const double* b_true, int64_t n) {
    steps(n, [&](int64_t i) -> TermBound {
      const uint16_t bb = b_impl[i];
      const double bv = f32_from_bf16(bb);
      const double amax = std::fabs(a[i]) + ra[i];
      add_product(sum_, a[i], b_true[i]);
      add_product(diff_, a[i], bv - b_true[i]);
      products_ += 2;
      if (bv == 0.0 || amax == 0.0) return {};
      propagated_ += ra[i] * std::fabs(bv);
      return {amax * std::fabs(bv), std::max(std::ilogb(amax * kSlack), -126) + bf16_exp(bb)};
    });
  }
  Bounded result() const {
    const double value = sum_.to_double();
    const double known = std::fabs(diff_.to_double()) * (1 + 0x1.0p-52);
    const double radius = (propagated_ + known + arith_ + 0x1.0p-52 * std::fabs(value) + products_ * kDropped) * kSlack;
    in_range(std::fabs(value) + radius);
    return {value, radius};
  }

 private:
  // What one term tells the step's truncation bound: a bound on the implementation's |product|
  // (0: the product is zero for every implementation) and its largest alignment exponent.
  struct TermBound {
    double mag = 0.0;
    int exp = 0;
  };
  // The chain's MMA steps over n terms: term(i) adds term i's products to the sums and returns its
  // TermBound; each step then adds (n+1) 2^(E-25) for the terms' and the accumulator's
  // truncations and one fp32 ulp of the running magnitude for the result's.
  template <class Term>
  void steps(int64_t n, Term term) {
    for (int64_t k0 = 0; k0 < n; k0 += spec::kMmaK) {
      const int64_t len = std::min<int64_t>(spec::kMmaK, n - k0);
      int max_exp = std::numeric_limits<int>::min();
      int count = 0;
      const double before = abs_bound_ + arith_;  // bounds the implementation's running value
      for (int64_t i = k0; i < k0 + len; ++i) {
        const TermBound t = term(i);
        if (t.mag == 0.0) continue;
        abs_bound_ += t.mag;
        max_exp = std::max(max_exp, t.exp);
        ++count;
      }
      if (before > 0) {  // the accumulator is a term too; a subnormal one aligns at -126
        max_exp = std::max({max_exp, std::ilogb(before * kSlack), -126});
        ++count;
      }
      if (count == 0) continue;
      max_exp = std::max(max_exp, spec::kMmaZeroExp);  // zero terms align at -133
      arith_ += count * std::ldexp(1.0, max_exp - 25) + 0x1.0p-23 * (abs_bound_ + arith_) * kSlack + 0x1.0p-149;
    }
  }

  ExactSum sum_, diff_;
  double propagated_ = 0.0, arith_ = 0.0, abs_bound_ = 0.0;
  int64_t products_ = 0;
};

Bounded bounded_chain(const double* a, const double* ra, const uint16_t* b, int64_t b_stride, int64_t n) {
  BoundedChain c;
  c.add(a, ra, b, b_stride, n);
  return c.result();
}

// The true values and radii of a vector of bf16 inputs (radius 0).
void exact_operand(const uint16_t* a, int64_t n, std::vector<double>& v, std::vector<double>& r) {
  v.resize(n);
  r.assign(n, 0.0);
  for (int64_t i = 0; i < n; ++i) v[i] = f32_from_bf16(a[i]);
}


// What one token's end-to-end pass keeps of a routed slot or of the shared expert: gate, up
// and act per intermediate column.
struct Swiglu {
  std::vector<Bounded> g, u;
  std::vector<double> act, act_r;
};

// The exact and bound tensors of a checked tensor in `out`, filled with NaN (unsampled).
struct Out {
  float* exact = nullptr;
  float* bound = nullptr;
};
Out make_out(TensorMap& out, const spec::LayerConfig& cfg, const std::string& checked) {
  const std::vector<int64_t> shape = spec_shape(*find_spec(checked), cfg);
  Tensor ex(DType::kF32, shape), bd(DType::kF32, shape);
  std::fill(ex.data<float>(), ex.data<float>() + ex.numel(), std::numeric_limits<float>::quiet_NaN());
  std::fill(bd.data<float>(), bd.data<float>() + bd.numel(), std::numeric_limits<float>::quiet_NaN());
  const std::string pe = bound_exact_path(checked), pb = bound_radius_path(checked);
  out[pe] = std::move(ex);
  out[pb] = std::move(bd);
  return {out[pe].data<float>(), out[pb].data<float>()};
}
// The true value stored as fp32; the storage rounding joins the radius, which is rounded up.
void store(const Bounded& b, float* exact, float* bound) {
  const float v32 = static_cast<float>(b.v);
  const double rr = (b.r + std::fabs(static_cast<double>(v32) - b.v)) * kSlack;
  float b32 = static_cast<float>(rr);
  if (static_cast<double>(b32) < rr) b32 = std::nextafter(b32, std::numeric_limits<float>::infinity());
  *exact = v32;
  *bound = b32;
}

// ORDER: combine-slots and dx-slots: acc = start (shared_out, dx_shared; 0 without a shared
// expert), then one fp32 fma of weight[k] * term[k] (an add when the weight is 1) per non-empty
// slot in slot order, then bf16: the exact sum and the radius of any implementation's result.
Bounded slot_sum(const Bounded* start, const int32_t* topk_row, const float* weights, const Bounded* terms,
                 int64_t stride, int64_t K) {
  ExactSum sum;
  double r = 0.0, mag = 0.0;
  if (start) {
    add_product(sum, start->v, 1.0);
    r = start->r + kDropped;
    mag = std::fabs(start->v);
  }
  for (int64_t k = 0; k < K; ++k) {
    if (topk_row[k] < 0) continue;
    const double w = weights ? weights[k] : 1.0;
    const Bounded& term = terms[k * stride];
    add_product(sum, w, term.v);
    r += std::fabs(w) * term.r + kDropped;
    mag += std::fabs(w * term.v);
    r += half_ulp(mag + r, 24);  // the fma's (add's) rounding
  }
  const double value = sum.to_double();
  return rounded({value, r + 0x1.0p-52 * std::fabs(value)}, 8);
}

// The weight gradients end to end: for every (sampled) intermediate column of every expert, the
// column's act, d_gate and d_up over the expert's canonical rows (ORDER: weight-grad chain over the
// canonical row list, 16 rows per step; the shared expert's over each rank's tokens in order),
// each from the inputs alone as in the per-token pass, then the chains with x, dy and d_output.
void weight_grads(const spec::LayerConfig& cfg, const TensorMap& inputs, const Sample* sample, int threads,
                  TensorMap& out) {
  const int64_t H = cfg.hidden, I = cfg.intermediate, Is = cfg.shared_intermediate, E = cfg.num_experts,
                K = cfg.top_k, R = cfg.num_ranks, T = cfg.tokens_per_rank;
  auto in16 = [&](const char* p) { return at(inputs, p).data<uint16_t>(); };
  const uint16_t* x = in16("inputs/x");
  const uint16_t* d_out = in16("inputs/d_output");
  const int32_t* topk = at(inputs, "inputs/topk_experts").data<int32_t>();
  const float* rw = at(inputs, "inputs/router_weights").data<float>();
  // One intermediate column of a row: act, d_gate and d_up from x's row, d_act's operand (dy or
  // d_output: true values a_true, implementation bits a_impl) and the column's weights.
  struct Column {
    Bounded act, dg, du;
  };
  auto column = [&](const uint16_t* x_row, const uint16_t* wg_row, const uint16_t* wu_row, const double* dy_true,
                    const double* dy_impl, const uint16_t* wd_col, int64_t wd_stride, std::vector<double>& xv,
                    std::vector<double>& xr) {
    exact_operand(x_row, H, xv, xr);
    const Bounded g = bounded_chain(xv.data(), xr.data(), wg_row, 1, H);
    const Bounded u = bounded_chain(xv.data(), xr.data(), wu_row, 1, H);
    BoundedChain dc;
    dc.add_known(dy_true, dy_impl, wd_col, wd_stride, H);
    const Bounded da = dc.result();
    Column c;
    c.act = act_of(g, u);
    c.dg = d_gate_of(da, g, u);
    c.du = d_up_of(da, g);
    return c;
  };

  std::vector<int64_t> offsets(E + 1);
  std::vector<spec::RowRef> rows(cfg.num_slots());
  std::vector<int32_t> slot_row(cfg.num_slots());
  spec::build_routing_plan(cfg, topk, {offsets.data(), rows.data(), slot_row.data()});
  std::vector<int64_t> cols, scols;
  for (int64_t i = 0; i < I; ++i)
    if (!sample || sample->inter_mask[i]) cols.push_back(i);
  for (int64_t j = 0; j < Is; ++j)
    if (!sample || sample->shared_mask[j]) scols.push_back(j);

  {
    const Out og = make_out(out, cfg, "grads/d_w_routed_gate"), ou = make_out(out, cfg, "grads/d_w_routed_up"),
              od = make_out(out, cfg, "grads/d_w_routed_down");
    const uint16_t* wrg = in16("inputs/w_routed_gate");
    const uint16_t* wru = in16("inputs/w_routed_up");
    const uint16_t* wrd = in16("inputs/w_routed_down");
    const int64_t nc = static_cast<int64_t>(cols.size());
    parallel_for(E * nc, threads, [&](int64_t begin, int64_t end) {
      // Per expert (cached): x's and dy's columns over its rows, dy true and as implemented.
      std::vector<uint16_t> x_t, dy_bits;
      std::vector<double> dy_true, dy_impl, xv, xr, row_true(H), row_impl(H);
      std::vector<double> av, ar, gv, gr, uv, ur;
      int64_t cached = -1;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t e = item / nc, i = cols[item % nc];
        const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
        try {
        if (e != cached) {
          x_t.assign(H * n, 0);
          dy_bits.assign(H * n, 0);
          dy_true.assign(H * n, 0.0);
          dy_impl.assign(H * n, 0.0);
          for (int64_t r = 0; r < n; ++r) {
            const spec::RowRef row = rows[r0 + r];
            const float w = rw[int64_t{row.token_idx} * K + row.slot_idx];
            for (int64_t h = 0; h < H; ++h) {
              const uint16_t d = d_out[int64_t{row.token_idx} * H + h];
              x_t[h * n + r] = x[int64_t{row.token_idx} * H + h];
              dy_bits[h * n + r] = spec::scale_grad(w, d);
              dy_true[h * n + r] = static_cast<double>(w) * f32_from_bf16(d);
              dy_impl[h * n + r] = f32_from_bf16(dy_bits[h * n + r]);
            }
          }
          cached = e;
        }
        av.resize(n), ar.resize(n), gv.resize(n), gr.resize(n), uv.resize(n), ur.resize(n);
        for (int64_t r = 0; r < n; ++r) {
          const spec::RowRef row = rows[r0 + r];
          for (int64_t h = 0; h < H; ++h) row_true[h] = dy_true[h * n + r], row_impl[h] = dy_impl[h * n + r];
          const Column c = column(x + int64_t{row.token_idx} * H, wrg + (e * I + i) * H, wru + (e * I + i) * H,
                                  row_true.data(), row_impl.data(), wrd + e * H * I + i, I, xv, xr);
          av[r] = c.act.v, ar[r] = c.act.r, gv[r] = c.dg.v, gr[r] = c.dg.r, uv[r] = c.du.v, ur[r] = c.du.r;
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t gi = (e * I + i) * H + h, di = (e * H + h) * I + i;
          store(bounded_chain(gv.data(), gr.data(), x_t.data() + h * n, 1, n), og.exact + gi, og.bound + gi);
          store(bounded_chain(uv.data(), ur.data(), x_t.data() + h * n, 1, n), ou.exact + gi, ou.bound + gi);
          BoundedChain c;
          c.add_mixed(av.data(), ar.data(), dy_bits.data() + h * n, dy_true.data() + h * n, n);
          store(c.result(), od.exact + di, od.bound + di);
        }
        } catch (const oracle_scalar::RangeError& err) {
          throw oracle_scalar::RangeError(std::string(err.what()) + " in expert " + std::to_string(e) +
                                          "'s weight gradients of intermediate column " + std::to_string(i) +
                                          " (grads/d_w_routed_gate and _up [" + std::to_string(e) + ", " +
                                          std::to_string(i) + ", :], grads/d_w_routed_down [" + std::to_string(e) +
                                          ", :, " + std::to_string(i) + "])");
        }
      }
    }, std::max<int64_t>(1, nc));
  }
  if (Is == 0) return;
  {
    const Out og = make_out(out, cfg, "grads/d_w_shared_gate"), ou = make_out(out, cfg, "grads/d_w_shared_up"),
              od = make_out(out, cfg, "grads/d_w_shared_down");
    const uint16_t* wsg = in16("inputs/w_shared_gate");
    const uint16_t* wsu = in16("inputs/w_shared_up");
    const uint16_t* wsd = in16("inputs/w_shared_down");
    const int64_t nc = static_cast<int64_t>(scols.size());
    parallel_for(R * nc, threads, [&](int64_t begin, int64_t end) {
      std::vector<uint16_t> x_t(H * T), do_t(H * T);
      std::vector<double> xv, xr, dv(H), av(T), ar(T), gv(T), gr(T), uv(T), ur(T);
      int64_t cached = -1;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t rank = item / nc, j = scols[item % nc], t0 = rank * T;
        try {
        if (rank != cached) {
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              x_t[h * T + t] = x[(t0 + t) * H + h];
              do_t[h * T + t] = d_out[(t0 + t) * H + h];
            }
          cached = rank;
        }
        for (int64_t t = 0; t < T; ++t) {
          // The shared expert's d_act operand is d_output itself: true and implemented alike.
          for (int64_t h = 0; h < H; ++h) dv[h] = f32_from_bf16(d_out[(t0 + t) * H + h]);
          const Column c = column(x + (t0 + t) * H, wsg + j * H, wsu + j * H, dv.data(), dv.data(), wsd + j, Is, xv, xr);
          av[t] = c.act.v, ar[t] = c.act.r, gv[t] = c.dg.v, gr[t] = c.dg.r, uv[t] = c.du.v, ur[t] = c.du.r;
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t gi = (rank * Is + j) * H + h, di = (rank * H + h) * Is + j;
          store(bounded_chain(gv.data(), gr.data(), x_t.data() + h * T, 1, T), og.exact + gi, og.bound + gi);
          store(bounded_chain(uv.data(), ur.data(), x_t.data() + h * T, 1, T), ou.exact + gi, ou.bound + gi);
          store(bounded_chain(av.data(), ar.data(), do_t.data() + h * T, 1, T), od.exact + di, od.bound + di);
        }
        } catch (const oracle_scalar::RangeError& err) {
          throw oracle_scalar::RangeError(std::string(err.what()) + " in rank " + std::to_string(rank) +
                                          "'s shared-expert weight gradients of column " + std::to_string(j) +
                                          " (grads/d_w_shared_gate and _up [" + std::to_string(rank) + ", " +
                                          std::to_string(j) + ", :], grads/d_w_shared_down [" +
                                          std::to_string(rank) + ", :, " + std::to_string(j) + "])");
        }
      }
    }, std::max<int64_t>(1, nc));
  }
}

// oracle_end_to_end; backward: also the gradients (the inputs hold d_output).
TensorMap end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs, const OracleOptions& options,
                     bool backward) {
  validate_inputs(cfg, inputs, backward, "end-to-end oracle inputs");
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
  const uint16_t* d_out = backward ? in16("inputs/d_output") : nullptr;
  const int32_t* topk = at(inputs, "inputs/topk_experts").data<int32_t>();
  const float* rw = at(inputs, "inputs/router_weights").data<float>();

  TensorMap out;
  auto make = [&](const std::string& checked) { return make_out(out, cfg, checked); };
  const Out o_out = make("outputs/output");
  const Out o_drw = backward ? make("grads/d_router_weights") : Out{};
  const Out o_dx = backward ? make("grads/d_x") : Out{};

  // One range of tokens; t_now says which token a bound past fp32's range came from.
  auto tokens = [&](int64_t begin, int64_t end, int64_t& t_now) {
    std::vector<double> xv, xr, dv, dr, dy_true, dy_impl, dgv, dgr, duv, dur;
    std::vector<Swiglu> slots(K);
    Swiglu sh;
    std::vector<Bounded> y(K * H), so(H), dxs(H), dx_slot(K * H), da;
    // gate, up and act of one row over n intermediate columns (weights wg, wu: [n, H]).
    auto swiglu = [&](const uint16_t* wg, const uint16_t* wu, int64_t n, Swiglu& s) {
      s.g.resize(n);
      s.u.resize(n);
      s.act.resize(n);
      s.act_r.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        s.g[j] = bounded_chain(xv.data(), xr.data(), wg + j * H, 1, H);
        s.u[j] = bounded_chain(xv.data(), xr.data(), wu + j * H, 1, H);
        const Bounded a = act_of(s.g[j], s.u[j]);
        s.act[j] = a.v;
        s.act_r[j] = a.r;
      }
    };
    // The SwiGLU gradients of one row from d_act (bounded, per column).
    auto swiglu_grads = [&](const std::vector<Bounded>& da, const Swiglu& s) {
      const int64_t n = static_cast<int64_t>(da.size());
      dgv.resize(n), dgr.resize(n), duv.resize(n), dur.resize(n);
      for (int64_t j = 0; j < n; ++j) {
        const Bounded dg = d_gate_of(da[j], s.g[j], s.u[j]), du = d_up_of(da[j], s.g[j]);
        dgv[j] = dg.v, dgr[j] = dg.r, duv[j] = du.v, dur[j] = du.r;
      }
    };
    for (int64_t t = begin; t < end; ++t) {
      if (sample && !sample->token_mask[t]) continue;
      t_now = t;
      exact_operand(x + t * H, H, xv, xr);
      // ---- forward
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = topk[t * K + k];
        if (e < 0) continue;
        swiglu(wrg + e * I * H, wru + e * I * H, I, slots[k]);
        for (int64_t h = 0; h < H; ++h) {
          // y is stored as bf16.
          y[k * H + h] = rounded(bounded_chain(slots[k].act.data(), slots[k].act_r.data(), wrd + (e * H + h) * I, 1, I), 8);
        }
      }
      if (shared) {
        swiglu(wsg, wsu, Is, sh);
        for (int64_t h = 0; h < H; ++h) {
          // shared_out stays fp32: no rounding past the chain's own.
          so[h] = bounded_chain(sh.act.data(), sh.act_r.data(), wsd + h * Is, 1, Is);
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const Bounded o = slot_sum(shared ? &so[h] : nullptr, topk + t * K, rw + t * K, &y[h], H, K);
        store(o, o_out.exact + t * H + h, o_out.bound + t * H + h);
      }
      if (!backward) continue;
      // ---- backward, per token: d_router_weights and d_x.
      const uint16_t* dout = d_out + t * H;
      std::fill(dxs.begin(), dxs.end(), Bounded{});
      if (shared) {
        // The shared expert's output gradient is d_output itself: d_act = chain over H of
        // d_output and W_shared_down's column j.
        exact_operand(dout, H, dv, dr);
        da.resize(Is);
        for (int64_t j = 0; j < Is; ++j) da[j] = bounded_chain(dv.data(), dr.data(), wsd + j, Is, H);
        swiglu_grads(da, sh);
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: dot-chain over 2 Is, gate half then up half, one accumulator.
          BoundedChain c;
          c.add(dgv.data(), dgr.data(), wsg + h, H, Is);
          c.add(duv.data(), dur.data(), wsu + h, H, Is);
          dxs[h] = c.result();  // dx_shared stays fp32
        }
      }
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = topk[t * K + k];
        float* ex_rw = o_drw.exact + t * K + k;
        float* bd_rw = o_drw.bound + t * K + k;
        if (e < 0) {  // an empty slot's gradient is exactly 0 and it adds nothing to d_x
          *ex_rw = 0.0f;
          *bd_rw = 0.0f;
          continue;
        }
        // d_router_weights: 32 fma lanes over H and a 31-add butterfly (ORDER: router-grad-lanes),
        // every result bounded by the sum of the |products|' bounds.
        {
          ExactSum sum;
          double r = 0.0, mag = 0.0;
          for (int64_t h = 0; h < H; ++h) {
            const double dvh = f32_from_bf16(dout[h]);
            add_product(sum, dvh, y[k * H + h].v);
            r += std::fabs(dvh) * y[k * H + h].r + kDropped;
            mag += std::fabs(dvh) * y[k * H + h].max();
          }
          const double value = sum.to_double();
          // Each of the ops roundings is at most half an ulp of a partial sum, and the partial sums
          // include the roundings before them: M = mag + r + ops half_ulp(M) bounds every one
          // (half_ulp is a step function of M, so the iteration settles in a step or two).
          const double ops = static_cast<double>(H + spec::kRouterGradLanes - 1);
          double M = mag + r;
          for (double next = mag + r + ops * half_ulp(M, 24); next > M; next = mag + r + ops * half_ulp(M, 24))
            M = in_range(next) * kSlack;
          r += ops * half_ulp(M, 24) + 0x1.0p-52 * std::fabs(value);
          store(Bounded{value, r * kSlack}, ex_rw, bd_rw);
        }
        // dy: true w * d_output; every implementation's is rn_bf16(rn(w * d_output)), known exactly.
        const float w = rw[t * K + k];
        dy_true.resize(H), dy_impl.resize(H);
        for (int64_t h = 0; h < H; ++h) {
          dy_true[h] = static_cast<double>(w) * f32_from_bf16(dout[h]);
          dy_impl[h] = f32_from_bf16(spec::scale_grad(w, dout[h]));
        }
        // d_act: chain over H of dy and W_down[e]'s column i (stride I).
        da.resize(I);
        for (int64_t i = 0; i < I; ++i) {
          BoundedChain c;
          c.add_known(dy_true.data(), dy_impl.data(), wrd + e * H * I + i, I, H);
          da[i] = c.result();
        }
        swiglu_grads(da, slots[k]);
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: dot-chain over 2I, gate half then up half, one accumulator; then bf16.
          BoundedChain c;
          c.add(dgv.data(), dgr.data(), wrg + e * I * H + h, H, I);
          c.add(duv.data(), dur.data(), wru + e * I * H + h, H, I);
          dx_slot[k * H + h] = rounded(c.result(), 8);
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const Bounded d = slot_sum(shared ? &dxs[h] : nullptr, topk + t * K, nullptr, &dx_slot[h], H, K);
        store(d, o_dx.exact + t * H + h, o_dx.bound + t * H + h);
      }
    }
  };
  parallel_for(G, threads, [&](int64_t begin, int64_t end) {
    int64_t t_now = -1;
    try {
      tokens(begin, end, t_now);
    } catch (const oracle_scalar::RangeError& e) {
      throw oracle_scalar::RangeError(std::string(e.what()) + " in token " + std::to_string(t_now) + "'s " +
                                      (backward ? "output, d_x or d_router_weights" : "output") + " (rank " +
                                      std::to_string(t_now / cfg.tokens_per_rank) + "'s token " +
                                      std::to_string(t_now % cfg.tokens_per_rank) + ")");
    }
  }, 1);
  if (backward) {
    weight_grads(cfg, inputs, sample, threads, out);  // a RangeError there names its expert or rank and column
  }
  return out;
}

// The entry points: a bound past fp32's range ends the oracle with the place it was met and the fix.
TensorMap end_to_end_named(const spec::LayerConfig& cfg, const TensorMap& inputs, const OracleOptions& options,
                           bool backward) {
  try {
    return end_to_end(cfg, inputs, options, backward);
  } catch (const oracle_scalar::RangeError& e) {
    throw Error(std::string("end-to-end oracle: ") + e.what() +
                "; its bounds do not cover overflow (a result of 2^128 or more is Inf in fp32): scale the inputs down "
                "(/inputs/x, the weight datasets, /inputs/router_weights or /inputs/d_output)");
  }
}

}  // namespace

TensorMap oracle_end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs, const OracleOptions& options) {
  return end_to_end_named(cfg, inputs, options, inputs.count("inputs/d_output") > 0);
}

TensorMap oracle_forward_end_to_end(const spec::LayerConfig& cfg, const TensorMap& inputs,
                                    const OracleOptions& options) {
  return end_to_end_named(cfg, inputs, options, false);
}

}  // namespace mok::ref
