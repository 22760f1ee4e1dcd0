// The CPU emulator of profile bf16-v1: per-slot expert MLPs, shared expert, combine, backward, weight grads.
#include "mok/reference/emulate.hpp"

#include "mok/reference/error.hpp"
#include "mok/reference/parallel.hpp"
#include "mok/reference/schema.hpp"
#include "mok/spec/orders.hpp"
#include "mok/spec/routing_plan.hpp"

#include <algorithm>
#include <vector>

namespace mok::ref {
namespace {

using spec::bf16_from_f32_rne;
using spec::f32_from_bf16;

// Read-only views of the inputs with their sizes.
struct Inputs {
  const spec::LayerConfig& cfg;
  int64_t G, H, I, Is, E, K, R, T;
  const uint16_t *x, *w_sg, *w_su, *w_sd, *w_rg, *w_ru, *w_rd, *d_out;
  const int32_t* topk;
  const float* rw;
};

// The global routing plan of the layer (spec::build_routing_plan on host vectors).
struct Plan {
  std::vector<int64_t> offsets;
  std::vector<spec::RowRef> rows;
  std::vector<int32_t> slot_row;
};

Plan make_plan(const spec::LayerConfig& cfg, const int32_t* topk) {
  Plan p;
  p.offsets.resize(cfg.num_experts + 1);
  p.rows.resize(cfg.num_slots());
  p.slot_row.resize(cfg.num_slots());
  spec::build_routing_plan(cfg, topk, {p.offsets.data(), p.rows.data(), p.slot_row.data()});
  return p;
}

Tensor make(const spec::LayerConfig& cfg, const char* path) {
  const TensorSpec* s = find_spec(path);
  return Tensor(s->dtype, spec_shape(*s, cfg));
}

// Which columns a row computes: all, or the sample's.
std::vector<int64_t> all_columns(int64_t n) {
  std::vector<int64_t> c(n);
  for (int64_t i = 0; i < n; ++i) c[i] = i;
  return c;
}

class Emulator {
 public:
  Emulator(const Inputs& in, const EmulateOptions& opt)
      : in_(in), opt_(opt), model_(*opt.mma_model), threads_(resolve_threads(opt.num_threads)) {
    plan_ = make_plan(in.cfg, in.topk);
    const auto& cfg = in.cfg;
    for (const char* p : {"intermediates/gate", "intermediates/up", "intermediates/act",
                          "intermediates/y", "outputs/output"})
      out_[p] = make(cfg, p);
    if (in.Is > 0)
      for (const char* p : {"intermediates/shared_gate", "intermediates/shared_up",
                            "intermediates/shared_act", "intermediates/shared_out"})
        out_[p] = make(cfg, p);
    if (opt.backward) {
      for (const char* p : {"intermediates/dy", "intermediates/d_act", "intermediates/d_gate",
                            "intermediates/d_up", "intermediates/dx_slot", "grads/d_x",
                            "grads/d_router_weights", "grads/d_w_routed_gate",
                            "grads/d_w_routed_up", "grads/d_w_routed_down"})
        out_[p] = make(cfg, p);
      if (in.Is > 0)
        for (const char* p : {"intermediates/shared_d_act", "intermediates/shared_d_gate",
                              "intermediates/shared_d_up", "intermediates/dx_shared",
                              "grads/d_w_shared_gate", "grads/d_w_shared_up",
                              "grads/d_w_shared_down"})
          out_[p] = make(cfg, p);
    }
    if (opt.sample) {
      token_mask_ = &opt.sample->token_mask;
      inter_cols_ = opt.sample->inter_cols;
      shared_cols_ = opt.sample->shared_cols;
    } else {
      inter_cols_ = all_columns(in.I);
      shared_cols_ = all_columns(in.Is);
    }
  }

  TensorMap run() {
    forward_slots();
    if (in_.Is > 0) shared_forward();
    combine();
    if (opt_.backward) {
      backward_slots();
      if (in_.Is > 0) shared_backward();
      reduce_dx();
      routed_weight_grads();
      if (in_.Is > 0) shared_weight_grads();
    }
    if (!opt_.intermediates) {
      for (auto it = out_.begin(); it != out_.end();)
        it = it->first.rfind("intermediates/", 0) == 0 ? out_.erase(it) : std::next(it);
    }
    return std::move(out_);
  }

 private:
  bool token_sampled(int64_t g) const { return !token_mask_ || (*token_mask_)[g]; }
  template <class T> T* o(const char* path) { return out_.at(path).data<T>(); }

  // Forward of every routed slot: gate/up chains over H, SwiGLU, down chain over I.
  // Unsampled tokens compute only the sampled I columns (what the weight grads need).
  void forward_slots() {
    const int64_t H = in_.H, I = in_.I, K = in_.K;
    float* gate = o<float>("intermediates/gate");
    float* up = o<float>("intermediates/up");
    uint16_t* act = o<uint16_t>("intermediates/act");
    uint16_t* y = o<uint16_t>("intermediates/y");
    const int64_t num_rows = plan_.offsets[in_.E];
    parallel_for(num_rows, threads_, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> cols_all = all_columns(I);
      for (int64_t r = begin; r < end; ++r) {
        const spec::RowRef row = plan_.rows[r];
        const int64_t e = in_.topk[row.token_idx * K + row.slot_idx];
        const int64_t slot = int64_t{row.token_idx} * K + row.slot_idx;
        const bool full = token_sampled(row.token_idx);
        const std::vector<int64_t>& cols = full ? cols_all : inter_cols_;
        const uint16_t* x_row = in_.x + int64_t{row.token_idx} * H;
        for (int64_t i : cols) {
          // ORDER: dot-chain over H.
          const float g = spec::dot_chain_bf16(model_, 0.0f, x_row, 1, in_.w_rg + (e * I + i) * H, 1, H);
          const float u = spec::dot_chain_bf16(model_, 0.0f, x_row, 1, in_.w_ru + (e * I + i) * H, 1, H);
          gate[slot * I + i] = g;
          up[slot * I + i] = u;
          act[slot * I + i] = spec::swiglu_act(g, u);
        }
        if (!full) continue;
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: dot-chain over I.
          const float v = spec::dot_chain_bf16(model_, 0.0f, act + slot * I, 1, in_.w_rd + (e * H + h) * I, 1, I);
          y[slot * H + h] = bf16_from_f32_rne(v);
        }
      }
    }, 4);
  }

  void shared_forward() {
    const int64_t H = in_.H, Is = in_.Is;
    float* sg = o<float>("intermediates/shared_gate");
    float* su = o<float>("intermediates/shared_up");
    uint16_t* sa = o<uint16_t>("intermediates/shared_act");
    float* so = o<float>("intermediates/shared_out");
    parallel_for(in_.G, threads_, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> cols_all = all_columns(Is);
      for (int64_t g = begin; g < end; ++g) {
        const bool full = token_sampled(g);
        const std::vector<int64_t>& cols = full ? cols_all : shared_cols_;
        const uint16_t* x_row = in_.x + g * H;
        for (int64_t j : cols) {
          const float gv = spec::dot_chain_bf16(model_, 0.0f, x_row, 1, in_.w_sg + j * H, 1, H);
          const float uv = spec::dot_chain_bf16(model_, 0.0f, x_row, 1, in_.w_su + j * H, 1, H);
          sg[g * Is + j] = gv;
          su[g * Is + j] = uv;
          sa[g * Is + j] = spec::swiglu_act(gv, uv);
        }
        if (!full) continue;
        for (int64_t h = 0; h < H; ++h)
          so[g * H + h] = spec::dot_chain_bf16(model_, 0.0f, sa + g * Is, 1, in_.w_sd + h * Is, 1, Is);
      }
    }, 4);
  }

  void combine() {
    const int64_t H = in_.H, K = in_.K;
    const uint16_t* y = o<uint16_t>("intermediates/y");
    const float* so = in_.Is > 0 ? o<float>("intermediates/shared_out") : nullptr;
    uint16_t* output = o<uint16_t>("outputs/output");
    parallel_for(in_.G, threads_, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        if (!token_sampled(g)) continue;
        for (int64_t h = 0; h < H; ++h) {
          float acc = so ? so[g * H + h] : 0.0f;
          // ORDER: combine-slots.
          for (int64_t k = 0; k < K; ++k) {
            if (in_.topk[g * K + k] < 0) continue;
            acc = spec::combine_step(acc, in_.rw[g * K + k], y[(g * K + k) * H + h]);
          }
          output[g * H + h] = bf16_from_f32_rne(acc);
        }
      }
    }, 16);
  }

  // Backward of every routed slot: dy, d_router_weights, da (chain over H of dy * W_down
  // columns), dg/du, and dx_slot (one chain over 2I, gate half first).
  void backward_slots() {
    const int64_t H = in_.H, I = in_.I, K = in_.K;
    const float* gate = o<float>("intermediates/gate");
    const float* up = o<float>("intermediates/up");
    const uint16_t* y = o<uint16_t>("intermediates/y");
    uint16_t* dy = o<uint16_t>("intermediates/dy");
    float* da = o<float>("intermediates/d_act");
    uint16_t* dg = o<uint16_t>("intermediates/d_gate");
    uint16_t* du = o<uint16_t>("intermediates/d_up");
    uint16_t* dx_slot = o<uint16_t>("intermediates/dx_slot");
    float* d_rw = o<float>("grads/d_router_weights");
    const int64_t num_rows = plan_.offsets[in_.E];
    parallel_for(num_rows, threads_, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> cols_all = all_columns(I);
      for (int64_t r = begin; r < end; ++r) {
        const spec::RowRef row = plan_.rows[r];
        const int64_t g = row.token_idx;
        const int64_t slot = g * K + row.slot_idx;
        const int64_t e = in_.topk[slot];
        const bool full = token_sampled(g);
        const float w = in_.rw[slot];
        for (int64_t h = 0; h < H; ++h) dy[slot * H + h] = spec::scale_grad(w, in_.d_out[g * H + h]);
        if (full) d_rw[slot] = spec::router_grad_dot(in_.d_out + g * H, y + slot * H, H);
        const std::vector<int64_t>& cols = full ? cols_all : inter_cols_;
        for (int64_t i : cols) {
          // ORDER: dot-chain over H; W_down[e] is [H, I], so column i has stride I.
          const float d = spec::dot_chain_bf16(model_, 0.0f, dy + slot * H, 1, in_.w_rd + e * H * I + i, I, H);
          da[slot * I + i] = d;
          dg[slot * I + i] = spec::swiglu_grad_gate(d, gate[slot * I + i], up[slot * I + i]);
          du[slot * I + i] = spec::swiglu_grad_up(d, gate[slot * I + i]);
        }
        if (!full) continue;
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: dot-chain over 2I, gate half then up half, one accumulator.
          float acc = spec::dot_chain_bf16(model_, 0.0f, dg + slot * I, 1, in_.w_rg + e * I * H + h, H, I);
          acc = spec::dot_chain_bf16(model_, acc, du + slot * I, 1, in_.w_ru + e * I * H + h, H, I);
          dx_slot[slot * H + h] = bf16_from_f32_rne(acc);
        }
      }
    }, 4);
  }

  void shared_backward() {
    const int64_t H = in_.H, Is = in_.Is;
    const float* sg = o<float>("intermediates/shared_gate");
    const float* su = o<float>("intermediates/shared_up");
    float* sda = o<float>("intermediates/shared_d_act");
    uint16_t* sdg = o<uint16_t>("intermediates/shared_d_gate");
    uint16_t* sdu = o<uint16_t>("intermediates/shared_d_up");
    float* dxs = o<float>("intermediates/dx_shared");
    parallel_for(in_.G, threads_, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> cols_all = all_columns(Is);
      for (int64_t g = begin; g < end; ++g) {
        const bool full = token_sampled(g);
        const std::vector<int64_t>& cols = full ? cols_all : shared_cols_;
        for (int64_t j : cols) {
          // The shared expert's output gradient is d_output itself (weight 1, already bf16).
          const float d = spec::dot_chain_bf16(model_, 0.0f, in_.d_out + g * H, 1, in_.w_sd + j, Is, H);
          sda[g * Is + j] = d;
          sdg[g * Is + j] = spec::swiglu_grad_gate(d, sg[g * Is + j], su[g * Is + j]);
          sdu[g * Is + j] = spec::swiglu_grad_up(d, sg[g * Is + j]);
        }
        if (!full) continue;
        for (int64_t h = 0; h < H; ++h) {
          float acc = spec::dot_chain_bf16(model_, 0.0f, sdg + g * Is, 1, in_.w_sg + h, H, Is);
          dxs[g * H + h] = spec::dot_chain_bf16(model_, acc, sdu + g * Is, 1, in_.w_su + h, H, Is);
        }
      }
    }, 4);
  }

  void reduce_dx() {
    const int64_t H = in_.H, K = in_.K;
    const uint16_t* dx_slot = o<uint16_t>("intermediates/dx_slot");
    const float* dxs = in_.Is > 0 ? o<float>("intermediates/dx_shared") : nullptr;
    uint16_t* d_x = o<uint16_t>("grads/d_x");
    parallel_for(in_.G, threads_, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        if (!token_sampled(g)) continue;
        for (int64_t h = 0; h < H; ++h) {
          float acc = dxs ? dxs[g * H + h] : 0.0f;
          // ORDER: dx-slots.
          for (int64_t k = 0; k < K; ++k)
            if (in_.topk[g * K + k] >= 0) acc = spec::dx_step(acc, dx_slot[(g * K + k) * H + h]);
          d_x[g * H + h] = bf16_from_f32_rne(acc);
        }
      }
    }, 16);
  }

  // Routed weight gradients: for expert e the chain runs over its canonical row list
  // (ascending token, then slot), 16 rows per step. Operands are gathered into
  // column-major scratch so each output element's chain reads contiguous memory.
  void routed_weight_grads() {
    const int64_t H = in_.H, I = in_.I;
    const uint16_t* act = o<uint16_t>("intermediates/act");
    const uint16_t* dy = o<uint16_t>("intermediates/dy");
    const uint16_t* dg = o<uint16_t>("intermediates/d_gate");
    const uint16_t* du = o<uint16_t>("intermediates/d_up");
    float* dwg = o<float>("grads/d_w_routed_gate");
    float* dwu = o<float>("grads/d_w_routed_up");
    float* dwd = o<float>("grads/d_w_routed_down");
    const int64_t num_cols = static_cast<int64_t>(inter_cols_.size());
    // Work item = (expert, sampled column index).
    parallel_for(in_.E * num_cols, threads_, [&](int64_t begin, int64_t end) {
      std::vector<uint16_t> x_t, dy_t, a_col, dg_col, du_col;
      int64_t cached_expert = -1;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t e = item / num_cols;
        const int64_t i = inter_cols_[item % num_cols];
        const int64_t r0 = plan_.offsets[e], n = plan_.offsets[e + 1] - r0;
        if (e != cached_expert) {
          // ORDER: canonical rows of e; x_t[h][r] and dy_t[h][r] hold column h over the rows.
          x_t.assign(H * n, 0);
          dy_t.assign(H * n, 0);
          for (int64_t r = 0; r < n; ++r) {
            const spec::RowRef row = plan_.rows[r0 + r];
            const int64_t slot = int64_t{row.token_idx} * in_.K + row.slot_idx;
            for (int64_t h = 0; h < H; ++h) {
              x_t[h * n + r] = in_.x[int64_t{row.token_idx} * H + h];
              dy_t[h * n + r] = dy[slot * H + h];
            }
          }
          cached_expert = e;
        }
        a_col.assign(n, 0);
        dg_col.assign(n, 0);
        du_col.assign(n, 0);
        for (int64_t r = 0; r < n; ++r) {
          const spec::RowRef row = plan_.rows[r0 + r];
          const int64_t slot = int64_t{row.token_idx} * in_.K + row.slot_idx;
          a_col[r] = act[slot * I + i];
          dg_col[r] = dg[slot * I + i];
          du_col[r] = du[slot * I + i];
        }
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: weight-grad chain over the canonical row list, 16 rows per step.
          dwg[(e * I + i) * H + h] = spec::dot_chain_bf16(model_, 0.0f, dg_col.data(), 1, x_t.data() + h * n, 1, n);
          dwu[(e * I + i) * H + h] = spec::dot_chain_bf16(model_, 0.0f, du_col.data(), 1, x_t.data() + h * n, 1, n);
          dwd[(e * H + h) * I + i] = spec::dot_chain_bf16(model_, 0.0f, dy_t.data() + h * n, 1, a_col.data(), 1, n);
        }
      }
    }, std::max<int64_t>(1, num_cols));
  }

  // Shared weight gradients per rank: the chain runs over the rank's tokens in order.
  void shared_weight_grads() {
    const int64_t H = in_.H, Is = in_.Is, T = in_.T;
    const uint16_t* sa = o<uint16_t>("intermediates/shared_act");
    const uint16_t* sdg = o<uint16_t>("intermediates/shared_d_gate");
    const uint16_t* sdu = o<uint16_t>("intermediates/shared_d_up");
    float* dwg = o<float>("grads/d_w_shared_gate");
    float* dwu = o<float>("grads/d_w_shared_up");
    float* dwd = o<float>("grads/d_w_shared_down");
    const int64_t num_cols = static_cast<int64_t>(shared_cols_.size());
    parallel_for(in_.R * num_cols, threads_, [&](int64_t begin, int64_t end) {
      std::vector<uint16_t> x_t, do_t, a_col(T), dg_col(T), du_col(T);
      int64_t cached_rank = -1;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t rank = item / num_cols;
        const int64_t j = shared_cols_[item % num_cols];
        const int64_t g0 = rank * T;
        if (rank != cached_rank) {
          x_t.assign(H * T, 0);
          do_t.assign(H * T, 0);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              x_t[h * T + t] = in_.x[(g0 + t) * H + h];
              do_t[h * T + t] = in_.d_out[(g0 + t) * H + h];
            }
          cached_rank = rank;
        }
        for (int64_t t = 0; t < T; ++t) {
          a_col[t] = sa[(g0 + t) * Is + j];
          dg_col[t] = sdg[(g0 + t) * Is + j];
          du_col[t] = sdu[(g0 + t) * Is + j];
        }
        float* g_out = dwg + rank * Is * H;
        float* u_out = dwu + rank * Is * H;
        float* d_out = dwd + rank * H * Is;
        for (int64_t h = 0; h < H; ++h) {
          // ORDER: shared weight-grad chain over the rank's tokens in order, 16 per step.
          g_out[j * H + h] = spec::dot_chain_bf16(model_, 0.0f, dg_col.data(), 1, x_t.data() + h * T, 1, T);
          u_out[j * H + h] = spec::dot_chain_bf16(model_, 0.0f, du_col.data(), 1, x_t.data() + h * T, 1, T);
          d_out[h * Is + j] = spec::dot_chain_bf16(model_, 0.0f, do_t.data() + h * T, 1, a_col.data(), 1, T);
        }
      }
    }, std::max<int64_t>(1, num_cols));
  }

  const Inputs& in_;
  const EmulateOptions& opt_;
  const spec::MmaModel& model_;
  int threads_;
  Plan plan_;
  TensorMap out_;
  const std::vector<uint8_t>* token_mask_ = nullptr;
  std::vector<int64_t> inter_cols_, shared_cols_;
};

}  // namespace

TensorMap emulate(const spec::LayerConfig& cfg, const TensorMap& inputs, const EmulateOptions& options) {
  validate_inputs(cfg, inputs, options.backward);
  if (options.sample) validate_sample(cfg, *options.sample, "emulate");
  if (options.mma_model == nullptr) throw Error("emulate: EmulateOptions::mma_model is null; leave it at its default");
  if (options.num_threads < 0 || options.num_threads > 4096)
    throw Error("emulate: num_threads = " + std::to_string(options.num_threads) + "; use 0 (all cores) to 4096");
  const bool shared = cfg.has_shared();
  auto u16 = [&](const char* p) { return at(inputs, p).data<uint16_t>(); };
  Inputs in{cfg,
            cfg.num_tokens(), cfg.hidden, cfg.intermediate, cfg.shared_intermediate,
            cfg.num_experts, cfg.top_k, cfg.num_ranks, cfg.tokens_per_rank,
            u16("inputs/x"),
            shared ? u16("inputs/w_shared_gate") : nullptr,
            shared ? u16("inputs/w_shared_up") : nullptr,
            shared ? u16("inputs/w_shared_down") : nullptr,
            u16("inputs/w_routed_gate"), u16("inputs/w_routed_up"), u16("inputs/w_routed_down"),
            options.backward ? u16("inputs/d_output") : nullptr,
            at(inputs, "inputs/topk_experts").data<int32_t>(),
            at(inputs, "inputs/router_weights").data<float>()};
  Emulator emulator(in, options);
  return emulator.run();
}

}  // namespace mok::ref
