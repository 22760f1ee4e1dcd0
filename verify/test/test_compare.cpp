// Comparison semantics: ULP distances, stage order, and compare() itself on fresh random goldens
// with planted differences (bitwise and bounds criteria, missing and reshaped tensors, bad bounds).
#include "mok/verify/compare.hpp"

#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/reference/schema.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace mok;

TEST(UlpDistance, NeighboursAndSigns) {
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x3F80, 0x3F81), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x0000, 0x8000), 0u);  // +0 and -0 are 0 ulps apart
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x0001, 0x8001), 2u);  // across zero
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x3F800000, 0x3F800003), 3u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x7FC00000, 0x3F800000), UINT64_MAX);
}

// Infinities are numbers on the monotone line (one step from the largest finite value), every NaN
// is one class (0 apart, whatever its sign or payload), fp64 uses all 64 bits and int32 is a plain
// absolute difference (mutation-checked: is_nan taking Inf for NaN, a NaN class of distance 1, fp64
// folded to 32 bits and a signed int32 difference each fail here).
TEST(UlpDistance, InfinitiesNansFp64AndInt32) {
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x7F80, 0x7F7F), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0xFF7F, 0xFF80), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x7F800000, 0x7F7FFFFF), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0xFF800000, 0xFF7FFFFF), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x7FC0, 0xFF81), 0u);  // two NaNs
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF32, 0x7FC00000, 0xFF800001), 0u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kBf16, 0x7FC0, 0x7F80), UINT64_MAX);  // NaN against Inf
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF64, 0x3FF0000000000000ull, 0x3FF0000000000001ull), 1u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF64, 0x3FF0000000000000ull, 0xBFF0000000000000ull),
            2 * 0x3FF0000000000000ull);  // 1.0 and -1.0
  EXPECT_EQ(verify::ulp_distance(ref::DType::kF64, 0x7FF8000000000000ull, 0xFFF0000000000001ull), 0u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kI32, 3, 10), 7u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kI32, 10, 3), 7u);
  EXPECT_EQ(verify::ulp_distance(ref::DType::kI32, 0xFFFFFFFFu, 1), 2u);  // -1 and 1
}

TEST(StageOrder, ForwardBeforeBackward) {
  EXPECT_LT(verify::stage_rank("intermediates/gate"), verify::stage_rank("intermediates/y"));
  EXPECT_LT(verify::stage_rank("intermediates/y"), verify::stage_rank("outputs/output"));
  EXPECT_LT(verify::stage_rank("outputs/output"), verify::stage_rank("grads/d_x"));
}

// Every stage comes after the stages whose values it is computed from (DESIGN.md section 3), so
// the first failing stage is where a wrong value entered, not one it flowed into.
TEST(StageOrder, EveryStageAfterItsOperands) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> operands = {
      {"intermediates/act", {"intermediates/gate", "intermediates/up"}},
      {"intermediates/y", {"intermediates/act"}},
      {"intermediates/shared_act", {"intermediates/shared_gate", "intermediates/shared_up"}},
      {"intermediates/shared_out", {"intermediates/shared_act"}},
      {"outputs/output", {"intermediates/y", "intermediates/shared_out"}},
      {"grads/d_router_weights", {"intermediates/y"}},
      {"intermediates/d_act", {"intermediates/dy"}},
      {"intermediates/d_gate", {"intermediates/d_act", "intermediates/gate", "intermediates/up"}},
      {"intermediates/d_up", {"intermediates/d_act", "intermediates/gate"}},
      {"intermediates/dx_slot", {"intermediates/d_gate", "intermediates/d_up"}},
      {"intermediates/shared_d_gate", {"intermediates/shared_d_act", "intermediates/shared_gate", "intermediates/shared_up"}},
      {"intermediates/shared_d_up", {"intermediates/shared_d_act", "intermediates/shared_gate"}},
      {"intermediates/dx_shared", {"intermediates/shared_d_gate", "intermediates/shared_d_up"}},
      {"grads/d_x", {"intermediates/dx_slot", "intermediates/dx_shared"}},
      {"grads/d_w_routed_down", {"intermediates/dy", "intermediates/act"}},
      {"grads/d_w_routed_gate", {"intermediates/d_gate"}},
      {"grads/d_w_routed_up", {"intermediates/d_up"}},
      {"grads/d_w_shared_down", {"intermediates/shared_act"}},
      {"grads/d_w_shared_gate", {"intermediates/shared_d_gate"}},
      {"grads/d_w_shared_up", {"intermediates/shared_d_up"}}};
  const int unknown = verify::stage_rank("inputs/x");
  for (const auto& [stage, ops] : operands) {
    EXPECT_LT(verify::stage_rank(stage), unknown) << stage;
    for (const char* op : ops) EXPECT_LT(verify::stage_rank(op), verify::stage_rank(stage)) << op << " before " << stage;
  }
}

// A golden as mok-golden makes one (emulator forward and backward with intermediates, oracle
// bounds), from a random small layer and seed.
struct Case {
  ref::Golden golden;
  ref::TensorMap candidate;        // the golden's outputs, grads and intermediates, unchanged
  std::vector<std::string> judged;  // the candidate's paths
};

rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    const int64_t R = *rc::gen::element<int64_t>(1, 2);
    const int64_t E = R * *rc::gen::inRange<int64_t>(1, 4);
    const int64_t K = *rc::gen::inRange<int64_t>(1, E + 1);
    const spec::LayerConfig cfg{*rc::gen::element<int64_t>(16, 32), *rc::gen::element<int64_t>(16, 32),
                                *rc::gen::element<int64_t>(0, 16), E, K, R, *rc::gen::inRange<int64_t>(1, 6)};
    ref::RoutingSpec rs = ref::parse_routing(*rc::gen::element<std::string>("uniform", "zipf:1.2"));
    rs.empty_prob = *rc::gen::element(0.0, 0.2);
    Case c;
    c.golden.cfg = cfg;
    c.golden.tensors = ref::generate_inputs(cfg, rs, *rc::gen::inRange<uint64_t>(1, 1u << 30));
    const ref::TensorMap result = ref::emulate(cfg, c.golden.tensors);
    for (auto& [p, t] : ref::oracle_bounds(cfg, c.golden.tensors, result)) c.golden.tensors[p] = t;
    for (const auto& [p, t] : result) {
      c.golden.tensors[p] = t;
      c.candidate[p] = t;
      c.judged.push_back(p);
    }
    return c;
  });
}

// Flips bit `bit` of element i (bits counted within the dtype's width).
void flip_bit(ref::Tensor& t, int64_t i, int bit) {
  const size_t width = ref::dtype_size(t.dtype());
  auto* bytes = static_cast<unsigned char*>(t.raw()) + static_cast<size_t>(i) * width;
  bytes[static_cast<size_t>(bit) / 8 % width] ^= static_cast<unsigned char>(1u << (bit % 8));
}

const verify::TensorReport* find(const verify::Report& r, const std::string& path) {
  for (const auto& t : r.tensors)
    if (t.path == path) return &t;
  return nullptr;
}

RC_GTEST_PROP(Compare, IdenticalTensorsPassBothCriteria, ()) {
  const Case c = *gen_case();
  for (const auto crit : {verify::Criterion::kBitwise, verify::Criterion::kWithinBounds}) {
    verify::CompareOptions o;
    o.criterion = crit;
    const verify::Report r = verify::compare(c.golden, c.candidate, o);
    RC_ASSERT(r.passed);
    RC_ASSERT(r.first_bad_stage.empty());
    for (const auto& t : r.tensors) {
      RC_ASSERT(t.equal == t.compared);
      // Nothing differs, so nothing is named (mutation-checked: a `>=` in the worst-element scan
      // named an equal element).
      RC_ASSERT(t.first_idx == -1);
      RC_ASSERT(t.worst_idx == -1);
      RC_ASSERT(t.max_ulp == 0u);
      RC_ASSERT(t.worst_location.empty());
    }
  }
}

RC_GTEST_PROP(Compare, OneFlippedBitFailsAtItsTensorAndElement, ()) {
  Case c = *gen_case();
  const std::string path = *rc::gen::elementOf(c.judged);
  ref::Tensor& t = c.candidate.at(path);
  RC_PRE(t.numel() > 0);
  const int64_t i = *rc::gen::inRange<int64_t>(0, t.numel());
  const uint64_t before = t.bits_at(i);
  flip_bit(t, i, *rc::gen::inRange<int>(0, static_cast<int>(8 * ref::dtype_size(t.dtype()))));
  const uint64_t after = t.bits_at(i);
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  RC_ASSERT(!r.passed);
  RC_ASSERT(r.first_bad_stage.rfind(path, 0) == 0);
  const verify::TensorReport* tr = find(r, path);
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(tr->equal == tr->compared - 1);
  RC_ASSERT(tr->worst_idx == i);
  // The distance of that one element (0 for +0 against -0, whose bits still differ).
  RC_ASSERT(tr->max_ulp == verify::ulp_distance(t.dtype(), before, after));
}

// The report names the first wrong element of the first failing stage (DESIGN.md's stage
// bisector), and the largest difference beside it.
RC_GTEST_PROP(Compare, TheFirstWrongElementIsNamed, ()) {
  Case c = *gen_case();
  const std::string path = *rc::gen::elementOf(c.judged);
  ref::Tensor& t = c.candidate.at(path);
  RC_PRE(t.numel() > 1);
  const int64_t i = *rc::gen::inRange<int64_t>(0, t.numel());
  const int64_t j = *rc::gen::distinctFrom(rc::gen::inRange<int64_t>(0, t.numel()), i);
  const int bits = static_cast<int>(8 * ref::dtype_size(t.dtype()));
  flip_bit(t, i, *rc::gen::inRange(0, bits));
  flip_bit(t, j, *rc::gen::inRange(0, bits));
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  const verify::TensorReport* tr = find(r, path);
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(tr->first_idx == std::min(i, j));
  RC_ASSERT(r.first_bad_stage.rfind(path + " at " + tr->first_location, 0) == 0);
  RC_ASSERT(r.first_bad_stage.find("first of 2 differing elements") != std::string::npos);
}

RC_GTEST_PROP(Compare, AMissingOutputOrGradientFails, ()) {
  Case c = *gen_case();
  std::vector<std::string> required;
  for (const auto& p : c.judged)
    if (p.rfind("outputs/", 0) == 0 || p.rfind("grads/", 0) == 0) required.push_back(p);
  RC_PRE(!required.empty());
  const std::string path = *rc::gen::elementOf(required);
  c.candidate.erase(path);
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  RC_ASSERT(!r.passed);
  const verify::TensorReport* tr = find(r, path);
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(!tr->passed);
  RC_ASSERT(tr->worst_location == "missing from the candidate");
  // An intermediate may be missing (the CUDA kernel returns none).
  Case d = *gen_case();
  for (auto it = d.candidate.begin(); it != d.candidate.end();)
    it = it->first.rfind("intermediates/", 0) == 0 ? d.candidate.erase(it) : std::next(it);
  RC_ASSERT(verify::compare(d.golden, d.candidate, verify::CompareOptions{}).passed);
}

RC_GTEST_PROP(Compare, AnotherShapeFails, ()) {
  Case c = *gen_case();
  const std::string path = *rc::gen::elementOf(c.judged);
  const ref::Tensor& t = c.candidate.at(path);
  std::vector<int64_t> shape = t.shape();
  shape.insert(shape.begin(), 1);  // the same elements, one more dimension
  ref::Tensor reshaped(t.dtype(), shape);
  std::memcpy(reshaped.raw(), t.raw(), t.size_bytes());
  c.candidate[path] = reshaped;
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  RC_ASSERT(!r.passed);
  RC_ASSERT(r.first_bad_stage.find("dtype/shape differ") != std::string::npos);
}

// Under the bounds criterion bits may differ, but an element moved past its radius fails, and
// bounds that check nothing (all NaN: "not sampled") cannot pass.
RC_GTEST_PROP(Compare, BoundsCriterionJudgesTheRadius, ()) {
  Case c = *gen_case();
  ref::Tensor& out = c.candidate.at("outputs/output");
  RC_PRE(out.numel() > 0);
  const int64_t i = *rc::gen::inRange<int64_t>(0, out.numel());
  const double exact = c.golden.tensors.at(ref::bound_exact_path("outputs/output")).value_at(i);
  const double radius = c.golden.tensors.at(ref::bound_radius_path("outputs/output")).value_at(i);
  verify::CompareOptions o;
  o.criterion = verify::Criterion::kWithinBounds;
  // bf16 output: write a value far outside [exact - radius, exact + radius].
  const float far = static_cast<float>(exact + 4.0 * radius + 1.0 + std::fabs(exact));
  uint32_t bits = 0;
  std::memcpy(&bits, &far, 4);
  out.data<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
  const verify::Report r = verify::compare(c.golden, c.candidate, o);
  RC_ASSERT(!r.passed);
  RC_ASSERT(find(r, "outputs/output")->outside_bound >= 1);

  Case d = *gen_case();
  ref::Tensor& radii = d.golden.tensors.at(ref::bound_radius_path("outputs/output"));
  for (int64_t k = 0; k < radii.numel(); ++k) radii.data<float>()[k] = std::numeric_limits<float>::quiet_NaN();
  RC_PRE(radii.numel() > 0);
  const verify::Report nan_bounds = verify::compare(d.golden, d.candidate, o);
  RC_ASSERT(!nan_bounds.passed);
  RC_ASSERT(find(nan_bounds, "outputs/output")->bound_checked == 0);
  // The table and the summary say why (only --json did; audit, fiftieth session).
  const std::string table = verify::format_table(nan_bounds);
  RC_ASSERT(table.find("FAILED  no element has a radius (all NaN)") != std::string::npos);
  // Only the output's radii are NaN: it is the failing stage when no earlier one fails.
  if (nan_bounds.first_bad_stage.rfind("outputs/output", 0) == 0 && find(nan_bounds, "outputs/output")->equal ==
                                                                         find(nan_bounds, "outputs/output")->compared)
    RC_ASSERT(nan_bounds.first_bad_stage.find("outputs/output: no element has a radius") != std::string::npos);

  // A negative radius is a broken golden: bad input, not a failed check.
  radii.data<float>()[*rc::gen::inRange<int64_t>(0, radii.numel())] = -1.0f;
  RC_ASSERT_THROWS_AS(verify::compare(d.golden, d.candidate, o), mok::Error);
}

// The bounds criterion needs the golden's bounds: an output or gradient without them fails (its
// bits may match), and a candidate sharing no judged tensor with the golden is not a pass
// (mutation-checked: each rule removed passed both cases).
RC_GTEST_PROP(Compare, NoBoundsOrNothingToCompareIsNotAPass, ()) {
  Case c = *gen_case();
  std::vector<std::string> checked;
  for (const auto& p : c.judged)
    if (p.rfind("outputs/", 0) == 0 || p.rfind("grads/", 0) == 0) checked.push_back(p);
  const std::string path = *rc::gen::elementOf(checked);
  c.golden.tensors.erase(ref::bound_exact_path(path));
  c.golden.tensors.erase(ref::bound_radius_path(path));
  verify::CompareOptions o;
  o.criterion = verify::Criterion::kWithinBounds;
  const verify::Report r = verify::compare(c.golden, c.candidate, o);
  RC_ASSERT(!r.passed);
  const verify::TensorReport* tr = find(r, path);
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(!tr->has_bounds);
  RC_ASSERT(!tr->passed);
  RC_ASSERT(tr->equal == tr->compared);
  for (const auto& t : r.tensors) RC_ASSERT(t.passed == (t.path != path));
  RC_ASSERT(verify::compare(c.golden, c.candidate, verify::CompareOptions{}).passed);  // bitwise: fine

  ref::TensorMap inputs_only;
  for (const auto& [p, t] : c.golden.tensors)
    if (p.rfind("inputs/", 0) == 0) inputs_only[p] = t;
  ref::Golden bare = c.golden;
  for (auto it = bare.tensors.begin(); it != bare.tensors.end();)
    it = it->first.rfind("inputs/", 0) == 0 ? std::next(it) : bare.tensors.erase(it);
  for (const auto crit : {verify::Criterion::kBitwise, verify::Criterion::kWithinBounds}) {
    o.criterion = crit;
    const verify::Report none = verify::compare(bare, inputs_only, o);
    RC_ASSERT(!none.passed);
    RC_ASSERT(none.tensors.empty());
    RC_ASSERT(none.first_bad_stage.rfind("nothing to compare", 0) == 0);
  }
}

// One differing element is named alone (no "first of 1" tail); a zero whose sign alone changed
// (+0 against -0: 0 ulps apart, different bits) is still that element (mutation-checked).
RC_GTEST_PROP(Compare, ASingleDifferenceIsNamedExactly, ()) {
  Case c = *gen_case();
  std::vector<std::string> inter;
  for (const auto& p : c.judged)
    if (p.rfind("intermediates/", 0) == 0 && c.candidate.at(p).numel() > 0) inter.push_back(p);
  const std::string path = *rc::gen::elementOf(inter);
  ref::Tensor& t = c.candidate.at(path);
  ref::Tensor& g = c.golden.tensors.at(path);
  const int64_t i = *rc::gen::inRange<int64_t>(0, t.numel());
  const size_t width = ref::dtype_size(t.dtype());
  std::memset(static_cast<char*>(g.raw()) + i * width, 0, width);  // +0 in the golden
  std::memset(static_cast<char*>(t.raw()) + i * width, 0, width);
  flip_bit(t, i, static_cast<int>(8 * width) - 1);                 // -0 in the candidate
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  RC_ASSERT(!r.passed);
  const verify::TensorReport* tr = find(r, path);
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(tr->first_idx == i);
  RC_ASSERT(tr->max_ulp == 0u);
  RC_ASSERT(tr->equal == tr->compared - 1);
  RC_ASSERT(r.first_bad_stage == path + " at " + tr->first_location);
}

// With wrong elements in two stages, the first failing stage is the earlier one in stage order,
// whichever the candidate lists first (mutation-checked: a later stage overwriting it fails).
RC_GTEST_PROP(Compare, TheEarliestOfTwoFailingStagesIsNamed, ()) {
  Case c = *gen_case();
  const std::string a = *rc::gen::elementOf(c.judged);
  const std::string b = *rc::gen::elementOf(c.judged);
  RC_PRE(a != b && c.candidate.at(a).numel() > 0 && c.candidate.at(b).numel() > 0);
  for (const std::string& p : {a, b}) {
    ref::Tensor& t = c.candidate.at(p);
    flip_bit(t, *rc::gen::inRange<int64_t>(0, t.numel()), 0);
  }
  const verify::Report r = verify::compare(c.golden, c.candidate, verify::CompareOptions{});
  const std::string& first = verify::stage_rank(a) < verify::stage_rank(b) ? a : b;
  RC_ASSERT(r.first_bad_stage.rfind(first + " at ", 0) == 0);
}

// Under the bounds criterion: a NaN candidate element is outside every radius; elements the
// oracle did not sample (NaN radius) are skipped, not an end to the check; intermediates the golden
// holds no bounds for are not judged (nor listed); and the JSON report gives the same counts
// (mutation-checked).
RC_GTEST_PROP(Compare, BoundsCriterionNanCandidatesUnsampledElementsAndJson, ()) {
  Case c = *gen_case();
  ref::Tensor& out = c.candidate.at("outputs/output");
  const int64_t n = out.numel();
  RC_PRE(n > 1);
  const int64_t i = *rc::gen::inRange<int64_t>(1, n);
  // Elements before i not sampled; element i NaN.
  ref::Tensor& radii = c.golden.tensors.at(ref::bound_radius_path("outputs/output"));
  for (int64_t k = 0; k < i; ++k) radii.data<float>()[k] = std::numeric_limits<float>::quiet_NaN();
  out.data<uint16_t>()[i] = 0x7FC0;
  verify::CompareOptions o;
  o.criterion = verify::Criterion::kWithinBounds;
  const verify::Report r = verify::compare(c.golden, c.candidate, o);
  RC_ASSERT(!r.passed);
  for (const auto& t : r.tensors) RC_ASSERT(t.has_bounds);  // the golden bounds no intermediate
  const verify::TensorReport* tr = find(r, "outputs/output");
  RC_ASSERT(tr != nullptr);
  RC_ASSERT(tr->bound_checked == n - i);
  RC_ASSERT(tr->outside_bound == 1);
  RC_ASSERT(tr->first_outside_idx == i);
  RC_ASSERT(std::isinf(tr->worst_bound_ratio));
  const nlohmann::json j = nlohmann::json::parse(verify::format_json(r));
  RC_ASSERT(j["passed"] == false);
  bool seen = false;
  for (const auto& t : j["tensors"]) {
    if (t["tensor"] != "outputs/output") continue;
    seen = true;
    RC_ASSERT(t["outside_bound"] == 1);
    RC_ASSERT(t["bound_checked"] == n - i);
    RC_ASSERT(t["worst_error_over_bound"] == "inf");
    RC_ASSERT(t["passed"] == false);
  }
  RC_ASSERT(seen);
}

}  // namespace
