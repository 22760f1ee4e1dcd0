// Tensor-core tile engines. A block (two warpgroups) computes one [128 x N] fp32 tile of a GEMM
// as one MMA chain per output element; two engines share the chain and differ in how operands
// reach shared memory:
//  - gemm_fast (sm_90a): 128 x 128 tiles, operands by TMA with 128-byte swizzle in a 4- or 6-stage
//    mbarrier pipeline, K-major or MN-major (transposed) operands read directly by wgmma, an
//    optional second B operand sharing A (gate and up in one pass);
//  - gemm_slow (any GPU): 128 x 64 tiles filled element by element by threads through accessor
//    functions; wgmma.m64n64k16 on sm_90a, mma.sync.m16n8k16 elsewhere.
// ORDER: dot-chain: K advances 16 at a time in increasing order, one MMA step per 16 K-elements
// (the fast engine may add all-zero steps past K, which change no accumulator); every path
// rounds exactly like spec::mma_bf16_step (the probes check it), so neither the engine nor the
// tile shape changes an element's chain.
#pragma once

#include "mok/kernel/params.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/spec/config.hpp"
#include "mok/spec/orders.hpp"

#include <cstdint>
#include <type_traits>

namespace mok::kernel::device {

constexpr int kThreads = 256;        // two warpgroups
constexpr int kWarps = kThreads / 32;
constexpr int kTileM = 128;          // rows of every tile: 64 per warpgroup, 16 per warp
constexpr int kTileNSlow = 64;
constexpr int kTileNFast = 128;      // fast engine with two B operands (gate and up)
constexpr int kTileNWide = 256;      // fast engine with one B operand
constexpr int kStepK = spec::kMmaK;
static_assert(kTileM == 16 * kWarps, "one m16 slab per warp");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOK_WGMMA 1  // sm_90a: wgmma (and TMA for the fast engine)
#endif

// ---- fast engine geometry: a 64 x 64 bf16 TMA box is 8 KiB (64 rows of 128 swizzled bytes);
// a 128-wide operand tile of one 64-wide K chunk is two boxes.
constexpr int kChunkK = 64;
constexpr int kBoxBytes = 64 * 64 * 2;
constexpr int kOperandBytes = 2 * kBoxBytes;
constexpr int kRingBytes = 12 * kOperandBytes;  // 192 KiB of stages
// A stage holds one chunk of A (128 rows), B (kBN rows) and, with kDual, B2 (128 rows), in
// 16 KiB units: 3 units (4 stages) for 128 + 128 + 128 or 128 + 256, 2 units (6 stages) for
// 128 + 128; 144-160 KiB of loads run ahead of the chunk in use.
template <bool kDual, int kBN>
constexpr int kUnitsPerStage = 1 + kBN / 128 + (kDual ? 1 : 0);
constexpr int kMaxStages = 6;

// The ring's 1024-byte alignment leaves 976 bytes after the barriers: 16 for the engine's
// profile (GemmLaps), and `layer_scratch`, which the engine never touches, where the backward
// keeps its row-tile table (moe.cuh, above row_tile_at). Growing FastSmem, or a block's static
// shared memory, past 196 KiB in all moves the SM to the 228 KiB carve-out and shrinks L1 from 60
// to 28 KiB, which made the backward 1-5% slower on the H200 (kernel/notes/bench_v8_run_o.txt).
inline constexpr int kLayerScratchInts = 238;
struct FastSmem {
  alignas(1024) uint8_t ring[kRingBytes];
  alignas(8) uint64_t full[kMaxStages];
  int32_t layer_scratch[kLayerScratchInts];
  uint64_t* laps;      // GemmLaps (below): the current call's sums, or null; thread 0 only
  uint64_t lap_since;  // ... and the time its current lap began
};
static_assert(sizeof(FastSmem) == kRingBytes + 1024, "the scratch table fits in the alignment padding");

// Slow engine buffers. wgmma reads the no-swizzle canonical layout (8x8 core matrices of 128
// contiguous bytes: core (row/8, k/8) at element (row/8)*128 + (k/8)*64; LBO 128, SBO 256);
// mma.sync reads padded row-major tiles.
struct SlowSmemWgmma {
  alignas(128) uint16_t a[kTileM * kStepK];
  alignas(128) uint16_t b[kTileNSlow * kStepK];
};
struct SlowSmemMma {
  uint16_t a[kTileM][kStepK + 8];
  uint16_t b[kTileNSlow][kStepK + 8];  // stored [n][k]: the col-major B fragment reads rows of it
};
#if defined(MOK_WGMMA)
using SlowSmem = SlowSmemWgmma;
#else
using SlowSmem = SlowSmemMma;
#endif

// Dynamic shared memory a launch needs (the fast engine only runs on sm_90a).
constexpr size_t smem_bytes_for(int cc_major, bool fast) {
  return fast && cc_major == 9 ? sizeof(FastSmem) + 1024 : (sizeof(SlowSmemMma) > sizeof(SlowSmemWgmma)
                                                                 ? sizeof(SlowSmemMma)
                                                                 : sizeof(SlowSmemWgmma)) + 1024;
}

// The block's dynamic shared memory, 1024-byte aligned (128-byte swizzle atoms need it).
// The first 1024-byte boundary at or after raw, as raw plus an offset: pointer arithmetic on the
// __shared__ array keeps its address space visible to the compiler, so accesses through the
// result compile to shared-memory instructions (LDS / STS). Rounding the address as an integer
// (as before) hid it: every access through the ring became a generic LD / ST.
__device__ __forceinline__ uint8_t* aligned_smem(unsigned char* raw) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
  return raw + (((a + 1023) & ~uintptr_t{1023}) - a);  // the same address as rounding a itself
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Fragment coordinates shared by every path: warp w owns rows 16w..16w+15 of the tile; element
// e of acc[j] is row g (+8 for e >= 2), column 8j + 2c + (e & 1). This is mma.sync's m16n8
// layout and wgmma's accumulator layout (warp w % 4 of warpgroup w / 4).
template <int NJ>
__device__ __forceinline__ void zero_accumulators(float (&acc)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
}

template <int NJ, class Epilogue>
__device__ __forceinline__ void store_accumulators(const float (&acc)[NJ][4], int64_t M, int64_t N, int64_t m0,
                                                   int64_t n0, Epilogue epilogue) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = m0 + warp * 16 + g + (e >= 2 ? 8 : 0), col = n0 + j * 8 + 2 * c + (e & 1);
      if (row < M && col < N) epilogue(row, col, acc[j][e]);
    }
}

template <int NJ>
__device__ __forceinline__ void fence_accumulators(float (&acc)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[j][e])::"memory");
}

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

#if defined(MOK_WGMMA)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint64_t desc_noswizzle(const void* p) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{128 >> 4} << 16) | (uint64_t{256 >> 4} << 32);
}

// 128-byte swizzle descriptors (layout type 1 in bits 62-63). K-major: 8-row atoms of 128-byte
// rows, SBO 1024 (LBO unused). MN-major: atoms of 64 MN elements x 8 K rows, K atoms 1024 bytes
// apart (SBO), 64-element MN blocks one TMA box (8 KiB) apart (LBO).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, bool mn_major) {
  const uint64_t lbo = mn_major ? kBoxBytes : 16;
  return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ int core_offset(int row, int k) {
  return (row >> 3) * 128 + (k >> 3) * 64 + (row & 7) * 8 + (k & 7);
}

#define MOK_ACC8(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define MOK_ACC32(d, j) MOK_ACC8(d, j), MOK_ACC8(d, j + 1), MOK_ACC8(d, j + 2), MOK_ACC8(d, j + 3)
#define MOK_ACC128(d, j) MOK_ACC32(d, j), MOK_ACC32(d, j + 4), MOK_ACC32(d, j + 8), MOK_ACC32(d, j + 12)

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : MOK_ACC32(d, 0), MOK_ACC32(d, 4)
      : "l"(da), "l"(db)
      : "memory");
}

// One wgmma.m64n128k16 with the transpose immediates TA (A MN-major) and TB (B MN-major).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, %66, %67;\n"
      : MOK_ACC32(d, 0), MOK_ACC32(d, 4), MOK_ACC32(d, 8), MOK_ACC32(d, 12)
      : "l"(da), "l"(db), "n"(TA), "n"(TB)
      : "memory");
}

// One wgmma.m64n256k16 (B MN-major when TB; A always K-major or MN-major per TA).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[32][4], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
      "%128, %129, 1, 1, 1, %130, %131;\n"
      : MOK_ACC128(d, 0), MOK_ACC128(d, 16)
      : "l"(da), "l"(db), "n"(TA), "n"(TB)
      : "memory");
}

template <int TA, int TB, int NJ>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[NJ][4], uint64_t da, uint64_t db) {
  if constexpr (NJ == 16)
    wgmma_m64n128k16<TA, TB>(d, da, db);
  else
    wgmma_m64n256k16<TA, TB>(d, da, db);
}

// Loads the box at (col, row) of a 2D bf16 tensor map (64 columns, the map's box height) into
// shared memory, completing on the mbarrier (elements outside the tensor read as zero).
__device__ __forceinline__ void tma_load_box(void* dst, const TensorMapBytes* map, int32_t col, int32_t row,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      :
      : "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
}

// The tensor maps live in global memory (LaunchParams::maps), rewritten by the host before a
// launch when they changed: thread 0, which issues every TMA copy of its block, acquires each for the tensormap
// proxy before first use.
__device__ __forceinline__ void acquire_tensor_maps(const TensorMapBytes* maps, int count) {
  if (threadIdx.x == 0)
    for (int i = 0; i < count; ++i)
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(
                       reinterpret_cast<uint64_t>(maps + i))
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
#endif

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---------------------------------------------------------------------------------------------
// Slow engine: C[m0:m0+128, n0:n0+64] = sum_k A(m, k) * B(k, n) over k in [0, K) with the
// accessors load_a(m, k) and load_b(k, n) returning bf16 bits (called only inside the problem),
// then epilogue(m, n, value) for every m < M, n < N. All threads of the block must call it.
template <class LoadA, class LoadB, class Epilogue>
__device__ void gemm_slow(uint8_t* smem_raw, int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0, LoadA load_a,
                          LoadB load_b, Epilogue epilogue) {
  SlowSmem& smem = *reinterpret_cast<SlowSmem*>(smem_raw);
  float acc[8][4];
  zero_accumulators(acc);
  // ORDER: dot-chain, one MMA step per 16 K-elements, increasing k.
  for (int64_t k0 = 0; k0 < K; k0 += kStepK) {
    __syncthreads();
#if defined(MOK_WGMMA)
    for (int idx = threadIdx.x; idx < kTileM * kStepK; idx += kThreads) {
      const int r = idx / kStepK, kk = idx % kStepK;
      const int64_t m = m0 + r, k = k0 + kk, n = n0 + r;
      smem.a[core_offset(r, kk)] = (m < M && k < K) ? load_a(m, k) : uint16_t{0};
      if (r < kTileNSlow) smem.b[core_offset(r, kk)] = (n < N && k < K) ? load_b(k, n) : uint16_t{0};
    }
    // Ordinary stores that the tensor cores read next need the async-proxy fence.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    wgmma_fence();
    wgmma_m64n64k16(acc, desc_noswizzle(smem.a + wg * 64 * kStepK), desc_noswizzle(smem.b));
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
#else
    for (int idx = threadIdx.x; idx < kTileM * kStepK; idx += kThreads) {
      const int r = idx / kStepK, kk = idx % kStepK;
      const int64_t m = m0 + r, k = k0 + kk, n = n0 + r;
      smem.a[r][kk] = (m < M && k < K) ? load_a(m, k) : uint16_t{0};
      if (r < kTileNSlow) smem.b[r][kk] = (n < N && k < K) ? load_b(k, n) : uint16_t{0};
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

// ---------------------------------------------------------------------------------------------
// Fast engine operands. A 128-wide tile of an operand over K, from up to two tensor maps: K in
// [0, split) from map[0], [split, K) from map[1] (split a multiple of kChunkK).
//  - K-major (A(m, k) at row m, column k): tile row i is map row base[s] + i, K column k - start.
//    box_rows: the maps' box height (64, or kKMajorBoxRows for the layer's K-major maps): a chunk
//    of a width-row tile is width / box_rows copies, box_rows * 128 bytes apart (the 128-byte
//    swizzle repeats every 8 rows, so the image does not depend on box_rows).
//  - MN-major (A(m, k) at row k, column m): tile element i is column mn0 + i of map row
//    base[s] + k - start, from 64 x 64 boxes. Rows at or past K are zeroed in shared memory (they
//    may belong to the next expert).
struct FastOperand {
  const TensorMapBytes* map[2];
  int64_t split;
  int32_t base[2];
  int32_t mn0;
  int32_t box_rows;  // K-major: 64 or 128; MN-major: 0
};

__device__ __forceinline__ FastOperand kmajor(const TensorMapBytes* map, int64_t row0, int box_rows = 64) {
  return FastOperand{{map, map}, int64_t{1} << 40, {static_cast<int32_t>(row0), static_cast<int32_t>(row0)}, 0,
                     box_rows};
}
__device__ __forceinline__ FastOperand kmajor2(const TensorMapBytes* m0, int64_t r0, const TensorMapBytes* m1,
                                               int64_t r1, int64_t split, int box_rows = 64) {
  return FastOperand{{m0, m1}, split, {static_cast<int32_t>(r0), static_cast<int32_t>(r1)}, 0, box_rows};
}
__device__ __forceinline__ FastOperand mnmajor(const TensorMapBytes* map, int64_t krow0, int64_t mn0) {
  return FastOperand{{map, map}, int64_t{1} << 40, {static_cast<int32_t>(krow0), static_cast<int32_t>(krow0)},
                     static_cast<int32_t>(mn0), 0};
}
__device__ __forceinline__ FastOperand mnmajor2(const TensorMapBytes* m0, int64_t r0, const TensorMapBytes* m1,
                                                int64_t r1, int64_t split, int64_t mn0) {
  return FastOperand{{m0, m1}, split, {static_cast<int32_t>(r0), static_cast<int32_t>(r1)}, static_cast<int32_t>(mn0),
                     0};
}

// A K-major A operand whose rows are read where they lie instead of from one tensor (the
// forward's routed rows straight from each token's x, LaunchParams::direct_rows): every thread
// of the block copies its share of each chunk with cp.async into the same 128-byte-swizzled image
// a 128-row TMA box makes, and the stage's barrier counts the copies' completion. Thread t copies
// 16-byte unit t % 8 of tile rows t / 8 + 32 q (q = 0..3), so eight lanes cover a row's 128 bytes
// and a warp instruction four whole rows (four 128-byte requests). table: 128 row addresses (K
// column 0) in shared memory, written before gemm_fast is called; a row past the tile's end may
// repeat any valid row, since A's row i reaches only C's row i, which the epilogue does not store
// (TMA loads whatever follows there too). K must be a multiple of kChunkK (the fast engine's H is).
// copy: null, or a second table in shared memory of 128 destination rows (null past the tile's
// end): each thread then also writes the units it copied to them, chunk by chunk, from shared
// memory while the chunk's wgmma runs (the forward's first column tile of a row tile keeps the
// gathered copy S.xd that the backward's weight gradients read).
struct RowsOperand {
  const uint16_t* const* table;
  uint16_t* const* copy;
};
template <class Op>
inline constexpr bool kIsRowsOperand = std::is_same_v<Op, RowsOperand>;

#if defined(MOK_WGMMA)
// This thread's first tile row r and 16-byte unit u of a RowsOperand, and that unit's place in the
// swizzled A image at `image`: rows r + 32 q share r's swizzle (r & 7), so the thread's other units
// sit 32 rows (4 KiB) apart.
struct RowsUnit {
  int r, u;
  uint32_t at;
};
__device__ __forceinline__ RowsUnit rows_unit(const uint8_t* image) {
  const int r = threadIdx.x >> 3, u = threadIdx.x & 7;
  return RowsUnit{r, u, smem_u32(image) + r * 128 + ((u ^ (r & 7)) << 4)};
}
// This thread's units of chunk `chunk` of a RowsOperand into the A image at dst, then an arrival on
// bar once they have landed (cp.async.mbarrier.arrive.noinc: the barrier counts one arrival per
// thread for these).
__device__ __forceinline__ void rows_load(uint8_t* dst, const RowsOperand& op, int64_t chunk, uint64_t* bar) {
  const RowsUnit w = rows_unit(dst);
#pragma unroll
  for (int q = 0; q < 4; ++q)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(w.at + q * 32 * 128),
                 "l"(op.table[w.r + 32 * q] + chunk * kChunkK + 8 * w.u)
                 : "memory");
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// The units rows_load copied for chunk `chunk` (landed: the stage's barrier has completed), from
// the A image at src to op.copy's rows.
__device__ __forceinline__ void rows_write_back(const uint8_t* src, const RowsOperand& op, int64_t chunk) {
  const RowsUnit w = rows_unit(src);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint16_t* dst = op.copy[w.r + 32 * q];
    if (dst == nullptr) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(w.at + q * 32 * 128));
    *reinterpret_cast<uint4*>(dst + chunk * kChunkK + 8 * w.u) = v;
  }
}

// One chunk of a `width`-wide operand tile: width / 64 MN-major boxes 8 KiB apart, or
// width / box_rows K-major boxes.
__device__ __forceinline__ void fast_load(uint8_t* dst, const FastOperand& op, int64_t k, uint64_t* bar, int width) {
  const int s = k >= op.split ? 1 : 0;
  const int32_t kk = static_cast<int32_t>(k - (s ? op.split : 0));
  if (op.box_rows == 0) {
    for (int b = 0; b < width / 64; ++b)
      tma_load_box(dst + b * kBoxBytes, op.map[s], op.mn0 + 64 * b, op.base[s] + kk, bar);
  } else {
    for (int r = 0; r < width; r += op.box_rows) tma_load_box(dst + r * 128, op.map[s], kk, op.base[s] + r, bar);
  }
}

// Zeroes K rows [from, 64) of an MN-major operand tile of `boxes` boxes in shared memory (whole
// 128-byte rows, so the swizzle does not matter).
__device__ __forceinline__ void zero_k_rows(uint8_t* tile, int from, int boxes) {
  const int words = (64 - from) * 128 / 16;  // uint4 per box
  for (int i = threadIdx.x; i < boxes * words; i += kThreads) {
    const int box = i / words, w = i % words;
    reinterpret_cast<uint4*>(tile + box * kBoxBytes + from * 128)[w] = make_uint4(0, 0, 0, 0);
  }
}

template <int TA, int TB, bool kDual, int NJ>
__device__ __forceinline__ void fast_chunk(float (&acc)[NJ][4], float (&acc2)[16][4], uint8_t* st, int steps) {
  const int wg = threadIdx.x / 128;
  const uint32_t a = smem_u32(st) + wg * kBoxBytes;  // this warpgroup's 64 rows of A
  const uint32_t b = smem_u32(st + kOperandBytes), b2 = smem_u32(st + 2 * kOperandBytes);  // B2 only with kDual
  const uint32_t a_step = TA ? 16 * 128 : 32, b_step = TB ? 16 * 128 : 32;
  // Every chunk runs all four steps (a branch around wgmma would make ptxas serialise every
  // wgmma of the kernel). In a partial last chunk the steps past K multiply rows zeroed in
  // shared memory; under the MMA model such a step returns every accumulator a chain can hold
  // unchanged (+0, finite, Inf, the canonical NaN); mma_model_test checks it.
  (void)steps;
#pragma unroll
  for (int j = 0; j < kChunkK / kStepK; ++j) {
    const uint64_t da = desc_sw128(a + j * a_step, TA != 0);
    wgmma_m64nNk16<TA, TB, NJ>(acc, da, desc_sw128(b + j * b_step, TB != 0));
    if constexpr (kDual) wgmma_m64n128k16<TA, TB>(acc2, da, desc_sw128(b2 + j * b_step, TB != 0));
  }
}
#endif

// An epilogue that reads memory (backward: the forward's g and u) can ask for it
// early: gemm_fast calls its prefetch() on every thread kPrefetchLead chunks before the main loop
// ends, so the reads hit L2 instead of DRAM (RowEpilogue's pre()).
inline constexpr int64_t kPrefetchLead = 12;

// Asks L2 to fetch `bytes` (a multiple of 16) at a 16-byte aligned global address (sm_90).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(p)), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// Row epilogues. The accumulator fragment gives a thread two rows and, per instruction, a warp
// eight rows of 32 (fp32) or 16 (bf16) bytes each: eight cache lines per store. A row epilogue
// instead receives the finished tile through shared memory (the idle ring), a warp per row and
// four adjacent columns per lane, so that a warp's store covers 256-512 contiguous bytes:
//  - key(i): one value per tile row (say, the address of the row's destination), computed once
//    per tile by thread i, after the GEMM's first block barrier, and passed to every store of
//    that row (moe.cuh's slot_row_epilogue counts rows in it, so once per row is a contract);
//  - store(i, key, j, v, valid) with v = c[i][j .. j+3] (and u = c2[i][j .. j+3] after v with
//    kDual), valid = how many of the four columns are inside the tile (1 .. 4);
//  - optionally pre(), gemm_fast's prefetch() hook (kPrefetchLead).
// Every value is the same fp32 accumulator as in the fragment path: only who stores changes.
struct NoPrefetch {
  __device__ __forceinline__ void operator()() const {}
};
template <class Key, class Store, class Pre = NoPrefetch>
struct RowEpilogue {
  static constexpr bool kRows = true;
  Key key;
  Store store;
  Pre pre;
  __device__ __forceinline__ void prefetch() const
    requires(!std::is_same_v<Pre, NoPrefetch>)
  {
    pre();
  }
};
template <class Key, class Store>
__device__ __forceinline__ RowEpilogue<Key, Store> by_rows(Key key, Store store) {
  return RowEpilogue<Key, Store>{key, store, NoPrefetch{}};
}
template <class Key, class Store, class Pre>
__device__ __forceinline__ RowEpilogue<Key, Store, Pre> by_rows(Key key, Store store, Pre pre) {
  return RowEpilogue<Key, Store, Pre>{key, store, pre};
}
template <class E>
inline constexpr bool kIsRowEpilogue = requires { E::kRows; };

// A row epilogue whose stores also read two fp32 arrays in global memory at the tile's own
// positions (the backward's phase 1: the forward's g and u): sources(i) gives row i's two
// pointers to the tile's first column, and store(i, key, j, v, a, b, valid) receives a = the
// first array's four values at columns j .. j+3 and b = the second's. gemm_fast copies those
// rows into shared memory beside the staged tile (cp.async, 16 bytes a lane, no registers held)
// kLoadedRowsDepth rows of a warp ahead of the row it stores, and issues a warp's first rows
// before it stages the accumulators, so that the reads are in flight behind the staging and
// the other rows' stores. The columns: every multiple of four below cols (the fast engine's
// widths are multiples of 64), so each row's pointers must be 16-byte aligned.
template <class Key, class Sources, class Store, class Pre = NoPrefetch>
struct LoadedRows {
  static constexpr bool kRows = true;
  static constexpr bool kLoadedRows = true;
  Key key;
  Sources sources;
  Store store;
  Pre pre;
  __device__ __forceinline__ void prefetch() const
    requires(!std::is_same_v<Pre, NoPrefetch>)
  {
    pre();
  }
};
struct RowSources {
  const float* a;
  const float* b;
};
template <class Key, class Sources, class Store, class Pre>
__device__ __forceinline__ LoadedRows<Key, Sources, Store, Pre> loaded_rows(Key key, Sources sources, Store store,
                                                                           Pre pre) {
  return LoadedRows<Key, Sources, Store, Pre>{key, sources, store, pre};
}
template <class E>
inline constexpr bool kIsLoadedRows = requires { E::kLoadedRows; };
inline constexpr int kLoadedRowsDepth = 3;
// A row epilogue with no per-row value.
struct NoKey {
  __device__ __forceinline__ int64_t operator()(int64_t) const { return 0; }
};

// A row epilogue whose tile may leave as bf16 (one B operand only): when `bf16` (the same on
// every thread), gemm_fast rounds the accumulators to bf16 (spec RNE: the bits store4_rne would
// store) as it stages them, half the shared-memory bytes of the fp32 staging, and calls
// store16(i, key, j, v, valid) with v = the eight bf16 values c[i][j .. j+7] (element q in bits
// 16 (q % 2) of word q / 2), valid = how many of them are inside the tile (1 .. 8): a warp's
// store covers a whole 512-byte row. Otherwise it behaves as a RowEpilogue with `store`.
// With an Early functor (mixed_rows_early): thread i < rows calls early(i) before the main loop,
// so that a key's global load (the layer's slot rows: the row's RowRef) is in flight behind the
// MMAs, and the epilogue calls key(i, value) with what early(i) returned instead of key(i).
struct NoEarly {};
template <class Key, class Store16, class Store, class Early = NoEarly>
struct MixedRows {
  static constexpr bool kRows = true;
  static constexpr bool kMixedRows = true;
  bool bf16;
  Key key;
  Store16 store16;
  Store store;
  Early early;
};
template <class Key, class Store16, class Store>
__device__ __forceinline__ MixedRows<Key, Store16, Store> mixed_rows(bool bf16, Key key, Store16 store16, Store store) {
  return MixedRows<Key, Store16, Store>{bf16, key, store16, store, NoEarly{}};
}
template <class Early, class Key, class Store16, class Store>
__device__ __forceinline__ MixedRows<Key, Store16, Store, Early> mixed_rows_early(bool bf16, Early early, Key key,
                                                                                   Store16 store16, Store store) {
  return MixedRows<Key, Store16, Store, Early>{bf16, key, store16, store, early};
}
template <class E>
inline constexpr bool kHasEarlyKeys = requires(E e) {
  E::kMixedRows;
  requires !std::is_same_v<decltype(e.early), NoEarly>;
};
template <class E>
inline constexpr bool kIsMixedRows = requires { E::kMixedRows; };

// Bulk row epilogues (sm_90): the tile is staged in the ring as for a row epilogue, then each
// tile row leaves shared memory as one asynchronous bulk copy (cp.async.bulk, done by the TMA
// unit) to dst(i), a float* to row i's first column in global memory. The block does not wait
// for the global writes: the next gemm_fast waits only until the copies have read the ring
// (bulk_wait_read on entry), and the caller waits for the writes (bulk_wait_all) before anything
// reads them. The bits are the staged fp32 accumulators, as with every other epilogue.
template <class Dst>
struct BulkRowsF32 {
  static constexpr bool kBulk = true;
  Dst dst;
};
template <class Dst>
__device__ __forceinline__ BulkRowsF32<Dst> bulk_rows_f32(Dst dst) {
  return BulkRowsF32<Dst>{dst};
}
template <class E>
inline constexpr bool kIsBulkEpilogue = requires { E::kBulk; };

// This thread's bulk copies, all but the newest kPending groups of them, have read their
// shared-memory sources / all of them have completed (their writes are visible to this thread).
// No-ops for a thread with none outstanding.
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// A pair epilogue with a fast form that holds only on a range of the first tile's values (the
// forward's SwiGLU: exp and the reciprocal without their range tests, spec::silu_normal_range).
// gemm_fast tests every value of c once with in_range(v), then runs fast(...) on the whole tile
// when all pass and general(...) otherwise (both with epilogue(i, j, ...)'s arguments). fast
// must give general's bits wherever in_range holds. Run on the whole tile, the fast form is
// straight-line code whose elements' chains the compiler can interleave; the general form's
// branches (one or more per element) leave it one chain at a time.
template <class Test, class Fast, class General>
struct RangedPairs {
  static constexpr bool kRanged = true;
  Test in_range;
  Fast fast;
  General general;
};
template <class Test, class Fast, class General>
__device__ __forceinline__ RangedPairs<Test, Fast, General> ranged_pairs(Test t, Fast f, General g) {
  return RangedPairs<Test, Fast, General>{t, f, g};
}
template <class E>
inline constexpr bool kIsRangedEpilogue = requires { E::kRanged; };

// The row form of a ranged epilogue: gemm_fast tests every value of c in the fragment with
// in_range(v) before it stages the tile, and when every thread's values pass, every row goes
// through fast (called as a RowEpilogue's store is), otherwise through general. The rows'
// stores then run with the accumulators dead, so the compiler has the registers to interleave
// the elements' chains.
template <class Key, class Test, class Fast, class General>
struct RangedRows {
  static constexpr bool kRows = true;
  static constexpr bool kRangedRows = true;
  Key key;
  Test in_range;
  Fast fast;
  General general;
};
template <class Key, class Test, class Fast, class General>
__device__ __forceinline__ RangedRows<Key, Test, Fast, General> ranged_rows(Key k, Test t, Fast f, General g) {
  return RangedRows<Key, Test, Fast, General>{k, t, f, g};
}
template <class E>
inline constexpr bool kIsRangedRows = requires { E::kRangedRows; };

// Row-epilogue staging in the ring: fp32 rows of 256 values (kDual: c at 0..127, c2 at 128..255)
// padded by 8 floats, so that a half-warp's float2 fragment stores hit 32 different banks; then
// the 128 row keys.
constexpr int kStageRowFloats = 256 + 8;
constexpr int kStageKeysOffset = kTileM * kStageRowFloats * 4;
static_assert(kStageKeysOffset + kTileM * 8 <= kRingBytes, "the staged tile and its keys fit in the ring");
// LoadedRows' copies: per warp, kLoadedRowsDepth rows of both arrays (256 floats each), after the
// staged tile's keys.
constexpr int kLoadedRowsOffset = kStageKeysOffset + kTileM * 8;
static_assert(kLoadedRowsOffset % 16 == 0 && kLoadedRowsOffset + kWarps * kLoadedRowsDepth * 2 * 256 * 4 <= kRingBytes,
              "the loaded rows fit in the ring beside the staged tile");
// The bf16 staging of MixedRows: rows of 256 values padded by 8 (528 bytes), so that a warp's
// 4-byte fragment stores (eight rows, four column pairs) hit 32 different banks; then the keys.
constexpr int kStageRowHalves = 256 + 8;
constexpr int kStageKeysOffset16 = kTileM * kStageRowHalves * 2;
static_assert(kStageKeysOffset16 % 8 == 0 && kStageKeysOffset16 + kTileM * 8 <= kRingBytes,
              "the bf16 staged tile and its keys fit in the ring");

// Stores four fp32 values (valid of them) at p: one 16-byte store when all four are valid and p is
// 16-byte aligned.
__device__ __forceinline__ void store4_f32(float* p, const float4& v, int valid) {
  if (valid == 4 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<float4*>(p) = v;
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int q = 0; q < valid; ++q) p[q] = e[q];
}
// Stores four bf16 bit patterns (valid of them) at p: one 8-byte store when possible.
__device__ __forceinline__ void store4_bf16(uint16_t* p, uint16_t b0, uint16_t b1, uint16_t b2, uint16_t b3,
                                            int valid) {
  if (valid == 4 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack2(b0, b1), pack2(b2, b3));
    return;
  }
  const uint16_t e[4] = {b0, b1, b2, b3};
  for (int q = 0; q < valid; ++q) p[q] = e[q];
}
// Four fp32 values rounded to bf16 (spec RNE) and stored as store4_bf16 does.
__device__ __forceinline__ void store4_rne(uint16_t* p, const float4& v, int valid) {
  store4_bf16(p, spec::bf16_from_f32_rne(v.x), spec::bf16_from_f32_rne(v.y), spec::bf16_from_f32_rne(v.z),
              spec::bf16_from_f32_rne(v.w), valid);
}
// The SwiGLU gradients of four columns, stored as store4_bf16 does: dg = rn(rn(da·u)·silu'(g)) and
// du = rn(da·silu(g)), silu(g) and silu'(g) derived from the forward's g with one range test for
// the four (spec::silu_and_grad_f32_n). The layer's backward phase 1 and mok-gemm-bench's model
// of it both call this.
__device__ __forceinline__ void store4_swiglu_grads(uint16_t* dg, uint16_t* du, const float4& da, const float4& g4,
                                                    const float4& u, int valid) {
  const float g[4] = {g4.x, g4.y, g4.z, g4.w};
  spec::SiluPair s[4];
  spec::silu_and_grad_f32_n(g, s);
  store4_bf16(dg, spec::swiglu_grad_gate_pre(da.x, u.x, s[0].grad), spec::swiglu_grad_gate_pre(da.y, u.y, s[1].grad),
              spec::swiglu_grad_gate_pre(da.z, u.z, s[2].grad), spec::swiglu_grad_gate_pre(da.w, u.w, s[3].grad),
              valid);
  store4_bf16(du, spec::swiglu_grad_up_pre(da.x, s[0].silu), spec::swiglu_grad_up_pre(da.y, s[1].silu),
              spec::swiglu_grad_up_pre(da.z, s[2].silu), spec::swiglu_grad_up_pre(da.w, s[3].silu), valid);
}
// Stores eight bf16 bit patterns packed in v (element q in bits 16 (q % 2) of word q / 2), valid of
// them, at p: one 16-byte store when all eight are valid and p is 16-byte aligned.
__device__ __forceinline__ void store8_bf16(uint16_t* p, const uint4& v, int valid) {
  if (valid == 8 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    *reinterpret_cast<uint4*>(p) = v;
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int q = 0; q < valid; ++q) p[q] = static_cast<uint16_t>(w[q / 2] >> (16 * (q % 2)));
}

// 16 bytes from global to shared memory without a register round trip (cp.async, sm_80 and
// later; a plain copy before that), and the wait for all of a thread's copies.
__device__ __forceinline__ void copy16_async(void* dst_smem, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst_smem)), "l"(src) : "memory");
#else
  *reinterpret_cast<uint4*>(dst_smem) = __ldcg(reinterpret_cast<const uint4*>(src));
#endif
}
__device__ __forceinline__ void copy16_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// Closes the thread's current group of copies; copy16_wait_all_but<N> waits for every group but
// the N most recent ones (copy16_wait_all_but_last: N = 1).
__device__ __forceinline__ void copy16_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copy16_wait_all_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void copy16_wait_all_but_last() { copy16_wait_all_but<1>(); }

// Optional profile of gemm_fast's calls (mok-bench --trace, in builds configured with
// -DMOK_GEMM_LAPS=ON; elsewhere every lap compiles to nothing): thread 0 adds to t[0] the time
// from entry past the entry barrier, to t[1] the time from there until it has issued the first
// chunks' loads, to t[2] the time from there until the first chunk's stage is full, to t[3] the
// main loop until every accumulator is final, to t[4] the epilogue. %globaltimer ticks are
// coarse (up to ~1 us on some parts), so only sums over many items mean anything. The pointer
// and the lap's start live in shared memory (FastSmem::laps, lap_since), not in registers across
// the main loop (a register more there made the forward spill), and the sums are added by
// fire-and-forget reductions (RED), so thread 0, the TMA issuer, never waits on a global load for
// the profile. Off by default because even a null pointer's test costs thread 0 a shared-memory
// load per lap, and the thirtieth session could not tell whether that costs time (A/B within the
// sittings' spread).
struct GemmLaps {
#if defined(MOK_GEMM_LAPS)
  FastSmem& smem;
  __device__ __forceinline__ static uint64_t now() {
    uint64_t v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
  }
  __device__ __forceinline__ GemmLaps(FastSmem& s, uint64_t* sums) : smem(s) {
    if (threadIdx.x == 0) {
      smem.laps = sums;
      if (sums != nullptr) smem.lap_since = now();
    }
  }
  __device__ __forceinline__ void lap(int k) {
    if (threadIdx.x != 0) return;
    uint64_t* t = smem.laps;
    if (t == nullptr) return;
    const uint64_t v = now();
    atomicAdd(reinterpret_cast<unsigned long long*>(t + k), static_cast<unsigned long long>(v - smem.lap_since));
    smem.lap_since = v;
  }
  __device__ __forceinline__ ~GemmLaps() { lap(4); }
#else
  __device__ __forceinline__ GemmLaps(FastSmem&, uint64_t*) {}
  __device__ __forceinline__ void lap(int) {}
#endif
  GemmLaps(const GemmLaps&) = delete;
  GemmLaps& operator=(const GemmLaps&) = delete;
};

// Fast engine: C[128 x kBN] = A[128 x K] * B[K x kBN] (and C2 = A * B2 when kDual, kBN = 128), then
// epilogue(i, j, c[i][j], c[i][j+1]) (or with c2's pair appended) for every even j < cols and
// i < rows, relative to the tile (cols must be even), or, for a RowEpilogue, its stores of four
// columns at a time (a MixedRows staged in bf16: eight) (above). TA / TB: A / B MN-major. All
// threads of the block must call it. laps: null, or kLapWords sums thread 0 adds to (GemmLaps).
// A is a FastOperand (TMA) or a RowsOperand (TA = 0: K-major rows copied by every thread).
template <int TA, int TB, bool kDual, int kBN, class OpA, class Epilogue>
__device__ void gemm_fast(uint8_t* smem_raw, int64_t K, int64_t rows, int64_t cols, const OpA& A,
                          const FastOperand& B, const FastOperand& B2, Epilogue epilogue, uint64_t* laps = nullptr) {
#if defined(MOK_WGMMA)
  FastSmem& smem = *reinterpret_cast<FastSmem*>(smem_raw);
  GemmLaps timer(smem, laps);  // its destructor adds the epilogue's time on every return
  bulk_wait_read();  // a previous tile's bulk stores (BulkRowsF32) have read the ring
  static_assert(kBN == 128 || (kBN == 256 && !kDual), "tile widths: 128 (one or two B operands) or 256 (one)");
  constexpr int kStages = 12 / kUnitsPerStage<kDual, kBN>;
  constexpr int kStageBytes = kUnitsPerStage<kDual, kBN> * kOperandBytes;
  constexpr int NJ = kBN / 8;
  // operand 0: A (16 KiB), 1: B (kBN / 8 KiB), 2: B2 (16 KiB, after B)
  auto stage = [&](int st, int operand) {
    return smem.ring + st * kStageBytes + (operand == 0 ? 0 : operand == 1 ? kOperandBytes : 2 * kOperandBytes);
  };
  float acc[NJ][4], acc2[16][4];  // acc2 is unused (and eliminated) without kDual
  zero_accumulators(acc);
  if constexpr (kDual) zero_accumulators(acc2);
  __syncthreads();  // the previous tile's readers of the buffers are done
  constexpr bool kRowsA = kIsRowsOperand<OpA>;
  static_assert(!kRowsA || TA == 0, "rows copied by threads are K-major");
  // A stage is full once thread 0's expected bytes (the TMA boxes) have landed and, with rows
  // copied by threads, every thread's copies have.
  constexpr uint32_t kArrivals = kRowsA ? 1 + kThreads : 1;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&smem.full[st])), "n"(kArrivals)
                   : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  timer.lap(0);
  const int64_t chunks = (K + kChunkK - 1) / kChunkK;
  constexpr uint32_t kBytes = kStageBytes - (kRowsA ? kOperandBytes : 0);
  auto load_chunk = [&](int64_t chunk) {  // one thread
    const int st = static_cast<int>(chunk % kStages);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&smem.full[st])),
                 "r"(kBytes)
                 : "memory");
    if constexpr (!kRowsA) fast_load(stage(st, 0), A, chunk * kChunkK, &smem.full[st], kTileM);
    fast_load(stage(st, 1), B, chunk * kChunkK, &smem.full[st], kBN);
    if constexpr (kDual) fast_load(stage(st, 2), B2, chunk * kChunkK, &smem.full[st], 128);
  };
  [[maybe_unused]] auto load_rows = [&](int64_t chunk) {  // every thread
    if constexpr (kRowsA) {
      const int st = static_cast<int>(chunk % kStages);
      rows_load(stage(st, 0), A, chunk, &smem.full[st]);
    }
  };
  if (threadIdx.x == 0)
    for (int64_t chunk = 0; chunk < kStages - 1 && chunk < chunks; ++chunk) load_chunk(chunk);
  if constexpr (kRowsA)
    for (int64_t chunk = 0; chunk < kStages - 1 && chunk < chunks; ++chunk) load_rows(chunk);
  [[maybe_unused]] uint64_t early_key = 0;  // kHasEarlyKeys: this thread's row's early(i)
  if constexpr (kHasEarlyKeys<Epilogue>)
    if (threadIdx.x < rows) early_key = epilogue.early(threadIdx.x);
  // The key of row threadIdx.x (only that row: early_key is this thread's).
  [[maybe_unused]] auto my_key = [&]() -> int64_t {
    if constexpr (kHasEarlyKeys<Epilogue>)
      return epilogue.key(threadIdx.x, early_key);
    else if constexpr (kIsRowEpilogue<Epilogue>)
      return epilogue.key(threadIdx.x);
    else
      return 0;
  };
  timer.lap(1);
  // ORDER: dot-chain: chunks in increasing k, and inside a chunk one wgmma per 16 K-elements in
  // increasing k on the same accumulators (wgmma executes a warpgroup's steps in issue order).
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int st = static_cast<int>(chunk % kStages);
    mbar_wait(&smem.full[st], static_cast<uint32_t>((chunk / kStages) & 1));
    // cp.async writes shared memory through the generic proxy and wgmma reads it through the
    // async proxy: each reader orders the two after its wait.
    if constexpr (kRowsA) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (chunk == 0) timer.lap(2);
    if constexpr (requires { epilogue.prefetch(); })
      if (chunk == (chunks > kPrefetchLead ? chunks - kPrefetchLead : 0)) epilogue.prefetch();
    const int64_t left = K - chunk * kChunkK;
    if (left < kChunkK) {  // the last, partial chunk: rows past K of MN-major operands must be zero
      if (TA) zero_k_rows(stage(st, 0), static_cast<int>(left), kTileM / 64);
      if (TB) {
        zero_k_rows(stage(st, 1), static_cast<int>(left), kBN / 64);
        if constexpr (kDual) zero_k_rows(stage(st, 2), static_cast<int>(left), 2);
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
    }
    const int steps = static_cast<int>(left < kChunkK ? (left + kStepK - 1) / kStepK : kChunkK / kStepK);
    wgmma_fence();
    fast_chunk<TA, TB, kDual, NJ>(acc, acc2, stage(st, 0), steps);
    wgmma_commit();
    if constexpr (kRowsA)
      if (A.copy != nullptr) rows_write_back(stage(st, 0), A, chunk);
    wgmma_wait<1>();  // this warpgroup's previous chunk is done
    __syncthreads();  // ... and the other's: its stage can be refilled
    if (threadIdx.x == 0 && chunk + kStages - 1 < chunks) load_chunk(chunk + kStages - 1);
    if constexpr (kRowsA)
      if (chunk + kStages - 1 < chunks) load_rows(chunk + kStages - 1);
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  if constexpr (kDual) fence_accumulators(acc2);
  // Rows copied by threads: the ring's A areas were written (cp.async) and read (the write-back)
  // through the generic proxy; the next tile's TMA loads write them through the async proxy.
  if constexpr (kRowsA) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  timer.lap(3);
  if (threadIdx.x == 0)  // every phase has completed: retire the barriers before the memory is reused
    for (int st = 0; st < kStages; ++st)
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&smem.full[st])) : "memory");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
  if constexpr (kIsRowEpilogue<Epilogue> || kIsBulkEpilogue<Epilogue>) {
    [[maybe_unused]] bool in = true;  // RangedRows: every value of c passes in_range (as for RangedPairs)
    if constexpr (kIsRangedRows<Epilogue>) {
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) in = in & epilogue.in_range(acc[j][e]);
    }
    // The ring is idle: every loaded chunk was consumed and both warpgroups' wgmma are done.
    if constexpr (kIsMixedRows<Epilogue>) {
      static_assert(!kDual && kBN == 256, "bf16 rows: one 256-wide B operand");
      if (epilogue.bf16) {
        uint16_t* staged16 = reinterpret_cast<uint16_t*>(smem.ring);
        int64_t* keys16 = reinterpret_cast<int64_t*>(smem.ring + kStageKeysOffset16);
        // The keys first (their area does not overlap the staged rows): a key that still needs a
        // global load (no early(i)) then has the staging stores to hide behind.
        if (threadIdx.x < rows) keys16[threadIdx.x] = my_key();
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int i = warp * 16 + g + (e >= 2 ? 8 : 0), jj = j * 8 + 2 * c;
            *reinterpret_cast<uint32_t*>(staged16 + i * kStageRowHalves + jj) =
                pack2(spec::bf16_from_f32_rne(acc[j][e]), spec::bf16_from_f32_rne(acc[j][e + 1]));
          }
        __syncthreads();
        const int j = 8 * lane;
        if (j < cols) {
          const int valid = cols - j < 8 ? static_cast<int>(cols - j) : 8;
#pragma unroll 4
          for (int64_t i = warp; i < rows; i += kWarps)
            epilogue.store16(i, keys16[i], j, *reinterpret_cast<const uint4*>(staged16 + i * kStageRowHalves + j),
                             valid);
        }
        // As below: generic-proxy staging before the next tile's TMA loads into the ring.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        return;
      }
    }
    [[maybe_unused]] float* loaded = nullptr;  // LoadedRows: this warp's rows of both arrays
    [[maybe_unused]] int my_rows = 0;
    [[maybe_unused]] auto load_row = [&](int r) {
      if constexpr (kIsLoadedRows<Epilogue>) {
        const int64_t i = warp + static_cast<int64_t>(r) * kWarps;
        const RowSources src = epilogue.sources(i);
        float* dst = loaded + (r % kLoadedRowsDepth) * 2 * kBN;
#pragma unroll
        for (int h = 0; h < kBN / 128; ++h) {
          const int j = h * 128 + 4 * lane;
          if (j < cols) {
            copy16_async(dst + j, src.a + j);
            copy16_async(dst + kBN + j, src.b + j);
          }
        }
      }
    };
    if constexpr (kIsLoadedRows<Epilogue>) {
      // The first rows' copies go out before the staging (they land beside it, past the keys).
      static_assert(kBN == 256, "loaded rows: the area holds 256-wide rows");
      loaded = reinterpret_cast<float*>(smem.ring + kLoadedRowsOffset) + warp * kLoadedRowsDepth * 2 * kBN;
      my_rows = rows > warp ? static_cast<int>((rows - warp + kWarps - 1) / kWarps) : 0;
#pragma unroll
      for (int r = 0; r < kLoadedRowsDepth; ++r) {
        if (r < my_rows) load_row(r);
        copy16_commit();
      }
    }
    float* staged = reinterpret_cast<float*>(smem.ring);
    [[maybe_unused]] int64_t* keys = reinterpret_cast<int64_t*>(smem.ring + kStageKeysOffset);
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = warp * 16 + g + (e >= 2 ? 8 : 0), jj = j * 8 + 2 * c;
        *reinterpret_cast<float2*>(staged + i * kStageRowFloats + jj) = make_float2(acc[j][e], acc[j][e + 1]);
        if constexpr (kDual)
          *reinterpret_cast<float2*>(staged + i * kStageRowFloats + 128 + jj) = make_float2(acc2[j][e], acc2[j][e + 1]);
      }
    if constexpr (kIsBulkEpilogue<Epilogue>) {
      static_assert(!kDual, "bulk rows: one B operand");
      // The staged rows are written by ordinary stores and read by the bulk copies (async proxy).
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      // A bulk copy moves 16-byte multiples: cols is a multiple of 64 wherever the fast engine
      // runs (the layer takes it only for H, I and Is multiples of 64; mok-gemm-bench's shapes are
      // multiples of 128), and dst(i) is then 16-byte aligned.
      if (threadIdx.x < rows) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                         reinterpret_cast<uint64_t>(epilogue.dst(threadIdx.x))),
                     "r"(smem_u32(staged + threadIdx.x * kStageRowFloats)), "r"(static_cast<uint32_t>(cols * 4))
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
      return;
    }
    if constexpr (kIsRowEpilogue<Epilogue>) {
      if (threadIdx.x < rows) keys[threadIdx.x] = my_key();
      constexpr int kCols = kDual ? 128 : kBN;  // columns of c per row: 128 per pass of a warp
      auto row_stores = [&](auto&& store, int64_t i) {
        const int64_t key = keys[i];
        const float* row = staged + i * kStageRowFloats;
#pragma unroll
        for (int h = 0; h < kCols / 128; ++h) {
          const int j = h * 128 + 4 * lane;
          if (j < cols) {
            const int valid = cols - j < 4 ? static_cast<int>(cols - j) : 4;
            const float4 v = *reinterpret_cast<const float4*>(row + j);
            if constexpr (kDual)
              store(i, key, j, v, *reinterpret_cast<const float4*>(row + 128 + j), valid);
            else
              store(i, key, j, v, valid);
          }
        }
      };
      if constexpr (kIsRangedRows<Epilogue>) {
        // Four rows per unrolled step, so that their chains (the forward's SwiGLU) interleave.
        auto all_rows = [&](auto&& store) {
#pragma unroll 4
          for (int64_t i = warp; i < rows; i += kWarps) row_stores(store, i);
        };
        if (__syncthreads_and(in))
          all_rows(epilogue.fast);
        else
          all_rows(epilogue.general);
      } else if constexpr (kIsLoadedRows<Epilogue>) {
        static_assert(!kDual, "loaded rows: one B operand");
        __syncthreads();
        // ORDER: none across rows (each element's chain is its own); row r of this warp waits
        // for its own copies only (a lane reads back exactly the 16-byte pieces it copied).
        for (int r = 0; r < my_rows; ++r) {
          copy16_wait_all_but<kLoadedRowsDepth - 1>();
          const int64_t i = warp + static_cast<int64_t>(r) * kWarps;
          const float* la = loaded + (r % kLoadedRowsDepth) * 2 * kBN;
#pragma unroll
          for (int h = 0; h < kBN / 128; ++h) {
            const int j = h * 128 + 4 * lane;
            if (j < cols)
              epilogue.store(i, keys[i], j, *reinterpret_cast<const float4*>(staged + i * kStageRowFloats + j),
                             *reinterpret_cast<const float4*>(la + j), *reinterpret_cast<const float4*>(la + kBN + j),
                             cols - j < 4 ? static_cast<int>(cols - j) : 4);
          }
          if (r + kLoadedRowsDepth < my_rows) load_row(r + kLoadedRowsDepth);
          copy16_commit();  // (empty groups keep the count of groups per row fixed)
        }
        copy16_wait_all();  // before the next tile's loads reuse the ring
      } else {
        __syncthreads();
        for (int64_t i = warp; i < rows; i += kWarps) row_stores(epilogue.store, i);
      }
      // The staged tile and keys were ordinary (generic-proxy) shared-memory accesses; the next
      // tile's TMA loads (async proxy) reuse the ring after its first barrier. Order the two
      // proxies as for zero_k_rows.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
  } else {
    // kAll: the tile is full (every pair is inside it), so no pair needs a test.
    auto pairs = [&](auto&& epi, auto all) {
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (e & 1) continue;  // elements e, e + 1 are columns jj, jj + 1 of one row
          const int64_t i = warp * 16 + g + (e >= 2 ? 8 : 0), jj = j * 8 + 2 * c;
          if (decltype(all)::value || (i < rows && jj < cols)) {
            if constexpr (kDual)
              epi(i, jj, acc[j][e], acc[j][e + 1], acc2[j][e], acc2[j][e + 1]);
            else
              epi(i, jj, acc[j][e], acc[j][e + 1]);
          }
        }
    };
    if constexpr (kIsRangedEpilogue<Epilogue>) {
      bool in = true;  // every value of c (inside the tile or not: a stricter test is still right)
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) in = in & epilogue.in_range(acc[j][e]);
      if (in && rows == kTileM && cols == kBN)
        pairs(epilogue.fast, std::true_type{});
      else if (in)
        pairs(epilogue.fast, std::false_type{});
      else
        pairs(epilogue.general, std::false_type{});
    } else {
      pairs(epilogue, std::false_type{});
    }
  }
#else
  // The host only selects the fast engine for sm_90a code; reaching this is a launch error.
  (void)smem_raw, (void)K, (void)rows, (void)cols, (void)A, (void)B, (void)B2, (void)epilogue, (void)laps;
  __trap();
#endif
}

}  // namespace mok::kernel::device
