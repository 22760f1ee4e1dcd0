// mok-mma-probe: runs single mma.sync.m16n8k16 bf16 instructions on the GPU and compares every
// output element with the spec's MMA model (crafted edge cases, then millions of random ones);
// then single wgmma.m64n8k16 instructions, and then the layer engines' own instruction forms
// (the fast engine's wgmma.m64n128k16 / m64n256k16 on 128-byte swizzled, K- or MN-major operands;
// the slow engine's m64n64k16 on unswizzled core matrices; issued through
// kernel/device/mma_tile.cuh's helpers), one instruction at a time.
#include "../device/mma_tile.cuh"
#include "mok/spec/mma_model.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// One instruction: A [16][16] row-major, B [16 k][8 n], C [16][8], all as bit patterns.
struct Instr {
  uint16_t a[16][16];
  uint16_t b[16][8];
  float c[16][8];
};

__global__ void probe_kernel(const Instr* in, float* out, int n) {
  const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= n) return;
  const Instr& p = in[i];
  const int lane = threadIdx.x % 32, g = lane >> 2, c = lane & 3;
  auto pack = [](uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); };
  uint32_t a0 = pack(p.a[g][2 * c], p.a[g][2 * c + 1]);
  uint32_t a1 = pack(p.a[g + 8][2 * c], p.a[g + 8][2 * c + 1]);
  uint32_t a2 = pack(p.a[g][2 * c + 8], p.a[g][2 * c + 9]);
  uint32_t a3 = pack(p.a[g + 8][2 * c + 8], p.a[g + 8][2 * c + 9]);
  uint32_t b0 = pack(p.b[2 * c][g], p.b[2 * c + 1][g]);
  uint32_t b1 = pack(p.b[2 * c + 8][g], p.b[2 * c + 9][g]);
  float d0 = p.c[g][2 * c], d1 = p.c[g][2 * c + 1], d2 = p.c[g + 8][2 * c], d3 = p.c[g + 8][2 * c + 1];
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  float* o = out + static_cast<int64_t>(i) * 128;
  o[g * 8 + 2 * c] = d0;
  o[g * 8 + 2 * c + 1] = d1;
  o[(g + 8) * 8 + 2 * c] = d2;
  o[(g + 8) * 8 + 2 * c + 1] = d3;
}

// One wgmma instruction: A [64][16] and B [16 k][8 n] from shared memory, C [64][8].
struct WInstr {
  uint16_t a[64][16];
  uint16_t b[16][8];
  float c[64][8];
};

// wgmma.m64n8k16 bf16 -> f32 with both operands in shared memory (no-swizzle canonical
// layout: 8x8 core matrices, LBO 128 bytes along K, SBO 256 bytes along M/N).
__global__ void wgmma_probe_kernel(const WInstr* in, float* out, int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ alignas(128) uint16_t a_s[64 * 16];
  __shared__ alignas(128) uint16_t b_s[8 * 16];
  const int i = blockIdx.x;
  if (i >= n) return;
  const WInstr& p = in[i];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane >> 2, c = lane & 3;
  auto off = [](int row, int k) { return (row >> 3) * 128 + (k >> 3) * 64 + (row & 7) * 8 + (k & 7); };
  for (int idx = t; idx < 64 * 16; idx += 128) a_s[off(idx / 16, idx % 16)] = p.a[idx / 16][idx % 16];
  for (int idx = t; idx < 8 * 16; idx += 128) b_s[off(idx / 16, idx % 16)] = p.b[idx % 16][idx / 16];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  auto desc = [](const void* ptr) {
    const uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(ptr));
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t{128} >> 4) << 16) | ((uint64_t{256} >> 4) << 32);
  };
  const int r = warp * 16 + g;
  float d0 = p.c[r][2 * c], d1 = p.c[r][2 * c + 1], d2 = p.c[r + 8][2 * c], d3 = p.c[r + 8][2 * c + 1];
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, 1, 1, 1, 0, 0;\n"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
               : "l"(desc(a_s)), "l"(desc(b_s))
               : "memory");
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float* o = out + static_cast<int64_t>(i) * 512;
  o[r * 8 + 2 * c] = d0;
  o[r * 8 + 2 * c + 1] = d1;
  o[(r + 8) * 8 + 2 * c] = d2;
  o[(r + 8) * 8 + 2 * c + 1] = d3;
#else
  (void)in;
  (void)out;
  (void)n;
#endif
}

uint16_t random_bf16(std::mt19937_64& rng, int center) {
  const uint64_t r = rng();
  switch (r % 32) {
    case 0: return static_cast<uint16_t>((r >> 8) & 0x807F);          // zero or subnormal
    case 1: return static_cast<uint16_t>(((r >> 8) & 0x8000) | 0x7F80 | ((r >> 20) % 64 == 0 ? 1 : 0));  // Inf, rarely NaN
    default: {
      const int e = std::clamp(center + static_cast<int>((r >> 8) % 25) - 12, -126, 127);
      return static_cast<uint16_t>(((r >> 40) & 0x8000) | ((e + 127) << 7) | ((r >> 16) & 0x7F));
    }
  }
}

float random_acc(std::mt19937_64& rng, int center) {
  const uint64_t r = rng();
  if (r % 16 == 0) return (r >> 8) & 1 ? -0.0f : 0.0f;
  const int e = std::clamp(center + static_cast<int>((r >> 8) % 61) - 30, -126, 127);
  const uint32_t bits = static_cast<uint32_t>(((r >> 40) & 1) << 31) | (static_cast<uint32_t>(e + 127) << 23) |
                        static_cast<uint32_t>((r >> 16) & 0x7FFFFF);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Crafted instructions: each puts one interesting case into row 0 / column 0 and random
// filler elsewhere (DESIGN section 6's cases and MMA-Sim's edge rules).
void crafted(std::vector<Instr>& out, std::mt19937_64& rng) {
  auto blank = [&] {
    Instr p{};
    for (auto& row : p.a) for (auto& v : row) v = random_bf16(rng, 0);
    for (auto& row : p.b) for (auto& v : row) v = random_bf16(rng, 0);
    for (auto& row : p.c) for (auto& v : row) v = random_acc(rng, 0);
    for (int k = 0; k < 16; ++k) { p.a[0][k] = 0; p.b[k][0] = 0; }
    p.c[0][0] = 0.0f;
    return p;
  };
  auto bf = [](float f) { return mok::spec::bf16_from_f32_rne(f); };
  struct Case { float acc; std::vector<std::pair<uint16_t, uint16_t>> ab; };
  const std::vector<Case> cases = {
      {0.0f, {{bf(1), bf(1)}, {bf(-1), bf(1)}, {bf(0x1p-25f), bf(1)}}},      // 2^-25 kept
      {0.0f, {{bf(1), bf(1)}, {bf(-1), bf(1)}, {bf(0x1p-26f), bf(1)}}},      // 2^-26 dropped
      {1.0f + 0x1p-23f, {{bf(0x1p-24f), bf(1)}, {bf(0x1p-25f), bf(1)}}},    // truncation, not RNE
      {0.0f, {{bf(1.5f), bf(1.5f)}, {bf(0x1p-25f), bf(1)}}},                 // product >= 2 not renormalised
      {0.0f, {{bf(1.75f), bf(1.75f)}, {bf(0x1.8p-25f), bf(1)}}},
      {0.0f, {{0x1A00, 0x1A80}, {0x9500, 0x1500}}},                          // zero terms align at -133
      {-0.0f, {{0x8000, 0x3F80}}},                                           // -0 result -> +0
      {0.0f, {{0x9780, 0x1780}}},                                            // tiny negative truncates to +0
      {0.0f, {{0x7F00, 0x4000}, {0x7F00, 0x4000}}},                          // overflow -> Inf
      {0.0f, {{0x0001, 0x3F80}, {0x0040, 0x4000}}},                          // subnormal inputs
      {3.0e38f, {{0x7F00, 0x3F80}}},                                         // accumulator overflow
      {0.0f, {{0x7F80, 0x0000}}},                                            // Inf * 0 -> NaN
      {0.0f, {{0x7F80, 0x3F80}, {0xFF80, 0x3F80}}},                          // Inf - Inf -> NaN
      {1.0f, {{0x7FC1, 0x3F80}}},                                            // NaN input
      {0x1p-149f, {{0x0001, 0x0001}}},                                       // smallest values
  };
  for (const Case& cs : cases) {
    Instr p = blank();
    p.c[0][0] = cs.acc;
    for (size_t k = 0; k < cs.ab.size(); ++k) {
      p.a[0][k] = cs.ab[k].first;
      p.b[k][0] = cs.ab[k].second;
    }
    out.push_back(p);
  }
}

float wmodel(const WInstr& p, int m, int n) {
  uint16_t b_col[16];
  for (int k = 0; k < 16; ++k) b_col[k] = p.b[k][n];
  return mok::spec::mma_bf16_step(mok::spec::kHopperBf16Mma, p.c[m][n], p.a[m], 1, b_col, 1, 16);
}

float model(const Instr& p, int m, int n) {
  uint16_t b_col[16];
  for (int k = 0; k < 16; ++k) b_col[k] = p.b[k][n];
  return mok::spec::mma_bf16_step(mok::spec::kHopperBf16Mma, p.c[m][n], p.a[m], 1, b_col, 1, 16);
}

// ---- The engines' instruction forms. One block (one warpgroup) per instruction. The fast
// engine's: A's 64 x 64 box and B's kN / 64 boxes (64 rows of 128 bytes each) copied into shared
// memory as TMA writes them (128-byte swizzle: the 16-byte chunk c of 128-byte row r sits at chunk
// c ^ (r % 8)), then one wgmma at k-step s (0-3) of the 64-wide chunk, with the descriptors and
// immediates the engine uses (desc_sw128, wgmma_m64nNk16<TA, TB, NJ>; fast_chunk's a_step /
// b_step). The slow engine's (kSlow): one 16-wide K step of A and B in core matrices, as
// gemm_slow stores them, and its wgmma_m64n64k16 on desc_noswizzle descriptors.
uint32_t bits(float f);
namespace dev = mok::kernel::device;
// kSlow: the slow engine's form instead (gemm_slow): wgmma.m64n64k16 on one 16-wide K step of A
// (64 x 16) and B (64 x 16, [n][k]) in the unswizzled core-matrix layout (core_offset,
// desc_noswizzle), A's 2 KiB then B's.
template <int NJ, bool kSlow = false>
constexpr int kTileOperandBytes = kSlow ? 2 * 64 * 16 * 2 : dev::kBoxBytes * (1 + NJ * 8 / 64);

template <int TA, int TB, int NJ, bool kSlow = false>
__global__ void tile_probe_kernel(const uint8_t* ops, const float* acc_in, const int* steps, float* out, int n) {
#if defined(MOK_WGMMA)
  extern __shared__ unsigned char tile_raw[];
  uint8_t* sm = dev::aligned_smem(tile_raw);  // swizzle atoms are 1024-byte aligned
  constexpr int kN = NJ * 8, kBytes = kTileOperandBytes<NJ, kSlow>;
  const int i = blockIdx.x;
  if (i >= n) return;
  const uint4* src = reinterpret_cast<const uint4*>(ops + static_cast<int64_t>(i) * kBytes);
  for (int w = threadIdx.x; w < kBytes / 16; w += 128) reinterpret_cast<uint4*>(sm)[w] = src[w];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane >> 2, c = lane & 3;
  const float* C = acc_in + static_cast<int64_t>(i) * 64 * kN;
  float d[NJ][4];
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[j][e] = C[(warp * 16 + g + (e >= 2 ? 8 : 0)) * kN + j * 8 + 2 * c + (e & 1)];
  dev::wgmma_fence();
  if constexpr (kSlow) {
    static_assert(NJ == 8 && TA == 0 && TB == 0, "the slow engine's form: m64n64k16, both operands K-major");
    dev::wgmma_m64n64k16(d, dev::desc_noswizzle(sm), dev::desc_noswizzle(sm + 64 * 16 * 2));
  } else {
    const int s = steps[i];
    const uint32_t a = dev::smem_u32(sm), b = a + dev::kBoxBytes;
    const uint32_t a_step = TA ? 16 * 128 : 32, b_step = TB ? 16 * 128 : 32;
    dev::wgmma_m64nNk16<TA, TB, NJ>(d, dev::desc_sw128(a + s * a_step, TA != 0), dev::desc_sw128(b + s * b_step, TB != 0));
  }
  dev::wgmma_commit();
  dev::wgmma_wait<0>();
  float* o = out + static_cast<int64_t>(i) * 64 * kN;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[(warp * 16 + g + (e >= 2 ? 8 : 0)) * kN + j * 8 + 2 * c + (e & 1)] = d[j][e];
#else
  (void)ops, (void)acc_in, (void)steps, (void)out, (void)n;
#endif
}

// Byte offset of a K-major operand element (row r of 64-row boxes, k in the 64-wide chunk) and of
// an MN-major one (k, mn) in the swizzled boxes.
int64_t kmajor_offset(int r, int k) {
  const int box = r / 64, rr = r % 64;
  return int64_t{box} * dev::kBoxBytes + rr * 128 + (((k / 8) ^ (rr % 8)) * 16) + (k % 8) * 2;
}
int64_t mnmajor_offset(int k, int mn) {
  const int box = mn / 64, m = mn % 64;
  return int64_t{box} * dev::kBoxBytes + k * 128 + (((m / 8) ^ (k % 8)) * 16) + (m % 8) * 2;
}

// Byte offset of element (row, k) of a 16-wide K step in the slow engine's core-matrix layout.
int64_t core_offset_bytes(int row, int k) {
  return 2 * static_cast<int64_t>((row >> 3) * 128 + (k >> 3) * 64 + (row & 7) * 8 + (k & 7));
}

// Runs `count` random instructions of one form and returns the elements that disagree with the model.
template <int TA, int TB, int NJ, bool kSlow = false>
int64_t probe_tile_form(int64_t count, std::mt19937_64& rng, unsigned threads, int64_t* elements) {
  constexpr int kN = NJ * 8, kBytes = kTileOperandBytes<NJ, kSlow>;
  const char* name = NJ == 8 ? "m64n64k16" : NJ == 16 ? "m64n128k16" : "m64n256k16";
  const int64_t chunk = 1024;
  const size_t smem = kBytes + 1024;
  cudaFuncSetAttribute(tile_probe_kernel<TA, TB, NJ, kSlow>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  uint8_t* d_ops = nullptr;
  float *d_acc = nullptr, *d_out = nullptr;
  int* d_steps = nullptr;
  cudaMalloc(&d_ops, chunk * kBytes);
  cudaMalloc(&d_acc, chunk * 64 * kN * sizeof(float));
  cudaMalloc(&d_out, chunk * 64 * kN * sizeof(float));
  cudaMalloc(&d_steps, chunk * sizeof(int));
  // Logical operands per instruction: A[m][k] (64 x 64), B[n][k] (kN x 64), C[m][n], step.
  std::vector<uint16_t> A(chunk * 64 * 64), B(chunk * kN * 64);
  std::vector<uint8_t> ops(chunk * kBytes);
  std::vector<float> acc(chunk * 64 * kN), out(chunk * 64 * kN);
  std::vector<int> steps(chunk);
  int64_t bad_total = 0, done = 0;
  std::atomic<int> printed{0};
  while (done < count) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, count - done));
    for (int i = 0; i < n; ++i) {
      const int center = static_cast<int>(rng() % 200) - 100;
      steps[i] = kSlow ? 0 : static_cast<int>(rng() % 4);  // the slow form holds one K step
      uint8_t* op = ops.data() + static_cast<int64_t>(i) * kBytes;
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < (kSlow ? 16 : 64); ++k) {
          const uint16_t v = random_bf16(rng, center / 2);
          A[(static_cast<int64_t>(i) * 64 + m) * 64 + k] = v;
          std::memcpy(op + (kSlow ? core_offset_bytes(m, k) : TA ? mnmajor_offset(k, m) : kmajor_offset(m, k)), &v, 2);
        }
      for (int nn = 0; nn < kN; ++nn)
        for (int k = 0; k < (kSlow ? 16 : 64); ++k) {
          const uint16_t v = random_bf16(rng, center / 2);
          B[(static_cast<int64_t>(i) * kN + nn) * 64 + k] = v;
          std::memcpy(op + (kSlow ? 64 * 16 * 2 + core_offset_bytes(nn, k)
                                  : dev::kBoxBytes + (TB ? mnmajor_offset(k, nn) : kmajor_offset(nn, k))),
                      &v, 2);
        }
      for (int e = 0; e < 64 * kN; ++e) acc[static_cast<int64_t>(i) * 64 * kN + e] = random_acc(rng, center);
    }
    cudaMemcpy(d_ops, ops.data(), static_cast<size_t>(n) * kBytes, cudaMemcpyHostToDevice);
    cudaMemcpy(d_acc, acc.data(), static_cast<size_t>(n) * 64 * kN * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_steps, steps.data(), n * sizeof(int), cudaMemcpyHostToDevice);
    tile_probe_kernel<TA, TB, NJ, kSlow><<<n, 128, smem>>>(d_ops, d_acc, d_steps, d_out, n);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "mok-mma-probe: %s kernel (TA %d, TB %d) failed: %s\n", name, TA, TB,
                   cudaGetErrorString(cudaGetLastError()));
      std::exit(1);
    }
    cudaMemcpy(out.data(), d_out, static_cast<size_t>(n) * 64 * kN * sizeof(float), cudaMemcpyDeviceToHost);
    std::atomic<int64_t> bad{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        uint16_t bcol[16];
        for (int i = static_cast<int>(t); i < n; i += static_cast<int>(threads))
          for (int m = 0; m < 64; ++m)
            for (int nn = 0; nn < kN; ++nn) {
              const int64_t e = (static_cast<int64_t>(i) * 64 + m) * kN + nn;
              const int k0 = 16 * steps[i];
              for (int k = 0; k < 16; ++k) bcol[k] = B[(static_cast<int64_t>(i) * kN + nn) * 64 + k0 + k];
              const float want = mok::spec::mma_bf16_step(mok::spec::kHopperBf16Mma, acc[e],
                                                          &A[(static_cast<int64_t>(i) * 64 + m) * 64 + k0], 1, bcol, 1, 16);
              if (bits(want) != bits(out[e])) {
                ++bad;
                if (printed.fetch_add(1) < 8)
                  std::printf("%s (TA %d, TB %d) MISMATCH instr %lld step %d element (%d,%d): gpu 0x%08x model 0x%08x\n",
                              name, TA, TB, static_cast<long long>(done + i), steps[i], m, nn, bits(out[e]), bits(want));
              }
            }
      });
    for (auto& th : pool) th.join();
    bad_total += bad;
    *elements += static_cast<int64_t>(n) * 64 * kN;
    done += n;
  }
  std::printf("mok-mma-probe: wgmma.%s, A %s-major, B %s-major, %s: %lld instructions, %lld elements, "
              "%lld disagree with %s\n",
              name, TA ? "MN" : "K", TB ? "MN" : "K",
              kSlow ? "no swizzle (the slow engine's core matrices)" : "128-byte swizzle", static_cast<long long>(done),
              static_cast<long long>(done * 64 * kN), static_cast<long long>(bad_total), mok::spec::kHopperBf16Mma.name);
  cudaFree(d_ops);
  cudaFree(d_acc);
  cudaFree(d_out);
  cudaFree(d_steps);
  return bad_total;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t count = 1000000, wgmma_count = 250000, tile_count = 2048;
  uint64_t seed = 20261202;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--count" && i + 1 < argc) count = std::atoll(argv[++i]);
    else if (a == "--wgmma-count" && i + 1 < argc) wgmma_count = std::atoll(argv[++i]);
    else if (a == "--tile-count" && i + 1 < argc) tile_count = std::atoll(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr,
                   "usage: mok-mma-probe [--count N] [--wgmma-count W] [--tile-count T] [--seed S]\n"
                   "Runs N random mma.sync.m16n8k16 and W random wgmma.m64n8k16 (A, B in shared memory) bf16->f32\n"
                   "instructions, plus crafted edge cases, then T random instructions of each form the layer's\n"
                   "engines issue (the fast engine's wgmma.m64n128k16 and m64n256k16, 128-byte swizzled, K- or\n"
                   "MN-major operands; the slow engine's m64n64k16 on unswizzled core matrices; through the\n"
                   "engines' own descriptor and instruction helpers), on the GPU, and compares every\n"
                   "output element with the spec's Hopper MMA model, bit for bit. wgmma runs only on compute\n"
                   "capability 9.0.\n"
                   "Exit 0: all agree; 1: a mismatch (the first ones are printed); 3: no GPU.\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "mok-mma-probe: no CUDA device; nothing to probe\n");
    return 3;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::mt19937_64 rng(seed);
  std::vector<Instr> instrs;
  crafted(instrs, rng);
  const size_t num_crafted = instrs.size();
  const int64_t chunk = 1 << 16;
  int64_t total_elems = 0, mismatches = 0, crafted_bad = 0;
  Instr* d_in = nullptr;
  float* d_out = nullptr;
  cudaMalloc(&d_in, chunk * sizeof(Instr));
  cudaMalloc(&d_out, chunk * 128 * sizeof(float));
  std::vector<float> out(chunk * 128);
  int64_t done = 0;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  bool first = true;
  while (done < count + static_cast<int64_t>(num_crafted)) {
    if (!first) instrs.clear();
    while (static_cast<int64_t>(instrs.size()) < chunk && done + static_cast<int64_t>(instrs.size()) < count + static_cast<int64_t>(num_crafted)) {
      Instr p;
      const int center = static_cast<int>(rng() % 200) - 100;
      for (auto& row : p.a) for (auto& v : row) v = random_bf16(rng, center / 2);
      for (auto& row : p.b) for (auto& v : row) v = random_bf16(rng, center / 2);
      for (auto& row : p.c) for (auto& v : row) v = random_acc(rng, center);
      instrs.push_back(p);
    }
    const int n = static_cast<int>(instrs.size());
    cudaMemcpy(d_in, instrs.data(), n * sizeof(Instr), cudaMemcpyHostToDevice);
    probe_kernel<<<(n + 3) / 4, 128>>>(d_in, d_out, n);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "mok-mma-probe: kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    cudaMemcpy(out.data(), d_out, static_cast<size_t>(n) * 128 * sizeof(float), cudaMemcpyDeviceToHost);
    std::atomic<int64_t> bad{0};
    std::atomic<int> printed{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int i = static_cast<int>(t); i < n; i += static_cast<int>(threads))
          for (int e = 0; e < 128; ++e) {
            const float want = model(instrs[i], e / 8, e % 8);
            const float got = out[static_cast<int64_t>(i) * 128 + e];
            if (bits(want) != bits(got)) {
              ++bad;
              if (printed.fetch_add(1) < 8)
                std::printf("MISMATCH instr %lld element (%d,%d): gpu 0x%08x model 0x%08x%s\n",
                            static_cast<long long>(done + i), e / 8, e % 8, bits(got), bits(want),
                            first && i < static_cast<int>(num_crafted) ? " (crafted)" : "");
              if (first && i < static_cast<int>(num_crafted) && e == 0) ++crafted_bad;
            }
          }
      });
    for (auto& th : pool) th.join();
    if (first) {
      std::printf("crafted: %zu instructions, element (0,0) of each: %lld disagree\n", num_crafted,
                  static_cast<long long>(crafted_bad));
    }
    mismatches += bad;
    total_elems += static_cast<int64_t>(n) * 128;
    done += n;
    first = false;
  }
  std::printf("mok-mma-probe: %s, mma.sync.m16n8k16 bf16: %lld instructions (%zu crafted), %lld elements, %lld "
              "disagree with %s\n",
              prop.name, static_cast<long long>(done), num_crafted, static_cast<long long>(total_elems),
              static_cast<long long>(mismatches), mok::spec::kHopperBf16Mma.name);
  cudaFree(d_in);
  cudaFree(d_out);
  if (prop.major != 9) {
    std::printf("mok-mma-probe: wgmma needs compute capability 9.0 (sm_90a); skipped on %d.%d\n", prop.major, prop.minor);
    return mismatches == 0 ? 0 : 1;
  }
  // wgmma.m64n8k16: the crafted cases sit in row 0 / column 0 of the first instructions.
  int64_t w_done = 0, w_elems = 0, w_bad_total = 0;
  const int64_t w_count = wgmma_count;
  const int64_t w_chunk = 1 << 14;
  WInstr* dw_in = nullptr;
  float* dw_out = nullptr;
  cudaMalloc(&dw_in, w_chunk * sizeof(WInstr));
  cudaMalloc(&dw_out, w_chunk * 512 * sizeof(float));
  std::vector<WInstr> winstrs;
  std::vector<float> wout(w_chunk * 512);
  {
    std::vector<Instr> seeds;
    crafted(seeds, rng);
    for (const Instr& cp : seeds) {  // widen each crafted m16 case into the first rows of an m64 one
      WInstr w;
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) w.a[m][k] = m < 16 ? cp.a[m][k] : random_bf16(rng, 0);
      for (int k = 0; k < 16; ++k)
        for (int nn = 0; nn < 8; ++nn) w.b[k][nn] = cp.b[k][nn];
      for (int m = 0; m < 64; ++m)
        for (int nn = 0; nn < 8; ++nn) w.c[m][nn] = m < 16 ? cp.c[m][nn] : random_acc(rng, 0);
      winstrs.push_back(w);
    }
  }
  std::atomic<int> printed_w{0};
  while (w_done < w_count + static_cast<int64_t>(num_crafted)) {
    while (static_cast<int64_t>(winstrs.size()) < w_chunk &&
           w_done + static_cast<int64_t>(winstrs.size()) < w_count + static_cast<int64_t>(num_crafted)) {
      WInstr p;
      const int center = static_cast<int>(rng() % 200) - 100;
      for (auto& row : p.a) for (auto& v : row) v = random_bf16(rng, center / 2);
      for (auto& row : p.b) for (auto& v : row) v = random_bf16(rng, center / 2);
      for (auto& row : p.c) for (auto& v : row) v = random_acc(rng, center);
      winstrs.push_back(p);
    }
    const int n = static_cast<int>(winstrs.size());
    cudaMemcpy(dw_in, winstrs.data(), n * sizeof(WInstr), cudaMemcpyHostToDevice);
    wgmma_probe_kernel<<<n, 128>>>(dw_in, dw_out, n);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "mok-mma-probe: wgmma kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    cudaMemcpy(wout.data(), dw_out, static_cast<size_t>(n) * 512 * sizeof(float), cudaMemcpyDeviceToHost);
    std::atomic<int64_t> bad{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int i = static_cast<int>(t); i < n; i += static_cast<int>(threads))
          for (int e = 0; e < 512; ++e) {
            const float want = wmodel(winstrs[i], e / 8, e % 8);
            const float got = wout[static_cast<int64_t>(i) * 512 + e];
            if (bits(want) != bits(got)) {
              ++bad;
              if (printed_w.fetch_add(1) < 8) {
                std::printf("WGMMA MISMATCH instr %lld element (%d,%d): gpu 0x%08x model 0x%08x\n",
                            static_cast<long long>(w_done + i), e / 8, e % 8, bits(got), bits(want));
              }
            }
          }
      });
    for (auto& th : pool) th.join();
    w_bad_total += bad;
    w_elems += static_cast<int64_t>(n) * 512;
    w_done += n;
    winstrs.clear();
  }
  std::printf("mok-mma-probe: %s, wgmma.m64n8k16 bf16 (A and B in shared memory): %lld instructions (%zu crafted), "
              "%lld elements, %lld disagree with %s\n",
              prop.name, static_cast<long long>(w_done), num_crafted, static_cast<long long>(w_elems),
              static_cast<long long>(w_bad_total), mok::spec::kHopperBf16Mma.name);
  cudaFree(dw_in);
  cudaFree(dw_out);
  // The engine's forms: forward phase 1 (B K-major, n128 per operand), forward phase 2 (n256),
  // backward phase 1 (B MN-major), weight gradients (A and B MN-major).
  int64_t tile_bad = 0, tile_elems = 0;
  if (tile_count > 0) {
    tile_bad += probe_tile_form<0, 0, 16>(tile_count, rng, threads, &tile_elems);
    tile_bad += probe_tile_form<0, 0, 32>(tile_count, rng, threads, &tile_elems);
    tile_bad += probe_tile_form<0, 1, 16>(tile_count, rng, threads, &tile_elems);
    tile_bad += probe_tile_form<0, 1, 32>(tile_count, rng, threads, &tile_elems);
    tile_bad += probe_tile_form<1, 1, 32>(tile_count, rng, threads, &tile_elems);
    // The slow engine's (gemm_slow: shapes not a multiple of 64, or TMA off).
    tile_bad += probe_tile_form<0, 0, 8, true>(tile_count, rng, threads, &tile_elems);
  }
  return mismatches == 0 && w_bad_total == 0 && tile_bad == 0 ? 0 : 1;
}
