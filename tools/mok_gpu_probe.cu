// mok-gpu-probe: measures on one GPU the SM-side and signaling parameters the simulator
// (simulator/topologies/*.json) otherwise assumes: per-SM copy rate against bytes in flight,
// one SM's load-only and store-only rate from L2 (its issue rate), the service time of atomics
// on one hot address, the cost of a release fence with stores pending, and the one-way latency
// of a flag between two SMs. Local memory only: on a one-GPU
// machine nothing crosses NVLink, so these are the issuing side's figures, not the wire's.
// Prints a table (or --json); exit 3 without a GPU.
#include "mok/cli.hpp"
#include "mok/cuda_check.hpp"
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

#define CK(x) MOK_CUDA_OR_EXIT("mok-gpu-probe", x)

// Each warp copies 16 bytes per lane per access, `kInflight` independent loads issued before
// their stores; blocks stride over the buffer. Bytes in flight per SM = warps x 32 x 16 x kInflight.
template <int kInflight>
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  const int64_t lanes = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += lanes * kInflight) {
    uint4 v[kInflight];
#pragma unroll
    for (int u = 0; u < kInflight; ++u)
      if (i + u * lanes < n) v[u] = src[i + u * lanes];
#pragma unroll
    for (int u = 0; u < kInflight; ++u)
      if (i + u * lanes < n) dst[i + u * lanes] = v[u];
  }
}

// One block streams `passes` times over an L2-resident buffer with loads only (folded into a
// register that goes to `sink`, so the loads stay) or stores only: the SM's own issue rate, the
// ceiling the simulator's gpu.sm_load_gbps / gpu.sm_store_gbps stand for, with the buffer close
// enough that the bytes in flight are not what binds.
template <int kInflight>
__global__ void load_only_kernel(const uint4* __restrict__ src, int64_t n, int passes, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int p = 0; p < passes; ++p)
    for (int64_t i = threadIdx.x; i < n; i += int64_t{blockDim.x} * kInflight) {
      uint4 v[kInflight];
#pragma unroll
      for (int u = 0; u < kInflight; ++u)
        if (i + u * blockDim.x < n) v[u] = src[i + u * blockDim.x];
#pragma unroll
      for (int u = 0; u < kInflight; ++u)
        if (i + u * blockDim.x < n) {
          acc.x ^= v[u].x;
          acc.y ^= v[u].y;
          acc.z ^= v[u].z;
          acc.w ^= v[u].w;
        }
    }
  sink[threadIdx.x] = acc;
}

template <int kInflight>
__global__ void store_only_kernel(uint4* __restrict__ dst, int64_t n, int passes) {
  for (int p = 0; p < passes; ++p) {
    for (int64_t i = threadIdx.x; i < n; i += int64_t{blockDim.x} * kInflight) {
#pragma unroll
      for (int u = 0; u < kInflight; ++u)
        if (i + u * blockDim.x < n) dst[i + u * blockDim.x] = make_uint4(p, u, 0, 1);
    }
    asm volatile("" ::: "memory");  // each pass's stores stay: none is folded into the next pass's
  }
}

__global__ void hot_atomic_kernel(unsigned int* counter, int per_thread) {
  for (int i = 0; i < per_thread; ++i) atomicAdd(counter, 1u);
}

// One thread stores `pending` 4-byte words (distinct 128-byte lines), then times a
// __threadfence(); repeated, the minimum and median go back.
__global__ void fence_kernel(unsigned int* lines, int pending, int reps, long long* cycles) {
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i < pending; ++i) lines[i * 32] = r + i;
    const long long t0 = clock64();
    __threadfence();
    const long long t1 = clock64();
    cycles[r] = t1 - t0;
  }
}

// Two blocks (on different SMs) pass a flag back and forth `rounds` times through global memory
// (volatile polls, release stores); block 0 records the total time.
__global__ void pingpong_kernel(volatile unsigned int* flag, int rounds, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0, t1 = 0;
  if (blockIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int r = 0; r < rounds; ++r) {
    const unsigned int mine = 2 * r + blockIdx.x;  // block 0 writes even values, block 1 odd
    while (*flag != mine) {
    }
    __threadfence();
    *flag = mine + 1;
  }
  if (blockIdx.x == 0) {
    while (*flag != 2u * rounds) {
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    *ns = t1 - t0;
  }
}

float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mok-gpu-probe: the issuing-side parameters of the simulator measured on this GPU (local memory):\n"
               "per-SM copy rate vs bytes in flight, one SM's load and store issue rate from L2, hot-address atomic\n"
               "service time, fence cost, flag latency\n\n"
               "  mok-gpu-probe --json > probe.json\n"
               "  mok-gpu-probe --mib 256 --reps 9\n\n"
               "Exit codes: 0 measured, 1 a CUDA failure, 2 bad usage, 3 no usable GPU here.",
               "mok-gpu-probe"};
  int64_t mib = 1024;
  int reps = 5;
  bool json = false;
  app.add_option("--mib", mib, "copy buffer size in MiB (read and written once per repetition; 16 to 65536)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{65536}));
  app.add_option("--reps", reps, "repetitions per figure (median reported; 1 to 1000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "one JSON object on stdout");
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "mok-gpu-probe: no usable CUDA device\n");
    return 3;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };

  // 1. Copy rate per SM against SMs and bytes in flight (8 warps per block, one block per SM).
  const int64_t n = mib * 1024 * 1024 / 16;
  uint4 *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, n * 16));
  CK(cudaMalloc(&dst, n * 16));
  CK(cudaMemset(src, 1, n * 16));
  struct CopyRow {
    int blocks, inflight;
    double gbps_total, gbps_per_sm;
    int64_t inflight_bytes;
  };
  std::vector<CopyRow> copy_rows;
  for (int blocks : {1, 4, 16, sms})
    for (int inflight : {1, 2, 4, 8}) {
      std::vector<double> t;
      for (int r = 0; r < reps + 1; ++r) {
        CK(cudaEventRecord(a));
        switch (inflight) {
          case 1: copy_kernel<1><<<blocks, 256>>>(src, dst, n); break;
          case 2: copy_kernel<2><<<blocks, 256>>>(src, dst, n); break;
          case 4: copy_kernel<4><<<blocks, 256>>>(src, dst, n); break;
          default: copy_kernel<8><<<blocks, 256>>>(src, dst, n); break;
        }
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        if (r > 0) t.push_back(time_ms(a, b));
      }
      const double gbps = 2.0 * n * 16 / (median(t) * 1e-3) / 1e9;  // read + write
      copy_rows.push_back({blocks, inflight, gbps, gbps / blocks, int64_t{8} * 32 * 16 * inflight});
    }
  CK(cudaFree(src));
  CK(cudaFree(dst));

  // 1b. One SM alone, loads only and stores only, over a 4 MiB buffer that stays in L2.
  struct IssueRow {
    const char* op;
    int warps, inflight;
    double gbps;
  };
  std::vector<IssueRow> issue_rows;
  {
    const int64_t n_l2 = int64_t{4} * 1024 * 1024 / 16;
    const int passes = 16;
    uint4 *buf = nullptr, *sink = nullptr;
    CK(cudaMalloc(&buf, n_l2 * 16));
    CK(cudaMalloc(&sink, 1024 * 16));
    CK(cudaMemset(buf, 3, n_l2 * 16));
    for (int store = 0; store < 2; ++store)
      for (int warps : {8, 32})
        for (int inflight : {1, 4, 8}) {
          std::vector<double> t;
          for (int r = 0; r < reps + 1; ++r) {
            CK(cudaEventRecord(a));
            const int threads = warps * 32;
            if (store) {
              switch (inflight) {
                case 1: store_only_kernel<1><<<1, threads>>>(buf, n_l2, passes); break;
                case 4: store_only_kernel<4><<<1, threads>>>(buf, n_l2, passes); break;
                default: store_only_kernel<8><<<1, threads>>>(buf, n_l2, passes); break;
              }
            } else {
              switch (inflight) {
                case 1: load_only_kernel<1><<<1, threads>>>(buf, n_l2, passes, sink); break;
                case 4: load_only_kernel<4><<<1, threads>>>(buf, n_l2, passes, sink); break;
                default: load_only_kernel<8><<<1, threads>>>(buf, n_l2, passes, sink); break;
              }
            }
            CK(cudaGetLastError());
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            if (r > 0) t.push_back(time_ms(a, b));
          }
          const double gbps = double(passes) * n_l2 * 16 / (median(t) * 1e-3) / 1e9;
          issue_rows.push_back({store ? "store" : "load", warps, inflight, gbps});
        }
    CK(cudaFree(buf));
    CK(cudaFree(sink));
  }

  // 2. Atomics on one address from every SM: service time per atomic.
  unsigned int* counter = nullptr;
  CK(cudaMalloc(&counter, 4));
  const int per_thread = 64;
  std::vector<double> ta;
  for (int r = 0; r < reps + 1; ++r) {
    CK(cudaMemset(counter, 0, 4));
    CK(cudaEventRecord(a));
    hot_atomic_kernel<<<sms, 256>>>(counter, per_thread);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    if (r > 0) ta.push_back(time_ms(a, b));
  }
  const double atomics = double(sms) * 256 * per_thread;
  const double atomic_ns = median(ta) * 1e6 / atomics;

  // 3. Fence cost with 0, 8 and 64 stores pending (cycles -> ns at the measured SM clock).
  unsigned int* lines = nullptr;
  long long* cycles = nullptr;
  const int freps = 64;
  CK(cudaMalloc(&lines, 64 * 128));
  CK(cudaMalloc(&cycles, freps * sizeof(long long)));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  struct FenceRow {
    int pending;
    double ns;
  };
  std::vector<FenceRow> fence_rows;
  for (int pending : {0, 8, 64}) {
    fence_kernel<<<1, 1>>>(lines, pending, freps, cycles);
    CK(cudaDeviceSynchronize());
    std::vector<long long> c(freps);
    CK(cudaMemcpy(c.data(), cycles, freps * sizeof(long long), cudaMemcpyDeviceToHost));
    std::vector<double> cd(c.begin() + 4, c.end());  // the first few warm the lines
    fence_rows.push_back({pending, median(cd) / (clock_khz * 1e-6)});
  }

  // 4. Flag one-way latency between two SMs.
  unsigned int* flag = nullptr;
  unsigned long long* ns = nullptr;
  CK(cudaMalloc(&flag, 4));
  CK(cudaMalloc(&ns, 8));
  const int rounds = 2000;
  std::vector<double> tp;
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemset(flag, 0, 4));
    pingpong_kernel<<<2, 32>>>(flag, rounds, ns);
    CK(cudaDeviceSynchronize());
    unsigned long long h = 0;
    CK(cudaMemcpy(&h, ns, 8, cudaMemcpyDeviceToHost));
    tp.push_back(double(h) / (2.0 * rounds));
  }
  const double flag_ns = median(tp);

  if (json) {
    std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"copy\": [", prop.name, sms);
    for (size_t i = 0; i < copy_rows.size(); ++i)
      std::printf("%s{\"blocks\": %d, \"inflight_per_lane\": %d, \"inflight_bytes_per_sm\": %lld, \"gbps\": %.1f, "
                  "\"gbps_per_sm\": %.2f}",
                  i ? ", " : "", copy_rows[i].blocks, copy_rows[i].inflight,
                  static_cast<long long>(copy_rows[i].inflight_bytes), copy_rows[i].gbps_total,
                  copy_rows[i].gbps_per_sm);
    std::printf("], \"one_sm_l2\": [");
    for (size_t i = 0; i < issue_rows.size(); ++i)
      std::printf("%s{\"op\": \"%s\", \"warps\": %d, \"inflight_per_lane\": %d, \"gbps\": %.1f}", i ? ", " : "",
                  issue_rows[i].op, issue_rows[i].warps, issue_rows[i].inflight, issue_rows[i].gbps);
    std::printf("], \"hot_atomic_ns\": %.3f, \"fence_ns\": {", atomic_ns);
    for (size_t i = 0; i < fence_rows.size(); ++i)
      std::printf("%s\"%d\": %.1f", i ? ", " : "", fence_rows[i].pending, fence_rows[i].ns);
    std::printf("}, \"flag_one_way_ns\": %.1f}\n", flag_ns);
    return 0;
  }
  std::printf("# mok-gpu-probe %s (%d SMs), local memory, median of %d\n", prop.name, sms, reps);
  std::printf("copy: blocks (1 per SM, 8 warps)  loads in flight/lane  bytes in flight/SM  GB/s total  GB/s per SM\n");
  for (const auto& r : copy_rows)
    std::printf("      %4d %20d %19lld %11.1f %12.2f\n", r.blocks, r.inflight, static_cast<long long>(r.inflight_bytes),
                r.gbps_total, r.gbps_per_sm);
  std::printf("one SM alone, 4 MiB buffer in L2 (its issue rate): op  warps  in flight/lane  GB/s\n");
  for (const auto& r : issue_rows) std::printf("      %5s %6d %15d %6.1f\n", r.op, r.warps, r.inflight, r.gbps);
  std::printf("hot-address atomicAdd from %d SMs: %.3f ns per thread-level atomic (the compiler may merge a warp's\n"
              "  same-address atomics into one, so this is not the service time of one remote atomic)\n",
              sms, atomic_ns);
  for (const auto& f : fence_rows)
    std::printf("__threadfence with %2d stores pending: %.0f ns (median of %d)\n", f.pending, f.ns, freps - 4);
  std::printf("flag one-way latency between two SMs (volatile poll, fence, store): %.0f ns\n", flag_ns);
  return 0;
}
