// mok-gpu-probe: measures on one GPU the SM-side and signaling parameters the simulator
// (simulator/topologies/*.json) otherwise assumes: per-SM copy rate against bytes in flight,
// one SM's load-only and store-only rate from L2 (its issue rate), the service time of atomics
// on one hot address, the cost of a release fence with stores pending, and the one-way latency
// of a flag between two SMs. Local memory by default: on a one-GPU machine nothing crosses
// NVLink, so these are the issuing side's figures, not the wire's. With --peer D (a machine with
// several GPUs) it also measures against device D's memory across NVLink: one SM's remote load and
// store rate against bytes in flight, every SM pushing and pulling, and the flag hand-off.
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

// The same hand-off between two GPUs: one block on each, the flag in the peer GPU's memory (`role`
// 0 runs on this GPU and polls across NVLink, role 1 on the peer polls its own memory); role 0
// records the total time.
// The clock starts just before role 0's first store (value 1), so the peer kernel's start-up is not
// counted: the time covers the 2 x rounds hand-offs of values 1 .. 2 x rounds. A poll that sees nothing for 2 s traps (the host then
// reports a CUDA error instead of hanging).
__device__ __forceinline__ void poll_until(volatile unsigned int* flag, unsigned int value) {
  unsigned long long t0 = 0, t;
  for (unsigned int polls = 1; *flag != value; ++polls)
    if ((polls & 4095) == 0) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t0 == 0)
        t0 = t;
      else if (t - t0 > 2000000000ull)
        __trap();
    }
}
__global__ void pingpong_role_kernel(volatile unsigned int* flag, int rounds, int role, unsigned long long* ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = 0, t1 = 0;
  for (int r = 0; r < rounds; ++r) {
    const unsigned int mine = 2 * r + role;
    poll_until(flag, mine);
    __threadfence_system();
    if (role == 0 && r == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    *flag = mine + 1;
  }
  if (role == 0) {
    poll_until(flag, 2u * rounds);
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
  int peer = -1;
  app.add_option("--peer", peer,
                 "also measure across NVLink against this CUDA device (1 to 63; needs peer access from device 0): one "
                 "SM's remote load-only and store-only rate against bytes in flight (the simulator's "
                 "sm_*_inflight_bytes and issue rates), every SM pushing to and pulling from it, and the flag hand-off "
                 "between the two GPUs")
      ->check(CLI::Range(1, 63));
  app.add_flag("--json", json, "one JSON object on stdout");
  if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "mok-gpu-probe: no usable CUDA device\n");
    return 3;
  }
  if (peer >= 0) {
    int can = 0;
    if (peer >= n_dev || cudaDeviceCanAccessPeer(&can, 0, peer) != cudaSuccess || !can) {
      std::fprintf(stderr, "mok-gpu-probe: --peer %d: this machine has %d CUDA device(s) and device 0 %s; run it on a "
                   "machine with several GPUs joined by NVLink, or leave --peer out\n",
                   peer, n_dev, peer >= n_dev ? "has no such peer" : "cannot access it as a peer");
      return 3;
    }
  }
  CK(cudaSetDevice(0));
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
  // Median milliseconds of `reps` launches after one untimed, each between two events.
  auto timed_ms = [&](auto launch) {
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      CK(cudaEventRecord(a));
      launch();
      CK(cudaGetLastError());
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      if (r > 0) t.push_back(time_ms(a, b));
    }
    return median(t);
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
      const double ms = timed_ms([&] {
        switch (inflight) {
          case 1: copy_kernel<1><<<blocks, 256>>>(src, dst, n); break;
          case 2: copy_kernel<2><<<blocks, 256>>>(src, dst, n); break;
          case 4: copy_kernel<4><<<blocks, 256>>>(src, dst, n); break;
          default: copy_kernel<8><<<blocks, 256>>>(src, dst, n); break;
        }
      });
      const double gbps = 2.0 * n * 16 / (ms * 1e-3) / 1e9;  // read + write
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
  // One block streaming `passes` times over n 16-byte words of buf, loads only then stores only,
  // with 8 and 32 warps and 1 / 4 / 8 accesses in flight per lane (the local rows from L2 here,
  // the remote rows of --peer below).
  auto issue_sweep = [&](uint4* buf, int64_t n_words, int passes, uint4* sink) {
    std::vector<IssueRow> rows;
    for (int store = 0; store < 2; ++store)
      for (int warps : {8, 32})
        for (int inflight : {1, 4, 8}) {
          const int threads = warps * 32;
          const double ms = timed_ms([&] {
            if (store) {
              switch (inflight) {
                case 1: store_only_kernel<1><<<1, threads>>>(buf, n_words, passes); break;
                case 4: store_only_kernel<4><<<1, threads>>>(buf, n_words, passes); break;
                default: store_only_kernel<8><<<1, threads>>>(buf, n_words, passes); break;
              }
            } else {
              switch (inflight) {
                case 1: load_only_kernel<1><<<1, threads>>>(buf, n_words, passes, sink); break;
                case 4: load_only_kernel<4><<<1, threads>>>(buf, n_words, passes, sink); break;
                default: load_only_kernel<8><<<1, threads>>>(buf, n_words, passes, sink); break;
              }
            }
          });
          rows.push_back({store ? "store" : "load", warps, inflight, double(passes) * n_words * 16 / (ms * 1e-3) / 1e9});
        }
    return rows;
  };
  std::vector<IssueRow> issue_rows;
  {
    const int64_t n_l2 = int64_t{4} * 1024 * 1024 / 16;
    uint4 *buf = nullptr, *sink = nullptr;
    CK(cudaMalloc(&buf, n_l2 * 16));
    CK(cudaMalloc(&sink, 1024 * 16));
    CK(cudaMemset(buf, 3, n_l2 * 16));
    issue_rows = issue_sweep(buf, n_l2, 16, sink);
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

  // 5. Across NVLink (--peer): the buffers live on the peer, the SMs of device 0 reach them.
  struct PeerCopyRow {
    const char* dir;
    int blocks;
    double gbps;
  };
  std::vector<IssueRow> peer_issue;
  std::vector<PeerCopyRow> peer_copy;
  double peer_flag_ns = 0;
  int peer_rank = -1;  // the driver's relative performance rank of the link (NVLink above PCIe)
  if (peer >= 0) {
    CK(cudaDeviceEnablePeerAccess(peer, 0));
    CK(cudaDeviceGetP2PAttribute(&peer_rank, cudaDevP2PAttrPerformanceRank, 0, peer));
    const int64_t n_l2 = int64_t{4} * 1024 * 1024 / 16, n_big = int64_t{256} * 1024 * 1024 / 16;
    uint4 *remote = nullptr, *remote_big = nullptr, *local_big = nullptr, *sink = nullptr;
    unsigned int* rflag = nullptr;
    CK(cudaSetDevice(peer));
    CK(cudaMalloc(&remote, n_l2 * 16));
    CK(cudaMalloc(&remote_big, n_big * 16));
    CK(cudaMalloc(&rflag, 4));
    CK(cudaMemset(remote, 5, n_l2 * 16));
    CK(cudaMemset(remote_big, 6, n_big * 16));
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&local_big, n_big * 16));
    CK(cudaMalloc(&sink, 1024 * 16));
    CK(cudaMemset(local_big, 7, n_big * 16));
    // One SM alone against the peer's memory: rate against bytes in flight (warps x 32 x 16 x in flight).
    peer_issue = issue_sweep(remote, n_l2, 4, sink);
    // Every SM pushing to the peer (local source, remote destination) and pulling from it.
    for (int pull = 0; pull < 2; ++pull)
      for (int blocks : {1, 16, 32, sms}) {
        const double ms = timed_ms([&] {
          if (pull)
            copy_kernel<4><<<blocks, 256>>>(remote_big, local_big, n_big);
          else
            copy_kernel<4><<<blocks, 256>>>(local_big, remote_big, n_big);
        });
        peer_copy.push_back({pull ? "pull" : "push", blocks, double(n_big) * 16 / (ms * 1e-3) / 1e9});
      }
    // Flag hand-off between the GPUs, the flag in the peer's memory.
    unsigned long long* pns = nullptr;
    CK(cudaMalloc(&pns, 8));
    std::vector<double> tf;
    const int rounds = 1000;
    for (int r = 0; r < reps; ++r) {
      CK(cudaSetDevice(peer));
      CK(cudaMemset(rflag, 0, 4));
      CK(cudaDeviceSynchronize());
      pingpong_role_kernel<<<1, 32>>>(rflag, rounds, 1, nullptr);
      CK(cudaGetLastError());
      CK(cudaSetDevice(0));
      pingpong_role_kernel<<<1, 32>>>(rflag, rounds, 0, pns);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(peer));
      CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(0));
      unsigned long long h = 0;
      CK(cudaMemcpy(&h, pns, 8, cudaMemcpyDeviceToHost));
      tf.push_back(double(h) / (2.0 * rounds));
    }
    peer_flag_ns = median(tf);
    for (void* q : {static_cast<void*>(local_big), static_cast<void*>(sink), static_cast<void*>(pns)}) CK(cudaFree(q));
    CK(cudaSetDevice(peer));
    for (void* q : {static_cast<void*>(remote), static_cast<void*>(remote_big), static_cast<void*>(rflag)}) CK(cudaFree(q));
    CK(cudaSetDevice(0));
  }

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
    std::printf("}, \"flag_one_way_ns\": %.1f", flag_ns);
    if (peer >= 0) {
      std::printf(", \"peer\": {\"device\": %d, \"link_performance_rank\": %d, \"one_sm\": [", peer, peer_rank);
      for (size_t i = 0; i < peer_issue.size(); ++i)
        std::printf("%s{\"op\": \"%s\", \"warps\": %d, \"inflight_per_lane\": %d, \"inflight_bytes\": %d, "
                    "\"gbps\": %.2f}",
                    i ? ", " : "", peer_issue[i].op, peer_issue[i].warps, peer_issue[i].inflight,
                    peer_issue[i].warps * 32 * 16 * peer_issue[i].inflight, peer_issue[i].gbps);
      std::printf("], \"copy\": [");
      for (size_t i = 0; i < peer_copy.size(); ++i)
        std::printf("%s{\"dir\": \"%s\", \"blocks\": %d, \"gbps\": %.1f}", i ? ", " : "", peer_copy[i].dir,
                    peer_copy[i].blocks, peer_copy[i].gbps);
      std::printf("], \"flag_one_way_ns\": %.1f}", peer_flag_ns);
    }
    std::printf("}\n");
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
  if (peer >= 0) {
    std::printf("across the peer link to device %d (P2P performance rank %d; NVLink on the machines this is for), one SM "
                "alone, 4 MiB in the peer's memory (its L2): op  warps  in flight/lane  bytes in flight  GB/s\n",
                peer, peer_rank);
    for (const auto& r : peer_issue)
      std::printf("      %5s %6d %15d %16d %6.2f\n", r.op, r.warps, r.inflight, r.warps * 32 * 16 * r.inflight, r.gbps);
    std::printf("across NVLink, 256 MiB, blocks of 8 warps with 4 loads in flight per lane: dir  blocks  GB/s one way\n");
    for (const auto& r : peer_copy) std::printf("      %4s %7d %8.1f\n", r.dir, r.blocks, r.gbps);
    std::printf("flag hand-off between the two GPUs (flag in the peer's memory): %.0f ns one way\n", peer_flag_ns);
  }
  return 0;
}
