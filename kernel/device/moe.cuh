// The fused MoE layer kernels (forward, backward): one persistent cooperative launch holds every rank.
#pragma once

#include "mma_tile.cuh"
#include "sync.cuh"

#include "mok/kernel/params.hpp"
#include "mok/spec/orders.hpp"

namespace mok::kernel::device {

using spec::RowRef;

// Which rank a block serves and its role: blocks [0, comm) of a rank communicate (gather rows
// from peers); the rest compute (expert and shared-expert GEMMs, weight gradients). Every block
// of the rank then takes a share of the combines for the rank's own tokens. Roles change who
// does the work, never its order.
struct Role {
  int rank;
  int block;         // within the rank
  bool comm;
  int index;         // within the role
  int count;         // blocks in the role
};

__device__ inline Role my_role(const LaunchParams& P) {
  Role r;
  r.rank = P.first_rank + static_cast<int>(blockIdx.x) / P.blocks_per_rank;
  r.block = static_cast<int>(blockIdx.x) % P.blocks_per_rank;
  r.comm = r.block < P.comm_blocks_per_rank;
  r.index = r.comm ? r.block : r.block - P.comm_blocks_per_rank;
  r.count = r.comm ? P.comm_blocks_per_rank : P.blocks_per_rank - P.comm_blocks_per_rank;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Routing plan, built by every rank for its own experts from all ranks' topk_experts.
// ORDER: canonical rows of expert e: ascending global token id, then slot (spec routing plan);
// the block scans tokens in order, 128 at a time, and places matches by a block-wide prefix count.
__device__ inline bool build_plan(const LaunchParams& P, const Role& role) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t K = c.top_k, T = c.tokens_per_rank, G = c.num_tokens(), E_local = c.experts_per_rank();
  RankState& S = const_cast<RankState&>(P.state[role.rank]);
  __shared__ int64_t base;
  __shared__ int warp_counts[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Validation (every rank checks every token it reads): ids in [-1, E), distinct in a row.
  for (int64_t e_local = role.block; e_local < E_local; e_local += P.blocks_per_rank) {
    const int64_t e = role.rank * E_local + e_local;
    if (threadIdx.x == 0) base = 0;
    for (int64_t g0 = 0; g0 < G; g0 += kThreads) {
      const int64_t g = g0 + threadIdx.x;
      int slot = -1;
      if (g < G) {
        const int32_t* row = P.peers[g / T].topk + (g % T) * K;
        for (int64_t k = 0; k < K; ++k) {
          const int32_t id = row[k];
          if (id < -1 || id >= c.num_experts) raise_error(P, 2, role.rank, kFlagBadRouting, c.num_experts, id, g * K + k);
          for (int64_t j = 0; j < k; ++j)
            if (id >= 0 && row[j] == id) raise_error(P, 2, role.rank, kFlagBadRouting, 0, id, g * K + k);
          if (id == e) slot = static_cast<int>(k);
        }
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, slot >= 0);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int64_t before = base;
      for (int w = 0; w < warp; ++w) before += warp_counts[w];
      if (slot >= 0) {
        const int64_t pos = S.expert_offsets[e_local] + before + __popc(ballot & ((1u << lane) - 1u));
        if (pos < P.row_capacity) S.rows[pos] = RowRef{static_cast<int32_t>(g), slot};  // bad routing can overflow
      }
      __syncthreads();
      if (threadIdx.x == 0)
        for (int w = 0; w < kThreads / 32; ++w) base += warp_counts[w];
      __syncthreads();
    }
  }
  return load_volatile(P.abort) == 0;
}

// Row counts per local expert -> offsets (one block per rank, before the plan is filled).
__device__ inline void count_rows(const LaunchParams& P, const Role& role) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t K = c.top_k, T = c.tokens_per_rank, G = c.num_tokens(), E_local = c.experts_per_rank();
  RankState& S = const_cast<RankState&>(P.state[role.rank]);
  __shared__ unsigned long long counts[256];
  for (int64_t e0 = 0; e0 < E_local; e0 += 256) {
    for (int i = threadIdx.x; i < 256; i += kThreads) counts[i] = 0;
    __syncthreads();
    const int64_t first = role.rank * E_local + e0;
    for (int64_t i = threadIdx.x; i < G * K; i += kThreads) {
      const int32_t id = P.peers[(i / K) / T].topk[i % (T * K)];
      if (id >= first && id < first + 256 && id < (role.rank + 1) * E_local) atomicAdd(&counts[id - first], 1ull);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t run = e0 == 0 ? 0 : S.expert_offsets[e0];
      if (e0 == 0) S.expert_offsets[0] = 0;
      for (int64_t e = e0; e < E_local && e < e0 + 256; ++e) {
        run += static_cast<int64_t>(counts[e - e0]);
        S.expert_offsets[e + 1] = run;
      }
      // Only invalid routing (duplicate ids) can exceed the workspace; stop before using it.
      if (run > P.row_capacity) raise_error(P, 2, role.rank, kFlagBadRouting, P.row_capacity, run, -1);
    }
    __syncthreads();
  }
}

// Expected arrivals of a pass: this rank's non-empty slots, each pushed exactly once. Block 0
// of the rank computes it before a rank barrier that precedes every wait on it.
__device__ inline void count_expected_arrivals(const LaunchParams& P, const Role& role) {
  const int64_t n_slots = P.cfg.tokens_per_rank * P.cfg.top_k;
  __shared__ unsigned int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned int mine = 0;
  for (int64_t i = threadIdx.x; i < n_slots; i += kThreads) mine += P.peers[role.rank].topk[i] >= 0;
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) P.state[role.rank].counters[4] = total;
}

// Gathers rows of a token-major bf16 tensor (x or d_output) from their owners into the rank's
// row-major workspace and raises each row's ready flag to the launch epoch.
template <class Source>
__device__ inline void gather_rows(const LaunchParams& P, const Role& role, uint16_t* dst, uint32_t* ready,
                                   Source source) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden, T = c.tokens_per_rank;
  const int64_t n_rows = S.expert_offsets[c.experts_per_rank()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t p = role.index * (kThreads / 32) + warp; p < n_rows; p += role.count * (kThreads / 32)) {
    const RowRef row = S.rows[p];
    const uint16_t* src = source(P.peers[row.token_idx / T]) + (row.token_idx % T) * H;
    for (int64_t h = lane; h < H; h += 32) dst[p * H + h] = src[h];
    async_proxy_fence();  // the row is read next by TMA (async proxy)
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicMax(&ready[p], P.epoch);
  }
}

// Waits until rows [p0, p0 + n) of a gathered tensor are ready (thread i waits for row i).
__device__ inline bool wait_rows(const LaunchParams& P, const Role& role, const uint32_t* ready, int64_t p0, int64_t n,
                                 int flag) {
  bool ok = true;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    ok = ok && wait_at_least(P, &ready[p0 + i], P.epoch, role.rank, flag, p0 + i);
  async_proxy_fence();  // the rows are read next by TMA
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Combine and backward push: row p's value at column `col`, rounded to bf16, goes straight into
// the token owner's slot buffer (y_slots or dx_slots), where each (token, slot) is written once.
__device__ inline void push_to_owner(const LaunchParams& P, const RankState& S, uint16_t* PeerBuffers::*slots,
                                     int64_t p, int64_t col, float v) {
  const spec::LayerConfig& c = P.cfg;
  const RowRef row = S.rows[p];
  uint16_t* dst = P.peers[row.token_idx / c.tokens_per_rank].*slots;
  dst[((row.token_idx % c.tokens_per_rank) * c.top_k + row.slot_idx) * c.hidden + col] = spec::bf16_from_f32_rne(v);
}

// After a tile's pushes: every thread fences its stores, then each row is counted at its owner
// (arrivals[which]: 0 forward, 1 backward).
__device__ inline void publish_rows(const LaunchParams& P, const RankState& S, int64_t p0, int64_t n, int which) {
  __threadfence();
  __syncthreads();
  for (int64_t m = threadIdx.x; m < n; m += kThreads)
    atomicAdd(&P.peers[S.rows[p0 + m].token_idx / P.cfg.tokens_per_rank].arrivals[which], 1u);
}

// ---------------------------------------------------------------------------------------------
// Forward.

__device__ inline bool forward_expert_tile(const LaunchParams& P, const Role& role, TileSmem& smem, int64_t e_local,
                                           int64_t p0, int64_t n) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, I = c.intermediate;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  if (!wait_rows(P, role, S.row_ready, p0, n, kFlagDispatchRow)) return false;
  const uint16_t* xd = S.xd + p0 * H;
  const uint16_t* wg = W.w_routed_gate + e_local * I * H;
  const uint16_t* wu = W.w_routed_up + e_local * I * H;
  const uint16_t* wd = W.w_routed_down + e_local * H * I;
  float* gate = S.gate + p0 * I;
  float* up = S.up + p0 * I;
  uint16_t* act = S.act + p0 * I;
  auto zero = [] __device__(int64_t, int64_t) { return 0.0f; };
  const RankTensorMaps& maps = P.maps[role.rank];
  const bool tma = P.use_tma != 0;
  for (int64_t n0 = 0; n0 < I; n0 += kTileN) {
    // ORDER: dot-chain over H for g and u.
    gemm_tile_kmajor(smem, n, I, H, 0, n0, zero, maps.xd, p0, xd, H, maps.w_routed_gate, e_local * I, wg, H, tma,
                     [&](int64_t m, int64_t col, float v) { gate[m * I + col] = v; });
    gemm_tile_kmajor(smem, n, I, H, 0, n0, zero, maps.xd, p0, xd, H, maps.w_routed_up, e_local * I, wu, H, tma,
                     [&](int64_t m, int64_t col, float v) { up[m * I + col] = v; });
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n * I; i += kThreads) act[i] = spec::swiglu_act(gate[i], up[i]);
  async_proxy_fence();  // act is read next by TMA
  __syncthreads();
  for (int64_t n0 = 0; n0 < H; n0 += kTileN) {
    // ORDER: dot-chain over I; the result is pushed into the token owner's slot buffer.
    gemm_tile_kmajor(smem, n, H, I, 0, n0, zero, maps.act, p0, act, I, maps.w_routed_down, e_local * H, wd, I, tma,
                     [&](int64_t m, int64_t col, float v) { push_to_owner(P, S, &PeerBuffers::y_slots, p0 + m, col, v); });
  }
  publish_rows(P, S, p0, n, 0);
  return true;
}

__device__ inline void forward_shared_tile(const LaunchParams& P, const Role& role, TileSmem& smem, int64_t t0,
                                           int64_t n) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, Is = c.shared_intermediate;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const uint16_t* x = P.peers[role.rank].x + t0 * H;
  auto zero = [] __device__(int64_t, int64_t) { return 0.0f; };
  float* sg = S.shared_gate + t0 * Is;
  float* su = S.shared_up + t0 * Is;
  uint16_t* sa = S.shared_act + t0 * Is;
  const RankTensorMaps& maps = P.maps[role.rank];
  const bool tma = P.use_tma != 0;
  for (int64_t n0 = 0; n0 < Is; n0 += kTileN) {
    gemm_tile_kmajor(smem, n, Is, H, 0, n0, zero, maps.x, t0, x, H, maps.w_shared_gate, 0, W.w_shared_gate, H, tma,
                     [&](int64_t m, int64_t col, float v) { sg[m * Is + col] = v; });
    gemm_tile_kmajor(smem, n, Is, H, 0, n0, zero, maps.x, t0, x, H, maps.w_shared_up, 0, W.w_shared_up, H, tma,
                     [&](int64_t m, int64_t col, float v) { su[m * Is + col] = v; });
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n * Is; i += kThreads) sa[i] = spec::swiglu_act(sg[i], su[i]);
  async_proxy_fence();  // shared_act is read next by TMA
  __syncthreads();
  float* so = S.shared_out + t0 * H;
  for (int64_t n0 = 0; n0 < H; n0 += kTileN)
    gemm_tile_kmajor(smem, n, H, Is, 0, n0, zero, maps.shared_act, t0, sa, Is, maps.w_shared_down, 0, W.w_shared_down,
                     Is, tma, [&](int64_t m, int64_t col, float v) { so[m * H + col] = v; });
  publish(&S.counters[2], 1);
}

__device__ inline int64_t shared_tiles(const spec::LayerConfig& c) {
  return c.has_shared() ? (c.tokens_per_rank + kTileM - 1) / kTileM : 0;
}

// The compute role's work list: every local expert's rows in 64-row tiles, then the shared
// expert's token tiles; item i goes to compute block i mod count (who computes, never how).
// Returns false when the pass is aborting.
template <class ExpertTile, class SharedTile>
__device__ bool for_each_compute_item(const LaunchParams& P, const Role& role, ExpertTile expert_tile,
                                      SharedTile shared_tile) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t T = c.tokens_per_rank;
  int64_t item = 0;
  for (int64_t e = 0; e < c.experts_per_rank(); ++e) {
    const int64_t lo = S.expert_offsets[e], hi = S.expert_offsets[e + 1];
    for (int64_t p0 = lo; p0 < hi; p0 += kTileM, ++item)
      if (item % role.count == role.index && !expert_tile(e, p0, min(static_cast<int64_t>(kTileM), hi - p0)))
        return false;
  }
  for (int64_t j = 0; j < shared_tiles(c); ++j, ++item)
    if (item % role.count == role.index) shared_tile(j * kTileM, min(static_cast<int64_t>(kTileM), T - j * kTileM));
  return true;
}

__global__ void __launch_bounds__(kThreads) moe_forward_kernel(const LaunchParams* params) {
  const LaunchParams& P = *params;
  const Role role = my_role(P);
  if (role.rank == P.silent_rank) return;
  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  TileSmem& smem = *reinterpret_cast<TileSmem*>(dynamic_smem);
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden, K = c.top_k, T = c.tokens_per_rank;

  if (role.block == 0) {
    count_rows(P, role);
    count_expected_arrivals(P, role);
  }
  if (!rank_barrier(P, role.rank)) return;
  if (!build_plan(P, role)) return;
  if (!rank_barrier(P, role.rank)) return;

  if (role.comm) {
    gather_rows(P, role, S.xd, S.row_ready, [](const PeerBuffers& b) { return b.x; });
  } else {
    if (!for_each_compute_item(
            P, role,
            [&](int64_t e, int64_t p0, int64_t n) { return forward_expert_tile(P, role, smem, e, p0, n); },
            [&](int64_t t0, int64_t n) { forward_shared_tile(P, role, smem, t0, n); }))
      return;
  }
  // Every block of the rank combines a share of its tokens once every slot has arrived and the
  // shared expert is done (the element partition changes who computes, never the order).
  if (!block_wait(P, &P.peers[role.rank].arrivals[0], S.counters[4], role.rank, kFlagForwardArrivals, -1)) return;
  if (!block_wait(P, &S.counters[2], static_cast<uint32_t>(shared_tiles(c)), role.rank, kFlagSharedForward, -1))
    return;
  const uint16_t* y = P.peers[role.rank].y_slots;
  const int32_t* topk = P.peers[role.rank].topk;
  const float* w = P.peers[role.rank].router_weights;
  uint16_t* out = P.tensors[role.rank].output;
  for (int64_t i = role.block * kThreads + threadIdx.x; i < T * H; i += P.blocks_per_rank * kThreads) {
    const int64_t t = i / H, h = i % H;
    float acc = c.has_shared() ? __ldcg(&S.shared_out[i]) : 0.0f;
    for (int64_t k = 0; k < K; ++k)  // ORDER: combine-slots
      if (topk[t * K + k] >= 0) acc = spec::combine_step(acc, w[t * K + k], __ldcg(&y[(t * K + k) * H + h]));
    out[i] = spec::bf16_from_f32_rne(acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.

__device__ inline bool backward_expert_tile(const LaunchParams& P, const Role& role, TileSmem& smem, int64_t e_local,
                                            int64_t p0, int64_t n) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, I = c.intermediate, K = c.top_k, T = c.tokens_per_rank;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  if (!wait_rows(P, role, S.row_ready_bwd, p0, n, kFlagBackwardDispatchRow)) return false;
  const uint16_t* wg = W.w_routed_gate + e_local * I * H;
  const uint16_t* wu = W.w_routed_up + e_local * I * H;
  const uint16_t* wd = W.w_routed_down + e_local * H * I;
  uint16_t* dy = S.dy + p0 * H;
  for (int64_t i = threadIdx.x; i < n * H; i += kThreads) {
    const RowRef row = S.rows[p0 + i / H];
    const float w = P.peers[row.token_idx / T].router_weights[(row.token_idx % T) * K + row.slot_idx];
    dy[i] = spec::scale_grad(w, S.dod[p0 * H + i]);
  }
  __syncthreads();
  const float* gate = S.gate + p0 * I;
  const float* up = S.up + p0 * I;
  uint16_t* dg = S.d_gate + p0 * I;
  uint16_t* du = S.d_up + p0 * I;
  auto zero = [] __device__(int64_t, int64_t) { return 0.0f; };
  for (int64_t n0 = 0; n0 < I; n0 += kTileN)  // ORDER: dot-chain over H (da = dy . W_down[e])
    gemm_tile(smem, n, I, H, 0, n0, zero, [&](int64_t m, int64_t k) { return dy[m * H + k]; },
              [&](int64_t k, int64_t col) { return wd[k * I + col]; },
              [&](int64_t m, int64_t col, float da) {
                const int64_t j = m * I + col;
                dg[j] = spec::swiglu_grad_gate(da, gate[j], up[j]);
                du[j] = spec::swiglu_grad_up(da, gate[j]);
              });
  __syncthreads();
  for (int64_t n0 = 0; n0 < H; n0 += kTileN)  // ORDER: dot-chain over 2I, gate half first
    gemm_tile(smem, n, H, 2 * I, 0, n0, zero,
              [&](int64_t m, int64_t k) { return k < I ? dg[m * I + k] : du[m * I + (k - I)]; },
              [&](int64_t k, int64_t col) { return k < I ? wg[k * H + col] : wu[(k - I) * H + col]; },
              [&](int64_t m, int64_t col, float v) { push_to_owner(P, S, &PeerBuffers::dx_slots, p0 + m, col, v); });
  publish_rows(P, S, p0, n, 1);
  return true;
}

__device__ inline void backward_shared_tile(const LaunchParams& P, const Role& role, TileSmem& smem, int64_t t0,
                                            int64_t n) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, Is = c.shared_intermediate;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const uint16_t* dout = P.peers[role.rank].d_output + t0 * H;
  const float* sg = S.shared_gate + t0 * Is;
  const float* su = S.shared_up + t0 * Is;
  uint16_t* sdg = S.shared_d_gate + t0 * Is;
  uint16_t* sdu = S.shared_d_up + t0 * Is;
  auto zero = [] __device__(int64_t, int64_t) { return 0.0f; };
  for (int64_t n0 = 0; n0 < Is; n0 += kTileN)
    gemm_tile(smem, n, Is, H, 0, n0, zero, [&](int64_t m, int64_t k) { return dout[m * H + k]; },
              [&](int64_t k, int64_t col) { return W.w_shared_down[k * Is + col]; },
              [&](int64_t m, int64_t col, float da) {
                const int64_t j = m * Is + col;
                sdg[j] = spec::swiglu_grad_gate(da, sg[j], su[j]);
                sdu[j] = spec::swiglu_grad_up(da, sg[j]);
              });
  __syncthreads();
  float* dxs = S.dx_shared + t0 * H;
  for (int64_t n0 = 0; n0 < H; n0 += kTileN)
    gemm_tile(smem, n, H, 2 * Is, 0, n0, zero,
              [&](int64_t m, int64_t k) { return k < Is ? sdg[m * Is + k] : sdu[m * Is + (k - Is)]; },
              [&](int64_t k, int64_t col) {
                return k < Is ? W.w_shared_gate[k * H + col] : W.w_shared_up[(k - Is) * H + col];
              },
              [&](int64_t m, int64_t col, float v) { dxs[m * H + col] = v; });
  publish(&S.counters[3], 1);
}

// Weight-gradient tile items: routed (per local expert: gate, up [I x H]; down [H x I]) then
// shared (gate, up [Is x H]; down [H x Is]). ORDER: weight-grad chain over the canonical row
// list (routed) or the rank's tokens in order (shared), 16 rows per MMA step.
__device__ inline void weight_grad_tiles(const LaunchParams& P, const Role& role, TileSmem& smem) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, T = c.tokens_per_rank;
  const int64_t E_local = c.experts_per_rank();
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  auto zero = [] __device__(int64_t, int64_t) { return 0.0f; };
  auto tiles = [](int64_t M, int64_t N) { return ((M + kTileM - 1) / kTileM) * ((N + kTileN - 1) / kTileN); };
  int64_t item = 0;
  for (int64_t e = 0; e < E_local; ++e) {
    const int64_t r0 = S.expert_offsets[e], nr = S.expert_offsets[e + 1] - r0;
    for (int which = 0; which < 3; ++which) {
      const bool down = which == 2;
      const int64_t M = down ? H : I, N = down ? I : H;
      const uint16_t* a_src = which == 0 ? S.d_gate : which == 1 ? S.d_up : S.dy;  // [rows, M]
      const uint16_t* b_src = down ? S.act : S.xd;                                 // [rows, N]
      float* out = (which == 0 ? W.d_w_routed_gate : which == 1 ? W.d_w_routed_up : W.d_w_routed_down) + e * M * N;
      const int64_t tn = (N + kTileN - 1) / kTileN;
      for (int64_t t = 0; t < tiles(M, N); ++t, ++item) {
        if (item % role.count != role.index) continue;
        gemm_tile(smem, M, N, nr, (t / tn) * kTileM, (t % tn) * kTileN, zero,
                  [&](int64_t m, int64_t k) { return a_src[(r0 + k) * M + m]; },
                  [&](int64_t k, int64_t col) { return b_src[(r0 + k) * N + col]; },
                  [&](int64_t m, int64_t col, float v) { out[m * N + col] = v; });
      }
    }
  }
  if (!c.has_shared()) return;
  const uint16_t* x = P.peers[role.rank].x;
  const uint16_t* dout = P.peers[role.rank].d_output;
  for (int which = 0; which < 3; ++which) {
    const bool down = which == 2;
    const int64_t M = down ? H : Is, N = down ? Is : H;
    const uint16_t* a_src = which == 0 ? S.shared_d_gate : which == 1 ? S.shared_d_up : dout;  // [T, M]
    const uint16_t* b_src = down ? S.shared_act : x;                                           // [T, N]
    float* out = which == 0 ? W.d_w_shared_gate : which == 1 ? W.d_w_shared_up : W.d_w_shared_down;
    const int64_t tn = (N + kTileN - 1) / kTileN;
    for (int64_t t = 0; t < tiles(M, N); ++t, ++item) {
      if (item % role.count != role.index) continue;
      gemm_tile(smem, M, N, T, (t / tn) * kTileM, (t % tn) * kTileN, zero,
                [&](int64_t m, int64_t k) { return a_src[k * M + m]; },
                [&](int64_t k, int64_t col) { return b_src[k * N + col]; },
                [&](int64_t m, int64_t col, float v) { out[m * N + col] = v; });
    }
  }
}

__global__ void __launch_bounds__(kThreads) moe_backward_kernel(const LaunchParams* params) {
  const LaunchParams& P = *params;
  const Role role = my_role(P);
  if (role.rank == P.silent_rank) return;
  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  TileSmem& smem = *reinterpret_cast<TileSmem*>(dynamic_smem);
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden, K = c.top_k, T = c.tokens_per_rank;
  // The routing plan and the forward intermediates (gate, up, act, gathered x, shared
  // gate/up/act) stay in the workspace from the forward pass of the same inputs.
  if (role.block == 0) count_expected_arrivals(P, role);
  if (role.comm) {
    gather_rows(P, role, S.dod, S.row_ready_bwd, [](const PeerBuffers& b) { return b.d_output; });
  } else {
    if (!for_each_compute_item(
            P, role,
            [&](int64_t e, int64_t p0, int64_t n) { return backward_expert_tile(P, role, smem, e, p0, n); },
            [&](int64_t t0, int64_t n) { backward_shared_tile(P, role, smem, t0, n); }))
      return;
  }
  if (!rank_barrier(P, role.rank)) return;
  // Every block: a share of d_x once every dx row has arrived, and of d_router_weights; then
  // the compute blocks produce the weight gradients.
  if (!block_wait(P, &P.peers[role.rank].arrivals[1], S.counters[4], role.rank, kFlagBackwardArrivals, -1)) return;
  if (!block_wait(P, &S.counters[3], static_cast<uint32_t>(shared_tiles(c)), role.rank, kFlagSharedBackward, -1))
    return;
  const uint16_t* dx = P.peers[role.rank].dx_slots;
  const uint16_t* y = P.peers[role.rank].y_slots;
  const uint16_t* dout = P.peers[role.rank].d_output;
  const int32_t* topk = P.peers[role.rank].topk;
  const RankTensors& R = P.tensors[role.rank];
  for (int64_t i = role.block * kThreads + threadIdx.x; i < T * H; i += P.blocks_per_rank * kThreads) {
    const int64_t t = i / H, h = i % H;
    float acc = c.has_shared() ? __ldcg(&S.dx_shared[i]) : 0.0f;
    for (int64_t k = 0; k < K; ++k)  // ORDER: dx-slots
      if (topk[t * K + k] >= 0) acc = spec::dx_step(acc, __ldcg(&dx[(t * K + k) * H + h]));
    R.d_x[i] = spec::bf16_from_f32_rne(acc);
  }
  // ORDER: router-grad-lanes: one warp per slot, lane j sums h = j mod 32, xor butterfly.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t s = role.block * (kThreads / 32) + warp; s < T * K; s += P.blocks_per_rank * (kThreads / 32)) {
    if (topk[s] < 0) {
      if (lane == 0) R.d_router_weights[s] = 0.0f;
      continue;
    }
    const int64_t t = s / K;
    float acc = 0.0f;
    for (int64_t h = lane; h < H; h += 32)
      acc = spec::ffma(spec::f32_from_bf16(dout[t * H + h]), spec::f32_from_bf16(y[s * H + h]), acc);
    for (int offset = 16; offset >= 1; offset /= 2) acc = spec::fadd(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
    if (lane == 0) R.d_router_weights[s] = acc;
  }
  if (!role.comm) weight_grad_tiles(P, role, smem);
}

}  // namespace mok::kernel::device
