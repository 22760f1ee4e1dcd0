// A fixed-partition parallel-for over host threads: each index is processed by exactly one thread,
// so results never depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace mok::ref {

// Number of worker threads to use: `requested` when > 0, else the hardware concurrency.
int resolve_threads(int requested);

// Calls body(begin, end) on disjoint contiguous chunks of [0, n), using up to `threads`
// threads. Chunks are claimed dynamically, but every output an index writes belongs to that
// index alone, so the result does not depend on scheduling. An exception ends the loop (chunks
// not yet claimed do not run) and is rethrown once every thread has stopped: of several, the
// one from the lowest chunk, which is the one a serial loop would have met first.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& body,
                  int64_t grain = 1);

}  // namespace mok::ref
