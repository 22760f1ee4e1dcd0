// Tensor-core tile engine: a block computes a [64 x 64] fp32 tile as one mma.sync chain per element.
#pragma once

#include "mok/kernel/params.hpp"
#include "mok/spec/config.hpp"

#include <cstdint>

namespace mok::kernel::device {

// Block shape of every GEMM in the kernel: 4 warps (one warpgroup), each owning 16 rows x 64
// columns of the tile. ORDER: dot-chain: K advances 16 at a time in increasing order, one MMA
// step per 16 K-elements: wgmma.m64n64k16 on sm_90a, 8 x mma.sync.m16n8k16 elsewhere; both
// round exactly like spec::mma_bf16_step (the probes check it), so neither the path nor the
// tile's shape changes an element's chain.
constexpr int kThreads = 128;
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kStepK = spec::kMmaK;
static_assert(kTileM == 16 * (kThreads / 32), "one m16 slab per warp");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOK_WGMMA 1  // sm_90a: the tile's MMA is one wgmma.m64n64k16 per K step
#endif

// The TMA pipeline (sm_90a): kStages buffers of kChunkK K-elements for A and B, each filled by
// kChunkK / 8 boxes of 64 rows x 16 bytes, completing on that stage's mbarrier.
constexpr int kStages = 4;
constexpr int kChunkK = 64;

// Shared memory of one block. Operands sit in wgmma's no-swizzle canonical layout: 8x8 core
// matrices of 128 contiguous bytes. Filled by threads (16 K-elements): core (row/8, k/8) at
// byte (row/8)*256 + (k/8)*128 (LBO 128, SBO 256). Filled by TMA: each 8-wide K column is a
// box of 64 16-byte rows, so core (row/8, k/8) is at byte (k/8)*1024 + (row/8)*128 (LBO 1024,
// SBO 128).
struct TileSmemWgmma {
  alignas(1024) uint16_t a[kStages][kTileM * kChunkK];
  alignas(1024) uint16_t b[kStages][kTileN * kChunkK];  // B^T: row = n
  alignas(8) uint64_t full[kStages];
};

// mma.sync path: one 16-wide K step, rows padded by 8 bf16 against bank conflicts.
struct TileSmemMma {
  uint16_t a[kTileM][kStepK + 8];
  uint16_t b[kTileN][kStepK + 8];  // stored [n][k]: the col-major B fragment reads rows of it
};

#if defined(MOK_WGMMA)
using TileSmem = TileSmemWgmma;
#else
using TileSmem = TileSmemMma;
#endif

// Dynamic shared memory a launch needs on a device of this compute capability.
constexpr size_t smem_bytes_for(int cc_major) {
  return cc_major == 9 ? sizeof(TileSmemWgmma) : sizeof(TileSmemMma);
}

#if defined(MOK_WGMMA)
__device__ __forceinline__ int core_offset(int row, int k) {
  return (row >> 3) * 128 + (k >> 3) * 64 + (row & 7) * 8 + (k & 7);
}

__device__ __forceinline__ uint64_t smem_descriptor(const void* p, uint64_t lbo = 128, uint64_t sbo = 256) {
  const uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(p));
  return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Loads the 8 x 64 box at (col, row) of a 2D bf16 tensor map into shared memory, completing
// on the mbarrier (out-of-range elements read as zero).
__device__ __forceinline__ void tma_load_box(void* dst, const TensorMapBytes& map, int32_t col, int32_t row,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      :
      : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(&map)), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
}

// acc[j][0..3] is the m16n8 fragment of columns 8j..8j+7 of this warp's 16 rows, which is
// exactly wgmma's accumulator layout for m64n64 (4 registers per 8 columns).
__device__ __forceinline__ void wgmma_issue_m64n64k16_bf16(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  wgmma_issue_m64n64k16_bf16(d, desc_a, desc_b);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
#endif

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The m16n8 accumulator fragments of this thread: acc[j] covers columns 8j..8j+7 of the warp's
// 16 rows; element e of acc[j] is row g (+8 for e >= 2), column 8j + 2c + (e & 1).
template <class Init>
__device__ __forceinline__ void init_accumulators(float (&acc)[8][4], int64_t M, int64_t N, int64_t m0, int64_t n0,
                                                  Init init) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = m0 + warp * 16 + g + (e >= 2 ? 8 : 0), col = n0 + j * 8 + 2 * c + (e & 1);
      acc[j][e] = row < M && col < N ? init(row, col) : 0.0f;
    }
}

template <class Epilogue>
__device__ __forceinline__ void store_accumulators(const float (&acc)[8][4], int64_t M, int64_t N, int64_t m0,
                                                   int64_t n0, Epilogue epilogue) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = m0 + warp * 16 + g + (e >= 2 ? 8 : 0), col = n0 + j * 8 + 2 * c + (e & 1);
      if (row < M && col < N) epilogue(row, col, acc[j][e]);
    }
}

// Computes C[m0:m0+64, n0:n0+64] = init(m, n) + sum_k A(m, k) * B(k, n) over k in [0, K) with
// the accessors load_a(m, k) and load_b(k, n) returning bf16 bits (0 outside the problem), then
// calls epilogue(m, n, value) for every m < M, n < N. `init(m, n)` gives the chain's starting
// value (0 for a fresh dot product). All threads of the block must call it.
template <class Init, class LoadA, class LoadB, class Epilogue>
__device__ void gemm_tile(TileSmem& smem, int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0,
                          Init init, LoadA load_a, LoadB load_b, Epilogue epilogue) {
  float acc[8][4];
  init_accumulators(acc, M, N, m0, n0, init);
  // ORDER: dot-chain, one MMA step per 16 K-elements, increasing k.
  for (int64_t k0 = 0; k0 < K; k0 += kStepK) {
    __syncthreads();
#if defined(MOK_WGMMA)
    for (int idx = threadIdx.x; idx < kTileM * kStepK; idx += kThreads) {
      const int r = idx / kStepK, kk = idx % kStepK;
      const int64_t m = m0 + r, k = k0 + kk, n = n0 + r;
      smem.a[0][core_offset(r, kk)] = (m < M && k < K) ? load_a(m, k) : uint16_t{0};
      smem.b[0][core_offset(r, kk)] = (n < N && k < K) ? load_b(k, n) : uint16_t{0};
    }
    // Ordinary stores that the tensor cores read next need the async-proxy fence.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    wgmma_m64n64k16_bf16(acc, smem_descriptor(smem.a[0]), smem_descriptor(smem.b[0]));
#else
    for (int idx = threadIdx.x; idx < kTileM * kStepK; idx += kThreads) {
      const int r = idx / kStepK, kk = idx % kStepK;
      const int64_t m = m0 + r, k = k0 + kk, n = n0 + r;
      smem.a[r][kk] = (m < M && k < K) ? load_a(m, k) : uint16_t{0};
      smem.b[r][kk] = (n < N && k < K) ? load_b(k, n) : uint16_t{0};
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
    const int ar = warp * 16 + g;
    uint32_t a[4];
    a[0] = pack2(smem.a[ar][2 * c], smem.a[ar][2 * c + 1]);
    a[1] = pack2(smem.a[ar + 8][2 * c], smem.a[ar + 8][2 * c + 1]);
    a[2] = pack2(smem.a[ar][2 * c + 8], smem.a[ar][2 * c + 9]);
    a[3] = pack2(smem.a[ar + 8][2 * c + 8], smem.a[ar + 8][2 * c + 9]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int bn = j * 8 + g;
      uint32_t b[2];
      b[0] = pack2(smem.b[bn][2 * c], smem.b[bn][2 * c + 1]);
      b[1] = pack2(smem.b[bn][2 * c + 8], smem.b[bn][2 * c + 9]);
      mma_m16n8k16_bf16(acc[j], a, b);
    }
#endif
  }
  store_accumulators(acc, M, N, m0, n0, epilogue);
}

// The same tile as gemm_tile for K-major operands held in tensor maps: A(m, k) is element
// (a_row0 + m, k) of a_map and B(k, n) is element (b_row0 + n, k) of b_map. On sm_90a the
// tiles arrive by TMA; elsewhere a_ptr/b_ptr (the same tensors, row-major with leading
// dimensions lda/ldb, already offset to a_row0/b_row0) feed the thread-filled path. Rows past
// M or N read neighbouring rows (or zeros past the tensor) and are never stored.
template <class Init, class Epilogue>
__device__ void gemm_tile_kmajor(TileSmem& smem, int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0, Init init,
                                 const TensorMapBytes& a_map, int64_t a_row0, const uint16_t* a_ptr, int64_t lda,
                                 const TensorMapBytes& b_map, int64_t b_row0, const uint16_t* b_ptr, int64_t ldb,
                                 bool use_tma, Epilogue epilogue) {
#if defined(MOK_WGMMA)
  if (use_tma) {
    float acc[8][4];
    init_accumulators(acc, M, N, m0, n0, init);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int st = 0; st < kStages; ++st)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&smem.full[st])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int64_t num_chunks = (K + kChunkK - 1) / kChunkK;
    // One thread fills stage `chunk % kStages` with chunk `chunk` (boxes past K read zeros).
    auto load_chunk = [&](int64_t chunk) {
      const int st = static_cast<int>(chunk % kStages);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&smem.full[st])),
                   "r"(2 * kTileM * kChunkK * 2)
                   : "memory");
      for (int col = 0; col < kChunkK / 8; ++col) {
        const int32_t k = static_cast<int32_t>(chunk * kChunkK + 8 * col);
        tma_load_box(smem.a[st] + col * 512, a_map, k, static_cast<int32_t>(a_row0 + m0), &smem.full[st]);
        tma_load_box(smem.b[st] + col * 512, b_map, k, static_cast<int32_t>(b_row0 + n0), &smem.full[st]);
      }
    };
    if (threadIdx.x == 0)
      for (int64_t chunk = 0; chunk < kStages - 1 && chunk < num_chunks; ++chunk) load_chunk(chunk);
    // ORDER: dot-chain: chunks in increasing k, and inside a chunk one wgmma per 16 K-elements
    // in increasing k, all on the same accumulators (wgmma executes them in issue order).
    for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
      // The stage refilled here was consumed in the previous iteration (ended by a barrier).
      if (threadIdx.x == 0 && chunk + kStages - 1 < num_chunks) load_chunk(chunk + kStages - 1);
      const int st = static_cast<int>(chunk % kStages);
      mbar_wait(&smem.full[st], static_cast<uint32_t>((chunk / kStages) & 1));
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int j = 0; j < kChunkK / kStepK; ++j) {
        if (chunk * kChunkK + j * kStepK >= K) break;  // no extra steps past K
        wgmma_issue_m64n64k16_bf16(acc, smem_descriptor(smem.a[st] + 2 * j * 512, 1024, 128),
                                   smem_descriptor(smem.b[st] + 2 * j * 512, 1024, 128));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      __syncthreads();
    }
    if (threadIdx.x == 0)  // every phase has completed: retire the barriers before the memory is reused
      for (int st = 0; st < kStages; ++st)
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&smem.full[st])) : "memory");
    store_accumulators(acc, M, N, m0, n0, epilogue);
    return;
  }
#else
  (void)a_map;
  (void)b_map;
  (void)a_row0;
  (void)b_row0;
  (void)use_tma;
#endif
  gemm_tile(smem, M, N, K, m0, n0, init, [&](int64_t m, int64_t k) { return a_ptr[m * lda + k]; },
            [&](int64_t k, int64_t n) { return b_ptr[n * ldb + k]; }, epilogue);
}

}  // namespace mok::kernel::device
