// mok::ref::parallel_for: every index runs once on any thread count, and of several errors the
// one from the lowest chunk reaches the caller (the error a serial loop meets first).
#include "mok/reference/parallel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

TEST(ParallelFor, EveryIndexRunsOnce) {
  for (int threads : {1, 2, 3, 8})
    for (int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(1000);
      mok::ref::parallel_for(1000, threads, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      }, grain);
      for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i << " threads " << threads;
    }
}

// Chunk 9 fails at once; chunk 2 fails 50 ms later, so in time chunk 9's error comes first. The
// caller must still see chunk 2's.
TEST(ParallelFor, TheLowestChunksErrorIsRethrown) {
  for (int threads : {1, 2, 4}) {
    try {
      mok::ref::parallel_for(16, threads, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if (i == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            throw std::runtime_error("chunk 2");
          }
          if (i == 9) throw std::runtime_error("chunk 9");
        }
      });
      ADD_FAILURE() << "no error with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk 2") << threads << " threads";
    }
  }
}

}  // namespace
