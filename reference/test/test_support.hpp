// Test helpers: random valid layer configs and inputs for property tests.
#pragma once

#include "mok/reference/generate.hpp"
#include "mok/spec/config.hpp"

#include <rapidcheck.h>

#include <string>

// Fails the current RapidCheck case when `ok` is false, after logging the streamed `message`, which
// is built only then. (RC_ASSERT's expression capture evaluates both operands of && and ||, so
// the older idiom RC_ASSERT_FALSE(!ok && (RC_LOG() << ..., true)) logged on every call: a failing
// case printed every element checked, passing ones too, and passing runs paid for the text.)
#define MOK_RC_REQUIRE(ok, message)   \
  do {                                \
    if (!(ok)) {                      \
      RC_LOG() << message << "\n";    \
      RC_FAIL("failed: " #ok);        \
    }                                 \
  } while (false)

namespace mok::test {

// A small random config valid for the spec (so a property runs in milliseconds).
inline spec::LayerConfig gen_config() {
  spec::LayerConfig c;
  c.hidden = 16 * *rc::gen::inRange(1, 4);
  c.intermediate = 16 * *rc::gen::inRange(1, 3);
  c.shared_intermediate = 16 * *rc::gen::inRange(0, 2);
  c.num_ranks = *rc::gen::element<int64_t>(1, 2, 4);
  c.num_experts = c.num_ranks * *rc::gen::inRange<int64_t>(1, 4);
  c.top_k = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(c.num_experts, 4) + 1);
  c.tokens_per_rank = *rc::gen::inRange<int64_t>(1, 9);
  return c;
}

inline ref::RoutingSpec gen_routing() {
  ref::RoutingSpec r = ref::parse_routing(*rc::gen::element<std::string>("uniform", "zipf:1.2", "zipf:1.01", "hot:1"));
  r.empty_prob = *rc::gen::element(0.0, 0.0, 0.2);
  r.rank_skew = *rc::gen::element(0.0, 0.5);
  return r;
}

}  // namespace mok::test
