// Bounded waits, the rank barrier and error reporting: every wait ends, with a diagnostic if it must.
#pragma once

#include "mok/kernel/params.hpp"

namespace mok::kernel::device {

__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Profile (LaunchParams::trace): thread 0 of the block records marks and sums; no-ops when off.
__device__ __forceinline__ uint64_t trace_now(const LaunchParams& P) { return P.trace ? global_time_ns() : 0; }
__device__ __forceinline__ void trace_mark(const LaunchParams& P, int slot) {
  if (P.trace && threadIdx.x == 0) P.trace[blockIdx.x * int64_t{kTraceSlots} + slot] = global_time_ns();
}
__device__ __forceinline__ void trace_add(const LaunchParams& P, int slot, uint64_t since) {
  if (P.trace && threadIdx.x == 0) P.trace[blockIdx.x * int64_t{kTraceSlots} + slot] += global_time_ns() - since;
}
// The block's words from slot on (GemmLaps' kLapWords sums), or null when not tracing.
__device__ __forceinline__ uint64_t* trace_words(const LaunchParams& P, int slot) {
  return P.trace ? P.trace + blockIdx.x * int64_t{kTraceSlots} + slot : nullptr;
}
__device__ __forceinline__ void trace_count(const LaunchParams& P, int slot) {
  if (P.trace && threadIdx.x == 0) P.trace[blockIdx.x * int64_t{kTraceSlots} + slot] += 1;
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}

// Orders this thread's ordinary global-memory accesses with later bulk-tensor (TMA) accesses,
// which go through the async proxy. A no-op before sm_90.
__device__ __forceinline__ void async_proxy_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// Release / acquire fences of the signals that cross ranks: GPU scope on one GPU (the virtual
// rack), system scope when the peers are other GPUs (the NCCL transport with several GPUs).
__device__ __forceinline__ void publish_fence(const LaunchParams& P) {
  if (P.system_scope)
    __threadfence_system();
  else
    __threadfence();
}
__device__ __forceinline__ void acquire_fence(const LaunchParams& P) { publish_fence(P); }

// Records the first error of the launch and tells every block to stop.
__device__ inline void raise_error(const LaunchParams& P, uint32_t code, int rank, int flag, uint64_t expected,
                                   uint64_t observed, int64_t index) {
  if (atomicCAS(&P.error->code, 0u, code) == 0u) {
    P.error->rank = rank;
    P.error->flag = flag;
    P.error->block = static_cast<int32_t>(blockIdx.x);
    P.error->expected = expected;
    P.error->observed = observed;
    P.error->index = index;
    __threadfence();
  }
  atomicExch(P.abort, 1u);
}

// One thread waits until *p >= target (a counter or an epoch flag), at most P.timeout_ns.
// Returns false when the launch is aborting (this wait timed out, or another did).
__device__ inline bool wait_at_least(const LaunchParams& P, const uint32_t* p, uint32_t target, int rank, int flag,
                                     int64_t index) {
  uint32_t seen = load_volatile(p);
  if (seen >= target) {
    acquire_fence(P);  // acquire on the fast path too
    return true;
  }
  const uint64_t start = global_time_ns();
  for (;;) {
    seen = load_volatile(p);
    if (seen >= target) {
      acquire_fence(P);
      return true;
    }
    if (load_volatile(P.abort)) return false;
    if (global_time_ns() - start > P.timeout_ns) {
      raise_error(P, 1, rank, flag, target, seen, index);
      return false;
    }
    __nanosleep(128);
  }
}

// Block-wide: thread 0 waits, everyone learns the outcome. All threads must call it.
__device__ inline bool block_wait(const LaunchParams& P, const uint32_t* p, uint32_t target, int rank, int flag,
                                  int64_t index) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) ok = wait_at_least(P, p, target, rank, flag, index) ? 1 : 0;
  __syncthreads();
  return ok != 0;
}

// Windowed transports (NCCL, the split rack: one launch per rank): a rank's inputs sit in its
// window and its peers read them and push into it. Before the launch, a staging kernel on the
// rank's stream (windowed.cu) waits until every rank has entered the previous pass, then copies
// the rank's inputs into this pass's copy and resets its arrival counters. On entering, the rank's
// first block sets its own pass word to pass_seq (a system-scope atomic when the peers are other
// GPUs) and waits until every rank's word has reached it, reading each over NVLink; the rank's
// other blocks wait for that block's local flag (counters[7]), not for the peers' words. So a rank
// in pass n has seen every rank enter pass n - 1, hence finish pass n - 2, and the window keeps
// two copies of each input, by parity: a copy for pass n never overwrites one a peer still reads.
// A rank with an error pending (an earlier pass failed, or this pass's staging timed out, and
// check_errors() has not run) does not enter: its peers then time out naming it, instead of
// reading a window it did not refill or pushing into one it has left. A rank that never enters
// ends its peers' waits in the timeout's diagnostic. No-op on the virtual rack (every rank in one
// launch, ordered by its stream).
__device__ inline bool enter_pass(const LaunchParams& P, bool first_block) {
  if (!P.pass_entry) return true;
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* entered = &P.state[P.first_rank].counters[7];  // zeroed before every launch
    if (first_block) {
      ok = load_volatile(&P.error->code) == 0u ? 1 : 0;
      if (ok) {
        publish_fence(P);
        uint32_t* word = P.peers[P.first_rank].pass_word;
        if (P.system_scope)
          atomicMax_system(word, P.pass_seq);
        else
          atomicMax(word, P.pass_seq);
      }
      // ORDER: ranks ascending, so that a missing rank is reported the same way every time.
      for (int p = 0; p < P.num_ranks && ok && P.pass_entry == 1; ++p)
        ok = wait_at_least(P, P.peers[p].pass_word, P.pass_seq, p, kFlagPassEntry, p) ? 1 : 0;
      if (ok) {
        __threadfence();
        atomicExch(entered, 1u);
      } else {
        atomicExch(P.abort, 1u);  // the rank's other blocks stop waiting (a timeout has said so already)
      }
    } else {
      // Ends with the first block's own bounded wait (in `entered` or the abort word); bounded here
      // too, at twice the timeout, for a first block that never became resident.
      const uint64_t start = global_time_ns();
      for (;;) {
        if (load_volatile(entered) != 0u) {
          acquire_fence(P);
          ok = 1;
          break;
        }
        if (load_volatile(P.abort) != 0u) {
          ok = 0;
          break;
        }
        if (global_time_ns() - start > 2 * P.timeout_ns) {
          raise_error(P, 1, P.first_rank, kFlagPassEntry, P.pass_seq, 0, P.first_rank);
          ok = 0;
          break;
        }
        __nanosleep(128);
      }
    }
  }
  __syncthreads();
  if (ok && P.stall_ns) {  // tests only (SplitRackOptions::stall_us): the rank reads its peers' windows late
    if (threadIdx.x == 0) {
      const uint64_t start = global_time_ns();
      while (global_time_ns() - start < P.stall_ns) __nanosleep(1000);
    }
    __syncthreads();
  }
  return ok != 0;
}

// Barrier over the blocks of one rank (count in counters[0], generation in counters[1]).
__device__ inline bool rank_barrier(const LaunchParams& P, int rank) {
  uint32_t* counters = P.state[rank].counters;
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = 1;
    const uint32_t gen = load_volatile(&counters[1]);
    __threadfence();
    const int blocks = rank_block_count(rank - P.first_rank, P.blocks_per_rank, P.wide_ranks);
    if (atomicAdd(&counters[0], 1u) == static_cast<uint32_t>(blocks) - 1) {
      atomicExch(&counters[0], 0u);
      __threadfence();
      atomicAdd(&counters[1], 1u);
    } else {
      ok = wait_at_least(P, &counters[1], gen + 1, rank, kFlagRankBarrier, -1) ? 1 : 0;
    }
  }
  __syncthreads();
  return ok != 0;
}

// Every thread fences its own writes, then one thread publishes `amount` to a peer's counter.
__device__ inline void publish(uint32_t* counter, uint32_t amount) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && amount) atomicAdd(counter, amount);
}

}  // namespace mok::kernel::device
