// Internal parts of the engine (mok::sim) that record its diagnostics, in a header so that tests
// can drive them: the distribution of signal latencies, and the critical path's segments.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mok/sim/error.hpp"
#include "mok/sim/layer_sim.hpp"

namespace mok::sim::detail {

[[noreturn]] inline void internal_diagnostic_error(const std::string& what) {
  throw Error("internal: layer engine: " + what + "; please report", ErrorKind::kInternal);
}

// Exact distribution of non-negative integer nanoseconds with bounded memory. A negative value is
// an internal error (a signal latency below 0: a chunk known before its data landed), not 0.
class NsHistogram {
 public:
  void add(int64_t v) {
    if (v < 0) internal_diagnostic_error("a negative signal latency (" + std::to_string(v) + " ns)");
    ++count_;
    sum_ += static_cast<double>(v);
    if (v < kDense) {
      if (dense_.empty()) dense_.assign(kDense, 0);
      ++dense_[v];
    } else {
      overflow_.push_back(v);
    }
  }
  Quantiles summary() {
    Quantiles q;
    q.count = count_;
    if (count_ == 0) return q;
    q.mean_ns = sum_ / static_cast<double>(count_);
    std::sort(overflow_.begin(), overflow_.end());
    auto nth = [&](double p) {
      int64_t rank = static_cast<int64_t>(std::ceil(p * static_cast<double>(count_)));
      rank = std::max<int64_t>(rank, 1);
      int64_t seen = 0;
      if (!dense_.empty())
        for (int64_t v = 0; v < kDense; ++v) {
          seen += dense_[v];
          if (seen >= rank) return v;
        }
      return overflow_[rank - seen - 1];
    };
    q.p50_ns = nth(0.5);
    q.p90_ns = nth(0.9);
    q.p99_ns = nth(0.99);
    q.max_ns = nth(1.0);
    return q;
  }

 private:
  static constexpr int64_t kDense = int64_t{1} << 18;
  int64_t count_ = 0;
  double sum_ = 0;
  std::vector<uint32_t> dense_;
  std::vector<int64_t> overflow_;
};

// A critical-path segment; one that would end before it starts is an internal error (the
// events it spans happened out of order), not dropped.
inline void append_path_segment(std::vector<PathSegment>& path, std::string what, int64_t start_ns, int64_t end_ns) {
  if (end_ns < start_ns)
    internal_diagnostic_error("critical-path segment '" + what + "' ends at " + std::to_string(end_ns) +
                              " ns, before it starts at " + std::to_string(start_ns) + " ns");
  path.push_back(PathSegment{std::move(what), start_ns, end_ns});
}

}  // namespace mok::sim::detail
