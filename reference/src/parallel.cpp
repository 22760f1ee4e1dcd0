// Chunked parallel-for (the threads claim chunks in order) used by the emulator, the oracle and
// the simulator's workload generator (both cores of a CI machine).
#include "mok/reference/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace mok::ref {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& body,
                  int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t num_chunks = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::min<int64_t>(resolve_threads(threads), num_chunks));
  if (workers <= 1) {
    body(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  int64_t error_chunk = num_chunks;
  std::mutex error_mutex;
  // Chunks are claimed in increasing order, so when chunk c fails every chunk below c has been
  // claimed and runs to its end: keeping the failed chunk with the smallest index rethrows the
  // error a serial loop would have met first, whatever the timing.
  auto work = [&] {
    int64_t c = 0;
    try {
      for (;;) {
        c = next.fetch_add(1);
        if (c >= num_chunks) break;
        body(c * grain, std::min(n, (c + 1) * grain));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (c < error_chunk) {
        error = std::current_exception();
        error_chunk = c;
      }
      next.store(num_chunks);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  for (int t = 1; t < workers; ++t) {
    // A thread the system refuses (std::system_error) is one worker fewer, not an error: the
    // chunks are claimed by whoever runs, and the threads already started are joined below.
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mok::ref
