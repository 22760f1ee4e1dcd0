// The fused MoE layer kernels (forward, backward): one persistent cooperative launch holds every rank.
#pragma once

#include "mma_tile.cuh"
#include "sync.cuh"

#include "mok/kernel/params.hpp"
#include "mok/kernel/row_tiles.hpp"
#include "mok/spec/orders.hpp"

namespace mok::kernel::device {

using spec::RowRef;

// The atomics variant (-DMOK_ATOMICS_VARIANT, built only as the benchmark mok-bench-atomics):
// the same kernel with the combine, d_x and weight gradients accumulated by fp32 atomics in
// arrival order, the design the deterministic kernel is measured against (issue 4). Its results
// are not bit-reproducible and nothing but the benchmark uses it.
#if defined(MOK_ATOMICS_VARIANT)
inline constexpr bool kAtomics = true;
#else
inline constexpr bool kAtomics = false;
#endif
// Row splits of each weight-gradient tile in the atomics variant (partial sums added atomically).
inline constexpr int64_t kAtomicSplits = 4;

// Which rank a block serves and its role: blocks [0, comm) of a rank communicate (gather rows
// from peers) and then join the rest on the GEMM work items (expert and shared-expert GEMMs,
// weight gradients). Every block of the rank then takes a share of the combines for the rank's
// own tokens. Roles change who
// does the work, never its order.
struct Role {
  int rank;
  int block;         // within the rank
  int blocks;        // the rank's blocks (rank_block_of: one more on the first P.wide_ranks ranks)
  bool comm;
  int index;         // within the role
  int count;         // blocks in the role
};

__device__ inline Role my_role(const LaunchParams& P, bool forward) {
  const int comm = forward ? P.comm_blocks_forward : P.comm_blocks_per_rank;
  const RankBlock rb = rank_block_of(static_cast<int>(blockIdx.x), P.blocks_per_rank, P.wide_ranks);
  Role r;
  r.rank = P.first_rank + rb.local;
  r.block = rb.block;
  r.blocks = rb.count;
  r.comm = r.block < comm;
  r.index = r.comm ? r.block : r.block - comm;
  r.count = r.comm ? comm : r.blocks - comm;
  return r;
}

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tokens whose routing rows a block of a rank reads while counting and planning: a
// contiguous slice of the G tokens of every rank (one of role.blocks), the same slice in both
// steps (the plan's row positions start from the counts of the slices before it).
struct TokenSlice {
  int64_t lo, hi;
};
__device__ __forceinline__ TokenSlice token_slice(const LaunchParams& P, const Role& role) {
  const int64_t G = P.cfg.num_tokens(), per = ceil_div(G, role.blocks);
  const int64_t lo = min(G, role.block * per);
  return TokenSlice{lo, min(G, lo + per)};
}

// Global token g as (owner rank, token at the owner): spec::LayerConfig::token_rank and the
// token's index there, in 32-bit unsigned division, which serves because
// spec::LayerConfig::validate keeps R * T * K below 2^31 (a few instructions, against the
// subroutine call of a 64-bit division).
struct TokenAt {
  int rank;
  int64_t t;
};
__device__ __forceinline__ TokenAt token_at(const LaunchParams& P, int32_t g) {
  const uint32_t T = static_cast<uint32_t>(P.cfg.tokens_per_rank), u = static_cast<uint32_t>(g);
  const uint32_t r = u / T;
  return TokenAt{static_cast<int>(r), static_cast<int64_t>(u - r * T)};
}

// The router weights, checked before a pass does any work (DESIGN.md section 3: a non-finite
// router weight is refused, never turned into a wrong answer). Every rank checks every global
// entry [G, K] (empty slots too, as the host's check does), each block the entries of its token
// slice, so every rank stops on its own and none has started its work when another raises. A
// thread that finds one (its first: its later entries are larger) folds the entry and the float's
// bits into ErrorRecord::weight_key by an integer atomicMax, so that after the launch the record
// names the first bad entry in token order whichever blocks ran first, and raises code 4. Returns
// false when the block found one (it must then leave without arriving at any barrier, so that the
// rank's other blocks see the abort there). No shared memory: the common case is one block-wide OR.
__device__ inline bool check_router_weights(const LaunchParams& P, const Role& role) {
  const int64_t K = P.cfg.top_k, TK = P.cfg.tokens_per_rank * K;
  const TokenSlice ts = token_slice(P, role);
  const int64_t lo = ts.lo * K, hi = ts.hi * K;
  // Entry i is entry i % TK of rank i / TK's weights; the pair advances by additions.
  int64_t i = lo + threadIdx.x, owner = i / TK, at = i % TK;
  bool bad = false;
  for (; i < hi; i += kThreads) {
    const uint32_t bits = __float_as_uint(P.peers[owner].router_weights[at]);
    if ((bits & 0x7f800000u) == 0x7f800000u) {  // Inf or NaN: the largest exponent
      atomicMax(reinterpret_cast<unsigned long long*>(&P.error->weight_key), weight_error_key(i, bits));
      raise_error(P, 4, role.rank, kFlagBadRouting, 0, bits, i);
      bad = true;
      break;
    }
    for (at += kThreads; at >= TK; at -= TK) ++owner;
  }
  return __syncthreads_or(bad ? 1 : 0) == 0;
}

// Rows per local expert: every block of the rank counts the routing entries of its token slice in
// shared memory, writes its counts to block_counts[e][block] and adds them to expert_counts
// (integer sums: the same whatever the slices). Before the plan is filled (a rank barrier follows).
__device__ inline void count_rows(const LaunchParams& P, const Role& role) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t K = c.top_k, T = c.tokens_per_rank, E_local = c.experts_per_rank();
  const RankState& S = P.state[role.rank];
  __shared__ unsigned int counts[256];
  const TokenSlice ts = token_slice(P, role);
  const int64_t lo = ts.lo * K, hi = ts.hi * K;
  for (int64_t e0 = 0; e0 < E_local; e0 += 256) {
    for (int i = threadIdx.x; i < 256; i += kThreads) counts[i] = 0;
    __syncthreads();
    const int64_t first = role.rank * E_local + e0, last = role.rank * E_local + min(E_local, e0 + 256);
    // Entry i is entry i % TK of rank i / TK's routing; the pair advances by additions (no
    // 64-bit division per entry).
    const int64_t TK = T * K;
    int64_t i = lo + threadIdx.x, owner = i / TK, at = i % TK;
    for (; i < hi; i += kThreads) {
      const int32_t id = P.peers[owner].topk[at];
      if (id >= first && id < last) atomicAdd(&counts[id - first], 1u);
      for (at += kThreads; at >= TK; at -= TK) ++owner;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 256 && e0 + i < E_local; i += kThreads) {
      S.block_counts[(e0 + i) * block_counts_stride(P.blocks_per_rank) + role.block] = counts[i];
      if (counts[i]) atomicAdd(&S.expert_counts[e0 + i], counts[i]);
    }
    __syncthreads();
  }
}

// Block 0 of the rank, after count_rows and a rank barrier: expert_offsets from the counts (read
// by every later phase, after the next rank barrier), and the workspace check.
__device__ inline void write_offsets(const LaunchParams& P, const Role& role) {
  const int64_t E_local = P.cfg.experts_per_rank();
  const RankState& S = P.state[role.rank];
  __shared__ uint32_t chunk[256];
  int64_t run = 0;  // thread 0's
  if (threadIdx.x == 0) S.expert_offsets[0] = 0;
  for (int64_t e0 = 0; e0 < E_local; e0 += 256) {
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += kThreads) chunk[i] = e0 + i < E_local ? __ldcg(&S.expert_counts[e0 + i]) : 0u;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t e = e0; e < E_local && e < e0 + 256; ++e) {
        run += chunk[e - e0];
        S.expert_offsets[e + 1] = run;
      }
  }
  // Invalid routing (duplicate ids) or a workspace sized for other routing can exceed it.
  if (threadIdx.x == 0 && run > P.row_capacity) raise_error(P, 2, role.rank, kFlagBadRouting, P.row_capacity, run, -1);
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// Routing plan, built by every rank for its own experts from all ranks' topk_experts.

// One token's routing row, checked: `bad` is the first invalid entry in slot order (-1: none): an
// id outside [-1, E), or one that repeats an earlier slot's. kRegK > 0 (rows of at most kRegK
// ids): the ids the caller loaded into registers (load_ids, every load in flight at once) are
// checked there. kRegK = 0: any K, one id at a time from the row.
struct RowCheck {
  int64_t bad = -1;
  int32_t bad_id = 0;
};
// A routing row of at most kRegK ids into registers, every load in flight at once (-1 past K).
template <int kRegK>
__device__ __forceinline__ void load_ids(const int32_t* row, int64_t K, int32_t (&ids)[kRegK]) {
#pragma unroll
  for (int k = 0; k < kRegK; ++k) ids[k] = k < K ? row[k] : -1;
}

template <int kRegK>
__device__ __forceinline__ RowCheck check_row(const int32_t* row, const int32_t (&ids)[kRegK > 0 ? kRegK : 1],
                                              int64_t K, int64_t E) {
  RowCheck r;
  auto visit = [&](int64_t k, int32_t id, auto earlier) {
    if (r.bad < 0 && (id < -1 || id >= E)) r = RowCheck{k, id};
    if (r.bad < 0 && id >= 0 && earlier(id)) r = RowCheck{k, id};
  };
  if constexpr (kRegK > 0) {
#pragma unroll
    for (int k = 0; k < kRegK; ++k)
      if (k < K)
        visit(k, ids[k], [&](int32_t id) {
          bool seen = false;
#pragma unroll
          for (int j = 0; j < k; ++j) seen |= ids[j] == id;
          return seen;
        });
  } else {
    for (int64_t k = 0; k < K; ++k)
      visit(k, row[k], [&](int32_t id) {
        for (int64_t j = 0; j < k; ++j)
          if (row[j] == id) return true;
        return false;
      });
  }
  return r;
}

// ORDER: canonical rows of expert e: ascending global token id, then slot (spec routing plan; a
// valid row names e at most once, so token order is the whole order). Block b of the rank places
// the rows of its token slice (token_slice, the slice count_rows counted): expert e's first row of
// the slice is the rows of local experts before e plus e's rows in the slices of blocks 0 .. b - 1
// (block_counts, summed with 16-byte loads). The slice is read 256 tokens a round, a thread a
// token; each warp marks its lanes' experts in one bit mask per (warp, expert) in shared memory,
// and a lane's row for e goes after e's rows from earlier rounds, earlier warps (their masks'
// popcounts) and lower lanes of its warp. Every routing row is checked once per rank, by the
// block whose slice holds it (ids in [-1, E), distinct in a row), and the first invalid entry the
// block sees is raised. Experts are placed kPlanExperts at a time in the idle ring (5 KiB), so
// any E_local fits the slow engine's buffers too. Before: a block per expert scanned all G rows
// twice (qwen3's "plan built" at 0.096 ms, H100, thirty-third session).
inline constexpr int kPlanExperts = 128;
inline constexpr int kRowCheckRegs = 16;
template <int kRegK>
__device__ inline void plan_slice(const LaunchParams& P, const Role& role, uint8_t* smem) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t K = c.top_k, T = c.tokens_per_rank, E_all = c.num_experts, E_local = c.experts_per_rank();
  const RankState& S = P.state[role.rank];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned below = (1u << lane) - 1u;
  uint32_t* masks = reinterpret_cast<uint32_t*>(smem);                      // [kWarps][kPlanExperts]
  int64_t* base = reinterpret_cast<int64_t*>(masks + kWarps * kPlanExperts);  // [kPlanExperts]
  __shared__ int64_t scan[kWarps];
  const TokenSlice ts = token_slice(P, role);
  const int64_t stride = block_counts_stride(P.blocks_per_rank);
  int64_t before = 0;  // rows of the local experts before this group (every thread's copy)
  int64_t bad_index = -1;
  int32_t bad_id = 0;
  for (int64_t e0 = 0; e0 < E_local; e0 += kPlanExperts) {
    const int n_e = static_cast<int>(min(static_cast<int64_t>(kPlanExperts), E_local - e0));
    // base[i]: the first row of expert e0 + i in this slice.
    const int i = threadIdx.x;
    int64_t total = 0, earlier = 0;
    if (i < n_e) {
      total = __ldcg(&S.expert_counts[e0 + i]);
      const uint32_t* row = S.block_counts + (e0 + i) * stride;
      uint32_t sum = 0;
      for (int q = 0; q < role.block; q += 4) {
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(row + q));
        sum += v.x + (q + 1 < role.block ? v.y : 0u) + (q + 2 < role.block ? v.z : 0u) +
               (q + 3 < role.block ? v.w : 0u);
      }
      earlier = sum;
    }
    if (i < kPlanExperts)
      for (int w = 0; w < kWarps; ++w) masks[w * kPlanExperts + i] = 0u;
    // An exclusive scan of the group's totals: within the warp by shuffles, then over warps.
    int64_t incl = total;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (lane == 31) scan[warp] = incl;
    __syncthreads();
    int64_t offset = before;
    for (int w = 0; w < warp; ++w) offset += scan[w];
    if (i < n_e) base[i] = offset + incl - total + earlier;
    for (int w = 0; w < kWarps; ++w) before += scan[w];
    __syncthreads();
    const int64_t first = role.rank * E_local + e0;
    // This thread's token g = t0 + threadIdx.x as (rank, token), advanced by additions (the GPU
    // has no 64-bit divide instruction).
    int64_t g_rank = (ts.lo + threadIdx.x) / T, g_t = (ts.lo + threadIdx.x) % T;
    for (int64_t t0 = ts.lo; t0 < ts.hi; t0 += kThreads) {
      const int64_t g = t0 + threadIdx.x;
      const bool mine = g < ts.hi;
      const int32_t* row = mine ? P.peers[g_rank].topk + g_t * K : nullptr;
      for (g_t += kThreads; g_t >= T && g_rank < P.num_ranks; g_t -= T) ++g_rank;
      int32_t ids[kRegK > 0 ? kRegK : 1];
      if constexpr (kRegK > 0) {
        if (mine) load_ids(row, K, ids);
      }
      auto id_at = [&](int64_t k) -> int32_t {
        if constexpr (kRegK > 0) return ids[k];
        else return row[k];
      };
      if (mine && e0 == 0 && bad_index < 0) {  // the checks, on the first group's pass only
        const RowCheck r = check_row<kRegK>(row, ids, K, E_all);
        if (r.bad >= 0) {
          bad_index = g * K + r.bad;
          bad_id = r.bad_id;
        }
      }
      auto each_local = [&](auto body) {
        if (!mine) return;
        if constexpr (kRegK > 0) {
#pragma unroll
          for (int k = 0; k < kRegK; ++k)
            if (k < K && id_at(k) >= first && id_at(k) < first + n_e) body(k, static_cast<int>(id_at(k) - first));
        } else {
          for (int64_t k = 0; k < K; ++k)
            if (id_at(k) >= first && id_at(k) < first + n_e) body(k, static_cast<int>(id_at(k) - first));
        }
      };
      each_local([&](int64_t, int e) { atomicOr(&masks[warp * kPlanExperts + e], 1u << lane); });
      __syncthreads();
      each_local([&](int64_t k, int e) {
        int64_t pos = base[e] + __popc(masks[warp * kPlanExperts + e] & below);
        for (int w = 0; w < warp; ++w) pos += __popc(masks[w * kPlanExperts + e]);
        if (pos < P.row_capacity)  // bad routing can overflow
          S.rows[pos] = RowRef{static_cast<int32_t>(g), static_cast<int32_t>(k)};
      });
      __syncthreads();
      if (i < n_e) {
        int64_t n = 0;
        for (int w = 0; w < kWarps; ++w) {
          n += __popc(masks[w * kPlanExperts + i]);
          masks[w * kPlanExperts + i] = 0u;
        }
        base[i] += n;
      }
      __syncthreads();
    }
  }
  if (bad_index >= 0) raise_error(P, 2, role.rank, kFlagBadRouting, E_all, bad_id, bad_index);
#if defined(MOK_WGMMA)
  // The ring's bytes are next written by TMA and bulk copies (the async proxy): order this
  // plan's generic-proxy accesses before them (build_plan's barrier follows).
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
static_assert(kThreads >= kPlanExperts && kPlanExperts % 32 == 0, "a thread per expert of a plan group");
static_assert(kWarps * kPlanExperts * 4 + kPlanExperts * 8 <= smem_bytes_for(0, false) - 1024,
              "the plan's masks and bases fit in the dynamic shared memory of a slow launch");

__device__ inline bool build_plan(const LaunchParams& P, const Role& role, uint8_t* smem) {
  const int64_t K = P.cfg.top_k;
  if (K <= 8) plan_slice<8>(P, role, smem);
  else if (K <= kRowCheckRegs) plan_slice<kRowCheckRegs>(P, role, smem);
  else plan_slice<0>(P, role, smem);
  // One decision for the whole block: a block whose threads read the flag at different moments
  // would split, and a part without thread 0 would wait forever on its TMA barriers.
  return __syncthreads_or(load_volatile(P.abort) != 0 ? 1 : 0) == 0;
}

// Column-tile widths of the engine in use: GEMMs with two B operands (forward gate and up) and
// with one (everything else). The slow engine's tiles are 64 wide.
__device__ __forceinline__ int64_t width_dual(const LaunchParams& P) { return P.fast ? kTileNFast : kTileNSlow; }
__device__ __forceinline__ int64_t width_single(const LaunchParams& P) { return P.fast ? kTileNWide : kTileNSlow; }

__device__ inline int64_t shared_tiles(const spec::LayerConfig& c) {
  return c.has_shared() ? (c.tokens_per_rank + kTileM - 1) / kTileM : 0;
}

// Expected arrivals of a pass: this rank's non-empty slots, each pushed once per column tile of
// H. Every block of the rank adds its slice's share to counters[4] (zeroed before every pass;
// integer sums) before a rank barrier that precedes every wait on it.
__device__ inline void count_expected_arrivals(const LaunchParams& P, const Role& role) {
  const int64_t n_slots = P.cfg.tokens_per_rank * P.cfg.top_k;
  const int64_t per = ceil_div(n_slots, role.blocks), lo = min(n_slots, role.block * per),
                hi = min(n_slots, lo + per);
  __shared__ unsigned int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned int mine = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) mine += P.peers[role.rank].topk[i] >= 0;
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0 && total)
    atomicAdd(&P.state[role.rank].counters[4], total * static_cast<uint32_t>(ceil_div(P.cfg.hidden, width_single(P))));
}

// 16-byte loads each lane keeps in flight while gathering (8 measured no faster on the H200:
// kernel/notes/bench_default_comm_atomics.txt).
inline constexpr int kGatherInFlight = 4;

// Gathers rows of a token-major bf16 tensor (x, or d_output scaled by the slot's router weight)
// from their owners into the rank's row-major workspace and raises each row's ready flag to the
// launch epoch. One warp per row; with H a multiple of 8 every lane moves 16 bytes per access,
// four accesses in flight (a row of 7168 is 28 loads per lane).
template <bool kScale, class Source>
__device__ inline void gather_rows(const LaunchParams& P, const Role& role, uint16_t* dst, uint32_t* ready,
                                   Source source) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden, K = c.top_k;
  const int64_t n_rows = S.expert_offsets[c.experts_per_rank()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool vec = H % 8 == 0;
  for (int64_t p = role.index * kWarps + warp; p < n_rows; p += role.count * kWarps) {
    const RowRef row = S.rows[p];
    const TokenAt at = token_at(P, row.token_idx);
    const PeerBuffers& owner = P.peers[at.rank];
    const uint16_t* __restrict__ src = source(owner) + at.t * H;
    uint16_t* __restrict__ out = dst + p * H;
    const float w = kScale ? owner.router_weights[at.t * K + row.slot_idx] : 0.0f;
    auto convert = [&](uint4 v) {
      if constexpr (kScale) {
        uint32_t* u = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          u[q] = pack2(spec::scale_grad(w, static_cast<uint16_t>(u[q] & 0xFFFF)),
                       spec::scale_grad(w, static_cast<uint16_t>(u[q] >> 16)));
      }
      return v;
    };
    if (vec) {
      const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(src);
      uint4* __restrict__ d4 = reinterpret_cast<uint4*>(out);
      const int64_t n4 = H / 8;
      int64_t i = lane;
      for (; i + 32 * (kGatherInFlight - 1) < n4; i += 32 * kGatherInFlight) {
        uint4 v[kGatherInFlight];
#pragma unroll
        for (int q = 0; q < kGatherInFlight; ++q) v[q] = s4[i + 32 * q];
#pragma unroll
        for (int q = 0; q < kGatherInFlight; ++q) d4[i + 32 * q] = convert(v[q]);
      }
      for (; i < n4; i += 32) d4[i] = convert(s4[i]);
    } else {
      for (int64_t h = lane; h < H; h += 32) out[h] = kScale ? spec::scale_grad(w, src[h]) : src[h];
    }
    async_proxy_fence();  // the row is read next by TMA (async proxy)
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicMax(&ready[p], P.epoch);
  }
}

#if defined(MOK_WGMMA)
// The forward's gather by bulk copies (LaunchParams::bulk_gather, sm_90a): the same rows, bytes
// and flags as gather_rows<false>, moved global -> shared -> global by the TMA unit
// (cp.async.bulk) through the idle ring instead of through registers. The thread gather keeps
// only 16 KiB per block in flight (Little's law then gives the 20-25 GB/s per SM that
// mok-bench's traces show); here lane 0 of each warp runs its own pipeline of up to eight row
// slots, so a block keeps up to the whole 192 KiB ring in flight. Rows go to (block, warp) in the
// same interleaved order as gather_rows, so row tiles become ready in about row order.
inline constexpr int kBulkSlotsPerWarp = 8;
inline constexpr int kBulkBarBytes = kWarps * kBulkSlotsPerWarp * 8;  // the mbarriers, at the ring's end
// Warps that run a pipeline (at least two slots each where rows allow) and slots per warp; 0 when a
// row does not fit twice in the ring (the caller gathers with threads then).
__device__ inline void bulk_gather_shape(int64_t row_bytes, int& warps, int& slots) {
  const int64_t slot = (row_bytes + 127) / 128 * 128, room = kRingBytes - kBulkBarBytes;
  const int64_t total = room / slot;
  warps = static_cast<int>(total / 2 < kWarps ? total / 2 : kWarps);
  slots = warps > 0 ? static_cast<int>(total / warps < kBulkSlotsPerWarp ? total / warps : kBulkSlotsPerWarp) : 0;
}
// bulk_wait_read<n> for a count known only at run time (n in 1..4; the instruction takes an
// immediate).
__device__ __forceinline__ void bulk_wait_read_all_but(int n) {
  switch (n) {
    case 1: bulk_wait_read<1>(); break;
    case 2: bulk_wait_read<2>(); break;
    case 3: bulk_wait_read<3>(); break;
    default: bulk_wait_read<4>(); break;
  }
}
template <class Source>
__device__ inline void gather_rows_bulk(const LaunchParams& P, const Role& role, uint8_t* smem, uint16_t* dst,
                                        uint32_t* ready, Source source, int warps, int slots) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden;
  const int64_t n_rows = S.expert_offsets[c.experts_per_rank()];
  const uint32_t bytes = static_cast<uint32_t>(H * 2);  // a multiple of 16 (H is a multiple of 64 here)
  const int64_t slot_bytes = (int64_t{bytes} + 127) / 128 * 128;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < warps && lane == 0) {
    uint8_t* base = smem + static_cast<int64_t>(warp) * slots * slot_bytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kRingBytes - kBulkBarBytes) + warp * kBulkSlotsPerWarp;
    for (int q = 0; q < slots; ++q)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bars[q])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    const int64_t first = static_cast<int64_t>(role.index) * warps + warp, stride = static_cast<int64_t>(role.count) * warps;
    const int64_t mine = first < n_rows ? (n_rows - first + stride - 1) / stride : 0;
    auto row_of = [&](int64_t k) { return first + k * stride; };
    auto load = [&](int64_t k) {
      const int q = static_cast<int>(k % slots);
      const RowRef row = S.rows[row_of(k)];
      const TokenAt at = token_at(P, row.token_idx);
      const uint16_t* src = source(P.peers[at.rank]) + at.t * H;
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&bars[q])), "r"(bytes)
                   : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
              smem_u32(base + q * slot_bytes)),
          "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(&bars[q]))
          : "memory");
    };
    // A row's flag goes up once its store has completed: its writes are then visible to this
    // thread, and the release makes them visible to whoever acquires the flag (wait_rows, which
    // then orders them before its TMA loads). Stores are waited for kLag behind the newest and
    // flags raised `batch` (KernelOptions::bulk_gather_batch, default 4) at a time after one
    // fence, so neither the write latency nor the fence is paid per row (a lag of 2 and a fence per row ran at 13 GB/s per SM on qwen3 rows).
    // The pipeline: a slot is loaded, stored from, and loaded again once its store has read it;
    // `stores` (KernelOptions::bulk_gather_stores) stores may still be reading when the oldest's
    // slot is reused, so up to slots - stores loads are in flight behind them.
    constexpr int64_t kLag = 8;
    const int stores = P.bulk_gather_stores < slots ? P.bulk_gather_stores : slots - 1;
    const int64_t batch = P.bulk_gather_batch;
    int64_t raised = 0;  // rows [0, raised) of this pipeline have their flags up
    auto raise_to = [&](int64_t end) {
      async_proxy_fence();
      __threadfence();
      for (; raised < end; ++raised) atomicMax(&ready[row_of(raised)], P.epoch);
    };
    for (int64_t k = 0; k < slots && k < mine; ++k) load(k);
    for (int64_t k = 0; k < mine; ++k) {
      const int q = static_cast<int>(k % slots);
      mbar_wait(&bars[q], static_cast<uint32_t>((k / slots) & 1));
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                       reinterpret_cast<uint64_t>(dst + row_of(k) * H)),
                   "r"(smem_u32(base + q * slot_bytes)), "r"(bytes)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      // Row k - stores's slot takes row k - stores + slots once its store has read it.
      bulk_wait_read_all_but(stores);
      if (k >= stores && k - stores + slots < mine) load(k - stores + slots);
      if (k + 1 - kLag >= raised + batch) {  // stores of rows up to k - kLag have completed after this wait
        asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kLag) : "memory");
        raise_to(k + 1 - kLag);
      }
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    raise_to(mine);
    for (int q = 0; q < slots; ++q) asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&bars[q])) : "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // before TMA loads overwrite the barriers
  }
  __syncthreads();  // the ring is free again for the GEMMs' TMA loads
}
#endif

// Waits until rows [p0, p0 + n) of a gathered tensor are ready (thread i waits for row i).
__device__ inline bool wait_rows(const LaunchParams& P, const Role& role, const uint32_t* ready, int64_t p0, int64_t n,
                                 int flag) {
  bool ok = true;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    ok = ok && wait_at_least(P, &ready[p0 + i], P.epoch, role.rank, flag, p0 + i);
  async_proxy_fence();  // the rows are read next by TMA
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// A row tile's first GEMM is done when all its column tiles have published.
__device__ inline bool wait_tile(const LaunchParams& P, const Role& role, const uint32_t* counter, uint32_t target,
                                 int64_t index) {
  const bool ok = block_wait(P, counter, target, role.rank, kFlagTileDone, index);
  async_proxy_fence();  // the tile's intermediates are read next by TMA
  return ok;
}

// A tile's intermediates are complete: fence for the async proxy and count the tile.
__device__ inline void publish_tile(uint32_t* counter) {
  async_proxy_fence();
  publish(counter, 1);
}

// Combine and backward push: canonical row p's slot row in its token owner's slot buffer
// (y_slots or dx_slots), where each (token, slot) is written once.
__device__ __forceinline__ uint16_t* slot_row_of(const LaunchParams& P, uint16_t* PeerBuffers::*slots, RowRef row) {
  const spec::LayerConfig& c = P.cfg;
  return P.peers[row.token_idx / c.tokens_per_rank].*slots +
         ((row.token_idx % c.tokens_per_rank) * c.top_k + row.slot_idx) * c.hidden;
}
__device__ __forceinline__ uint16_t* slot_row(const LaunchParams& P, const RankState& S, uint16_t* PeerBuffers::*slots,
                                              int64_t p) {
  return slot_row_of(P, slots, S.rows[p]);
}
__device__ inline void push_to_owner(const LaunchParams& P, const RankState& S, uint16_t* PeerBuffers::*slots,
                                     int64_t p, int64_t col, float v) {
  slot_row(P, S, slots, p)[col] = spec::bf16_from_f32_rne(v);
}

// Rows per owner rank of a tile's pushes (publish_rows), or of all of a block's tiles of a rank
// (publish_tallied_rows), tallied in shared memory. Thread r zeroes and later reads entry r, so
// a new tally cannot overwrite the previous one before its counts are made.
__device__ __forceinline__ uint32_t* owner_tally() {
  __shared__ uint32_t per_owner[kMaxRanks];
  return per_owner;
}
__device__ __forceinline__ void zero_owner_tally(const LaunchParams& P) {
  for (int r = threadIdx.x; r < P.num_ranks; r += kThreads) owner_tally()[r] = 0;
}

// The fast engine's phase-2 epilogue (forward down, backward d_x), through shared memory: a
// routed row goes to its slot row at the token's owner (the row's key is that address), staged
// already rounded to bf16 (MixedRows: half the shared-memory bytes, one 16-byte store per lane),
// a shared-expert row to this rank's fp32 `shared` rows (staged in fp32). A routed row's RowRef
// is loaded before the main loop (mixed_rows_early), and its key, the slot address, made from it in
// the epilogue, which also counts the row in owner_tally() (zeroed before the block's first item,
// published after its last: publish_tallied_rows), so that nothing reads the tile's rows again.
// That relies on gemm_fast calling key(i, ...) exactly once per row: an engine that skipped or
// repeated it would miscount the rows and the owner's combine would wait for good.
__device__ __forceinline__ auto slot_row_epilogue(const LaunchParams& P, const RankState& S,
                                                  uint16_t* PeerBuffers::*slots, bool routed, int64_t p0, int64_t n0,
                                                  float* shared) {
  const int64_t H = P.cfg.hidden;
  return mixed_rows_early(
      routed,
      // the row's RowRef, loaded before the main loop (its 8 bytes as one word)
      [&S, routed, p0](int64_t i) -> uint64_t {
        return routed ? *reinterpret_cast<const uint64_t*>(S.rows + p0 + i) : 0;
      },
      [&P, slots, routed](int64_t, uint64_t early) {
        if (!routed) return int64_t{0};
        RowRef row;
        static_assert(sizeof(RowRef) == sizeof(uint64_t), "a RowRef is one 8-byte word");
        memcpy(&row, &early, sizeof row);
        atomicAdd(&owner_tally()[row.token_idx / P.cfg.tokens_per_rank], 1u);
        return reinterpret_cast<int64_t>(slot_row_of(P, slots, row));
      },
      [n0](int64_t, int64_t key, int j, const uint4& v, int valid) {
        store8_bf16(reinterpret_cast<uint16_t*>(key) + n0 + j, v, valid);
      },
      // fp32 staging: only a shared-expert tile (a routed one always takes the bf16 form above)
      [p0, n0, shared, H](int64_t i, int64_t, int j, const float4& v, int valid) {
        store4_f32(shared + (p0 + i) * H + n0 + j, v, valid);
      });
}

// Atomics variant: adds a column pair of row p to its token's fp32 accumulator at the owner,
// forward w * rn(y) (scale), backward rn(dx); a shared-expert row (routed false, p the token)
// adds its fp32 value to this rank's own accumulator. Order of arrival decides the sum's bits.
__device__ inline void atomic_pair(const LaunchParams& P, const Role& role, const RankState& S, bool routed,
                                   bool scale, int64_t p, int64_t col, float v0, float v1) {
  const int64_t H = P.cfg.hidden, T = P.cfg.tokens_per_rank;
  float* a;
  if (routed) {
    const RowRef row = S.rows[p];
    const PeerBuffers& owner = P.peers[row.token_idx / T];
    const int64_t t = row.token_idx % T;
    const float w = scale ? owner.router_weights[t * P.cfg.top_k + row.slot_idx] : 1.0f;
    v0 = spec::fmul(w, spec::round_bf16(v0));
    v1 = spec::fmul(w, spec::round_bf16(v1));
    a = owner.acc + t * H + col;
  } else {
    a = P.peers[role.rank].acc + p * H + col;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(a), make_float2(v0, v1));
#else
  atomicAdd(a, v0);
  atomicAdd(a + 1, v1);
#endif
}

// Atomics variant: out = rn(acc) over the rank's tokens, once every contribution has arrived.
__device__ inline void finish_from_acc(const LaunchParams& P, const Role& role, uint16_t* out) {
  const int64_t n = P.cfg.tokens_per_rank * P.cfg.hidden;
  const float* acc = P.peers[role.rank].acc;
  for (int64_t i = (int64_t{role.block} * kThreads + threadIdx.x) * 2; i < n;
       i += int64_t{role.blocks} * kThreads * 2) {
    if (i + 1 < n) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(acc + i));
      *reinterpret_cast<uint32_t*>(out + i) = pack2(spec::bf16_from_f32_rne(v.x), spec::bf16_from_f32_rne(v.y));
    } else {
      out[i] = spec::bf16_from_f32_rne(__ldcg(acc + i));
    }
  }
}

// Counting pushed rows at their owners (arrivals[which]: 0 forward, 1 backward). Rows are tallied
// per owner in shared memory first, so an owner's counter takes one global atomic per block and
// tally, not one per row (a single owner's counter would otherwise take every row of the pass).
// count_at_owners adds the tally (after the caller's fence and barrier); publish_rows, after one
// tile's pushes, fences, tallies the tile's rows and adds them (the slow engine and the atomics
// build); publish_tallied_rows (below) does the fast deterministic build's once per rank.
__device__ inline void count_at_owners(const LaunchParams& P, int which) {
  const uint32_t* per_owner = owner_tally();
  for (int r = threadIdx.x; r < P.num_ranks; r += kThreads)
    if (per_owner[r]) {
      if (P.system_scope)
        atomicAdd_system(&P.peers[r].arrivals[which], per_owner[r]);
      else
        atomicAdd(&P.peers[r].arrivals[which], per_owner[r]);
    }
}
__device__ inline void publish_rows(const LaunchParams& P, const RankState& S, int64_t p0, int64_t n, int which) {
  uint32_t* per_owner = owner_tally();
  publish_fence(P);  // the pushes may have gone to other GPUs
  zero_owner_tally(P);
  __syncthreads();
  for (int64_t m = threadIdx.x; m < n; m += kThreads)
    atomicAdd(&per_owner[S.rows[p0 + m].token_idx / P.cfg.tokens_per_rank], 1u);
  __syncthreads();
  count_at_owners(P, which);
}

// The fast engine's deterministic build counts a block's pushed rows once, after its last item of
// a rank (tallied_rows): slot_row_epilogue's keys add every tile's rows to owner_tally(), zeroed
// before the block's first item, and nothing but the owners' reductions, which run after every
// item of the pass, waits for the arrivals. One fence then covers every push of the block, instead
// of a fence (a wait for the tile's stores to land) and two barriers after every phase-2 tile.
__device__ __forceinline__ bool tallied_rows(const LaunchParams& P) { return P.fast && !kAtomics; }
__device__ inline void publish_tallied_rows(const LaunchParams& P, int which) {
  const uint64_t t0 = trace_now(P);
  publish_fence(P);  // every thread's pushes, to this GPU or others
  __syncthreads();
  count_at_owners(P, which);
  trace_add(P, kTrPublish, t0);
}

// ---------------------------------------------------------------------------------------------
// Work items. A row tile is up to 128 rows of one local expert (canonical rows p0 .. p0+n-1)
// or of the rank's own tokens for the shared expert (e = -1, tokens p0 .. p0+n-1). Each pass
// runs two GEMM phases over column tiles: phase 1 (forward gate/up; backward d_act) and phase 2
// (forward down; backward d_x), whose row tile waits for all of its phase-1 column tiles. Items
// are claimed by the rank's blocks in list order (phase 1 of every row tile first; ItemClaims), so
// a wait only ever waits for items claimed earlier: no deadlock, and who computes never changes
// how.
struct RowTile {
  int64_t e;      // local expert, or -1 for the shared expert
  int64_t p0, n;  // first row (canonical row or token) and row count
  int64_t index;  // counter index in tiles_done
};

// Every block of the rank (with LaunchParams::shared_items every block of the launch, rank after
// rank: for_item_ranks) computes work items, claimed one at a time from a per-rank counter
// (an integer atomic, zeroed before every pass): the compute blocks start at once, the
// communication blocks once their gather is done (they never wait before that). Claims go out in
// increasing item order, and a block works its claims in order, so the smallest unfinished
// claimed item waits only on smaller items, all finished: no deadlock. A block claims its next
// item when it starts one (the block's last thread; the answer is only read at the end of the
// item, so the atomic's round trip hides behind the GEMM), which keeps blocks finishing
// together (a fixed round-robin deal left a 0.3 ms tail on the dsv3 forward). Who computes an
// item never changes how: every result bit is the same. One shared slot serves every ItemClaims
// of a block; uses follow one another with a block barrier between them (the backward's rank
// barrier separates its GEMM items from its weight-gradient items).
class ItemClaims {
 public:
  __device__ explicit ItemClaims(uint32_t* counter) : counter_(counter) {
    if (threadIdx.x == kClaimer) slot()[0] = atomicAdd(counter_, 1u);
    __syncthreads();
    item_ = slot()[0];
  }
  __device__ int64_t item() const { return item_; }
  // Call on every thread at the start of the current item...
  __device__ void ask_next() {
    __syncthreads();  // every thread has read the slot
    if (threadIdx.x == kClaimer) pending_ = atomicAdd(counter_, 1u);
  }
  // ... and on every thread when it is done.
  __device__ void take_next() {
    if (threadIdx.x == kClaimer) slot()[0] = pending_;
    __syncthreads();
    item_ = slot()[0];
  }

 private:
  static constexpr int kClaimer = kThreads - 1;
  __device__ static uint32_t* slot() {
    __shared__ uint32_t claimed;
    return &claimed;
  }
  uint32_t* counter_;
  int64_t item_ = 0;
  uint32_t pending_ = 0;
};

// Row tile number rt: routed experts in order, each in 128-row tiles, then the shared expert's.
// Every work item maps its row tile number to (expert, rows) here. Walking expert_offsets in
// global memory from expert 0 costs one dependent L2 round trip per expert passed, about 0.1 us
// each: ~6 us per item at 128 local experts (qwen3), ~1.6 us at 32 (dsv3). So each block keeps
// every expert's first row tile in shared memory, filled once per pass before its first item,
// and finds an item's expert by binary search (expert_of_row_tile). Where the table lives
// differs by pass, because static shared memory costs the backward its L1:
// - forward (RowTileTable, static __shared__, 8 KiB): the offsets too, as int64. The forward
//   kernel is past 196 KiB of shared memory anyway. 15% off the qwen3 forward, 3.5% off dsv3's
//   (kernel/notes/bench_v8_run_o.txt).
// - backward (FastSmem::layer_scratch, the ring's alignment padding): int32 first tiles only;
//   the two offsets an item needs are read from global memory. The same static table there
//   took that kernel past 196 KiB, where the carve-out leaves 28 KiB of L1 instead of 60, and
//   made it 1-5% slower (run O); in the padding it adds no shared memory, and the qwen3
//   backward is 6-8% faster than with the walk, dsv3's 0-2% (kernel/notes/bench_v9_run_q.txt,
//   bench_v9_run_s.txt). The slow engine has no padding and walks.
// With more local experts than a table holds, the pass walks. Every way gives the same RowTile,
// so no result changes.
static_assert(kRowTileRows == kTileM, "row tiles are the engine's tile rows");
enum class TableAt { kStatic, kScratch };
inline constexpr int64_t kStaticTableExperts = 512;
inline constexpr int64_t kScratchTableExperts = kLayerScratchInts - 2;  // [0, E] and the count
struct RowTileTable {
  int64_t experts;                              // E_local, or -1: not cached (too many experts)
  int64_t offset[kStaticTableExperts + 1];      // expert_offsets
  int64_t first_tile[kStaticTableExperts + 1];  // row tiles of experts 0 .. e - 1; [E_local]: all routed ones
};
__device__ __forceinline__ RowTileTable& static_row_tile_table() {
  __shared__ RowTileTable table;
  return table;
}

// How a block maps row tiles to experts: Map::experts() < 0: walk expert_offsets; else
// offset(e) and first_tile(e) from the block's table.
struct StaticTileMap {  // the forward: everything in the static table (read from shared memory at each use)
  const RowTileTable* t;
  __device__ __forceinline__ int64_t experts() const { return t->experts; }
  __device__ __forceinline__ int64_t offset(int64_t e) const { return t->offset[e]; }
  __device__ __forceinline__ const int64_t* first_tiles() const { return t->first_tile; }
};
struct ScratchTileMap {  // the backward: first tiles in the padding, offsets in global memory
  const int64_t* offsets;
  const int32_t* table;  // null: walk
  __device__ __forceinline__ int64_t experts() const { return table ? table[kLayerScratchInts - 1] : -1; }
  __device__ __forceinline__ int64_t offset(int64_t e) const { return offsets[e]; }
  __device__ __forceinline__ const int32_t* first_tiles() const { return table; }
};

// After the plan's rank barrier (expert_offsets are final), on every thread of the block.
template <TableAt kAt>
__device__ inline auto load_row_tile_map(const LaunchParams& P, const RankState& S, uint8_t* smem) {
  const int64_t E = P.cfg.experts_per_rank();
  __syncthreads();  // an earlier pass's readers of the table are done
  if constexpr (kAt == TableAt::kStatic) {
    RowTileTable& t = static_row_tile_table();
    if (E <= kStaticTableExperts) {
      for (int64_t e = threadIdx.x; e <= E; e += kThreads) t.offset[e] = S.expert_offsets[e];
      __syncthreads();
      if (threadIdx.x == 0) {
        int64_t n = 0;
        for (int64_t e = 0; e < E; ++e) {
          t.first_tile[e] = n;
          n += row_tiles_of(t.offset[e + 1] - t.offset[e]);
        }
        t.first_tile[E] = n;
        t.experts = E;
      }
    } else if (threadIdx.x == 0) {
      t.experts = -1;
    }
    __syncthreads();
    return StaticTileMap{&t};
  } else {
    if (!P.fast) return ScratchTileMap{S.expert_offsets, nullptr};
    int32_t* table = reinterpret_cast<FastSmem*>(smem)->layer_scratch;
    const bool fits = E <= kScratchTableExperts;
    if (fits)  // expert e's row tiles at e + 1
      for (int64_t e = threadIdx.x; e < E; e += kThreads) {
        const int64_t tiles = row_tiles_of(S.expert_offsets[e + 1] - S.expert_offsets[e]);
        table[e + 1] = static_cast<int32_t>(tiles < INT32_MAX ? tiles : INT32_MAX);
      }
    __syncthreads();
    if (threadIdx.x == 0) {  // prefix sums: expert e's first row tile; the last entry: E or -1
      int64_t n = 0;
      if (fits) {
        table[0] = 0;
        for (int64_t e = 1; e <= E; ++e) {
          n += table[e];
          table[e] = static_cast<int32_t>(n < INT32_MAX ? n : INT32_MAX);
        }
      }
      table[kLayerScratchInts - 1] = fits && n < INT32_MAX ? static_cast<int32_t>(E) : -1;
    }
    __syncthreads();
    return ScratchTileMap{S.expert_offsets, table};
  }
}

// Row tiles of the rank's routed experts (the shared expert's follow them).
template <class Map>
__device__ inline int64_t routed_row_tiles(const LaunchParams& P, const RankState& S, const Map& m) {
  if (const int64_t E = m.experts(); E >= 0) return m.first_tiles()[E];
  int64_t n = 0;
  for (int64_t e = 0; e < P.cfg.experts_per_rank(); ++e) n += row_tiles_of(S.expert_offsets[e + 1] - S.expert_offsets[e]);
  return n;
}

template <class Map>
__device__ inline RowTile row_tile_at(const LaunchParams& P, const RankState& S, const Map& m, int64_t rt) {
  const int64_t index = rt;
  if (const int64_t E = m.experts(); E >= 0) {
    const auto* first_tile = m.first_tiles();
    if (rt < first_tile[E]) {
      const int64_t e = expert_of_row_tile(first_tile, E, rt);
      const int64_t first = m.offset(e), rows = m.offset(e + 1) - first, in = rt - first_tile[e];
      return RowTile{e, first + in * kTileM, min(static_cast<int64_t>(kTileM), rows - in * kTileM), index};
    }
    rt -= first_tile[E];
  } else {
    for (int64_t e = 0; e < P.cfg.experts_per_rank(); ++e) {
      const int64_t lo = S.expert_offsets[e], hi = S.expert_offsets[e + 1];
      const int64_t tiles = row_tiles_of(hi - lo);
      if (rt < tiles) return RowTile{e, lo + rt * kTileM, min(static_cast<int64_t>(kTileM), hi - lo - rt * kTileM), index};
      rt -= tiles;
    }
  }
  return RowTile{-1, rt * kTileM, min(static_cast<int64_t>(kTileM), P.cfg.tokens_per_rank - rt * kTileM), index};
}

// grouped_tile (the order of a phase's items): mok/kernel/row_tiles.hpp.

// Runs this block's phase 1 then phase 2 items. Item numbers: phase 1 is every routed row tile's
// column tiles (in grouped_tile order), then the shared expert's; phase 2 likewise over H. Blocks
// claim them in order (ItemClaims, counters[5]). phase1(tile, n0) / phase2(tile, n0) compute
// one column tile starting at column n0 and return false when the pass is aborting. kAt: where
// the block's row-tile table lives (the note above row_tile_at).
template <TableAt kAt, class Phase1, class Phase2>
__device__ bool run_phases(const LaunchParams& P, const Role& role, uint8_t* smem, int64_t n1_routed,
                           int64_t n1_shared, int64_t NT1, Phase1 phase1, Phase2 phase2) {
  const RankState& S = P.state[role.rank];
  uint64_t since = trace_now(P);  // the end of the previous item (kTrBetween)
  const auto table = load_row_tile_map<kAt>(P, S, smem);
  const int64_t NT2 = width_single(P);
  const int64_t c1r = ceil_div(n1_routed, NT1), c1s = ceil_div(n1_shared, NT1), c2 = ceil_div(P.cfg.hidden, NT2);
  const int64_t rr = routed_row_tiles(P, S, table), rs = shared_tiles(P.cfg);
  const int64_t p1_routed = rr * c1r, p1 = p1_routed + rs * c1s, total = p1 + (rr + rs) * c2;
  for (ItemClaims claims(&S.counters[5]); claims.item() < total; claims.take_next()) {
    const int64_t item = claims.item();
    claims.ask_next();
    trace_count(P, kTrItems);
    if (item < p1) {
      int64_t rt, col;
      if (item < p1_routed) {
        grouped_tile(item, rr, c1r, P.group_rows, rt, col);
      } else {
        grouped_tile(item - p1_routed, rs, c1s, P.group_rows, rt, col);
        rt += rr;
      }
      const RowTile t = row_tile_at(P, S, table, rt);
      trace_add(P, kTrBetween, since);
      if (!phase1(t, col * NT1)) return false;
    } else {
      int64_t rt, col;
      grouped_tile(item - p1, rr + rs, c2, P.group_rows, rt, col);
      const int64_t n0 = col * NT2;
      trace_count(P, kTrItems2);
      const RowTile t = row_tile_at(P, S, table, rt);
      const uint32_t need = static_cast<uint32_t>(t.e >= 0 ? c1r : c1s);
      trace_add(P, kTrBetween, since);
      const uint64_t t0 = trace_now(P);
      if (!wait_tile(P, role, &S.tiles_done[t.index], need, t.index)) return false;
      trace_add(P, kTrWaitTile, t0);
      if (!phase2(t, n0)) return false;
    }
    since = trace_now(P);
  }
  return true;
}

// The ranks whose GEMM items this block works, in the order it works them (body(w) runs one rank's
// items with w.rank = that rank; it returns false when the pass is aborting). Without
// LaunchParams::shared_items: the block's own rank only. With it (a launch of several ranks on one
// GPU, the virtual rack): every local rank's, in rank order, so that all the GPU's blocks work one
// rank's items at a time and share its A rows and weight tiles in L2 as at R = 1, instead of the
// ranks' block groups each streaming their own through one L2. A block starts on another rank's
// items once that rank's plan is complete: its rank-barrier generation has reached planned_gen
// (2 in the forward, after counting and planning; 0 in the backward, whose plan is the forward's).
// The order is the same on every block, and each rank's items are claimed in item order (ItemClaims),
// so every wait is for an item claimed earlier: no deadlock, and who computes an item changes no bit.
// body is called from two places, so nvcc weighs inlining it twice; the kernels mark their bodies
// __attribute__((always_inline)). Called instead of inlined, the item loop's wgmma would sit across a
// function call, and ptxas then serializes every wgmma of the kernel (advisory C7510: the same bits,
// passes 15-34% slower; forty-first and forty-second sessions). kernel.wgmma_pipelined checks it.
template <class Body>
__device__ __forceinline__ bool for_item_ranks(const LaunchParams& P, const Role& role, uint32_t planned_gen, Body body) {
  if (!P.shared_items) return body(role);
  const int local = P.local_ranks;
  for (int k = 0; k < local; ++k) {
    Role w = role;
    w.rank = P.first_rank + k;
    if (w.rank != role.rank) {
      if (planned_gen > 0) {
        const uint64_t t0 = trace_now(P);
        if (!block_wait(P, &P.state[w.rank].counters[1], planned_gen, w.rank, kFlagRankBarrier, -1)) return false;
        trace_add(P, kTrBetween, t0);  // the wait for that rank's plan
      }
#if defined(MOK_WGMMA)
      if (P.fast) {
        acquire_tensor_maps(&P.maps[w.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
        acquire_tensor_maps(&P.maps[kMaxRanks + w.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
      }
#endif
    }
    if (!body(w)) return false;
    __syncthreads();  // the next rank's ItemClaims reuse the block's claim slot
  }
  return true;
}

// Every local rank's blocks have passed their rank barrier of generation gen (with shared_items:
// so every block has finished every rank's items). Block-wide; false when aborting.
__device__ inline bool all_ranks_passed(const LaunchParams& P, uint32_t gen) {
  if (!P.shared_items) return true;
  const int local = P.local_ranks;
  for (int k = 0; k < local; ++k)
    if (!block_wait(P, &P.state[P.first_rank + k].counters[1], gen, P.first_rank + k, kFlagRankBarrier, -1))
      return false;
  return true;
}

// The rank's per-token reductions over its slots (forward combine, backward d_x): out[t, h] =
// rn(step(... step(init[t*H + h], w[t, k0], slot k0) ..., w[t, k_last], slot k_last)) over the
// non-empty slots in increasing k; init (fp32) and w may be null (0 and unused). Every block of the
// rank takes a share; each thread V adjacent columns, read from the slot buffer 16 bytes at a time
// when V = 8.
// With V = 8 all of a batch's loads are issued together and none waits on another: the routing
// entries, the weights, the init values (two 16-byte loads, not eight 4-byte ones that each cost
// an L2 request), and every slot row of the batch whether live or not (an empty slot's row is
// allocated and simply never written; its bits are loaded and ignored). A batch is one memory
// round trip; predicating the slot loads on the routing entries made it two. The routing entries
// and weights are the layer's inputs, never written while a kernel runs, so they take the
// read-only path (__ldg); init and the slots were written by other blocks of this launch and are
// read through L2 (__ldcg) after the acquire that waited for them.
// KC > 0: top_k is KC, known to the compiler (dispatch_combine below picks it for top-8).
template <int V, int KC, class Step>
__device__ inline void combine_columns(const LaunchParams& P, const Role& role, const uint16_t* slots,
                                       const int32_t* topk, const float* init, const float* w, Step step,
                                       uint16_t* out) {
  const int64_t H = P.cfg.hidden, K = KC > 0 ? KC : P.cfg.top_k, T = P.cfg.tokens_per_rank;
  for (int64_t i = (role.block * kThreads + threadIdx.x) * int64_t{V}; i < T * H;
       i += int64_t{role.blocks} * kThreads * V) {
    const int64_t t = i / H, h = i % H;
    float acc[V];
    if constexpr (V == 8) {
      if (init != nullptr) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(init + i));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(init + i + 4));
        acc[0] = a.x, acc[1] = a.y, acc[2] = a.z, acc[3] = a.w, acc[4] = b.x, acc[5] = b.y, acc[6] = b.z, acc[7] = b.w;
      } else {
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] = 0.0f;
      }
      constexpr int kSlotBatch = 8;
      for (int64_t k0 = 0; k0 < K; k0 += kSlotBatch) {  // ORDER: slots in increasing k
        int32_t e[kSlotBatch];
        float wk[kSlotBatch];
        uint4 q[kSlotBatch];
#pragma unroll
        for (int b = 0; b < kSlotBatch; ++b) {
          const bool in = k0 + b < K;
          e[b] = in ? __ldg(&topk[t * K + k0 + b]) : -1;
          wk[b] = in && w != nullptr ? __ldg(&w[t * K + k0 + b]) : 0.0f;
          if (in) q[b] = __ldcg(reinterpret_cast<const uint4*>(&slots[(t * K + k0 + b) * H + h]));
        }
#pragma unroll
        for (int b = 0; b < kSlotBatch; ++b) {
          if (e[b] < 0) continue;
          const uint32_t u[4] = {q[b].x, q[b].y, q[b].z, q[b].w};
#pragma unroll
          for (int v = 0; v < 8; ++v)
            acc[v] = step(acc[v], wk[b], static_cast<uint16_t>(v & 1 ? u[v / 2] >> 16 : u[v / 2] & 0xFFFF));
        }
      }
      uint32_t u[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        u[j] = pack2(spec::bf16_from_f32_rne(acc[2 * j]), spec::bf16_from_f32_rne(acc[2 * j + 1]));
      *reinterpret_cast<uint4*>(out + i) = make_uint4(u[0], u[1], u[2], u[3]);
    } else {
      acc[0] = init != nullptr ? __ldcg(&init[i]) : 0.0f;
      for (int64_t k = 0; k < K; ++k) {  // ORDER: slots in increasing k
        if (topk[t * K + k] < 0) continue;
        acc[0] = step(acc[0], w != nullptr ? w[t * K + k] : 0.0f, __ldcg(&slots[(t * K + k) * H + h]));
      }
      out[i] = spec::bf16_from_f32_rne(acc[0]);
    }
  }
}

// combine_columns with the widest V that H allows, and top-8 known at compile time: the same code
// with a runtime top_k took 0.43 ms on the dsv3-shaped probe, with K = 8 fixed 0.34 ms, against
// 0.32 ms for the probe's bare reduction (kernel/notes/combine_bw_probe.txt, H200).
template <class Step>
__device__ inline void dispatch_combine(const LaunchParams& P, const Role& role, const uint16_t* slots,
                                       const int32_t* topk, const float* init, const float* w, Step step,
                                       uint16_t* out) {
  if (P.cfg.hidden % 8 != 0)
    combine_columns<1, 0>(P, role, slots, topk, init, w, step, out);
  else if (P.cfg.top_k == 8)
    combine_columns<8, 8>(P, role, slots, topk, init, w, step, out);
  else
    combine_columns<8, 0>(P, role, slots, topk, init, w, step, out);
}

// ---------------------------------------------------------------------------------------------
// Forward.

// gate/up of one column tile: g and u fp32 and act = swiglu(g, u) bf16. The backward derives
// silu(g) and silu'(g) from g with the same code, so the same bits (kernel/README.md, "Backward
// phase 1": from the fifth to the sixteenth session the forward stored silu(g) and silu'(g)
// instead of g, 4 bytes more per element; that was chosen when the backward's epilogue ran on the
// fragments with the accumulators live, as it no longer does).
// Its stores stay in the fragment layout: through shared memory (a RowEpilogue) this tile took
// 5% longer on the dsv3 forward (2026-12-03, kernel/notes/bench_v6_rows.txt), where the other
// GEMMs' epilogues gained.
__device__ inline bool forward_phase1(const LaunchParams& P, const Role& role, uint8_t* smem, const RowTile& t,
                                      int64_t n0) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const RankTensorMaps& kmaps = P.maps[kMaxRanks + role.rank];  // K-major set (tall boxes)
  const int64_t H = c.hidden, p0 = t.p0, n = t.n;
  const bool routed = t.e >= 0;
  // Routed rows come from the gathered copy once their flags are up, or, with direct_rows, from
  // each token's x where it lies (an input: nothing to wait for).
  const bool direct = routed && P.direct_rows;
  uint64_t t0 = trace_now(P);
  if (routed && !direct && !wait_rows(P, role, S.row_ready, p0, n, kFlagDispatchRow)) return false;
  trace_add(P, kTrWaitRows, t0);
  t0 = trace_now(P);
  const int64_t N = routed ? c.intermediate : c.shared_intermediate;
  float* gate = routed ? S.gate : S.shared_gate;
  float* up = routed ? S.up : S.shared_up;
  uint16_t* act = routed ? S.act : S.shared_act;
  const uint16_t* a_src = routed ? S.xd : P.peers[role.rank].x;
  const uint16_t* wg = routed ? W.w_routed_gate + t.e * N * H : W.w_shared_gate;
  const uint16_t* wu = routed ? W.w_routed_up + t.e * N * H : W.w_shared_up;
  // ORDER: dot-chain over H for g and u.
  if (P.fast) {
    const TensorMapBytes* am = routed ? &kmaps.xd : &kmaps.x;
    const int64_t wrow = (routed ? t.e * N : 0) + n0;
    const FastOperand A = kmajor(am, p0, kKMajorBoxRows);
    // direct: the tile's row addresses (RowsOperand; rows past n repeat row n - 1). gemm_fast's
    // first barrier orders these writes before its loads, and the previous tile's loads were all
    // consumed before it returned.
    // The first column tile also writes the rows to S.xd for the backward's weight gradients.
    __shared__ const uint16_t* rows_table[kTileM];
    __shared__ uint16_t* rows_copy[kTileM];
    const bool write_xd = direct && n0 == 0;
    if (direct && threadIdx.x < kTileM) {
      const int64_t i = threadIdx.x < n ? threadIdx.x : n - 1;
      const TokenAt at = token_at(P, S.rows[p0 + i].token_idx);
      rows_table[threadIdx.x] = P.peers[at.rank].x + at.t * H;
      // Only the first column tile reads rows_copy (write_xd); the others pass no copy table.
      if (write_xd) rows_copy[threadIdx.x] = threadIdx.x < n ? S.xd + (p0 + threadIdx.x) * H : nullptr;
    }
    const RowsOperand rows_a{rows_table, write_xd ? rows_copy : nullptr};
    const FastOperand B = kmajor(routed ? &kmaps.w_routed_gate : &kmaps.w_shared_gate, wrow, kKMajorBoxRows);
    const FastOperand B2 = kmajor(routed ? &kmaps.w_routed_up : &kmaps.w_shared_up, wrow, kKMajorBoxRows);
    // normal: every gate value of the tile is in spec::silu_normal_range (the forms without
    // range tests; same bits).
    auto silu_pair = [](auto normal, float g) {
      if constexpr (decltype(normal)::value)
        return spec::silu_and_grad_f32_normal(g);
      else
        return spec::silu_and_grad_f32(g);
    };
    auto swiglu = [&](auto normal) {
      return [&](int64_t i, int64_t j, float g0, float g1, float u0, float u1) {
        const int64_t idx = (p0 + i) * N + n0 + j;
        const spec::SiluPair s0 = silu_pair(normal, g0), s1 = silu_pair(normal, g1);
        *reinterpret_cast<float2*>(gate + idx) = make_float2(g0, g1);
        *reinterpret_cast<float2*>(up + idx) = make_float2(u0, u1);
        *reinterpret_cast<uint32_t*>(act + idx) =
            pack2(spec::swiglu_act_pre(s0.silu, u0), spec::swiglu_act_pre(s1.silu, u1));
      };
    };
    const int64_t cols = min(static_cast<int64_t>(kTileNFast), N - n0);
    auto in_range = [](float v) { return spec::silu_normal_range(v); };
    if (P.staged_swiglu) {
      // The same values through the ring, a warp per row (RangedRows): four adjacent columns per
      // lane, 16-byte stores.
      auto swiglu4 = [&](auto normal) {
        return [&](int64_t, int64_t key, int j, const float4& g, const float4& u, int valid) {
          const float gv[4] = {g.x, g.y, g.z, g.w}, uv[4] = {u.x, u.y, u.z, u.w};
          uint16_t av[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) av[q] = spec::swiglu_act_pre(silu_pair(normal, gv[q]).silu, uv[q]);
          const int64_t idx = key + j;
          store4_f32(gate + idx, g, valid);
          store4_f32(up + idx, u, valid);
          store4_bf16(act + idx, av[0], av[1], av[2], av[3], valid);
        };
      };
      auto epi = ranged_rows([&](int64_t i) { return (p0 + i) * N + n0; }, in_range, swiglu4(std::true_type{}),
                             swiglu4(std::false_type{}));
      if (direct)
        gemm_fast<0, 0, true, kTileNFast>(smem, H, n, cols, rows_a, B, B2, epi, trace_words(P, kTrLaps1));
      else
        gemm_fast<0, 0, true, kTileNFast>(smem, H, n, cols, A, B, B2, epi, trace_words(P, kTrLaps1));
    } else {
      auto epi = ranged_pairs(in_range, swiglu(std::true_type{}), swiglu(std::false_type{}));
      if (direct)
        gemm_fast<0, 0, true, kTileNFast>(smem, H, n, cols, rows_a, B, B2, epi, trace_words(P, kTrLaps1));
      else
        gemm_fast<0, 0, true, kTileNFast>(smem, H, n, cols, A, B, B2, epi, trace_words(P, kTrLaps1));
    }
  } else {
    auto load_a = [&](int64_t m, int64_t k) { return a_src[(p0 + m) * H + k]; };
    gemm_slow(smem, n, N, H, 0, n0, load_a, [&](int64_t k, int64_t col) { return wg[col * H + k]; },
              [&](int64_t m, int64_t col, float g) { gate[(p0 + m) * N + col] = g; });
    // The same thread holds (m, col) in both tiles: it reads back its own g.
    gemm_slow(smem, n, N, H, 0, n0, load_a, [&](int64_t k, int64_t col) { return wu[col * H + k]; },
              [&](int64_t m, int64_t col, float u) {
                const int64_t idx = (p0 + m) * N + col;
                up[idx] = u;
                act[idx] = spec::swiglu_act_pre(spec::silu_and_grad_f32(gate[idx]).silu, u);
              });
  }
  trace_add(P, kTrPhase1, t0);
  t0 = trace_now(P);
  publish_tile(&S.tiles_done[t.index]);
  trace_add(P, kTrPublish, t0);
  return true;
}

// down of one column tile of H: routed rows are pushed into their owners' y slots; the shared
// expert's rows go to shared_out (fp32).
__device__ inline bool forward_phase2(const LaunchParams& P, const Role& role, uint8_t* smem, const RowTile& t,
                                      int64_t n0) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const RankTensorMaps& kmaps = P.maps[kMaxRanks + role.rank];  // K-major set (tall boxes)
  const int64_t H = c.hidden, p0 = t.p0, n = t.n;
  const bool routed = t.e >= 0;
  const uint64_t t0_start = trace_now(P);
  const int64_t Kd = routed ? c.intermediate : c.shared_intermediate;
  const uint16_t* act = routed ? S.act : S.shared_act;
  const uint16_t* wd = routed ? W.w_routed_down + t.e * H * Kd : W.w_shared_down;
  auto out = [&](int64_t m, int64_t col, float v) {
    if constexpr (kAtomics) {
      float* a = routed ? nullptr : P.peers[role.rank].acc + (p0 + m) * H + col;
      if (routed) {
        const RowRef row = S.rows[p0 + m];
        const PeerBuffers& owner = P.peers[row.token_idx / c.tokens_per_rank];
        const int64_t tok = row.token_idx % c.tokens_per_rank;
        a = owner.acc + tok * H + col;
        v = spec::fmul(owner.router_weights[tok * c.top_k + row.slot_idx], spec::round_bf16(v));
      }
      atomicAdd(a, v);
    } else if (routed) {
      push_to_owner(P, S, &PeerBuffers::y_slots, p0 + m, col, v);
    } else {
      S.shared_out[(p0 + m) * H + col] = v;
    }
  };
  // ORDER: dot-chain over I (Is).
  if (P.fast) {
    const FastOperand A = kmajor(routed ? &kmaps.act : &kmaps.shared_act, p0, kKMajorBoxRows);
    const FastOperand B = kmajor(routed ? &kmaps.w_routed_down : &kmaps.w_shared_down, (routed ? t.e * H : 0) + n0,
                                 kKMajorBoxRows);
    const int64_t cols = min(static_cast<int64_t>(kTileNWide), H - n0);
    if constexpr (kAtomics)
      gemm_fast<0, 0, false, kTileNWide>(smem, Kd, n, cols, A, B, B,
                             [&](int64_t i, int64_t j, float v0, float v1) {
                               atomic_pair(P, role, S, routed, true, p0 + i, n0 + j, v0, v1);
                             },
                             trace_words(P, kTrLaps2));
    else {
      gemm_fast<0, 0, false, kTileNWide>(smem, Kd, n, cols, A, B, B,
                             slot_row_epilogue(P, S, &PeerBuffers::y_slots, routed, p0, n0, S.shared_out),
                             trace_words(P, kTrLaps2));
    }
  } else {
    gemm_slow(smem, n, H, Kd, 0, n0, [&](int64_t m, int64_t k) { return act[(p0 + m) * Kd + k]; },
              [&](int64_t k, int64_t col) { return wd[col * Kd + k]; }, out);
  }
  trace_add(P, kTrPhase2, t0_start);
  const uint64_t t0 = trace_now(P);
  if (!routed)
    publish(&S.counters[2], 1);
  else if (!tallied_rows(P))
    publish_rows(P, S, p0, n, 0);
  trace_add(P, kTrPublish, t0);
  return true;
}

// The rank's routed x rows into its gathered copy S.xd (row_ready flags raised) by the forward's
// communication blocks: by TMA bulk copies where LaunchParams::bulk_gather allows, else by threads.
// (With direct_rows phase 1 writes S.xd instead, from the rows it copies: forward_phase1.)
__device__ inline void gather_x(const LaunchParams& P, const Role& role, uint8_t* smem) {
  const RankState& S = P.state[role.rank];
  auto x_of = [](const PeerBuffers& b) { return b.x; };
#if defined(MOK_WGMMA)
  int warps = 0, slots = 0;
  if (P.bulk_gather) bulk_gather_shape(P.cfg.hidden * 2, warps, slots);
  if (warps > 0) {
    gather_rows_bulk(P, role, smem, S.xd, S.row_ready, x_of, warps, slots);
    return;
  }
#else
  (void)smem;
#endif
  gather_rows<false>(P, role, S.xd, S.row_ready, x_of);
}

__global__ void __launch_bounds__(kThreads, 1) moe_forward_kernel(const __grid_constant__ LaunchParams params) {
  const LaunchParams& P = params;
  const Role role = my_role(P, true);
  if (role.rank == P.silent_rank) return;
  if (!enter_pass(P, role.block == 0)) return;  // windowed transports: every rank's window is published
  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  uint8_t* smem = aligned_smem(dynamic_smem);
#if defined(MOK_WGMMA)
  if (P.fast) {
    acquire_tensor_maps(&P.maps[role.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
    acquire_tensor_maps(&P.maps[kMaxRanks + role.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
  }
#endif
  trace_mark(P, kTrStart);
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden;

  // A block that finds a bad weight leaves; its rank's blocks stop at the barrier below, and every
  // other rank finds the same weight itself.
  if (!check_router_weights(P, role)) return;
  count_rows(P, role);
  count_expected_arrivals(P, role);
  if (!rank_barrier(P, role.rank)) return;
  if (role.block == 0) write_offsets(P, role);
  if (!build_plan(P, role, smem)) return;
  if (!rank_barrier(P, role.rank)) return;
  trace_mark(P, kTrPlanned);

  if (role.comm && !P.direct_rows) gather_x(P, role, smem);  // direct_rows: phase 1 reads x where it lies
  trace_mark(P, kTrGathered);
  if (!for_item_ranks(P, role, 2, [&](const Role& w) __attribute__((always_inline)) {
        zero_owner_tally(P);  // run_phases' first barrier orders this before the tiles' tallies
        if (!run_phases<TableAt::kStatic>(
                P, w, smem, c.intermediate, c.shared_intermediate, width_dual(P),
                [&](const RowTile& t, int64_t n0) { return forward_phase1(P, w, smem, t, n0); },
                [&](const RowTile& t, int64_t n0) { return forward_phase2(P, w, smem, t, n0); }))
          return false;
        if (tallied_rows(P)) publish_tallied_rows(P, 0);
        return true;
      }))
    return;
  trace_mark(P, kTrItemsDone);
  // Every block of the rank combines a share of its tokens once every slot has arrived and the
  // shared expert is done (the element partition changes who computes, never the order).
  if (!block_wait(P, &P.peers[role.rank].arrivals[0], S.counters[4], role.rank, kFlagForwardArrivals, -1)) return;
  if (!block_wait(P, &S.counters[2], static_cast<uint32_t>(shared_tiles(c) * ceil_div(H, width_single(P))), role.rank,
                  kFlagSharedForward, -1))
    return;
  trace_mark(P, kTrReduceStart);
  const uint16_t* y = P.peers[role.rank].y_slots;
  const int32_t* topk = P.peers[role.rank].topk;
  const float* w = P.peers[role.rank].router_weights;
  uint16_t* out = P.tensors[role.rank].output;
  // ORDER: combine-slots (per element; V adjacent columns per thread).
  const float* init = c.has_shared() ? S.shared_out : nullptr;
  auto step = [](float acc, float wk, uint16_t y_bits) { return spec::combine_step(acc, wk, y_bits); };
  if constexpr (kAtomics)
    finish_from_acc(P, role, out);
  else
    dispatch_combine(P, role, y, topk, init, w, step, out);
  trace_mark(P, kTrReduceDone);
  trace_mark(P, kTrEnd);
}

// ---------------------------------------------------------------------------------------------
// Backward.

// d_act of one column tile: da = dy . W_down (routed) or d_output . W_shared_down, then
// d_gate, d_up (bf16) from the forward's g and u (silu(g) and silu'(g) recomputed from g).
__device__ inline bool backward_phase1(const LaunchParams& P, const Role& role, uint8_t* smem, const RowTile& t,
                                       int64_t n0) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const RankTensorMaps& maps = P.maps[role.rank];
  const int64_t H = c.hidden, p0 = t.p0, n = t.n;
  const bool routed = t.e >= 0;
  uint64_t t0 = trace_now(P);
  if (routed && !wait_rows(P, role, S.row_ready_bwd, p0, n, kFlagBackwardDispatchRow)) return false;
  trace_add(P, kTrWaitRows, t0);
  t0 = trace_now(P);
  const int64_t N = routed ? c.intermediate : c.shared_intermediate;
  const float* gate = routed ? S.gate : S.shared_gate;
  const float* up = routed ? S.up : S.shared_up;
  uint16_t* dg = routed ? S.d_gate : S.shared_d_gate;
  uint16_t* du = routed ? S.d_up : S.shared_d_up;
  const uint16_t* a_src = routed ? S.dy : P.peers[role.rank].d_output;
  const uint16_t* wd = routed ? W.w_routed_down + t.e * H * N : W.w_shared_down;  // [H, N]
  // silu(g) and silu'(g) come from the forward's g by the forward's code: the same bits as the
  // values the forward's act used (in spec::silu_normal_range the branch-free form: same bits).
  auto epi = [&](int64_t m, int64_t col, float da) {
    const int64_t j = (p0 + m) * N + col;
    const spec::SiluPair s = spec::silu_and_grad_f32(gate[j]);
    dg[j] = spec::swiglu_grad_gate_pre(da, up[j], s.grad);
    du[j] = spec::swiglu_grad_up_pre(da, s.silu);
  };
  // ORDER: dot-chain over H.
  if (P.fast) {
    const RankTensorMaps& kmaps = P.maps[kMaxRanks + role.rank];  // K-major set (tall boxes)
    const FastOperand A = kmajor(routed ? &kmaps.dy : &kmaps.d_output, p0, kKMajorBoxRows);
    const FastOperand B = mnmajor(routed ? &maps.w_routed_down : &maps.w_shared_down, routed ? t.e * H : 0, n0);
    // The forward's g and u of the tile are asked into L2 near the end of the main loop, then
    // copied row by row into shared memory beside the staged tile, a few rows of each warp ahead
    // of its stores (LoadedRows: no registers held for them; this pass never writes them).
    const int64_t cols = min(static_cast<int64_t>(kTileNWide), N - n0);
    gemm_fast<0, 1, false, kTileNWide>(smem, H, n, cols, A, B, B,
                           loaded_rows(
                               NoKey{},
                               [&](int64_t i) {
                                 const int64_t idx = (p0 + i) * N + n0;
                                 return RowSources{gate + idx, up + idx};
                               },
                               [&](int64_t i, int64_t, int j, const float4& da, const float4& g4, const float4& u,
                                   int valid) {
                                 const int64_t idx = (p0 + i) * N + n0 + j;
                                 // valid is 4: N is a multiple of 64 here.
                                 store4_swiglu_grads(dg + idx, du + idx, da, g4, u, valid);
                               },
                               [&] {
                                 const float* src[2] = {gate, up};
                                 for (int q = threadIdx.x; q < 2 * kTileM; q += kThreads) {
                                   const int64_t r = q % kTileM;
                                   if (r < n)
                                     prefetch_l2(src[q / kTileM] + (p0 + r) * N + n0,
                                                 static_cast<uint32_t>(cols * sizeof(float)));
                                 }
                               }),
                           trace_words(P, kTrLaps1));
  } else {
    gemm_slow(smem, n, N, H, 0, n0, [&](int64_t m, int64_t k) { return a_src[(p0 + m) * H + k]; },
              [&](int64_t k, int64_t col) { return wd[k * N + col]; }, epi);
  }
  trace_add(P, kTrPhase1, t0);
  t0 = trace_now(P);
  publish_tile(&S.tiles_done[t.index]);
  trace_add(P, kTrPublish, t0);
  return true;
}

// d_x of one column tile of H: [d_gate | d_up] . [W_gate; W_up] over 2I, gate half first;
// routed rows are pushed into their owners' dx slots, shared rows go to dx_shared (fp32).
__device__ inline bool backward_phase2(const LaunchParams& P, const Role& role, uint8_t* smem, const RowTile& t,
                                       int64_t n0) {
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const RankTensorMaps& maps = P.maps[role.rank];
  const int64_t H = c.hidden, p0 = t.p0, n = t.n;
  const bool routed = t.e >= 0;
  const uint64_t t0_start = trace_now(P);
  const int64_t N1 = routed ? c.intermediate : c.shared_intermediate;
  const uint16_t* dg = routed ? S.d_gate : S.shared_d_gate;
  const uint16_t* du = routed ? S.d_up : S.shared_d_up;
  const uint16_t* wg = routed ? W.w_routed_gate + t.e * N1 * H : W.w_shared_gate;  // [N1, H]
  const uint16_t* wu = routed ? W.w_routed_up + t.e * N1 * H : W.w_shared_up;
  auto out = [&](int64_t m, int64_t col, float v) {
    if constexpr (kAtomics) {
      float* a = routed ? nullptr : P.peers[role.rank].acc + (p0 + m) * H + col;
      if (routed) {
        const RowRef row = S.rows[p0 + m];
        a = P.peers[row.token_idx / c.tokens_per_rank].acc + (row.token_idx % c.tokens_per_rank) * H + col;
        v = spec::round_bf16(v);
      }
      atomicAdd(a, v);
    } else if (routed) {
      push_to_owner(P, S, &PeerBuffers::dx_slots, p0 + m, col, v);
    } else {
      S.dx_shared[(p0 + m) * H + col] = v;
    }
  };
  // ORDER: dot-chain over 2I, gate half first.
  if (P.fast) {
    const RankTensorMaps& kmaps = P.maps[kMaxRanks + role.rank];  // K-major set (tall boxes)
    const FastOperand A = routed ? kmajor2(&kmaps.d_gate, p0, &kmaps.d_up, p0, N1, kKMajorBoxRows)
                                 : kmajor2(&kmaps.shared_d_gate, p0, &kmaps.shared_d_up, p0, N1, kKMajorBoxRows);
    const int64_t wrow = routed ? t.e * N1 : 0;
    const FastOperand B = routed ? mnmajor2(&maps.w_routed_gate, wrow, &maps.w_routed_up, wrow, N1, n0)
                                 : mnmajor2(&maps.w_shared_gate, wrow, &maps.w_shared_up, wrow, N1, n0);
    const int64_t cols = min(static_cast<int64_t>(kTileNWide), H - n0);
    if constexpr (kAtomics)
      gemm_fast<0, 1, false, kTileNWide>(smem, 2 * N1, n, cols, A, B, B,
                             [&](int64_t i, int64_t j, float v0, float v1) {
                               atomic_pair(P, role, S, routed, false, p0 + i, n0 + j, v0, v1);
                             },
                             trace_words(P, kTrLaps2));
    else {
      gemm_fast<0, 1, false, kTileNWide>(smem, 2 * N1, n, cols, A, B, B,
                             slot_row_epilogue(P, S, &PeerBuffers::dx_slots, routed, p0, n0, S.dx_shared),
                             trace_words(P, kTrLaps2));
    }
  } else {
    gemm_slow(
        smem, n, H, 2 * N1, 0, n0,
        [&](int64_t m, int64_t k) { return k < N1 ? dg[(p0 + m) * N1 + k] : du[(p0 + m) * N1 + (k - N1)]; },
        [&](int64_t k, int64_t col) { return k < N1 ? wg[k * H + col] : wu[(k - N1) * H + col]; }, out);
  }
  trace_add(P, kTrPhase2, t0_start);
  const uint64_t t0 = trace_now(P);
  if (!routed)
    publish(&S.counters[3], 1);
  else if (!tallied_rows(P))
    publish_rows(P, S, p0, n, 1);
  trace_add(P, kTrPublish, t0);
  return true;
}

// A weight-gradient tile's stores: fp32 rows staged in shared memory, each written by one bulk
// copy that the block does not wait for (deterministic kernel; weight_grad_tiles waits for its
// copies' writes at its end), or fp32 atomic adds of column pairs (the atomics variant).
__device__ __forceinline__ auto wgrad_epilogue(float* out, int64_t N, int64_t m0, int64_t n0) {
  if constexpr (kAtomics) {
    return [=](int64_t i, int64_t j, float v0, float v1) {
      float2* o = reinterpret_cast<float2*>(out + (m0 + i) * N + n0 + j);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(o, make_float2(v0, v1));
#else
      atomicAdd(&o->x, v0);
      atomicAdd(&o->y, v1);
#endif
    };
  } else {
    return bulk_rows_f32([=](int64_t i) { return out + (m0 + i) * N + n0; });
  }
}

// d_router_weights[s] = sum over h of d_output[t, h] * y[s, h] for every slot s = (t, k) of the
// rank's tokens (0 for an empty slot). ORDER: router-grad-lanes: one warp per slot; lane j sums
// h = j mod 32 in increasing h by fma, then an xor butterfly over 16, 8, 4, 2, 1.
// That order gives each lane every 32nd element, so reading the rows straight from global memory
// takes a 2-byte load per element and lane (64 bytes per warp instruction, few in flight). With
// C > 0 (H a multiple of 8) the warp first copies C-element pieces of both rows into its own
// part of the idle ring with 16-byte cp.async (2C / 256 copies per lane in flight), then each
// lane runs its chain from shared memory: the same elements, in the same order. C = 0 is the
// plain loop. Needs 4C bytes of shared memory per warp: 8 KiB of the slow engine's 9 KiB of
// buffers at C = 256. The fast engine's form (C = 2048) keeps two chunks per warp, 8C bytes (128
// KiB of its 192 KiB ring): the copies of the warp's next chunk, which may be its next slot's
// first, are in flight while the lanes run their chains over the current one, so the warp waits
// for memory once per slot rather than once per chunk. The chains and the butterfly are the same.
inline constexpr int kRouterChunkFast = 2048, kRouterChunkSlow = 256;
static_assert(kWarps * 8 * kRouterChunkFast <= kRingBytes, "the fast engine's two chunks per warp fit in its ring");
static_assert(kWarps * 4 * kRouterChunkSlow <= smem_bytes_for(0, false) - 1024,
              "the slow engine's staging fits in the dynamic shared memory a slow launch gets past alignment");
template <int C>
__device__ inline void router_grads(const LaunchParams& P, const Role& role, uint8_t* smem, const uint16_t* dout,
                                    const uint16_t* y, const int32_t* topk, float* d_router_weights) {
  const int64_t H = P.cfg.hidden, K = P.cfg.top_k, T = P.cfg.tokens_per_rank;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (C == kRouterChunkFast) {
    // Two buffers per warp, each a chunk of both rows; the warp's (slot, chunk) sequence is its
    // live slots in increasing s, each slot's chunks in increasing h.
    uint16_t* const base = reinterpret_cast<uint16_t*>(smem) + warp * 4 * C;
    const int64_t stride = int64_t{role.blocks} * kWarps, TK = T * K;
    auto live_from = [&](int64_t s) {  // the first live slot at or after s; empty slots get 0
      for (; s < TK; s += stride) {
        if (__ldg(&topk[s]) >= 0) break;
        if (lane == 0) d_router_weights[s] = 0.0f;
      }
      return s;
    };
    auto issue = [&](int64_t s, int64_t c0, int b) {
      const int n = static_cast<int>(H - c0 < C ? H - c0 : C);
      uint16_t* sd = base + b * 2 * C;
      for (int e = lane * 8; e < n; e += 256) {
        copy16_async(sd + e, dout + (s / K) * H + c0 + e);
        copy16_async(sd + C + e, y + s * H + c0 + e);
      }
      copy16_commit();
    };
    int64_t s = live_from(role.block * kWarps + warp), c0 = 0;
    int b = 0;
    float acc = 0.0f;
    if (s < TK) issue(s, 0, 0);
    while (s < TK) {  // ORDER: chunks in increasing h within a slot
      int64_t ns = s, nc0 = c0 + C;
      if (nc0 >= H) ns = live_from(s + stride), nc0 = 0;
      if (ns < TK) {
        issue(ns, nc0, b ^ 1);  // buffer b ^ 1 was last read before the __syncwarp below, one step ago
        copy16_wait_all_but_last();
      } else {
        copy16_wait_all();
      }
      __syncwarp();
      const uint16_t* sd = base + b * 2 * C;
      const int n = static_cast<int>(H - c0 < C ? H - c0 : C);
#pragma unroll 8
      for (int e = lane; e < n; e += 32)  // ORDER: this lane's columns in increasing h
        acc = spec::ffma(spec::f32_from_bf16(sd[e]), spec::f32_from_bf16(sd[C + e]), acc);
      __syncwarp();  // every lane has read buffer b before the next step's copies refill it
      if (nc0 == 0) {
        for (int offset = 16; offset >= 1; offset /= 2)
          acc = spec::fadd(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
        if (lane == 0) d_router_weights[s] = acc;
        acc = 0.0f;
      }
      s = ns, c0 = nc0, b ^= 1;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    __syncthreads();
    return;
  }
  [[maybe_unused]] uint16_t* sd = reinterpret_cast<uint16_t*>(smem) + warp * 2 * C;
  [[maybe_unused]] uint16_t* sy = sd + C;
  for (int64_t s = role.block * kWarps + warp; s < T * K; s += role.blocks * kWarps) {
    if (topk[s] < 0) {
      if (lane == 0) d_router_weights[s] = 0.0f;
      continue;
    }
    const int64_t t = s / K;
    float acc = 0.0f;
    if constexpr (C == 0) {
      for (int64_t h = lane; h < H; h += 32)
        acc = spec::ffma(spec::f32_from_bf16(dout[t * H + h]), spec::f32_from_bf16(y[s * H + h]), acc);
    } else {
      static_assert(C % 256 == 0, "whole 16-byte copies for every lane, and chunks of 32 columns");
      for (int64_t c0 = 0; c0 < H; c0 += C) {  // ORDER: chunks in increasing h
        const int n = static_cast<int>(H - c0 < C ? H - c0 : C);
        for (int e = lane * 8; e < n; e += 256) {
          copy16_async(sd + e, dout + t * H + c0 + e);
          copy16_async(sy + e, y + s * H + c0 + e);
        }
        copy16_wait_all();
        __syncwarp();
#pragma unroll 8
        for (int e = lane; e < n; e += 32)  // ORDER: this lane's columns in increasing h
          acc = spec::ffma(spec::f32_from_bf16(sd[e]), spec::f32_from_bf16(sy[e]), acc);
        __syncwarp();  // every lane has read the chunk before the next one lands
      }
    }
    for (int offset = 16; offset >= 1; offset /= 2) acc = spec::fadd(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
    if (lane == 0) d_router_weights[s] = acc;
  }
  if constexpr (C > 0) {
    // The ring's next users are the weight gradients' TMA loads (async proxy, sm_90 and later);
    // order this generic-proxy use of it before them, as after a row epilogue.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    __syncthreads();
  }
}

// Weight-gradient tile items: routed (per local expert: gate, up [I x H]; down [H x I]) then
// shared (gate, up [Is x H]; down [H x Is]). ORDER: weight-grad chain over the canonical row
// list (routed) or the rank's tokens in order (shared), 16 rows per MMA step.
__device__ inline void weight_grad_tiles(const LaunchParams& P, const Role& role, uint8_t* smem) {
  const spec::LayerConfig& c = P.cfg;
  const int64_t H = c.hidden, I = c.intermediate, Is = c.shared_intermediate, T = c.tokens_per_rank;
  const int64_t E_local = c.experts_per_rank(), NT = width_single(P);
  const RankState& S = P.state[role.rank];
  const RankTensors& W = P.tensors[role.rank];
  const RankTensorMaps& maps = P.maps[role.rank];
  // One [128 x NT] tile of out[M, N] = sum over rows r0 .. r0+nr-1 of a_src[r, m] * b_src[r, n].
  auto tile = [&](int64_t M, int64_t N, int64_t m0, int64_t n0, int64_t r0, int64_t nr, const uint16_t* a_src,
                  const uint16_t* b_src, const TensorMapBytes* am, const TensorMapBytes* bm, float* out) {
    if (P.fast) {
      gemm_fast<1, 1, false, kTileNWide>(smem, nr, min(static_cast<int64_t>(kTileM), M - m0),
                             min(static_cast<int64_t>(kTileNWide), N - n0), mnmajor(am, r0, m0), mnmajor(bm, r0, n0),
                             mnmajor(bm, r0, n0),
                             wgrad_epilogue(out, N, m0, n0), trace_words(P, kTrLapsW));
    } else {
      gemm_slow(smem, M, N, nr, m0, n0, [&](int64_t m, int64_t k) { return a_src[(r0 + k) * M + m]; },
                [&](int64_t k, int64_t col) { return b_src[(r0 + k) * N + col]; },
                [&](int64_t m, int64_t col, float v) {
                  if constexpr (kAtomics)
                    atomicAdd(out + m * N + col, v);
                  else
                    out[m * N + col] = v;
                });
    }
  };
  // Item numbers: per local expert gate, up (tiles of [I x H]) and down ([H x I]), each in
  // grouped_tile order; then the shared expert's three; claimed in order (ItemClaims, counters[6]).
  auto tiles_of = [&](int64_t M, int64_t N) { return ((M + kTileM - 1) / kTileM) * ((N + NT - 1) / NT); };
  const int64_t tgu = tiles_of(I, H), td = tiles_of(H, I), per_expert = 2 * tgu + td;
  const int64_t sgu = c.has_shared() ? tiles_of(Is, H) : 0, sd = c.has_shared() ? tiles_of(H, Is) : 0;
  const int64_t routed_items = E_local * per_expert, total = routed_items + 2 * sgu + sd;
  const uint16_t* x = P.peers[role.rank].x;
  const uint16_t* dout = P.peers[role.rank].d_output;
  // The atomics variant splits every tile's row chain in kAtomicSplits parts (64-row multiples).
  const int64_t splits = kAtomics ? kAtomicSplits : 1;
  auto split_rows = [&](int64_t split, int64_t& r0, int64_t& nr) {
    if (!kAtomics) return;
    const int64_t part = ceil_div(ceil_div(nr, splits), 64) * 64;
    const int64_t lo = min(nr, split * part), hi = min(nr, lo + part);
    r0 += lo;
    nr = hi - lo;
  };
  for (ItemClaims claims(&S.counters[6]); claims.item() < total * splits; claims.take_next()) {
    const int64_t work = claims.item();
    claims.ask_next();
    const int64_t item = work / splits, split = work % splits;
    trace_count(P, kTrWgradItems);
    const bool routed = item < routed_items;
    const int64_t e = routed ? item / per_expert : -1;
    const int64_t r = routed ? item % per_expert : item - routed_items;
    const int64_t gu = routed ? tgu : sgu;
    const int which = r < gu ? 0 : r < 2 * gu ? 1 : 2;
    const int64_t t = r - which * gu;
    const bool down = which == 2;
    const int64_t Nin = routed ? I : Is;  // the expert's intermediate size
    const int64_t M = down ? H : Nin, N = down ? Nin : H;
    // Tiles of one gradient in grouped_tile order (as the phases: blocks running together share
    // a few A and B column blocks of the expert's rows in L2).
    int64_t mt, nt;
    grouped_tile(t, (M + kTileM - 1) / kTileM, (N + NT - 1) / NT, P.group_rows, mt, nt);
    const int64_t m0 = mt * kTileM, n0 = nt * NT;
    if (routed) {
      int64_t r0 = S.expert_offsets[e], nr = S.expert_offsets[e + 1] - r0;
      split_rows(split, r0, nr);
      if (kAtomics && nr == 0) continue;
      const uint16_t* a_src = which == 0 ? S.d_gate : which == 1 ? S.d_up : S.dy;  // [rows, M]
      const uint16_t* b_src = down ? S.act : S.xd;                                 // [rows, N]
      const TensorMapBytes* am = which == 0 ? &maps.d_gate : which == 1 ? &maps.d_up : &maps.dy;
      const TensorMapBytes* bm = down ? &maps.act : &maps.xd;
      float* out = (which == 0 ? W.d_w_routed_gate : which == 1 ? W.d_w_routed_up : W.d_w_routed_down) + e * M * N;
      tile(M, N, m0, n0, r0, nr, a_src, b_src, am, bm, out);
    } else {
      const uint16_t* a_src = which == 0 ? S.shared_d_gate : which == 1 ? S.shared_d_up : dout;  // [T, M]
      const uint16_t* b_src = down ? S.shared_act : x;                                           // [T, N]
      const TensorMapBytes* am = which == 0 ? &maps.shared_d_gate : which == 1 ? &maps.shared_d_up : &maps.d_output;
      const TensorMapBytes* bm = down ? &maps.shared_act : &maps.x;
      float* out = which == 0 ? W.d_w_shared_gate : which == 1 ? W.d_w_shared_up : W.d_w_shared_down;
      int64_t r0 = 0, nr = T;
      split_rows(split, r0, nr);
      if (kAtomics && nr == 0) continue;
      tile(M, N, m0, n0, r0, nr, a_src, b_src, am, bm, out);
    }
  }
  bulk_wait_all();  // this thread's bulk row copies have written before the pass ends
}

__global__ void __launch_bounds__(kThreads, 1) moe_backward_kernel(const __grid_constant__ LaunchParams params) {
  const LaunchParams& P = params;
  const Role role = my_role(P, false);
  if (role.rank == P.silent_rank) return;
  if (!enter_pass(P, role.block == 0)) return;  // windowed transports: every rank's window is published
  extern __shared__ __align__(1024) unsigned char dynamic_smem[];
  uint8_t* smem = aligned_smem(dynamic_smem);
#if defined(MOK_WGMMA)
  if (P.fast) {
    acquire_tensor_maps(&P.maps[role.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
    acquire_tensor_maps(&P.maps[kMaxRanks + role.rank].xd, sizeof(RankTensorMaps) / sizeof(TensorMapBytes));
  }
#endif
  const spec::LayerConfig& c = P.cfg;
  const RankState& S = P.state[role.rank];
  const int64_t H = c.hidden;
  trace_mark(P, kTrStart);
  // The routing plan and the forward intermediates (gate, up, act, gathered x, shared
  // gate/up/act) stay in the workspace from the forward pass of the same inputs. An error not
  // yet reported (a failed forward before this backward) stops the pass at once; and a forward
  // that overflowed its workspace (its error reported or not) leaves offsets past row_capacity:
  // then nothing of the plan is used, so nothing is read or written past the workspace.
  // One decision per block: another block may raise (the weight check below) while this one's
  // threads read the record, and a block split here would leave threads waiting at a barrier.
  if (__syncthreads_or(load_volatile(&P.error->code) != 0u ? 1 : 0)) return;
  const int64_t planned_rows = S.expert_offsets[c.experts_per_rank()];
  if (planned_rows > P.row_capacity) {
    if (threadIdx.x == 0)
      raise_error(P, 3, role.rank, kFlagBadRouting, static_cast<uint64_t>(P.row_capacity),
                  static_cast<uint64_t>(planned_rows), -1);
    return;
  }
  // The backward's weights scale dy and are d_router_weights' terms: on the virtual rack they are
  // the caller's arguments to this pass, which may differ from the forward's (under NCCL the
  // window's copy, which the forward wrote). Checked again, with a rank barrier so that no block
  // of the rank starts before every block's check is done (a block that found a bad weight never
  // arrives; the others stop there). Barrier generations of the backward: kGenChecked here,
  // kGenItemsDone after the GEMM items (all_ranks_passed below waits for that one).
  constexpr uint32_t kGenChecked = 1, kGenItemsDone = 2;
  static_assert(kGenItemsDone == kGenChecked + 1, "one rank barrier between the check and the items' end");
  if (!check_router_weights(P, role)) return;
  if (!rank_barrier(P, role.rank)) return;
  count_expected_arrivals(P, role);
  trace_mark(P, kTrPlanned);
  if (role.comm) gather_rows<true>(P, role, S.dy, S.row_ready_bwd, [](const PeerBuffers& b) { return b.d_output; });
  trace_mark(P, kTrGathered);
  if (!for_item_ranks(P, role, 0, [&](const Role& w) __attribute__((always_inline)) {
        // Another rank's plan past its workspace: that rank's own blocks report it (above); its
        // items are not run.
        if (P.state[w.rank].expert_offsets[c.experts_per_rank()] > P.row_capacity) return false;
        zero_owner_tally(P);  // as in the forward
        if (!run_phases<TableAt::kScratch>(
                P, w, smem, c.intermediate, c.shared_intermediate, width_single(P),
                [&](const RowTile& t, int64_t n0) { return backward_phase1(P, w, smem, t, n0); },
                [&](const RowTile& t, int64_t n0) { return backward_phase2(P, w, smem, t, n0); }))
          return false;
        if (tallied_rows(P)) publish_tallied_rows(P, 1);
        return true;
      }))
    return;
  trace_mark(P, kTrItemsDone);
  if (!rank_barrier(P, role.rank)) return;
  if (!all_ranks_passed(P, kGenItemsDone)) return;  // shared items: every rank's d_act, dg, du are complete
  // Every block: a share of d_x once every dx row has arrived, and of d_router_weights; then
  // every block produces a share of the weight gradients.
  if (!block_wait(P, &P.peers[role.rank].arrivals[1], S.counters[4], role.rank, kFlagBackwardArrivals, -1)) return;
  if (!block_wait(P, &S.counters[3], static_cast<uint32_t>(shared_tiles(c) * ceil_div(H, width_single(P))), role.rank,
                  kFlagSharedBackward, -1))
    return;
  trace_mark(P, kTrReduceStart);
  const uint16_t* dx = P.peers[role.rank].dx_slots;
  const uint16_t* y = P.peers[role.rank].y_slots;
  const uint16_t* dout = P.peers[role.rank].d_output;
  const int32_t* topk = P.peers[role.rank].topk;
  const RankTensors& R = P.tensors[role.rank];
  // ORDER: dx-slots (per element; V adjacent columns per thread).
  const float* init = c.has_shared() ? S.dx_shared : nullptr;
  auto step = [](float acc, float, uint16_t dx_bits) { return spec::dx_step(acc, dx_bits); };
  if constexpr (kAtomics)
    finish_from_acc(P, role, R.d_x);
  else
    dispatch_combine(P, role, dx, topk, init, nullptr, step, R.d_x);
  trace_mark(P, kTrDxDone);
  if (H % 8 == 0 && P.fast)
    router_grads<kRouterChunkFast>(P, role, smem, dout, y, topk, R.d_router_weights);
  else if (H % 8 == 0)
    router_grads<kRouterChunkSlow>(P, role, smem, dout, y, topk, R.d_router_weights);
  else
    router_grads<0>(P, role, smem, dout, y, topk, R.d_router_weights);
  trace_mark(P, kTrReduceDone);
  for_item_ranks(P, role, 0, [&](const Role& w) __attribute__((always_inline)) {
    weight_grad_tiles(P, w, smem);
    return true;
  });
  trace_mark(P, kTrEnd);
}

}  // namespace mok::kernel::device
