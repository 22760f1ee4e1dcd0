// Fixed-partition parallel-for used by the emulator and oracle (both cores of a CI machine).
#include "mok/reference/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
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
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (;;) {
        const int64_t c = next.fetch_add(1);
        if (c >= num_chunks) break;
        body(c * grain, std::min(n, (c + 1) * grain));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(num_chunks);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mok::ref
