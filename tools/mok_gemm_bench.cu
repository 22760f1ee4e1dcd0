// mok-gemm-bench: the fused kernel's tile engine alone, on the GEMM shapes of the MoE layer, against
// cuBLAS on the same shapes in the same run. It separates what the engine's main loop reaches
// from what the layer around it costs (gathers, waits, epilogue traffic, the combine).
//
// Every SM runs one persistent block that takes [128 x N] tiles of one large GEMM in the layer's
// grouped order (8 row tiles, column-major inside a group) and calls the same gemm_fast the layer
// calls, with the operand layouts of each layer GEMM:
//   fwd1   gate and up:  A [M, K] K-major, two B [N, K] K-major (128-wide dual tile), K = H
//   fwd2   down:         A [M, K] K-major, B [N, K] K-major (256-wide tile), K = I
//   bwd1   d_act:        A [M, K] K-major, B [K, N] MN-major (256-wide), K = H
//   wgrad  weight grads: A [K, M] MN-major, B [K, N] MN-major (256-wide), K = rows of an expert
// Epilogues: `store` writes what the layer writes (fp32 or bf16 pairs), `none` only keeps the
// accumulators alive (the pure main loop); --fwd1-stores leaves out some of fwd1's stores while
// its SwiGLU math still runs (arithmetic against stores). Three variants of the engine run each case: stores
// from the accumulator fragments (pairs of columns, eight rows per warp instruction), the
// warp-specialised experiment below, and row stores through shared memory (the layer's epilogue
// since 2026-12-03); both others' bits are checked against the first. For wgrad a fourth line
// times the layer's weight-gradient epilogue since the eighth session: the staged rows leave by
// asynchronous bulk copies (BulkRowsF32), bits checked the same way. For fwd2 and bwd1 two more
// lines time the storing-warpgroup experiment (ws_store_kernel, below; bits checked the same
// way): the consumers hand a bf16 staging tile to storing warps and go on. A last line per mode
// times ping-pong consumers (pp_kernel: each warpgroup owns alternate 64-row half-tiles, so one
// stores while the other multiplies; bits checked the same way), and for fwd2 and bwd1 (M a
// multiple of 256) the warp-specialised engine in clusters of two blocks that share the weight
// tile by TMA multicast (mc_kernel; bits checked the same way). Prints a table: ms
// (median), TFLOP/s, % of the bf16 peak measured in the same run (an 8192^3 cublasGemmEx), and
// cuBLAS on the same M, N, K.
// Exit 3 without a GPU with sm_90a, 2 on bad arguments.
#include "../kernel/device/mma_tile.cuh"
#include "mok/spec/orders.hpp"

#include "mok/cli.hpp"
#include "mok/cuda_check.hpp"
#include <cublas_v2.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace mok::kernel;
using namespace mok::kernel::device;

#define CK(x) MOK_CUDA_OR_EXIT("mok-gemm-bench", x)

#define CKB(x)                                                                                  \
  do {                                                                                          \
    cublasStatus_t s_ = (x);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "mok-gemm-bench: %s: cuBLAS status %d\n", #x, static_cast<int>(s_));  \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

enum Mode { kFwd1 = 0, kFwd2 = 1, kBwd1 = 2, kWgrad = 3 };

struct Args {
  const TensorMapBytes* maps;  // A, B, B2 in global memory
  int64_t M, N, K;
  int64_t row_tiles, col_tiles;
  float* out_f32[3];
  uint16_t* out_bf16;
  bool store;
  int fwd1_stores;  // fwd1 with `store`: bit 0 the fp32 g and u; bit 1 act (bf16); the math always runs
  int64_t stagger_ns;  // odd-numbered blocks wait this long before their first tile
  bool layer;  // bwd1: the layer's epilogue (reads fp32 g, u from out_f32[0..1], derives silu(g) and silu'(g); writes
              // d_gate, d_up bf16)
};

[[maybe_unused]] __device__ __forceinline__ void grouped(int64_t i, int64_t rows, int64_t cols, int64_t& rt, int64_t& ct) {
  constexpr int64_t kGroup = 8;  // as the layer's grouped_tile with its default KernelOptions::group_rows
  const int64_t g = i / (kGroup * cols), in = i % (kGroup * cols);
  const int64_t n = min(kGroup, rows - g * kGroup);
  rt = g * kGroup + in % n;
  ct = in / n;
}

// The `store` epilogue writes what the layer writes for a column pair; `none` only keeps the
// values alive (a comparison no random input meets).
template <int kMode>
[[maybe_unused]] __device__ __forceinline__ void store_pair(const Args& a, int64_t idx, float v0, float v1) {
  if (a.store) {
    if constexpr (kMode == kWgrad)
      *reinterpret_cast<float2*>(a.out_f32[0] + idx) = make_float2(v0, v1);
    else
      *reinterpret_cast<uint32_t*>(a.out_bf16 + idx) =
          pack2(mok::spec::bf16_from_f32_rne(v0), mok::spec::bf16_from_f32_rne(v1));
  } else if (v0 + v1 == -1.25e30f) {
    a.out_f32[0][0] = v0;
  }
}
// fwd1: g and u in fp32 and act in bf16, as the layer's phase 1 (a.fwd1_stores
// leaves out some of the stores; the values are computed either way and kept alive).
template <bool kNormal = false>
[[maybe_unused]] __device__ __forceinline__ void store_gate_up(const Args& a, int64_t idx, float g0, float g1, float u0, float u1) {
  if (a.store) {
    const mok::spec::SiluPair s0 = kNormal ? mok::spec::silu_and_grad_f32_normal(g0) : mok::spec::silu_and_grad_f32(g0),
                              s1 = kNormal ? mok::spec::silu_and_grad_f32_normal(g1) : mok::spec::silu_and_grad_f32(g1);
    const uint32_t act = pack2(mok::spec::swiglu_act_pre(s0.silu, u0), mok::spec::swiglu_act_pre(s1.silu, u1));
    if (a.fwd1_stores & 1) {
      *reinterpret_cast<float2*>(a.out_f32[0] + idx) = make_float2(g0, g1);
      *reinterpret_cast<float2*>(a.out_f32[1] + idx) = make_float2(u0, u1);
    } else if (g0 + g1 + u0 + u1 == -1.25e30f) {
      a.out_f32[0][0] = g0;
    }
    if (a.fwd1_stores & 2)
      *reinterpret_cast<uint32_t*>(a.out_bf16 + idx) = act;
    else if (act == 0x7F7F1234u)
      a.out_f32[0][0] = u0;
  } else if (g0 + g1 + u0 + u1 == -1.25e30f) {
    a.out_f32[0][0] = g0;
  }
}

// The same stores as a row epilogue (gemm_fast stages the tile in shared memory; a warp stores
// 256-512 contiguous bytes of one row), as the layer does since 2026-12-03.
template <int kMode>
[[maybe_unused]] __device__ __forceinline__ void store_row4(const Args& a, int64_t idx, const float4& v, int valid) {
  using namespace mok::spec;
  if (!a.store) {
    if (v.x + v.y + v.z + v.w == -1.25e30f) a.out_f32[0][0] = v.x;
  } else if constexpr (kMode == kWgrad) {
    store4_f32(a.out_f32[0] + idx, v, valid);
  } else {
    store4_rne(a.out_bf16 + idx, v, valid);
  }
}
[[maybe_unused]] __device__ __forceinline__ void store_gate_up4(const Args& a, int64_t idx, const float4& g,
                                                                const float4& u, int valid) {
  using namespace mok::spec;
  if (!a.store) {
    if (g.x + g.y + u.z + u.w == -1.25e30f) a.out_f32[0][0] = g.x;
    return;
  }
  const SiluPair s0 = silu_and_grad_f32(g.x), s1 = silu_and_grad_f32(g.y), s2 = silu_and_grad_f32(g.z),
                 s3 = silu_and_grad_f32(g.w);
  if (a.fwd1_stores & 1) {
    store4_f32(a.out_f32[0] + idx, g, valid);
    store4_f32(a.out_f32[1] + idx, u, valid);
  } else if (g.x + g.y + u.z + u.w == -1.25e30f) {
    a.out_f32[0][0] = g.x;
  }
  const uint16_t h0 = swiglu_act_pre(s0.silu, u.x), h1 = swiglu_act_pre(s1.silu, u.y), h2 = swiglu_act_pre(s2.silu, u.z),
                 h3 = swiglu_act_pre(s3.silu, u.w);
  if (a.fwd1_stores & 2)
    store4_bf16(a.out_bf16 + idx, h0, h1, h2, h3, valid);
  else if ((h0 ^ h1 ^ h2 ^ h3) == 0x1234u && h0 == 0x7F7Fu)
    a.out_f32[0][0] = u.x;
}

// --stagger-us: every block takes the same tiles at the same pace, so all of them store their
// epilogues at once; delaying the odd-numbered blocks by about half a tile puts half of those
// stores inside the other blocks' main loops. If the stores of all the blocks together are
// bound by DRAM writes, the staggered launch is faster despite its delay.
__device__ __forceinline__ void stagger_start(const Args& a) {
  if (a.stagger_ns <= 0 || (blockIdx.x & 1) == 0) return;
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<uint64_t>(a.stagger_ns));
}

template <int kMode, bool kRows, bool kBulk = false>
__global__ void __launch_bounds__(kThreads, 1) engine_kernel(Args a) {
#if defined(MOK_WGMMA)
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  acquire_tensor_maps(a.maps, 3);
  stagger_start(a);
  constexpr int kBN = kMode == kFwd1 ? kTileNFast : kTileNWide;
  const int64_t total = a.row_tiles * a.col_tiles;
  for (int64_t item = blockIdx.x; item < total; item += gridDim.x) {
    int64_t rt, ct;
    grouped(item, a.row_tiles, a.col_tiles, rt, ct);
    const int64_t m0 = rt * kTileM, n0 = ct * kBN;
    const int64_t rows = min(int64_t{kTileM}, a.M - m0), cols = min(int64_t{kBN}, a.N - n0);
    const TensorMapBytes* mp = a.maps;
    if constexpr (kMode == kFwd1 && kRows) {
      gemm_fast<0, 0, true, kTileNFast>(
          smem, a.K, rows, cols, kmajor(mp, m0), kmajor(mp + 1, n0), kmajor(mp + 2, n0),
          by_rows(NoKey{}, [&](int64_t i, int64_t, int j, const float4& g, const float4& u, int valid) {
            store_gate_up4(a, (m0 + i) * a.N + n0 + j, g, u, valid);
          }));
    } else if constexpr (kMode == kFwd1) {
      // As the layer's phase 1: the forms without range tests when every gate value allows them.
      gemm_fast<0, 0, true, kTileNFast>(
          smem, a.K, rows, cols, kmajor(mp, m0), kmajor(mp + 1, n0), kmajor(mp + 2, n0),
          ranged_pairs([](float v) { return mok::spec::silu_normal_range(v); },
                       [&](int64_t i, int64_t j, float g0, float g1, float u0, float u1) {
                         store_gate_up<true>(a, (m0 + i) * a.N + n0 + j, g0, g1, u0, u1);
                       },
                       [&](int64_t i, int64_t j, float g0, float g1, float u0, float u1) {
                         store_gate_up<false>(a, (m0 + i) * a.N + n0 + j, g0, g1, u0, u1);
                       }));
    } else if constexpr (kBulk) {  // wgrad: fp32 rows by bulk copies, as the layer's weight gradients
      static_assert(kMode == kWgrad, "bulk rows: the weight-gradient mode");
      gemm_fast<1, 1, false, kTileNWide>(smem, a.K, rows, cols, mnmajor(mp, 0, m0), mnmajor(mp + 1, 0, n0),
                                         mnmajor(mp + 1, 0, n0),
                                         bulk_rows_f32([&](int64_t i) { return a.out_f32[0] + (m0 + i) * a.N + n0; }));
    } else if constexpr (kRows && kMode == kBwd1) {
      if (a.layer) {  // as the layer's backward phase 1: g and u rows copied into shared memory ahead
        gemm_fast<0, 1, false, kTileNWide>(
            smem, a.K, rows, cols, kmajor(mp, m0), mnmajor(mp + 1, 0, n0), mnmajor(mp + 1, 0, n0),
            loaded_rows(
                NoKey{},
                [&](int64_t i) {
                  const int64_t idx = (m0 + i) * a.N + n0;
                  return RowSources{a.out_f32[0] + idx, a.out_f32[1] + idx};
                },
                [&](int64_t i, int64_t, int j, const float4& v, const float4& g, const float4& u, int valid) {
                  const int64_t idx = (m0 + i) * a.N + n0 + j;
                  store4_swiglu_grads(a.out_bf16 + idx, a.out_bf16 + a.M * a.N + idx, v, g, u, valid);
                },
                NoPrefetch{}));
      } else {
        gemm_fast<0, 1, false, kTileNWide>(smem, a.K, rows, cols, kmajor(mp, m0), mnmajor(mp + 1, 0, n0),
                                           mnmajor(mp + 1, 0, n0),
                                           by_rows(NoKey{}, [&](int64_t i, int64_t, int j, const float4& v, int valid) {
                                             store_row4<kMode>(a, (m0 + i) * a.N + n0 + j, v, valid);
                                           }));
      }
    } else if constexpr (kRows) {
      constexpr int TA = kMode == kWgrad ? 1 : 0, TB = kMode == kFwd2 ? 0 : 1;
      const FastOperand A = TA ? mnmajor(mp, 0, m0) : kmajor(mp, m0);
      const FastOperand B = TB ? mnmajor(mp + 1, 0, n0) : kmajor(mp + 1, n0);
      gemm_fast<TA, TB, false, kTileNWide>(smem, a.K, rows, cols, A, B, B,
                                           by_rows(NoKey{}, [&](int64_t i, int64_t, int j, const float4& v, int valid) {
                                             store_row4<kMode>(a, (m0 + i) * a.N + n0 + j, v, valid);
                                           }));
    } else {
      constexpr int TA = kMode == kWgrad ? 1 : 0, TB = kMode == kFwd2 ? 0 : 1;
      const FastOperand A = TA ? mnmajor(mp, 0, m0) : kmajor(mp, m0);
      const FastOperand B = TB ? mnmajor(mp + 1, 0, n0) : kmajor(mp + 1, n0);
      gemm_fast<TA, TB, false, kTileNWide>(smem, a.K, rows, cols, A, B, B, [&](int64_t i, int64_t j, float v0, float v1) {
        const int64_t idx = (m0 + i) * a.N + n0 + j;
        if (kMode == kBwd1 && a.layer) {  // as the layer's backward phase 1, from the fragments
          const float2 g = __ldg(reinterpret_cast<const float2*>(a.out_f32[0] + idx));
          const float2 u = __ldg(reinterpret_cast<const float2*>(a.out_f32[1] + idx));
          const float gv[2] = {g.x, g.y};
          mok::spec::SiluPair s[2];
          mok::spec::silu_and_grad_f32_n(gv, s);
          *reinterpret_cast<uint32_t*>(a.out_bf16 + idx) = pack2(mok::spec::swiglu_grad_gate_pre(v0, u.x, s[0].grad),
                                                                 mok::spec::swiglu_grad_gate_pre(v1, u.y, s[1].grad));
          *reinterpret_cast<uint32_t*>(a.out_bf16 + a.M * a.N + idx) =
              pack2(mok::spec::swiglu_grad_up_pre(v0, s[0].silu), mok::spec::swiglu_grad_up_pre(v1, s[1].silu));
        } else {
          store_pair<kMode>(a, idx, v0, v1);
        }
      });
    }
  }
  bulk_wait_all();
#else
  (void)a;
  __trap();
#endif
}


// ---- Experimental: a warp-specialised engine with the same dot-chain order. Three warpgroups:
// warpgroup 0 loads (one thread issues every TMA copy, 40 registers), warpgroups 1 and 2 compute
// rows 0-63 and 64-127 of the tile (232 registers). The ring runs across tiles: the loader
// fills stages of the next tile while the consumers store the current one. Stages are handed
// back by "empty" mbarriers (one arrival per consumer warpgroup), not by block barriers.
constexpr int kWsThreads = 384;

#if defined(MOK_WGMMA)
// mbar_wait with a bound: after 2 s of failed polls (the clock read every 4,096 polls) it traps.
__device__ __forceinline__ void pp_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done = 0, polls = 0;
  uint64_t t0 = 0;
  while (true) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
    if (done) return;
    if ((++polls & 4095) == 0) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t0 == 0) t0 = t;
      else if (t - t0 > 2000000000ull) __trap();
    }
  }
}

// The warp-specialised variants' loader (one thread): every tile of this block in turn, in
// 128 / kRows parts of kRows rows (the ping-pong consumers' halves when kRows is 64), each chunk
// into the next stage of the ring once its consumer(s) have handed it back. A stage holds A's kRows
// rows, then B, then B2 (kDual). kBounded: waits trap after 2 s (pp_wait).
// ORDER: the ring's sequence is (tile, part, chunk); the consumers count it the same way.
template <int TA, int TB, bool kDual, int kBN, int kStages, int kRows = kTileM, bool kBounded = false>
__device__ __forceinline__ void ws_load(const Args& a, uint8_t* ring, uint64_t* full, uint64_t* empty, int64_t chunks) {
  constexpr int kB = kRows / 64 * kBoxBytes, kB2 = kB + kBN / 64 * kBoxBytes;
  constexpr int kStageBytes = kB2 + (kDual ? 2 * kBoxBytes : 0);
  const int64_t total = a.row_tiles * a.col_tiles;
  const TensorMapBytes* mp = a.maps;
  int64_t it = 0;
  for (int64_t item = blockIdx.x; item < total; item += gridDim.x) {
    int64_t rt, ct;
    grouped(item, a.row_tiles, a.col_tiles, rt, ct);
    const int64_t n0 = ct * kBN;
    const FastOperand B = TB ? mnmajor(mp + 1, 0, n0) : kmajor(mp + 1, n0);
    const FastOperand B2 = kmajor(mp + 2, n0);
    for (int part = 0; part < kTileM / kRows; ++part) {
      const int64_t m0 = rt * kTileM + int64_t{kRows} * part;
      const FastOperand A = TA ? mnmajor(mp, 0, m0) : kmajor(mp, m0);
      for (int64_t c = 0; c < chunks; ++c, ++it) {
        const int st = static_cast<int>(it % kStages);
        const uint32_t parity = static_cast<uint32_t>(((it / kStages) & 1) ^ 1);
        if constexpr (kBounded)
          pp_wait(&empty[st], parity);
        else
          mbar_wait(&empty[st], parity);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[st])),
                     "r"(kStageBytes)
                     : "memory");
        uint8_t* sp = ring + st * kStageBytes;
        fast_load(sp, A, c * kChunkK, &full[st], kRows);
        fast_load(sp + kB, B, c * kChunkK, &full[st], kBN);
        if constexpr (kDual) fast_load(sp + kB2, B2, c * kChunkK, &full[st], 128);
      }
    }
  }
}

// Each mode's operand layout in the warp-specialised kernels: two B operands (fwd1) or one, the
// tile width, and whether A / B are MN-major.
template <int kMode>
struct WsShape {
  static constexpr bool kDual = kMode == kFwd1;
  static constexpr int kBN = kDual ? kTileNFast : kTileNWide;
  static constexpr int TA = kMode == kWgrad ? 1 : 0, TB = (kMode == kFwd1 || kMode == kFwd2) ? 0 : 1;
};

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// After thread 0 has initialised the block's mbarriers: publish them, fetch the tensor maps, wait
// out --stagger-us, and meet (the warp-specialised kernels' common start).
__device__ __forceinline__ void ws_begin(const Args& a, int maps) {
  if (threadIdx.x == 0) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  acquire_tensor_maps(a.maps, maps);
  stagger_start(a);
  __syncthreads();
}

// Thread 0's set-up of a ring: full[st] completes on the loader's arrival plus the stage's bytes,
// empty[st] on one arrival per consumer warpgroup that reads the stage.
__device__ __forceinline__ void ws_init_ring(uint64_t* full, uint64_t* empty, int stages, uint32_t readers) {
  for (int st = 0; st < stages; ++st) {
    mbar_init(&full[st], 1);
    mbar_init(&empty[st], readers);
  }
}

// The register split of the 384-thread kernels: the loader's warpgroup gives registers up, the
// two consumer warpgroups take them (40 + 2 x 232 per thread of each warpgroup).
__device__ __forceinline__ void ws_loader_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
}
__device__ __forceinline__ void ws_consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// One 64-wide K chunk of a consumer warpgroup's 64 rows (ws_kernel, ws_store_kernel, pp_kernel):
// A at sa, B at sb (and B2 at sb2 with kDual) in shared memory.
// ORDER: four wgmma steps of 16 K-elements in increasing k, committed as one group.
template <int TA, int TB, bool kDual, int NJ>
__device__ __forceinline__ void ws_mma_chunk(float (&acc)[NJ][4], float (&acc2)[16][4], uint32_t sa, uint32_t sb,
                                             uint32_t sb2) {
  const uint32_t a_step = TA ? 16 * 128 : 32, b_step = TB ? 16 * 128 : 32;
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kChunkK / kStepK; ++j) {
    const uint64_t da = desc_sw128(sa + j * a_step, TA != 0);
    wgmma_m64nNk16<TA, TB, NJ>(acc, da, desc_sw128(sb + j * b_step, TB != 0));
    if constexpr (kDual) wgmma_m64n128k16<TA, TB>(acc2, da, desc_sw128(sb2 + j * b_step, TB != 0));
  }
  wgmma_commit();
}

// A consumer warpgroup's 64 accumulator rows (tile rows row0 .. row0 + 63) stored from the
// fragments, as the engine's fragment epilogue writes them.
template <int kMode, bool kDual, int NJ>
__device__ __forceinline__ void ws_store_fragments(const Args& a, const float (&acc)[NJ][4], const float (&acc2)[16][4],
                                                   int row0, int64_t m0, int64_t n0, int64_t rows, int64_t cols) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane >> 2, cq = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int64_t i = row0 + warp * 16 + g + (e >= 2 ? 8 : 0), jj = j * 8 + 2 * cq;
      if (i >= rows || jj >= cols) continue;
      const int64_t idx = (m0 + i) * a.N + n0 + jj;
      if constexpr (kDual)
        store_gate_up(a, idx, acc[j][e], acc[j][e + 1], acc2[j][e], acc2[j][e + 1]);
      else
        store_pair<kMode>(a, idx, acc[j][e], acc[j][e + 1]);
    }
}
#endif

template <int kMode>
__global__ void __launch_bounds__(kWsThreads, 1) ws_kernel(Args a) {
#if defined(MOK_WGMMA)
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  constexpr bool kDual = WsShape<kMode>::kDual;
  constexpr int kBN = WsShape<kMode>::kBN, TA = WsShape<kMode>::TA, TB = WsShape<kMode>::TB;
  constexpr int kStages = 12 / kUnitsPerStage<kDual, kBN>;
  constexpr int kStageBytes = kUnitsPerStage<kDual, kBN> * kOperandBytes;
  constexpr int NJ = kBN / 8;
  uint8_t* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kRingBytes);
  uint64_t* empty = full + kMaxStages;
  if (threadIdx.x == 0) {
    ws_init_ring(full, empty, kStages, 2);
  }
  ws_begin(a, 3);
  const int64_t total = a.row_tiles * a.col_tiles;
  const int64_t chunks = a.K / kChunkK;  // the bench keeps K a multiple of 64
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ws_loader_registers();
    if (threadIdx.x == 0) ws_load<TA, TB, kDual, kBN, kStages>(a, ring, full, empty, chunks);
  } else {
    ws_consumer_registers();
    const int cw = wg - 1;
    int64_t it = 0;
    for (int64_t item = blockIdx.x; item < total; item += gridDim.x) {
      int64_t rt, ct;
      grouped(item, a.row_tiles, a.col_tiles, rt, ct);
      const int64_t m0 = rt * kTileM, n0 = ct * kBN;
      const int64_t rows = min(int64_t{kTileM}, a.M - m0), cols = min(int64_t{kBN}, a.N - n0);
      float acc[NJ][4], acc2[16][4];
      zero_accumulators(acc);
      if constexpr (kDual) zero_accumulators(acc2);
      // ORDER: dot-chain: chunks in increasing k (ws_mma_chunk: 16 K-elements at a time in increasing k).
      for (int64_t c = 0; c < chunks; ++c, ++it) {
        const int st = static_cast<int>(it % kStages);
        mbar_wait(&full[st], static_cast<uint32_t>((it / kStages) & 1));
        uint8_t* sp = ring + st * kStageBytes;
        ws_mma_chunk<TA, TB, kDual, NJ>(acc, acc2, smem_u32(sp) + cw * kBoxBytes, smem_u32(sp + kOperandBytes),
                                        smem_u32(sp + 2 * kOperandBytes));
        wgmma_wait<1>();  // the previous chunk is done: hand its stage back
        if (c > 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      if constexpr (kDual) fence_accumulators(acc2);
      if (threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      ws_store_fragments<kMode, kDual, NJ>(a, acc, acc2, cw * 64, m0, n0, rows, cols);
    }
  }
#else
  (void)a;
  __trap();
#endif
}

// ---- Experimental: the warp-specialised engine with a storing warpgroup (fwd2 and bwd1: one B
// operand, bf16 rows out), the design kernel/README.md sketches for the layer's phase 2. The ring
// shrinks to three 48 KiB stages so that a bf16 staging tile (128 rows of 512 bytes, padded by 16
// bytes: a warp's 4-byte fragment stores then hit 32 banks) lives beside it. A consumer warpgroup
// rounds its 64 rows into the staging tile and goes straight on to its next tile's main loop;
// warps 1-3 of warpgroup 0 copy the staged rows to global memory (16 bytes per lane, a row per warp
// instruction) and hand the half back. Barriers: full / empty per stage (as ws_kernel), and per
// half of the staging tile `staged` (128 consumer arrivals) and `freed` (one per storing warp).
// (kHalf: one `staged`, and `freed[cw]` is consumer cw's turn to fill the area.)
// kHalf: the ring keeps its four stages and the staging area holds 64 rows, which the two
// consumer warpgroups fill in turn (warpgroup 1, then 2, each waiting until the storers have
// emptied it); the first consumer goes on with the next tile meanwhile, so the two warpgroups
// drift apart and one's epilogue overlaps the other's main loop.
constexpr int kWsStageRowBytes = 2 * kTileNWide + 16;
template <bool kHalf>
constexpr int kWsStoreStages = kHalf ? 4 : 3;
template <bool kHalf>
constexpr int kWsStagingOffset = kWsStoreStages<kHalf> * 3 * kOperandBytes;
template <bool kHalf>
constexpr int kWsBarrierOffset = kWsStagingOffset<kHalf> + (kHalf ? 64 : kTileM) * kWsStageRowBytes;
template <bool kHalf>
constexpr size_t kWsStoreSmem = kWsBarrierOffset<kHalf> + 16 * 8 + 1024;  // + alignment slack
static_assert(kWsStoreSmem<false> <= 227 * 1024 && kWsStoreSmem<true> <= 227 * 1024,
              "ring, staging and barriers fit in an H200 block's shared memory");

template <int kMode, bool kHalf>
__global__ void __launch_bounds__(kWsThreads, 1) ws_store_kernel(Args a) {
#if defined(MOK_WGMMA)
  static_assert(kMode == kFwd2 || kMode == kBwd1, "bf16 rows of one 256-wide B operand");
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  constexpr int kBN = kTileNWide;
  constexpr int TA = 0, TB = kMode == kFwd2 ? 0 : 1;
  constexpr int kStages = kWsStoreStages<kHalf>;
  constexpr int kStageBytes = 3 * kOperandBytes;
  constexpr int NJ = kBN / 8;
  uint8_t* ring = smem;
  uint8_t* staging = smem + kWsStagingOffset<kHalf>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kWsBarrierOffset<kHalf>);
  uint64_t* empty = full + kStages;
  uint64_t* staged = empty + kStages;  // [2]
  uint64_t* freed = staged + 2;        // [2]
  constexpr int kStoreWarps = 3;
  if (threadIdx.x == 0) {
    ws_init_ring(full, empty, kStages, 2);
    for (int h = 0; h < 2; ++h) {
      mbar_init(&staged[h], 128);
      mbar_init(&freed[h], kStoreWarps);
    }
  }
  ws_begin(a, 2);
  const int64_t total = a.row_tiles * a.col_tiles;
  const int64_t chunks = a.K / kChunkK;  // the bench keeps K a multiple of 64
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ws_loader_registers();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {  // the loader
      ws_load<TA, TB, false, kBN, kStages>(a, ring, full, empty, chunks);
    } else if (warp >= 1) {  // the storers: warps 1-3
      int64_t t = 0;
      for (int64_t item = blockIdx.x; item < total; item += gridDim.x, ++t) {
        int64_t rt, ct;
        grouped(item, a.row_tiles, a.col_tiles, rt, ct);
        const int64_t m0 = rt * kTileM, n0 = ct * kBN;
        const int64_t rows = min(int64_t{kTileM}, a.M - m0);
        for (int h = 0; h < 2; ++h) {
          // kHalf: one area, turn u = 2t + h, barriers 0 only
          const int bar = kHalf ? 0 : h;
          const uint32_t parity = static_cast<uint32_t>((kHalf ? 2 * t + h : t) & 1);
          mbar_wait(&staged[bar], parity);
          for (int r = warp - 1; r < 64; r += kStoreWarps) {
            const int64_t i = h * 64 + r;
            if (i < rows) {  // the bench's N is a multiple of 256: every column of the tile exists
              const uint4 v =
                  *reinterpret_cast<const uint4*>(staging + (kHalf ? r : i) * kWsStageRowBytes + lane * 16);
              *reinterpret_cast<uint4*>(a.out_bf16 + (m0 + i) * a.N + n0 + lane * 8) = v;
            }
          }
          __syncwarp();
          // Hand the area on: two areas, back to this half's consumer; one area, to the consumer
          // of the next turn (2t + h + 1), on that consumer's own barrier.
          const int next = kHalf ? (h + 1) & 1 : h;
          if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&freed[next])) : "memory");
        }
      }
    }
  } else {
    ws_consumer_registers();
    const int cw = wg - 1;
    const int warp = (threadIdx.x - 128) / 32, lane = threadIdx.x % 32, g = lane >> 2, cq = lane & 3;
    int64_t it = 0, t = 0;
    for (int64_t item = blockIdx.x; item < total; item += gridDim.x, ++t) {
      float acc[NJ][4], acc2[16][4];
      zero_accumulators(acc);
      // ORDER: dot-chain: chunks in increasing k, one wgmma per 16 K-elements in increasing k.
      for (int64_t c = 0; c < chunks; ++c, ++it) {
        const int st = static_cast<int>(it % kStages);
        mbar_wait(&full[st], static_cast<uint32_t>((it / kStages) & 1));
        uint8_t* sp = ring + st * kStageBytes;
        ws_mma_chunk<TA, TB, false, NJ>(acc, acc2, smem_u32(sp) + cw * kBoxBytes, smem_u32(sp + kOperandBytes), 0);
        wgmma_wait<1>();  // the previous chunk is done: hand its stage back
        if (c > 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      if (threadIdx.x % 128 == 0) {
        const int last = static_cast<int>((it - 1) % kStages);
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&empty[last])) : "memory");
      }
      // The storers have emptied the area: this half's previous tile (two areas), or the previous
      // turn (one area: turn u = 2t + cw waits for turn u - 1). Each consumer waits on its own
      // `freed` barrier, which completes once per tile for it: its k-th completion lets consumer
      // 0 into tile k + 1 and consumer 1 into tile k. A barrier is then never more than one phase
      // ahead of its waiter (a parity wait cannot tell phases two apart).
      const int bar = kHalf ? 0 : cw;
      const int64_t k = kHalf && cw == 1 ? t : t - 1;
      if (k >= 0) mbar_wait(&freed[cw], static_cast<uint32_t>(k & 1));
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int i = (kHalf ? 0 : cw * 64) + warp % 4 * 16 + g + (e >= 2 ? 8 : 0), jj = j * 8 + 2 * cq;
          *reinterpret_cast<uint32_t*>(staging + i * kWsStageRowBytes + jj * 2) =
              pack2(mok::spec::bf16_from_f32_rne(acc[j][e]), mok::spec::bf16_from_f32_rne(acc[j][e + 1]));
        }
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&staged[bar])) : "memory");
    }
  }
#else
  (void)a;
  __trap();
#endif
}

// ---- Experimental (twenty-seventh session; measured in the twenty-eighth on an H100 at about half the
// engine's speed, so rejected as a layout: BENCHMARKS.md): ping-pong consumers. As ws_kernel (one loader
// thread, two consumer warpgroups at 232 registers, full / empty mbarriers), but each consumer
// warpgroup owns whole 64-row half-tiles: of the block's tile t, rows 0-63 go to consumer 0
// (warpgroup 1) and rows 64-127 to consumer 1 (warpgroup 2), each over the full K with the tile's
// whole B. The loader fills the ring strictly in the order (tile, half, chunk), so the two main
// loops alternate: consumer 1's chunks come after all of consumer 0's, and consumer 0 stores its
// epilogue while consumer 1 multiplies. The tensor cores then idle only where one half's main loop is shorter than the
// other's epilogue. The cost: every stage carries the B tile for 64 rows, not 128 (B is read
// twice from L2 per tile: 40 KiB per stage for half the work of the cooperative engine's 48 KiB).
// Same dot-chain order per element, so the same bits as the engine.
// Turns: a consumer waits on a stage's `full` barrier by parity, which cannot tell phase k from
// phase k - 2, so it must never wait for a use of a stage whose previous use has not been loaded
// yet. The previous use of each of the first stages of a half belongs to the other warpgroup's
// half, which the loader may still be filling while this warpgroup, its epilogue done, comes
// back for its next half (the first version, without turns, deadlocked on the H200 that way). So
// a warpgroup starts half u only after the other has waited for every chunk of half u - 1:
// `turn[cw]` completes once per half of the other warpgroup (128 arrivals, every thread after its
// main loop: a review found that one thread's arrival let a lagging warp of the waiter miss a phase
// when K is a single chunk). Waits here are bounded (pp_wait): a hang traps after 2 s, so the bench
// exits with a CUDA error instead of spinning until the device call's limit.
// This also makes the alternation strict, as CUTLASS's ping-pong kernels order their MMAs.
constexpr int kPpStages = 5;
template <bool kDual, int kBN>
constexpr int kPpStageBytes = kBoxBytes + kBN / 64 * kBoxBytes + (kDual ? 2 * kBoxBytes : 0);
constexpr size_t kPpSmem = kPpStages * 40 * 1024 + (2 * kPpStages + 2) * 8 + 1024;
static_assert(kPpStageBytes<true, kTileNFast> == 40 * 1024 && kPpStageBytes<false, kTileNWide> == 40 * 1024,
              "every ping-pong stage is 40 KiB");
static_assert(kPpSmem <= 227 * 1024, "the ping-pong ring fits in an H200 block's shared memory");


template <int kMode>
__global__ void __launch_bounds__(kWsThreads, 1) pp_kernel(Args a) {
#if defined(MOK_WGMMA)
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  constexpr bool kDual = WsShape<kMode>::kDual;
  constexpr int kBN = WsShape<kMode>::kBN, TA = WsShape<kMode>::TA, TB = WsShape<kMode>::TB;
  constexpr int kStageBytes = kPpStageBytes<kDual, kBN>;
  constexpr int NJ = kBN / 8;
  uint8_t* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kPpStages * kStageBytes);
  uint64_t* empty = full + kPpStages;
  uint64_t* turn = empty + kPpStages;  // [2]: turn[cw] completes when the other warpgroup has loaded-and-waited a half
  if (threadIdx.x == 0) {
    ws_init_ring(full, empty, kPpStages, 1);
    for (int w = 0; w < 2; ++w)
      mbar_init(&turn[w], 128);
  }
  ws_begin(a, 3);
  const int64_t total = a.row_tiles * a.col_tiles;
  const int64_t chunks = a.K / kChunkK;  // the bench keeps K a multiple of 64
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ws_loader_registers();
    if (threadIdx.x == 0) ws_load<TA, TB, kDual, kBN, kPpStages, 64, true>(a, ring, full, empty, chunks);
  } else {
    ws_consumer_registers();
    const int cw = wg - 1;
    int64_t t = 0;
    for (int64_t item = blockIdx.x; item < total; item += gridDim.x, ++t) {
      int64_t rt, ct;
      grouped(item, a.row_tiles, a.col_tiles, rt, ct);
      const int64_t m0 = rt * kTileM, n0 = ct * kBN;
      const int64_t rows = min(int64_t{kTileM}, a.M - m0), cols = min(int64_t{kBN}, a.N - n0);
      float acc[NJ][4], acc2[16][4];
      zero_accumulators(acc);
      if constexpr (kDual) zero_accumulators(acc2);
      const int64_t base = (2 * t + cw) * chunks;  // this half's first place in the ring's sequence
      // Half u = 2t + cw waits for the other consumer's half u - 1: consumer 0 for the t-th
      // completion of turn[0] (consumer 1's half of tile t - 1), consumer 1 for the (t + 1)-th of
      // turn[1] (consumer 0's half of tile t). Neither barrier can be two phases ahead of its waiter: the other
      // warpgroup's next half waits in turn for this one.
      if (cw == 1)
        pp_wait(&turn[1], static_cast<uint32_t>(t & 1));
      else if (t > 0)
        pp_wait(&turn[0], static_cast<uint32_t>((t - 1) & 1));
      // ORDER: dot-chain: chunks in increasing k (ws_mma_chunk: 16 K-elements at a time in increasing k).
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t it = base + c;
        const int st = static_cast<int>(it % kPpStages);
        pp_wait(&full[st], static_cast<uint32_t>((it / kPpStages) & 1));
        uint8_t* sp = ring + st * kStageBytes;
        ws_mma_chunk<TA, TB, kDual, NJ>(acc, acc2, smem_u32(sp), smem_u32(sp + kBoxBytes),
                                        smem_u32(sp + kBoxBytes + kBN / 64 * kBoxBytes));
        wgmma_wait<1>();  // the previous chunk is done: hand its stage back
        if (c > 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kPpStages]);
      }
      // Every chunk of this half has been waited for (so loaded): the other warpgroup's turn. Every
      // thread of the warpgroup arrives (count 128), so the turn cannot complete while one of its
      // warps is still behind, e.g. storing the previous half when K is one chunk.
      mbar_arrive(&turn[1 - cw]);
      wgmma_wait<0>();
      fence_accumulators(acc);
      if constexpr (kDual) fence_accumulators(acc2);
      if (threadIdx.x % 128 == 0) mbar_arrive(&empty[(base + chunks - 1) % kPpStages]);
      ws_store_fragments<kMode, kDual, NJ>(a, acc, acc2, cw * 64, m0, n0, rows, cols);
    }
  }
#else
  (void)a;
  __trap();
#endif
}

// ---- Experimental (twenty-ninth session): the warp-specialised engine in clusters of two blocks
// that share the weight tile by TMA multicast. The two blocks of a cluster take adjacent row
// tiles (2p, 2p + 1) of the same column tile; each loads its own A (128 rows) and half of B's
// boxes, multicast into both blocks' stage at the same offset, so a block reads A 16 KiB + B
// 16 KiB from L2 per chunk instead of 48 KiB (ncu: the engine is at ~70% of the L2's throughput,
// cuBLAS reads a third less per FLOP with 1 x 2 clusters). A stage is refilled only when the
// consumers of both blocks have released it: each consumer warpgroup arrives on the stage's
// "empty" barrier in both blocks (four arrivals). fwd2 and bwd1 (one B), M a multiple of 256.
#if defined(MOK_WGMMA)
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrival on the mbarrier at the same shared-memory offset in block `cta` of the cluster, with the
// default (CTA-scope release) semantics, as CUTLASS's cluster barriers arrive: with
// `.release.cluster` here and `.acquire.cluster` on the loader's waits the kernels ran at half speed
// (H100, twenty-ninth session). The stage's bytes arrive through the async proxy and its readers
// are wgmma, so no generic-proxy write needs ordering across the blocks.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// One 64 x 64 box into the same offset of both blocks' shared memory, completing on the mbarrier
// at the same offset in each.
__device__ __forceinline__ void tma_load_box_mc(void* dst, const TensorMapBytes* map, int32_t col, int32_t row,
                                                uint64_t* bar) {
  const uint16_t mask = 0x3;
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n"
      :
      : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar)), "h"(mask)
      : "memory");
}
// This block's half of a 256-wide B chunk (boxes 2q, 2q + 1 of four), multicast into both blocks
// of the cluster at `dst` (the stage's B area), completing on `bar` in each.
template <int TB, int kBN>
__device__ __forceinline__ void load_b_half_mc(uint8_t* dst, const FastOperand& B, int64_t k0, uint32_t q, uint64_t* bar) {
  const int32_t k = static_cast<int32_t>(k0);
  for (int b = static_cast<int>(q) * (kBN / 128); b < (static_cast<int>(q) + 1) * (kBN / 128); ++b) {
    if (TB)
      tma_load_box_mc(dst + b * kBoxBytes, B.map[0], B.mn0 + 64 * b, B.base[0] + k, bar);
    else
      tma_load_box_mc(dst + b * kBoxBytes, B.map[0], k, B.base[0] + 64 * b, bar);
  }
}
#endif

template <int kMode>
__global__ void __launch_bounds__(kWsThreads, 1) mc_kernel(Args a) {
#if defined(MOK_WGMMA)
  static_assert(!WsShape<kMode>::kDual, "one B operand");
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  constexpr int kBN = WsShape<kMode>::kBN, TA = WsShape<kMode>::TA, TB = WsShape<kMode>::TB;
  constexpr int kStages = 12 / kUnitsPerStage<false, kBN>;
  constexpr int kStageBytes = kUnitsPerStage<false, kBN> * kOperandBytes;
  constexpr int NJ = kBN / 8, kB = kTileM / 64 * kBoxBytes;
  uint8_t* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kRingBytes);
  uint64_t* empty = full + kMaxStages;
  if (threadIdx.x == 0) ws_init_ring(full, empty, kStages, 4);  // two consumer warpgroups in each block
  ws_begin(a, 3);
  cluster_sync_all();  // both blocks' barriers exist before any multicast or remote arrival
  const uint32_t q = cluster_rank();
  const int64_t cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
  const int64_t pairs = a.row_tiles / 2 * a.col_tiles;
  const int64_t chunks = a.K / kChunkK;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ws_loader_registers();
    if (threadIdx.x == 0) {
      const TensorMapBytes* mp = a.maps;
      int64_t it = 0;
      for (int64_t pair = cluster; pair < pairs; pair += clusters) {
        int64_t rp, ct;
        grouped(pair, a.row_tiles / 2, a.col_tiles, rp, ct);
        const int64_t m0 = (2 * rp + q) * kTileM, n0 = ct * kBN;
        const FastOperand A = TA ? mnmajor(mp, 0, m0) : kmajor(mp, m0);
        const FastOperand B = TB ? mnmajor(mp + 1, 0, n0) : kmajor(mp + 1, n0);
        for (int64_t c = 0; c < chunks; ++c, ++it) {
          const int st = static_cast<int>(it % kStages);
          pp_wait(&empty[st], static_cast<uint32_t>(((it / kStages) & 1) ^ 1));
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[st])),
                       "r"(kStageBytes)
                       : "memory");
          uint8_t* sp = ring + st * kStageBytes;
          fast_load(sp, A, c * kChunkK, &full[st], kTileM);
          load_b_half_mc<TB, kBN>(sp + kB, B, c * kChunkK, q, &full[st]);
        }
      }
    }
  } else {
    ws_consumer_registers();
    const int cw = wg - 1;
    int64_t it = 0;
    for (int64_t pair = cluster; pair < pairs; pair += clusters) {
      int64_t rp, ct;
      grouped(pair, a.row_tiles / 2, a.col_tiles, rp, ct);
      const int64_t m0 = (2 * rp + q) * kTileM, n0 = ct * kBN;
      const int64_t rows = min(int64_t{kTileM}, a.M - m0), cols = min(int64_t{kBN}, a.N - n0);
      float acc[NJ][4], acc2[16][4];
      zero_accumulators(acc);
      // ORDER: dot-chain: chunks in increasing k (ws_mma_chunk: 16 K-elements at a time in increasing k).
      for (int64_t c = 0; c < chunks; ++c, ++it) {
        const int st = static_cast<int>(it % kStages);
        mbar_wait(&full[st], static_cast<uint32_t>((it / kStages) & 1));
        uint8_t* sp = ring + st * kStageBytes;
        ws_mma_chunk<TA, TB, false, NJ>(acc, acc2, smem_u32(sp) + cw * kBoxBytes, smem_u32(sp + kOperandBytes), 0);
        wgmma_wait<1>();  // the previous chunk is done: hand its stage back to both blocks' loaders
        if (c > 0 && threadIdx.x % 128 == 0) {
          mbar_arrive_cluster(&empty[(it - 1) % kStages], 0);
          mbar_arrive_cluster(&empty[(it - 1) % kStages], 1);
        }
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      if (threadIdx.x % 128 == 0) {
        mbar_arrive_cluster(&empty[(it - 1) % kStages], 0);
        mbar_arrive_cluster(&empty[(it - 1) % kStages], 1);
      }
      ws_store_fragments<kMode, false, NJ>(a, acc, acc2, cw * 64, m0, n0, rows, cols);
    }
  }
  cluster_sync_all();  // neither block leaves while the other may still write into it
#else
  (void)a;
  __trap();
#endif
}

// Launches a kernel of Args on clusters of two blocks of kWsThreads: as many clusters as fit at
// once (an even grid; the count is asked once per kernel).
template <auto* kKernel>
void launch_pairs(const Args& a, int sms, size_t smem) {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kWsThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  static int clusters = 0;
  if (clusters == 0) {
    cfg.gridDim = dim3(sms / 2 * 2);
    if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) != cudaSuccess || clusters < 1) clusters = sms / 2;
    std::printf("# %d clusters of two blocks at once\n", clusters);
  }
  cfg.gridDim = dim3(2 * std::min(clusters, sms / 2));
  cudaLaunchKernelEx(&cfg, kKernel, a);
}

template <int kMode>
__global__ void __launch_bounds__(kWsThreads, 1) pp_mc_kernel(Args a) {
#if defined(MOK_WGMMA)
  static_assert(!WsShape<kMode>::kDual, "one B operand");
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = aligned_smem(dyn);
  constexpr int kBN = WsShape<kMode>::kBN, TA = WsShape<kMode>::TA, TB = WsShape<kMode>::TB;
  constexpr int kStageBytes = kPpStageBytes<false, kBN>;
  constexpr int NJ = kBN / 8;
  uint8_t* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kPpStages * kStageBytes);
  uint64_t* empty = full + kPpStages;
  uint64_t* turn = empty + kPpStages;  // [2], as in pp_kernel
  if (threadIdx.x == 0) {
    ws_init_ring(full, empty, kPpStages, 2);
    for (int w = 0; w < 2; ++w) mbar_init(&turn[w], 128);
  }
  ws_begin(a, 3);
  cluster_sync_all();
  const uint32_t q = cluster_rank();
  const int64_t cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
  const int64_t pairs = a.row_tiles / 2 * a.col_tiles;
  const int64_t chunks = a.K / kChunkK;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    ws_loader_registers();
    if (threadIdx.x == 0) {
      const TensorMapBytes* mp = a.maps;
      int64_t it = 0;
      // ORDER: the ring's sequence is (tile, half, chunk), as the consumers count it.
      for (int64_t pair = cluster; pair < pairs; pair += clusters) {
        int64_t rp, ct;
        grouped(pair, a.row_tiles / 2, a.col_tiles, rp, ct);
        const int64_t n0 = ct * kBN;
        const FastOperand B = TB ? mnmajor(mp + 1, 0, n0) : kmajor(mp + 1, n0);
        for (int part = 0; part < 2; ++part) {
          const int64_t m0 = (2 * rp + q) * kTileM + 64 * part;
          const FastOperand A = TA ? mnmajor(mp, 0, m0) : kmajor(mp, m0);
          for (int64_t c = 0; c < chunks; ++c, ++it) {
            const int st = static_cast<int>(it % kPpStages);
            pp_wait(&empty[st], static_cast<uint32_t>(((it / kPpStages) & 1) ^ 1));
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[st])),
                         "r"(kStageBytes)
                         : "memory");
            uint8_t* sp = ring + st * kStageBytes;
            fast_load(sp, A, c * kChunkK, &full[st], 64);
            load_b_half_mc<TB, kBN>(sp + kBoxBytes, B, c * kChunkK, q, &full[st]);
          }
        }
      }
    }
  } else {
    ws_consumer_registers();
    const int cw = wg - 1;
    int64_t t = 0;
    for (int64_t pair = cluster; pair < pairs; pair += clusters, ++t) {
      int64_t rp, ct;
      grouped(pair, a.row_tiles / 2, a.col_tiles, rp, ct);
      const int64_t m0 = (2 * rp + q) * kTileM, n0 = ct * kBN;
      const int64_t rows = min(int64_t{kTileM}, a.M - m0), cols = min(int64_t{kBN}, a.N - n0);
      float acc[NJ][4], acc2[16][4];
      zero_accumulators(acc);
      const int64_t base = (2 * t + cw) * chunks;
      // The turns of pp_kernel: half 2t + cw waits for the other warpgroup's half before it.
      if (cw == 1)
        pp_wait(&turn[1], static_cast<uint32_t>(t & 1));
      else if (t > 0)
        pp_wait(&turn[0], static_cast<uint32_t>((t - 1) & 1));
      // ORDER: dot-chain: chunks in increasing k (ws_mma_chunk: 16 K-elements at a time in increasing k).
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t it = base + c;
        const int st = static_cast<int>(it % kPpStages);
        pp_wait(&full[st], static_cast<uint32_t>((it / kPpStages) & 1));
        uint8_t* sp = ring + st * kStageBytes;
        ws_mma_chunk<TA, TB, false, NJ>(acc, acc2, smem_u32(sp), smem_u32(sp + kBoxBytes), 0);
        wgmma_wait<1>();
        if (c > 0 && threadIdx.x % 128 == 0) {
          mbar_arrive_cluster(&empty[(it - 1) % kPpStages], 0);
          mbar_arrive_cluster(&empty[(it - 1) % kPpStages], 1);
        }
      }
      mbar_arrive(&turn[1 - cw]);
      wgmma_wait<0>();
      fence_accumulators(acc);
      if (threadIdx.x % 128 == 0) {
        mbar_arrive_cluster(&empty[(base + chunks - 1) % kPpStages], 0);
        mbar_arrive_cluster(&empty[(base + chunks - 1) % kPpStages], 1);
      }
      ws_store_fragments<kMode, false, NJ>(a, acc, acc2, cw * 64, m0, n0, rows, cols);
    }
  }
  cluster_sync_all();
#else
  (void)a;
  __trap();
#endif
}


// One persistent block per SM of the layer's engine or of the warp-specialised variant.
// variant 0: the engine with fragment stores, 1: warp-specialised, 2: the engine with row stores,
// 3 (wgrad only): the engine with bulk row copies, 4 / 5 (fwd2, bwd1): the storing warpgroup, 6: ping-pong,
// 7 (fwd2, bwd1): clusters of two sharing B by multicast, 8 (fwd2, bwd1): ping-pong in such clusters.
template <int kMode>
void launch_mode(const Args& a, int sms, size_t smem, int variant) {
  if constexpr (kMode == kWgrad)
    if (variant == 3) {
      engine_kernel<kMode, true, true><<<sms, kThreads, smem>>>(a);
      return;
    }
  if constexpr (kMode == kFwd2 || kMode == kBwd1)
    if (variant == 4 || variant == 5) {
      if (variant == 4)
        ws_store_kernel<kMode, false><<<sms, kWsThreads, (kWsStoreSmem<false>)>>>(a);
      else
        ws_store_kernel<kMode, true><<<sms, kWsThreads, (kWsStoreSmem<true>)>>>(a);
      return;
    }
  if (variant == 6) {
    pp_kernel<kMode><<<sms, kWsThreads, kPpSmem>>>(a);
    return;
  }
  if constexpr (kMode == kFwd2 || kMode == kBwd1)
    if (variant == 7 || variant == 8) {
      if (variant == 7)
        launch_pairs<mc_kernel<kMode>>(a, sms, smem);
      else
        launch_pairs<pp_mc_kernel<kMode>>(a, sms, kPpSmem);
      return;
    }
  if (variant == 1)
    ws_kernel<kMode><<<sms, kWsThreads, smem>>>(a);
  else if (variant == 2)
    engine_kernel<kMode, true><<<sms, kThreads, smem>>>(a);
  else
    engine_kernel<kMode, false><<<sms, kThreads, smem>>>(a);
}

__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // bf16 in about [-1, 1): sign, exponent 120..126, random mantissa (never zero)
    const uint32_t sign = (h >> 31) << 15, exp = 120 + (h >> 8) % 7, man = h & 0x7F;
    p[i] = static_cast<uint16_t>(sign | (exp << 7) | man);
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
}

// The layer's map format: a 2D bf16 [rows, cols] row-major tensor, 64 x 64 boxes, 128-byte swizzle.
TensorMapBytes map_of(const void* base, int64_t rows, int64_t cols) {
  TensorMapBytes m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
  if (encoder()(reinterpret_cast<CUtensorMap*>(&m), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "mok-gemm-bench: cuTensorMapEncodeTiled failed for a [%lld, %lld] tensor\n",
                 static_cast<long long>(rows), static_cast<long long>(cols));
    std::exit(1);
  }
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F f, int warmup, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "mok-gemm-bench: the fused kernel's tile engine (gemm_fast) alone on the MoE layer's GEMM shapes, against\n"
      "cuBLAS on the same shapes and the bf16 peak, all measured in the same run. Separates the engine's own\n"
      "efficiency from the layer's other costs. Example (dsv3 shapes):\n"
      "  mok-gemm-bench --M 16384 --H 7168 --I 2048 --wgrad-rows 2048\n\n"
      "Exit codes: 0 measured, 1 a CUDA or cuBLAS failure, 2 bad usage, 3 no sm_90 GPU here.",
      "mok-gemm-bench"};
  int64_t M = 16384, H = 7168, I = 2048, wrows = 2048;
  int reps = 10, warmup = 3;
  double stagger_us = 0;
  std::string modes = "fwd1,fwd2,bwd1,wgrad", epi = "store", fwd1_stores = "all";
  app.add_option("--M", M, "rows of the routed GEMMs (tokens x top-k of a rank's experts)")
      ->check(CLI::Range(128, 1 << 22))
      ->capture_default_str();
  app.add_option("--H", H, "hidden size (a multiple of 256)")->check(CLI::Range(256, 1 << 16))->capture_default_str();
  app.add_option("--I", I, "expert intermediate size (a multiple of 128)")->check(CLI::Range(128, 1 << 16))->capture_default_str();
  app.add_option("--wgrad-rows", wrows, "rows summed by a weight-gradient GEMM (one expert's rows)")
      ->check(CLI::Range(64, 1 << 22))
      ->capture_default_str();
  app.add_option("--modes", modes, "comma-separated subset of fwd1,fwd2,bwd1,wgrad")->capture_default_str();
  app.add_option("--epilogue", epi,
                 "store (what the layer writes), none (main loop only), or layer (bwd1 only: also reads the forward's "
                 "fp32 g and u, derives silu(g) and silu'(g) and writes the SwiGLU gradients, as the layer's epilogue; "
                 "the ws bits column then says n/a)")
      ->check(CLI::IsMember({"store", "none", "layer"}))
      ->capture_default_str();
  app.add_option("--fwd1-stores", fwd1_stores,
                 "with --epilogue store, which of fwd1's stores to write: all (the layer's: fp32 g and u and bf16 act), "
                 "f32 (the two fp32 arrays), act, or none; the SwiGLU math runs in every case, so none "
                 "against all separates the epilogue's arithmetic from its stores")
      ->check(CLI::IsMember({"all", "f32", "act", "none"}))
      ->capture_default_str();
  app.add_option("--stagger-us", stagger_us,
                 "odd-numbered blocks start this many microseconds late (about half a tile: ~18 for the qwen3 gate/up "
                 "tile), so that half of the blocks store while the others multiply; the time includes the delay. "
                 "Tests whether the epilogues of blocks running in step are bound by DRAM writes")
      ->check(mok::cli::finite_range(0.0, 1000.0, "a number of microseconds from 0 to 1000"))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed repetitions first")->check(CLI::Range(0, 100))->capture_default_str();
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  {
    // Every name of --modes must be one of the four, each once; an empty list measures nothing.
    const std::vector<std::string> known{"fwd1", "fwd2", "bwd1", "wgrad"};
    std::vector<std::string> seen;
    std::string cur;
    for (char ch : modes + ",") {
      if (ch != ',') {
        cur += ch;
        continue;
      }
      if (std::find(known.begin(), known.end(), cur) == known.end() ||
          std::find(seen.begin(), seen.end(), cur) != seen.end()) {
        std::fprintf(stderr, "mok-gemm-bench: --modes '%s': '%s' is %s; give a comma-separated subset of "
                     "fwd1,fwd2,bwd1,wgrad\n", modes.c_str(), cur.c_str(), cur.empty() ? "an empty name" : "not one of them (or repeated)");
        return 2;
      }
      seen.push_back(cur);
      cur.clear();
    }
    const bool has_bwd1 = std::find(seen.begin(), seen.end(), "bwd1") != seen.end();
    const bool has_fwd1 = std::find(seen.begin(), seen.end(), "fwd1") != seen.end();
    if (epi == "layer" && !has_bwd1) {
      std::fprintf(stderr, "mok-gemm-bench: --epilogue layer applies to bwd1 only, which --modes '%s' leaves out\n",
                   modes.c_str());
      return 2;
    }
    if (fwd1_stores != "all" && (epi != "store" || !has_fwd1)) {
      std::fprintf(stderr, "mok-gemm-bench: --fwd1-stores applies to fwd1 with --epilogue store (here --epilogue %s, "
                   "--modes '%s')\n", epi.c_str(), modes.c_str());
      return 2;
    }
  }
  if (H % 256 != 0 || I % 128 != 0 || wrows % 64 != 0) {
    std::fprintf(stderr,
                 "mok-gemm-bench: --H must be a multiple of 256, --I of 128 and --wgrad-rows of 64 (got %lld, %lld, %lld)\n",
                 static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(wrows));
    return 2;
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "mok-gemm-bench: no CUDA device; nothing measured\n");
    return 3;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || !encoder()) {
    std::fprintf(stderr, "mok-gemm-bench: needs an sm_90 GPU and the driver's tensor-map encoder (found %s, sm_%d%d)\n",
                 prop.name, prop.major, prop.minor);
    return 3;
  }
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, engine_kernel<kFwd1, false>));
  if (fa.binaryVersion != 90) {
    std::fprintf(stderr, "mok-gemm-bench: built without sm_90a code (binary version %d); configure with MOK_CUDA_ARCHS "
                 "containing 90a\n", fa.binaryVersion);
    return 3;
  }
  const size_t smem = smem_bytes_for(9, true);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;

  auto alloc_bf16 = [](int64_t n, uint32_t seed) {
    uint16_t* p = nullptr;
    CK(cudaMalloc(&p, n * 2));
    fill_kernel<<<1024, 256>>>(p, n, seed);
    CK(cudaGetLastError());
    return p;
  };
  // Peak: 8192^3 bf16 GEMM, fp32 accumulation.
  double peak = 0;
  {
    const int n = 8192;
    uint16_t *A = alloc_bf16(int64_t{n} * n, 1), *B = alloc_bf16(int64_t{n} * n, 2), *C = alloc_bf16(int64_t{n} * n, 3);
    const float one = 1, zero = 0;
    const double ms = time_ms(
        [&] {
          CKB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero, C,
                           CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        warmup, reps);
    peak = 2.0 * n * n * double(n) / (ms * 1e-3) / 1e12;
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
  }
  std::printf("# mok-gemm-bench %s (%d SMs): M %lld H %lld I %lld wgrad rows %lld, epilogue %s (fwd1 stores: %s), "
              "stagger %.1f us, median of %d after %d\n",
              prop.name, prop.multiProcessorCount, static_cast<long long>(M), static_cast<long long>(H),
              static_cast<long long>(I), static_cast<long long>(wrows), epi.c_str(), fwd1_stores.c_str(), stagger_us, reps, warmup);
  std::printf("# bf16 peak measured now: %.0f TFLOP/s (8192^3 cublasGemmEx)\n", peak);
  std::printf("%-6s %7s %7s %7s %10s %9s %7s %8s %9s %7s %8s %9s %7s %10s %9s %-7s %s\n", "gemm", "M", "N", "K",
              "engine ms", "TFLOP/s", "% peak", "ws ms", "TFLOP/s", "% peak", "rows ms", "TFLOP/s", "% peak",
              "cuBLAS ms", "TFLOP/s", "ws bits", "rows bits");

  for (const char* name : {"fwd1", "fwd2", "bwd1", "wgrad"}) {
    if (("," + modes + ",").find(std::string(",") + name + ",") == std::string::npos) continue;
    const std::string mname = name;
    const int mode = mname == "fwd1" ? kFwd1 : mname == "fwd2" ? kFwd2 : mname == "bwd1" ? kBwd1 : kWgrad;
    // GEMM dimensions (C is [GM, GN], reduction GK) and operand storage.
    int64_t GM = M, GN = I, GK = H;
    if (mode == kFwd2) GN = H, GK = I;
    if (mode == kBwd1) GN = I, GK = H;
    if (mode == kWgrad) GM = I, GN = H, GK = wrows;
    const int64_t a_rows = mode == kWgrad ? GK : GM, a_cols = mode == kWgrad ? GM : GK;
    const int64_t b_rows = mode == kFwd1 || mode == kFwd2 ? GN : GK, b_cols = mode == kFwd1 || mode == kFwd2 ? GK : GN;
    uint16_t* A = alloc_bf16(a_rows * a_cols, 11);
    uint16_t* B = alloc_bf16(b_rows * b_cols, 12);
    uint16_t* B2 = mode == kFwd1 ? alloc_bf16(b_rows * b_cols, 13) : B;
    TensorMapBytes host_maps[3] = {map_of(A, a_rows, a_cols), map_of(B, b_rows, b_cols), map_of(B2, b_rows, b_cols)};
    TensorMapBytes* maps = nullptr;
    CK(cudaMalloc(&maps, sizeof(host_maps)));
    CK(cudaMemcpy(maps, host_maps, sizeof(host_maps), cudaMemcpyHostToDevice));
    Args args{};
    args.maps = maps;
    args.M = GM, args.N = GN, args.K = GK;
    const int64_t bn = mode == kFwd1 ? kTileNFast : kTileNWide;
    args.row_tiles = (GM + kTileM - 1) / kTileM;
    args.col_tiles = (GN + bn - 1) / bn;
    args.store = epi != "none";
    args.layer = epi == "layer" && mode == kBwd1;
    args.stagger_ns = static_cast<int64_t>(stagger_us * 1000.0);
    args.fwd1_stores = fwd1_stores == "all" ? 3 : fwd1_stores == "f32" ? 1 : fwd1_stores == "act" ? 2 : 0;
    CK(cudaMalloc(&args.out_f32[0], GM * GN * 4));
    CK(cudaMalloc(&args.out_f32[1], mode == kFwd1 || args.layer ? GM * GN * 4 : 4));  // fwd1 and layer: u
    CK(cudaMalloc(&args.out_f32[2], 4));  // unused since the layer keeps g (seventeenth session)
    // cuBLAS writes 2N columns for fwd1; the layer epilogue of bwd1 writes two bf16 arrays
    CK(cudaMalloc(&args.out_bf16, GM * GN * (mode == kFwd1 || args.layer ? 4 : 2)));
    if (args.layer)  // random fp32 g and u (pairs of random halves: finite, about [-1, 1])
      for (int q = 0; q < 2; ++q) {
        fill_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t*>(args.out_f32[q]), GM * GN * 2, 31 + q);
        CK(cudaGetLastError());
      }
    auto launch_variant = [&](int variant) {
      switch (mode) {
        case kFwd1: launch_mode<kFwd1>(args, prop.multiProcessorCount, smem, variant); break;
        case kFwd2: launch_mode<kFwd2>(args, prop.multiProcessorCount, smem, variant); break;
        case kBwd1: launch_mode<kBwd1>(args, prop.multiProcessorCount, smem, variant); break;
        default: launch_mode<kWgrad>(args, prop.multiProcessorCount, smem, variant); break;
      }
    };
    auto launch = [&] { launch_variant(0); };
    auto launch_ws = [&] { launch_variant(1); };
    auto launch_rows = [&] { launch_variant(2); };
    for (auto* f : {engine_kernel<kFwd1, false>, engine_kernel<kFwd2, false>, engine_kernel<kBwd1, false>,
                    engine_kernel<kWgrad, false>, engine_kernel<kFwd1, true>, engine_kernel<kFwd2, true>,
                    engine_kernel<kBwd1, true>, engine_kernel<kWgrad, true>, ws_kernel<kFwd1>, ws_kernel<kFwd2>,
                    ws_kernel<kBwd1>, ws_kernel<kWgrad>, engine_kernel<kWgrad, true, true>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    for (auto* f : {mc_kernel<kFwd2>, mc_kernel<kBwd1>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    for (auto* f : {pp_mc_kernel<kFwd2>, pp_mc_kernel<kBwd1>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kPpSmem)));
    for (auto* f : {pp_kernel<kFwd1>, pp_kernel<kFwd2>, pp_kernel<kBwd1>, pp_kernel<kWgrad>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kPpSmem)));
    for (auto* f : {ws_store_kernel<kFwd2, false>, ws_store_kernel<kBwd1, false>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWsStoreSmem<false>)));
    for (auto* f : {ws_store_kernel<kFwd2, true>, ws_store_kernel<kBwd1, true>})
      CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWsStoreSmem<true>)));
    // Every variant must store the same bits (same chain order, same epilogue math); checked with
    // the stores on, over everything the mode writes: fwd1 g, u (fp32) and act
    // (bf16); wgrad fp32; fwd2 and bwd1 bf16; bwd1 with the layer's epilogue d_gate and d_up (bf16,
    // one array after the other; the warp-specialised variant has no such epilogue: n/a).
    std::vector<std::pair<void*, int64_t>> written;
    if (mode == kFwd1) {
      for (float* f : {args.out_f32[0], args.out_f32[1]}) written.emplace_back(f, GM * GN * 4);
      written.emplace_back(args.out_bf16, GM * GN * 2);
    } else if (mode == kWgrad) {
      written.emplace_back(args.out_f32[0], GM * GN * 4);
    } else {
      written.emplace_back(args.out_bf16, GM * GN * 2 * (args.layer ? 2 : 1));
    }
    // The bytes a launch leaves there, from zeroed memory.
    auto output_of = [&](auto run) {
      std::vector<unsigned char> v;
      for (auto [p, bytes] : written) CK(cudaMemset(p, 0, bytes));
      run();
      CK(cudaGetLastError());
      for (auto [p, bytes] : written) {
        const size_t at = v.size();
        v.resize(at + bytes);
        CK(cudaMemcpy(v.data() + at, p, bytes, cudaMemcpyDeviceToHost));
      }
      return v;
    };
    const bool keep = args.store;
    const int keep_stores = args.fwd1_stores;
    args.store = true;
    args.fwd1_stores = 3;  // the check compares every array the layer writes
    const std::vector<unsigned char> ref = output_of(launch);
    const bool same = !args.layer && output_of(launch_ws) == ref;
    const bool rows_same = output_of(launch_rows) == ref;
    const bool bulk_same = mode == kWgrad && output_of([&] { launch_variant(3); }) == ref;
    const bool storer = (mode == kFwd2 || mode == kBwd1) && !args.layer;  // the storing-warpgroup variant's cases
    const bool storer_same = storer && output_of([&] { launch_variant(4); }) == ref;
    const bool half_same = storer && output_of([&] { launch_variant(5); }) == ref;
    const bool pp_same = !args.layer && output_of([&] { launch_variant(6); }) == ref;
    const bool mc = storer && GM % 256 == 0;  // the multicast variant's cases
    const bool mc_same = mc && output_of([&] { launch_variant(7); }) == ref;
    const bool pp_mc_same = mc && output_of([&] { launch_variant(8); }) == ref;
    args.store = keep;
    args.fwd1_stores = keep_stores;
    const double ms = time_ms(launch, warmup, reps);
    const double ws_ms = time_ms(launch_ws, warmup, reps);
    const double rows_ms = time_ms(launch_rows, warmup, reps);
    // The bulk variant always stores (its epilogue has no `none`).
    const double bulk_ms = mode == kWgrad ? time_ms([&] { launch_variant(3); }, warmup, reps) : 0.0;
    // The storing-warpgroup variant always stores too.
    const double storer_ms = storer ? time_ms([&] { launch_variant(4); }, warmup, reps) : 0.0;
    const double half_ms = storer ? time_ms([&] { launch_variant(5); }, warmup, reps) : 0.0;
    // Ping-pong has the fragment epilogues only (not the layer's bwd1 epilogue).
    const double pp_ms = !args.layer ? time_ms([&] { launch_variant(6); }, warmup, reps) : 0.0;
    const double mc_ms = mc ? time_ms([&] { launch_variant(7); }, warmup, reps) : 0.0;
    const double pp_mc_ms = mc ? time_ms([&] { launch_variant(8); }, warmup, reps) : 0.0;
    const double flops = 2.0 * GM * GN * GK * (mode == kFwd1 ? 2 : 1);
    // cuBLAS on the same product (column-major view: C^T [GN, GM] = B^T A^T); for fwd1 one GEMM
    // with 2N columns (gate and up stacked).
    const int64_t cn = mode == kFwd1 ? 2 * GN : GN;
    uint16_t* Bc = alloc_bf16(cn * GK, 21);
    uint16_t* Ac = alloc_bf16(GM * GK, 22);
    const float one = 1, zero = 0;
    const double cms = time_ms(
        [&] {
          CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cn), static_cast<int>(GM),
                           static_cast<int>(GK), &one, Bc, CUDA_R_16BF, static_cast<int>(GK), Ac, CUDA_R_16BF,
                           static_cast<int>(GK), &zero, args.out_bf16, CUDA_R_16BF, static_cast<int>(cn),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        warmup, reps);
    auto tf = [&](double t) { return flops / (t * 1e-3) / 1e12; };
    std::printf("%-6s %7lld %7lld %7lld %10.3f %9.1f %6.1f%% %8.3f %9.1f %6.1f%% %8.3f %9.1f %6.1f%% %10.3f %9.1f %-7s %s\n",
                name, static_cast<long long>(GM), static_cast<long long>(cn), static_cast<long long>(GK), ms, tf(ms),
                100.0 * tf(ms) / peak, ws_ms, tf(ws_ms), 100.0 * tf(ws_ms) / peak, rows_ms, tf(rows_ms),
                100.0 * tf(rows_ms) / peak, cms, tf(cms), args.layer ? "n/a" : same ? "same" : "DIFFER",
                rows_same ? "same" : "DIFFER");
    if (mode == kWgrad)
      std::printf("%-6s bulk row copies (the layer's weight-gradient epilogue, always storing): %.3f ms, %.1f TFLOP/s, "
                  "%.1f%% peak, bits %s\n",
                  name, bulk_ms, tf(bulk_ms), 100.0 * tf(bulk_ms) / peak, bulk_same ? "same" : "DIFFER");
    if (storer)
      std::printf("%-6s storing warpgroup (3-stage ring, bf16 staging tile, warps 1-3 of the loader's warpgroup store "
                  "it while the consumers go on; always storing): %.3f ms, %.1f TFLOP/s, %.1f%% peak, bits %s\n",
                  name, storer_ms, tf(storer_ms), 100.0 * tf(storer_ms) / peak, storer_same ? "same" : "DIFFER");
    if (storer)
      std::printf("%-6s storing warpgroup, 4-stage ring, one 64-row staging area the two consumers fill in turn: "
                  "%.3f ms, %.1f TFLOP/s, %.1f%% peak, bits %s\n",
                  name, half_ms, tf(half_ms), 100.0 * tf(half_ms) / peak, half_same ? "same" : "DIFFER");
    if (!args.layer)
      std::printf("%-6s ping-pong (two consumer warpgroups on alternate 64-row half-tiles, fragment stores; one "
                  "overlaps its epilogue with the other's main loop): %.3f ms, %.1f TFLOP/s, %.1f%% peak, bits %s\n",
                  name, pp_ms, tf(pp_ms), 100.0 * tf(pp_ms) / peak, pp_same ? "same" : "DIFFER");
    if (mc)
      std::printf("%-6s clusters of two sharing B by TMA multicast (warp-specialised, fragment stores): %.3f ms, "
                  "%.1f TFLOP/s, %.1f%% peak, bits %s\n",
                  name, mc_ms, tf(mc_ms), 100.0 * tf(mc_ms) / peak, mc_same ? "same" : "DIFFER");
    if (mc)
      std::printf("%-6s ping-pong in clusters of two sharing B by TMA multicast (fragment stores): %.3f ms, "
                  "%.1f TFLOP/s, %.1f%% peak, bits %s\n",
                  name, pp_mc_ms, tf(pp_mc_ms), 100.0 * tf(pp_mc_ms) / peak, pp_mc_same ? "same" : "DIFFER");
    std::fflush(stdout);
    for (void* p : {static_cast<void*>(A), static_cast<void*>(B), static_cast<void*>(Ac), static_cast<void*>(Bc),
                    static_cast<void*>(maps), static_cast<void*>(args.out_f32[0]), static_cast<void*>(args.out_f32[1]), static_cast<void*>(args.out_f32[2]),
                    static_cast<void*>(args.out_bf16)})
      CK(cudaFree(p));
    if (B2 != B) CK(cudaFree(B2));
  }
  cublasDestroy(h);
  return 0;
}
