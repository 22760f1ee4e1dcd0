// mok-recip-probe: the device's division-free reciprocal (spec::frcp_ge1, the sigmoid's 1 / b)
// against the IEEE reciprocal for every fp32 b in [1, +Inf] on the GPU present, then the
// device's exp/sigmoid/silu/silu' against the host's (the spec's definitions) on 2^24 inputs
// spread over [-110, 100] and 2^22 random bit patterns; and the SwiGLU forms without range tests
// (the forward epilogue's) against the general ones for every |x| <= 87. Exit 0: identical bits everywhere;
// 1: a difference (the first ones printed); 3: no GPU.
#include "mok/cuda_check.hpp"
#include "mok/spec/math.hpp"

#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr uint32_t kOne = 0x3F800000u, kInf = 0x7F800000u;

__global__ void recip_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t n = uint64_t{kInf} - kOne + 1;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = kOne + static_cast<uint32_t>(i);
    const float b = __uint_as_float(bits);
    if (__float_as_uint(mok::spec::frcp_ge1(b)) != __float_as_uint(__frcp_rn(b))) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, bits);
    }
  }
}

// The forms without range tests (spec::silu_and_grad_f32_normal, exp_f32_normal) against the
// general ones for every fp32 x with |x| <= 87 (spec::silu_normal_range), both signs.
constexpr uint32_t kNormalLimit = 0x42AE0000u;  // 87.0f
__global__ void normal_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t n = 2 * (uint64_t{kNormalLimit} + 1);
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i >> 1) | (static_cast<uint32_t>(i & 1) << 31);
    const float x = __uint_as_float(bits);
    const mok::spec::SiluPair a = mok::spec::silu_and_grad_f32_normal(x), b = mok::spec::silu_and_grad_f32(x);
    if (!mok::spec::silu_normal_range(x) || __float_as_uint(a.silu) != __float_as_uint(b.silu) ||
        __float_as_uint(a.grad) != __float_as_uint(b.grad) ||
        __float_as_uint(mok::spec::exp_f32_normal(-x)) != __float_as_uint(mok::spec::exp_f32(-x))) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, bits);
    }
  }
}

struct Out {
  float exp, sigmoid, silu, grad;
};

__global__ void math_kernel(const float* x, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const mok::spec::SiluPair p = mok::spec::silu_and_grad_f32(x[i]);
    out[i] = {mok::spec::exp_f32(x[i]), mok::spec::sigmoid_f32(x[i]), p.silu, p.grad};
  }
}

bool same(float a, float b) {  // NaN payloads may differ between host and device
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}

#define CK(x) MOK_CUDA_OR_EXIT("mok-recip-probe", x)

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("mok-recip-probe: no CUDA device; skipped\n");
    return 3;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int fails = 0;

  unsigned long long* mism = nullptr;
  uint32_t* first = nullptr;
  CK(cudaMalloc(&mism, sizeof(*mism)));
  CK(cudaMalloc(&first, sizeof(*first)));
  CK(cudaMemset(mism, 0, sizeof(*mism)));
  CK(cudaMemset(first, 0xFF, sizeof(*first)));
  recip_kernel<<<prop.multiProcessorCount * 8, 256>>>(mism, first);
  CK(cudaGetLastError());
  unsigned long long m = 0;
  uint32_t f = 0;
  CK(cudaMemcpy(&m, mism, sizeof(m), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&f, first, sizeof(f), cudaMemcpyDeviceToHost));
  std::printf("frcp_ge1 vs IEEE reciprocal, every b in [1, +Inf] (%" PRIu64 " values) on %s (sm_%d%d): %llu differ\n",
              uint64_t{kInf} - kOne + 1, prop.name, prop.major, prop.minor, m);
  if (m) {
    std::printf("  first differing b: bits 0x%08X\n", f);
    fails = 1;
  }

  CK(cudaMemset(mism, 0, sizeof(*mism)));
  CK(cudaMemset(first, 0xFF, sizeof(*first)));
  normal_kernel<<<prop.multiProcessorCount * 8, 256>>>(mism, first);
  CK(cudaGetLastError());
  CK(cudaMemcpy(&m, mism, sizeof(m), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&f, first, sizeof(f), cudaMemcpyDeviceToHost));
  std::printf("silu_and_grad_f32_normal and exp_f32_normal vs the general forms, every |x| <= 87 (%" PRIu64
              " values): %llu differ\n",
              2 * (uint64_t{kNormalLimit} + 1), m);
  if (m) {
    std::printf("  first differing x: bits 0x%08X\n", f);
    fails = 1;
  }

  // Device math against the host's, same definitions.
  std::vector<float> x;
  const int64_t spread = int64_t{1} << 24, random = int64_t{1} << 22;
  for (int64_t i = 0; i < spread; ++i) x.push_back(-110.0f + 210.0f * static_cast<float>(i) / static_cast<float>(spread));
  std::mt19937 rng(20261203);
  for (int64_t i = 0; i < random; ++i) {
    const uint32_t bits = rng();
    float v;
    std::memcpy(&v, &bits, 4);
    x.push_back(v);
  }
  for (float v : {0.0f, -0.0f, 88.72283935546875f, -88.72283935546875f, -87.33654f, -104.0f, 104.0f,
                  __builtin_inff(), -__builtin_inff()})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  float* dx = nullptr;
  Out* dout = nullptr;
  CK(cudaMalloc(&dx, n * sizeof(float)));
  CK(cudaMalloc(&dout, n * sizeof(Out)));
  CK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  math_kernel<<<prop.multiProcessorCount * 8, 256>>>(dx, dout, n);
  CK(cudaGetLastError());
  std::vector<Out> got(n);
  CK(cudaMemcpy(got.data(), dout, n * sizeof(Out), cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const mok::spec::SiluPair p = mok::spec::silu_and_grad_f32(x[i]);
    const Out want{mok::spec::exp_f32(x[i]), mok::spec::sigmoid_f32(x[i]), p.silu, p.grad};
    if (!same(got[i].exp, want.exp) || !same(got[i].sigmoid, want.sigmoid) || !same(got[i].silu, want.silu) ||
        !same(got[i].grad, want.grad)) {
      if (bad++ < 5)
        std::printf("  x=%a: device exp %a sigmoid %a silu %a silu' %a, host %a %a %a %a\n", x[i], got[i].exp,
                    got[i].sigmoid, got[i].silu, got[i].grad, want.exp, want.sigmoid, want.silu, want.grad);
    }
  }
  std::printf("device vs host exp, sigmoid, silu, silu' on %" PRId64 " inputs: %" PRId64 " differ\n", n, bad);
  if (bad) fails = 1;
  cudaFree(mism);
  cudaFree(first);
  cudaFree(dx);
  cudaFree(dout);
  std::printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails;
}
