// The reference API's own checks (found by a review of misuse under AddressSanitizer on
// 2026-12-05): bad operands to oracle_bounds, emulate and make_sample, and RoutingSpecs built in
// code, throw mok::Error naming the problem instead of reading or writing out of bounds.
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/reference/sample.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <algorithm>
#include <string>

namespace {

using namespace mok;

const spec::LayerConfig kCfg{32, 16, 16, 4, 2, 2, 4};

// Runs `call` and returns the message of the mok::Error it throws ("" when it throws none).
template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const mok::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ApiChecks, OracleRejectsBadOperands) {
  const ref::TensorMap in = ref::generate_inputs(kCfg, ref::parse_routing("zipf:1.2"), 3);
  const ref::TensorMap result = ref::emulate(kCfg, in);
  EXPECT_NO_THROW(ref::oracle_bounds(kCfg, in, result));

  ref::TensorMap bad_x = in;
  bad_x["inputs/x"] = ref::Tensor(ref::DType::kBf16, {1, 16});
  EXPECT_NE(error_of([&] { ref::oracle_bounds(kCfg, bad_x, result); }).find("inputs/x"), std::string::npos);

  ref::TensorMap bad_y = result;
  bad_y["intermediates/y"] = ref::Tensor(ref::DType::kBf16, {8, 2, 16});
  EXPECT_NE(error_of([&] { ref::oracle_bounds(kCfg, in, bad_y); }).find("intermediates/y"), std::string::npos);

  // A non-finite operand is named as the caller says where the reference came from.
  ref::TensorMap nan_y = result;
  nan_y.at("intermediates/y").data<uint16_t>()[0] = 0x7FC0;
  const std::string nan_default = error_of([&] { ref::oracle_bounds(kCfg, in, nan_y); });
  EXPECT_EQ(nan_default.rfind("oracle: reference intermediates/y: element token=0 slot=0", 0), 0u) << nan_default;
  EXPECT_NE(nan_default.find("is NaN (bf16 bits 0x7fc0); the oracle's bounds need finite operands"), std::string::npos)
      << nan_default;
  ref::OracleOptions named;
  named.origin = "case.h5";
  named.reference_name = "the emulated ";
  named.reference_fix = "scale the inputs down";
  const std::string nan_named = error_of([&] { ref::oracle_bounds(kCfg, in, nan_y, named); });
  EXPECT_EQ(nan_named.rfind("case.h5: the emulated intermediates/y: element token=0 slot=0", 0), 0u) << nan_named;
  EXPECT_EQ(nan_named.substr(nan_named.size() - 23), "; scale the inputs down") << nan_named;

  ref::TensorMap bad_id = in;
  bad_id.at("inputs/topk_experts").data<int32_t>()[3] = 1000;
  EXPECT_NE(error_of([&] { ref::oracle_bounds(kCfg, bad_id, result); }).find("topk_experts"), std::string::npos);

  ref::Sample unprepared;
  unprepared.tokens = {0};
  ref::OracleOptions oo;
  oo.sample = &unprepared;
  EXPECT_NE(error_of([&] { ref::oracle_bounds(kCfg, in, result, oo); }).find("not prepared"), std::string::npos);
}

TEST(ApiChecks, EndToEndOracleRejectsBadOperands) {
  const ref::TensorMap in = ref::generate_inputs(kCfg, ref::parse_routing("zipf:1.2"), 3);
  EXPECT_NO_THROW(ref::oracle_end_to_end(kCfg, in));
  ref::TensorMap bad_w = in;
  bad_w["inputs/w_routed_down"] = ref::Tensor(ref::DType::kBf16, {4, 32, 8});
  EXPECT_NE(error_of([&] { ref::oracle_end_to_end(kCfg, bad_w); }).find("w_routed_down"), std::string::npos);
  ref::TensorMap bad_id = in;
  bad_id.at("inputs/topk_experts").data<int32_t>()[1] = -5;
  EXPECT_NE(error_of([&] { ref::oracle_end_to_end(kCfg, bad_id); }).find("topk_experts"), std::string::npos);
  ref::TensorMap nan_x = in;
  nan_x.at("inputs/x").data<uint16_t>()[0] = 0x7FC0;
  EXPECT_NE(error_of([&] { ref::oracle_forward_end_to_end(kCfg, nan_x); }).find("inputs/x"), std::string::npos);
  ref::OracleOptions threads;
  threads.num_threads = 5000;
  EXPECT_NE(error_of([&] { ref::oracle_end_to_end(kCfg, in, threads); }).find("num_threads"), std::string::npos);
  // Finite inputs whose sums reach fp32's range limit: the bounds do not cover overflow (review,
  // 2026-12-05), so the oracle says so instead of giving a radius an Inf result would break.
  ref::TensorMap huge = in;
  uint16_t* hx = huge.at("inputs/x").data<uint16_t>();
  for (int64_t i = 0; i < huge.at("inputs/x").numel(); ++i) hx[i] = 0x7F00;  // 2^127
  const std::string range = error_of([&] { ref::oracle_end_to_end(kCfg, huge); });
  EXPECT_NE(range.find("range limit"), std::string::npos) << range;
  // It names where (the first token, in token order whatever the threads) and the fix, and writes
  // the magnitude in a few digits (it printed 67 digits and no place; audit, fiftieth session).
  EXPECT_NE(range.find("in token 0's output, d_x or d_router_weights (rank 0's token 0)"), std::string::npos) << range;
  EXPECT_NE(range.find("scale the inputs down"), std::string::npos) << range;
  EXPECT_LT(range.size(), 400u) << range;
  // A weight gradient past the limit where every token's results stay far below it (x 2^100, the
  // gate and up weights 2^-100, d_output 2^60: d_x ~2^-26, d_w_routed_gate ~2^170) is named by its
  // expert, column and tensors (it said only "in a weight gradient"; fiftieth session's list).
  ref::TensorMap wide = in;
  auto fill = [&](const char* path, uint16_t bits) {
    ref::Tensor& t = wide.at(path);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = bits;
  };
  fill("inputs/x", 0x7180);  // 2^100
  for (const char* w : {"inputs/w_routed_gate", "inputs/w_routed_up", "inputs/w_shared_gate", "inputs/w_shared_up"})
    fill(w, 0x0D80);  // 2^-100
  fill("inputs/d_output", 0x5D80);  // 2^60
  EXPECT_NO_THROW(ref::oracle_forward_end_to_end(kCfg, wide));
  const int32_t* topk = wide.at("inputs/topk_experts").data<int32_t>();
  int64_t first_expert = kCfg.num_experts;
  for (int64_t i = 0; i < kCfg.num_slots(); ++i)
    if (topk[i] >= 0) first_expert = std::min<int64_t>(first_expert, topk[i]);
  const std::string wgrad = error_of([&] { ref::oracle_end_to_end(kCfg, wide); });
  const std::string e = std::to_string(first_expert);
  EXPECT_NE(wgrad.find("range limit"), std::string::npos) << wgrad;
  EXPECT_NE(wgrad.find("in expert " + e + "'s weight gradients of intermediate column 0 (grads/d_w_routed_gate and "
                       "_up [" + e + ", 0, :], grads/d_w_routed_down [" + e + ", :, 0])"),
            std::string::npos)
      << wgrad;
  EXPECT_NE(wgrad.find("scale the inputs down"), std::string::npos) << wgrad;
  ref::Sample unprepared;
  unprepared.tokens = {0};
  ref::OracleOptions oo;
  oo.sample = &unprepared;
  EXPECT_NE(error_of([&] { ref::oracle_end_to_end(kCfg, in, oo); }).find("not prepared"), std::string::npos);
}

TEST(ApiChecks, EmulateRejectsBadOptions) {
  const ref::TensorMap in = ref::generate_inputs(kCfg, ref::parse_routing("uniform"), 4);
  ref::EmulateOptions no_model;
  no_model.mma_model = nullptr;
  EXPECT_NE(error_of([&] { ref::emulate(kCfg, in, no_model); }).find("mma_model"), std::string::npos);
  ref::EmulateOptions threads;
  threads.num_threads = -7;
  EXPECT_NE(error_of([&] { ref::emulate(kCfg, in, threads); }).find("num_threads"), std::string::npos);
  // A sample prepared for another config (same tokens, wider I), and an empty one.
  spec::LayerConfig wide = kCfg;
  wide.intermediate = 64;
  ref::Sample other = ref::make_sample(wide, in.at("inputs/topk_experts"), 2, 2, 1);
  other.inter_cols = {40};
  other.prepare(wide);
  ref::EmulateOptions sampled;
  sampled.sample = &other;
  EXPECT_NE(error_of([&] { ref::emulate(kCfg, in, sampled); }).find("not prepared"), std::string::npos);
  ref::Sample empty;
  empty.prepare(kCfg);
  sampled.sample = &empty;
  EXPECT_NE(error_of([&] { ref::emulate(kCfg, in, sampled); }).find("no tokens"), std::string::npos);
}

// num_threads runs from 0 (all cores) to 4096 in emulate and both oracles: 4096 is taken (the
// workers are capped by the chunks, so a small layer starts few threads), -1 and 4097 are named
// errors (mutation-checked: a limit moved by one passes the -7 and 5000 cases above).
TEST(ApiChecks, ThreadCountLimitsAreExact) {
  const ref::TensorMap in = ref::generate_inputs(kCfg, ref::parse_routing("uniform"), 6);
  const ref::TensorMap result = ref::emulate(kCfg, in);
  for (const int n : {-1, 4096, 4097}) {
    const std::string want = n == 4096 ? "" : "num_threads = " + std::to_string(n) + "; use 0 (all cores) to 4096";
    ref::EmulateOptions eo;
    eo.num_threads = n;
    ref::OracleOptions oo;
    oo.num_threads = n;
    const std::string got[] = {error_of([&] { ref::emulate(kCfg, in, eo); }),
                               error_of([&] { ref::oracle_bounds(kCfg, in, result, oo); }),
                               error_of([&] { ref::oracle_end_to_end(kCfg, in, oo); })};
    for (const std::string& g : got) {
      if (want.empty()) EXPECT_EQ(g, "") << n;
      else EXPECT_NE(g.find(want), std::string::npos) << n << ": " << g;
    }
  }
}

TEST(ApiChecks, RoutingSpecsAndSamplesBuiltInCode) {
  ref::RoutingSpec zipf;
  zipf.kind = ref::RoutingSpec::Kind::kZipf;
  zipf.zipf_s = 1000;
  EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, zipf, 1); }).find("zipf"), std::string::npos);
  ref::RoutingSpec hot;
  hot.kind = ref::RoutingSpec::Kind::kHot;
  hot.hot_count = 2;
  hot.hot_factor = 0;
  EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, hot, 1); }).find("hot"), std::string::npos);
  ref::RoutingSpec nan_skew;
  nan_skew.rank_skew = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, nan_skew, 1); }).find("rank skew"), std::string::npos);

  // Routing text: a plain form only (strtod would take blanks and a '+').
  for (const char* text : {"uniform:", "zipf: 1", "hot:+4", "zipf:", "hot:4:"})
    EXPECT_NE(error_of([&] { ref::parse_routing(text); }), "") << text << " was accepted";
  for (const char* text : {"uniform", "zipf:1.2", "zipf:.5", "hot:4", "hot:4:8"})
    EXPECT_EQ(error_of([&] { ref::parse_routing(text); }), "") << text;
  EXPECT_THROW(ref::Rng(1).below(0), mok::Error);

  const ref::Tensor wrong(ref::DType::kI32, {1, 1});
  EXPECT_NE(error_of([&] { ref::make_sample(kCfg, wrong, 2, 2, 1); }).find("topk_experts must be i32"), std::string::npos);
  ref::Tensor bad_ids(ref::DType::kI32, {kCfg.num_tokens(), kCfg.top_k});
  for (int64_t i = 0; i < bad_ids.numel(); ++i) bad_ids.data<int32_t>()[i] = static_cast<int32_t>(i % 2);
  bad_ids.data<int32_t>()[5] = 99;
  EXPECT_NE(error_of([&] { ref::make_sample(kCfg, bad_ids, 2, 2, 1); }).find("expert id 99"), std::string::npos);
}

// The ends of each routing range, in text and in code: S in (0, 8], N in [1, E] (kCfg has E = 4),
// F >= 1, the rank skew and the empty-slot probability in [0, 1]; a number has nothing after it
// (mutation-checked: each bound moved by one step or loosened from < to <= fails here; the cases
// above stay far from the ends).
TEST(ApiChecks, RoutingRangeEndsAreExact) {
  for (const char* text : {"zipf:8", "zipf:0.001", "hot:1:1", "hot:4", "hot:1:1e12"})
    EXPECT_EQ(error_of([&] { ref::generate_inputs(kCfg, ref::parse_routing(text), 1); }), "") << text;
  for (const char* text : {"zipf:0", "zipf:-1", "zipf:8.5", "zipf:1.2x", "hot:0", "hot:2:0.5", "hot:1.5", "hot:2:3x", "hot:8:1e308", "hot:2:1e13", "hot:2:nan"})
    EXPECT_NE(error_of([&] { ref::parse_routing(text); }), "") << text << " was accepted";
  EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, ref::parse_routing("hot:5"), 1); }).find("lower N to at most 4"),
            std::string::npos);
  ref::RoutingSpec zero_s;
  zero_s.kind = ref::RoutingSpec::Kind::kZipf;
  zero_s.zipf_s = 0;
  EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, zero_s, 1); }).find("zipf"), std::string::npos);
  ref::RoutingSpec edges = ref::parse_routing("uniform");
  edges.rank_skew = 1;
  edges.empty_prob = 1;
  const ref::TensorMap all_empty = ref::generate_inputs(kCfg, edges, 1);
  const ref::Tensor& ids = all_empty.at("inputs/topk_experts");
  for (int64_t i = 0; i < ids.numel(); ++i) EXPECT_EQ(ids.data<int32_t>()[i], -1) << i;
  for (const double p : {-0.01, 1.01}) {
    ref::RoutingSpec bad = ref::parse_routing("uniform");
    bad.empty_prob = p;
    EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, bad, 1); }).find("empty-slot probability"), std::string::npos) << p;
    bad.empty_prob = 0;
    bad.rank_skew = p;
    EXPECT_NE(error_of([&] { ref::generate_inputs(kCfg, bad, 1); }).find("rank skew"), std::string::npos) << p;
  }
}

}  // namespace
