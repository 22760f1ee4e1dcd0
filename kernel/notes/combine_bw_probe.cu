// Scratch diagnostic (thirteenth session; modes 3-17 added in the fourteenth): what rate does a combine-shaped kernel reach on its own, and which of the layer's choices costs what?
#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ __forceinline__ float bf(uint32_t u, int hi) { return __uint_as_float(hi ? (u & 0xFFFF0000u) : (u << 16)); }
template <int V>
__global__ void __launch_bounds__(256, 1) combine(const uint16_t* __restrict__ slots, const float* __restrict__ init, const float* __restrict__ w,
                        uint16_t* __restrict__ out, int64_t T, int64_t K, int64_t H, int persistent_threads) {
  const int64_t total = T * H;
  const int64_t stride = persistent_threads ? (int64_t)gridDim.x * blockDim.x * 8 : total;
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < total; i += stride) {
    const int64_t t = i / H, h = i % H;
    float acc[8];
    if (init) { float4 a = *(const float4*)(init + i), b = *(const float4*)(init + i + 4);
      acc[0]=a.x;acc[1]=a.y;acc[2]=a.z;acc[3]=a.w;acc[4]=b.x;acc[5]=b.y;acc[6]=b.z;acc[7]=b.w; }
    else for (int v = 0; v < 8; ++v) acc[v] = 0.f;
    uint4 q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = __ldcg((const uint4*)(slots + (t * K + k) * H + h));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float wk = w[t * K + k];
      const uint32_t u[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[v] = fmaf(wk, bf(u[v / 2], v & 1), acc[v]);
    }
    uint32_t o[4];
    for (int j = 0; j < 4; ++j) o[j] = (__float_as_uint(acc[2*j]) >> 16) | (__float_as_uint(acc[2*j+1]) & 0xFFFF0000u);
    *(uint4*)(out + i) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
// The layer's combine before the fourteenth session: routing entries first, slot loads predicated
// on them (two round trips), init as eight 4-byte __ldcg loads, weights read inside the steps.
__global__ void __launch_bounds__(256, 1) combine_old(const uint16_t* slots, const float* init, const float* w, const int32_t* topk,
                        uint16_t* out, int64_t T, int64_t K, int64_t H, int nv) {
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < T * H; i += (int64_t)gridDim.x * blockDim.x * 8) {
    const int64_t t = i / H, h = i % H;
    float acc[8];
    for (int v = 0; v < 8; ++v) acc[v] = init ? __ldcg(&init[i + v]) : 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += 8) {
      bool live[8]; uint4 q[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) live[b] = k0 + b < K && __ldcg(&topk[t * K + k0 + b]) >= 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) if (live[b]) q[b] = __ldcg((const uint4*)(slots + (t * K + k0 + b) * H + h));
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        if (!live[b]) continue;
        const uint32_t u[4] = {q[b].x, q[b].y, q[b].z, q[b].w};
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] = fmaf(w[t * K + k0 + b], bf(u[v / 2], v & 1), acc[v]);
      }
    }
    uint32_t o[4];
    for (int j = 0; j < 4; ++j) o[j] = (__float_as_uint(acc[2*j]) >> 16) | (__float_as_uint(acc[2*j+1]) & 0xFFFF0000u);
    *(uint4*)(out + i) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
// The fourteenth session's form, every load of a batch issued together, none predicated on
// another (modes 5-7 all run combine_var<1, 0, 0>; mode 7 repeats mode 5), and its variants: RT (routing entries and weights) 0 = not read (all live), 1 = __ldcg,
// 2 = __ldg (read-only path, L1); IN (init) 0 = __ldcg, 1 = __ldg, 2 = ld.relaxed.gpu; SL (slots) 0 = __ldcg, 1 = __ldcs.
__device__ __forceinline__ float4 ld_relaxed4(const float* p) {
  float4 r;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
  return r;
}
template <int RT, int IN, int SL, int KC = 0>
__global__ void __launch_bounds__(256, 1) combine_var(const uint16_t* slots, const float* init, const float* w, const int32_t* topk,
                        uint16_t* out, int64_t T, int64_t K_, int64_t H) {
  const int64_t K = KC > 0 ? KC : K_;
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < T * H; i += (int64_t)gridDim.x * blockDim.x * 8) {
    const int64_t t = i / H, h = i % H;
    float acc[8];
    if (init) { float4 a, b;
      if (IN == 0) { a = __ldcg((const float4*)(init + i)); b = __ldcg((const float4*)(init + i + 4)); }
      else if (IN == 1) { a = __ldg((const float4*)(init + i)); b = __ldg((const float4*)(init + i + 4)); }
      else { a = ld_relaxed4(init + i); b = ld_relaxed4(init + i + 4); }
      acc[0]=a.x;acc[1]=a.y;acc[2]=a.z;acc[3]=a.w;acc[4]=b.x;acc[5]=b.y;acc[6]=b.z;acc[7]=b.w; }
    else for (int v = 0; v < 8; ++v) acc[v] = 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += 8) {
      int32_t e[8]; float wk[8]; uint4 q[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        const bool in = k0 + b < K;
        const int64_t s = t * K + k0 + b;
        e[b] = !in ? -1 : RT == 0 ? 0 : RT == 1 ? __ldcg(&topk[s]) : __ldg(&topk[s]);
        wk[b] = !in ? 0.f : RT == 0 ? 0.5f : RT == 1 ? __ldcg(&w[s]) : __ldg(&w[s]);
        if (in) q[b] = SL == 0 ? __ldcg((const uint4*)(slots + s * H + h)) : __ldcs((const uint4*)(slots + s * H + h));
      }
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        if (e[b] < 0) continue;
        const uint32_t u[4] = {q[b].x, q[b].y, q[b].z, q[b].w};
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] = fmaf(wk[b], bf(u[v / 2], v & 1), acc[v]);
      }
    }
    uint32_t o[4];
    for (int j = 0; j < 4; ++j) o[j] = (__float_as_uint(acc[2*j]) >> 16) | (__float_as_uint(acc[2*j+1]) & 0xFFFF0000u);
    *(uint4*)(out + i) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
__global__ void burn(float* sink, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.999f, d = blockIdx.x * 1e-4f;
  for (int i = 0; i < iters; ++i) { a = fmaf(a, b, c); d = fmaf(d, c, b); b = fmaf(b, 0.9999f, 1e-5f); c = fmaf(c, 1.00001f, -1e-6f); }
  if (a + d == 12345.f) sink[0] = a + b + c + d;
}
int main() {
  struct Case { const char* name; int64_t T, K, H; bool init; } cases[] = {{"dsv3", 8192, 8, 7168, true}, {"qwen3", 16384, 8, 2048, false}};
  for (auto c : cases) {
    uint16_t *slots, *out; float *init = nullptr, *w; int32_t* topk;
    CK(cudaMalloc(&slots, c.T * c.K * c.H * 2)); CK(cudaMalloc(&out, c.T * c.H * 2)); CK(cudaMalloc(&w, c.T * c.K * 4)); CK(cudaMalloc(&topk, c.T * c.K * 4)); CK(cudaMemset(topk, 0, c.T * c.K * 4));
    if (c.init) CK(cudaMalloc(&init, c.T * c.H * 4));
    CK(cudaMemset(slots, 0x3c, c.T * c.K * c.H * 2)); CK(cudaMemset(w, 0, c.T * c.K * 4));
    if (c.init) CK(cudaMemset(init, 0, c.T * c.H * 4));
    const double bytes = c.T * c.K * c.H * 2.0 + c.T * c.H * 2.0 + (c.init ? c.T * c.H * 4.0 : 0) + c.T * c.K * 4.0;
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float* sink; CK(cudaMalloc(&sink, 4));
    for (int mode = 0; mode < 18; ++mode) {
      // 0: one thread per 8 columns (full grid, many blocks per SM); 1: 132 blocks x 256, grid-stride (the layer's shape);
      // 2: memcpy of the slot bytes (reference)
      float best = 1e9, times[7];
      for (int r = 0; r < 7; ++r) {
        // dirty the L2 with another buffer's writes, as phase 2 does
        CK(cudaMemsetAsync(slots, 0x3c, c.T * c.K * c.H * 2));
        if (mode == 3 || mode == 6) burn<<<132 * 8, 256>>>(sink, 1000000);
        cudaEventRecord(a);
        if (mode == 0) combine<8><<<(unsigned)(c.T * c.H / 8 / 256), 256>>>(slots, init, w, out, c.T, c.K, c.H, 0);
        else if (mode == 1 || mode == 3) combine<8><<<132, 256>>>(slots, init, w, out, c.T, c.K, c.H, 1);
        else if (mode == 4) combine_old<<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H, 0);
        else if (mode == 5 || mode == 6 || mode == 7) combine_var<1, 0, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 8) combine_var<0, 0, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 9) combine_var<2, 0, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 10) combine_var<1, 1, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 11) combine_var<1, 2, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 12) combine_var<2, 1, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 13) combine_var<2, 0, 1><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 14) combine_var<2, 2, 1><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 15) combine_var<0, 1, 0><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 16) combine_var<2, 0, 0, 8><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else if (mode == 17) combine_var<0, 1, 0, 8><<<132, 256>>>(slots, init, w, topk, out, c.T, c.K, c.H);
        else cudaMemcpyAsync(slots + c.T * c.K * c.H / 2, slots, c.T * c.K * c.H, cudaMemcpyDeviceToDevice);
        cudaEventRecord(b); CK(cudaEventSynchronize(b));
        cudaEventElapsedTime(&times[r], a, b); if (times[r] < best) best = times[r];
      }
      std::sort(times, times + 7);
      const double by = mode == 2 ? c.T * c.K * c.H * 2.0 : bytes;
      printf("%s mode %d (%s): median %.3f ms, %.0f GB/s (bytes %.2f GB)\n", c.name, mode,
             mode == 0 ? "full grid" : mode == 1 ? "132 x 256 persistent" : mode == 3 ? "132 x 256 right after an FMA burn" : mode == 4 ? "the layer's old combine code" : mode == 5 ? "the layer's new combine code" : mode == 6 ? "new combine code right after an FMA burn" : mode == 7 ? "var rt=cg init=cg slots=cg" : mode == 8 ? "var rt=none init=cg slots=cg" : mode == 9 ? "var rt=ldg init=cg slots=cg" : mode == 10 ? "var rt=cg init=ldg slots=cg" : mode == 11 ? "var rt=cg init=relaxed slots=cg" : mode == 12 ? "var rt=ldg init=ldg slots=cg" : mode == 13 ? "var rt=ldg init=cg slots=cs" : mode == 14 ? "var rt=ldg init=relaxed slots=cs" : mode == 15 ? "var rt=none init=ldg slots=cg" : mode == 16 ? "var rt=ldg init=cg slots=cg K=8 fixed (the layer's new form)" : mode == 17 ? "var rt=none init=ldg slots=cg K=8 fixed" : "memcpy of half the slot buffer, read+write",
             times[3], by / times[3] / 1e6, by / 1e9);
    }
    cudaFree(slots); cudaFree(out); cudaFree(w); cudaFree(topk); if (init) cudaFree(init);
  }
  return 0;
}
