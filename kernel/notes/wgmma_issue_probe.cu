// Scratch diagnostic (twenty-ninth session): how much of an SM's tensor throughput do one and two
// warpgroups reach when they issue the engine's wgmma forms back to back from shared memory, with
// no loads, no epilogue and no barrier? It decides whether a ping-pong layout (one warpgroup's MMAs
// at a time) can reach the tensor rate at all: the twenty-eighth session's pp_kernel ran at 51% of
// peak, read (not measured) as "one warpgroup alone reaches about half the SM's tensor throughput".
//
// Each block holds one stage of operands in shared memory (A 64 x 64 per warpgroup, B 256 x 64,
// 128-byte swizzle, K-major, contents irrelevant: zeros) and its active warpgroups each issue
// `iters` chunks of four m64n256k16 (or m64n128k16) steps on it, one commit group per chunk, with
// wgmma.wait_group<W> after each chunk (W = 0: a wait per chunk; W = 1: one chunk in flight, as the
// engine and pp_kernel do). Modes, per block of 3 warpgroups (384 threads, as the ping-pong):
//   1: warpgroup 1 alone issues;        2: warpgroups 1 and 2 issue at the same time;
//   3: warpgroups 1 and 2 take turns (an mbarrier hand-off per chunk group of `turn` chunks).
// TFLOP/s = 2 * 64 * N * 16 * 4 * chunks * active warpgroups * blocks / time; one block per SM.
//
// Build (here): nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I kernel/include -I reference/include
//   -o gpu-run/binO/wgmma-issue-probe kernel/notes/wgmma_issue_probe.cu
// Run: gpu-run/binO/wgmma-issue-probe
#include "../device/mma_tile.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace mok::kernel::device;

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                        \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

constexpr int kA = 8192, kB = 32768;  // bytes: A 64 x 64 bf16 per warpgroup, B 256 x 64 bf16

template <int NJ, int W>
__device__ __forceinline__ void chunk(float (&acc)[NJ][4], uint32_t sa, uint32_t sb) {
#if defined(MOK_WGMMA)
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) wgmma_m64nNk16<0, 0, NJ>(acc, desc_sw128(sa + j * 32, false), desc_sw128(sb + j * 32, false));
  wgmma_commit();
  wgmma_wait<W>();
#endif
}

template <int NJ, int W, int kMode>
__global__ void __launch_bounds__(384, 1) probe(int iters, int turn, float* sink) {
  constexpr int mode = kMode;
#if defined(MOK_WGMMA)
  extern __shared__ __align__(1024) unsigned char dyn[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(dyn) + 1023) & ~uintptr_t{1023});
  for (int i = threadIdx.x; i < (2 * kA + kB) / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 2 * kA + kB);  // [2]: turn hand-offs
  if (threadIdx.x == 0)
    for (int w = 0; w < 2; ++w) asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(smem_u32(&bars[w])));
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const bool active = wg == 1 || (wg == 2 && mode != 1);
  if (!active) return;
  const int cw = wg - 1;
  float acc[NJ][4];
  zero_accumulators(acc);
  const uint32_t sa = smem_u32(smem + cw * kA), sb = smem_u32(smem + 2 * kA);
  if constexpr (kMode != 3) {
    for (int it = 0; it < iters; ++it) chunk<NJ, W>(acc, sa, sb);
  } else {
    // Turns of `turn` chunks: warpgroup 0 takes turns 0, 2, 4, ..., warpgroup 1 turns 1, 3, ...
    const int turns = iters / turn;
    for (int t = 0; t < turns; ++t) {
      if (t > 0 || cw == 1) {  // wait for the other's previous turn: its (t)-th arrival on bars[cw]
        const uint32_t phase = static_cast<uint32_t>((cw == 1 ? t : t - 1) & 1);
        asm volatile(
            "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(
                smem_u32(&bars[cw])),
            "r"(phase)
            : "memory");
      }
      for (int c = 0; c < turn; ++c) chunk<NJ, W>(acc, sa, sb);
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(&bars[1 - cw])) : "memory");
    }
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  float s = 0;
  for (int j = 0; j < NJ; ++j)
    for (int e = 0; e < 4; ++e) s += acc[j][e];
  if (s != 0.0f) sink[blockIdx.x] = s;  // never true (zeros): keeps the MMAs alive
#endif
}

template <int NJ, int W, int mode>
int run(const char* name, int iters, int turn, int sms, float* sink) {
  const size_t smem = 2 * kA + kB + 16 + 1024;
  CK(cudaFuncSetAttribute(probe<NJ, W, mode>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaEventRecord(a));
    probe<NJ, W, mode><<<sms, 384, smem>>>(iters, turn, sink);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (rep >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2] * 1e-3;
  const int active = mode == 1 ? 1 : 2;
  const double flops = 2.0 * 64 * (NJ * 8) * 16 * 4 * double(iters) * active * sms;
  std::printf("%-46s mode %d  wait<%d>  turn %3d: %8.3f ms  %7.1f TFLOP/s\n", name, mode, W, turn, t * 1e3, flops / t / 1e12);
  return 0;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# wgmma-issue-probe on %s (%d SMs), median of 5 after 2\n", prop.name, sms);
  float* sink = nullptr;
  CK(cudaMalloc(&sink, sms * sizeof(float)));
  const int iters = 4096;
  int rc = 0;
  rc |= run<32, 1, 1>("m64n256k16, one warpgroup", iters, 1, sms, sink);
  rc |= run<32, 1, 2>("m64n256k16, two warpgroups together", iters, 1, sms, sink);
  rc |= run<32, 0, 1>("m64n256k16, one warpgroup, wait per chunk", iters, 1, sms, sink);
  rc |= run<32, 0, 2>("m64n256k16, two together, wait per chunk", iters, 1, sms, sink);
  for (int turn : {1, 4, 16, 64})
    rc |= run<32, 1, 3>("m64n256k16, two taking turns", iters, turn, sms, sink);
  rc |= run<16, 1, 1>("m64n128k16, one warpgroup", iters, 1, sms, sink);
  rc |= run<16, 1, 2>("m64n128k16, two warpgroups together", iters, 1, sms, sink);
  return rc;
}
