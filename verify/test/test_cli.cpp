// mok-verify as users run it: exit codes 0/1/2/3, one clear message for every malformed file.
#include "malformed.hpp"
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/golden.hpp"
#include "mok/reference/oracle.hpp"
#include "mok/spec/bf16.hpp"
#include "mok/verify/backends.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <csignal>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using namespace mok;

struct CliRun {
  int code;
  std::string out, err;
};

// The scratch folder of run_cli, removed when the test program ends.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("mok-cli-" + std::to_string(::getpid()));
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};
const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

// Runs mok-verify with `args` (and `env`, e.g. "MOK_RANK= "); stdout goes to `stdout_to` when given
// (e.g. /dev/full), otherwise it is captured.
CliRun run_cli(const std::string& args, const std::string& stdout_to = "", const std::string& env = "") {
  const fs::path dir = scratch().path;
  fs::create_directories(dir);
  const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
  fs::remove(out);
  const int status = std::system(
      (env + std::string(MOK_VERIFY_BIN) + " " + args + " >" + (stdout_to.empty() ? out : stdout_to) + " 2>" + err)
          .c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, stdout_to.empty() ? slurp(out) : "", slurp(err)};
}

// A real golden made the way mok-golden makes one (emulator + oracle), in a temp folder.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("mok-cli-goldens-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const spec::LayerConfig cfg{32, 16, 16, 4, 2, 2, 6};
    ref::RoutingSpec rs = ref::parse_routing("zipf:1.2");
    rs.empty_prob = 0.1;
    golden_.cfg = cfg;
    golden_.meta.seed = 11;
    golden_.meta.routing = rs.describe();
    golden_.meta.generator_version = "test";
    golden_.tensors = ref::generate_inputs(cfg, rs, 11);
    const ref::TensorMap result = ref::emulate(cfg, golden_.tensors);
    for (auto& [p, t] : ref::oracle_bounds(cfg, golden_.tensors, result)) golden_.tensors[p] = t;
    for (auto& [p, t] : result) golden_.tensors[p] = t;
    good_ = (dir_ / "good.h5").string();
    ref::write_golden(good_, golden_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static inline fs::path dir_;
  static inline ref::Golden golden_;
  static inline std::string good_;
};

TEST_F(CliTest, EmulateAndOraclePassOnAGoodGolden) {
  CliRun r = run_cli("run " + good_ + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# PASSED"), std::string::npos) << r.out;
  r = run_cli("run " + good_ + " --backend oracle --json");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("\"passed\": true"), std::string::npos) << r.out;
  r = run_cli("run " + good_ + " --backend emulate --sample-tokens 3 --sample-cols 2");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# sample:"), std::string::npos) << r.out;
}

TEST_F(CliTest, ChangedBitIsFoundAtItsStageAndElement) {
  ref::Golden bad = golden_;
  uint16_t* y = bad.tensors.at("intermediates/y").data<uint16_t>();
  // Flip the last bit of a non-empty slot's expert output.
  const int32_t* tk = bad.tensors.at("inputs/topk_experts").data<int32_t>();
  int64_t slot = 0;
  while (tk[slot] < 0) ++slot;
  y[slot * 32 + 5] ^= 1;
  const std::string path = (dir_ / "flipped.h5").string();
  ref::write_golden(path, bad);
  const CliRun r = run_cli("run " + path + " --backend emulate");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("first failing stage: intermediates/y at token=" + std::to_string(slot / 2) +
                       " slot=" + std::to_string(slot % 2) + " expert=" + std::to_string(tk[slot]) + " h=5"),
            std::string::npos)
      << r.out;
  // compare: the golden against itself passes, against the flipped file fails.
  EXPECT_EQ(run_cli("compare " + good_ + " " + good_).code, 0);
  EXPECT_EQ(run_cli("compare " + good_ + " " + path).code, 1);
}

TEST_F(CliTest, OutputOutsideItsBoundFailsTheOracleCheck) {
  ref::Golden bad = golden_;
  uint16_t* out = bad.tensors.at("outputs/output").data<uint16_t>();
  out[7] = static_cast<uint16_t>(out[7] + 4);  // 4 bf16 ulps away
  const std::string path = (dir_ / "off.h5").string();
  ref::write_golden(path, bad);
  CliRun r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  // The report lists every tensor by path; the verdict is the failing-stage line.
  EXPECT_NE(r.out.find("# first failing stage: outputs/output"), std::string::npos) << r.out;
  // The bitwise columns compare the golden with the oracle's correctly rounded value (not with
  // itself): the moved element lies at least 3 ULP from it.
  r = run_cli("run " + path + " --backend oracle --json");
  const size_t at = r.out.find("\"tensor\": \"outputs/output\"");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t ulp = r.out.rfind("\"max_ulp\": ", at);
  ASSERT_NE(ulp, std::string::npos) << r.out;
  EXPECT_GE(std::stoll(r.out.substr(ulp + 11)), 3) << r.out;
}

// The oracle backend judges a golden's intermediates too, stage by stage, each from the golden's
// own earlier stages (found by audit: it used to judge only the output and gradients, so garbage
// intermediates passed): a gate of 1e30 and a d_act of -7 fail, first at intermediates/gate.
TEST_F(CliTest, OracleJudgesTheGoldensIntermediates) {
  CliRun r = run_cli("run " + good_ + " --backend oracle");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (const char* p : {"intermediates/gate ", "intermediates/act ", "intermediates/y ", "intermediates/shared_out ",
                        "intermediates/dy ", "intermediates/d_act ", "intermediates/d_gate ", "intermediates/dx_slot ",
                        "intermediates/shared_d_up ", "intermediates/dx_shared "})
    EXPECT_NE(r.out.find(p), std::string::npos) << p << "\n" << r.out;
  // In stage order, as the emulate backend lists them.
  EXPECT_LT(r.out.find("intermediates/y "), r.out.find("outputs/output "));
  EXPECT_LT(r.out.find("outputs/output "), r.out.find("intermediates/d_act "));

  ref::Golden bad = golden_;
  ref::Tensor& gate = bad.tensors.at("intermediates/gate");
  std::fill(gate.data<float>(), gate.data<float>() + gate.numel(), 1e30f);
  ref::Tensor& d_act = bad.tensors.at("intermediates/d_act");
  std::fill(d_act.data<float>(), d_act.data<float>() + d_act.numel(), -7.0f);
  const std::string path = (dir_ / "gate_garbage.h5").string();
  ref::write_golden(path, bad);
  r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/gate at token=0 slot=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# FAILED"), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend emulate");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/gate"), std::string::npos) << r.out;

  // One element of a later stage (d_up, bf16) moved 3 ULP: that stage fails, at that element.
  ref::Golden moved = golden_;
  uint16_t* du = moved.tensors.at("intermediates/d_up").data<uint16_t>();
  const int32_t* tk = moved.tensors.at("inputs/topk_experts").data<int32_t>();
  int64_t slot = 0;
  while (tk[slot] < 0) ++slot;
  du[slot * 16 + 3] = static_cast<uint16_t>(du[slot * 16 + 3] + 3);
  const std::string mpath = (dir_ / "d_up_moved.h5").string();
  ref::write_golden(mpath, moved);
  r = run_cli("run " + mpath + " --backend oracle");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/d_up at token=" + std::to_string(slot / 2) + " slot=" +
                       std::to_string(slot % 2) + " expert=" + std::to_string(tk[slot]) + " i=3"),
            std::string::npos)
      << r.out;
}

// Every shipped fixture passes the oracle backend, its intermediates judged too.
TEST(CliFixtures, EveryFixturePassesTheOracleWithItsIntermediates) {
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(MOK_FIXTURES_DIR)) {
    if (entry.path().extension() != ".h5") continue;
    ++seen;
    const CliRun r = run_cli("run " + entry.path().string() + " --backend oracle");
    EXPECT_EQ(r.code, 0) << entry.path() << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("intermediates/gate "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("intermediates/dx_slot "), std::string::npos) << r.out;
  }
  EXPECT_EQ(seen, 5);
}

// The end-to-end check sees what the stage-local oracle cannot: a golden whose results were made
// with other weights than its inputs hold (here the routed down projection x 1.25) is consistent
// stage by stage, since every stage is judged from the golden's own intermediates, but its output
// is far from the true output of its inputs.
TEST_F(CliTest, EndToEndCatchesResultsMadeFromOtherWeights) {
  CliRun r = run_cli("run " + good_ + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("outputs/output (end to end)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("grads/d_w_routed_down (end to end)"), std::string::npos) << r.out;

  // A forward-only golden: the output alone is judged end to end.
  ref::Golden fwd = golden_;
  for (auto it = fwd.tensors.begin(); it != fwd.tensors.end();) {
    const std::string& p = it->first;
    const bool backward = p.rfind("grads/", 0) == 0 || p == "inputs/d_output" ||
                          (p.rfind("bounds/", 0) == 0 && p.rfind("bounds/output_", 0) != 0) ||
                          (p.rfind("intermediates/", 0) == 0 &&
                           (p.find("/d") != std::string::npos || p.find("_d_") != std::string::npos));
    it = backward ? fwd.tensors.erase(it) : std::next(it);
  }
  const std::string fwd_path = (dir_ / "forward_only.h5").string();
  ref::write_golden(fwd_path, fwd);
  r = run_cli("run " + fwd_path + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("outputs/output (end to end)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("grads/d_x (end to end)"), std::string::npos) << r.out;

  ref::Golden bad = golden_;
  ref::TensorMap other = bad.tensors;
  ref::Tensor& wd = other.at("inputs/w_routed_down");
  uint16_t* w = wd.data<uint16_t>();
  for (int64_t i = 0; i < wd.numel(); ++i) w[i] = spec::bf16_from_f32_rne(1.25f * spec::f32_from_bf16(w[i]));
  const ref::TensorMap result = ref::emulate(bad.cfg, other, {.backward = true, .intermediates = true});
  for (auto& [p, t] : result) bad.tensors[p] = t;
  for (auto& [p, t] : ref::oracle_bounds(bad.cfg, golden_.tensors, result)) bad.tensors[p] = t;
  // End-to-end bounds made from the other weights too, stored: consistent with the results, and
  // still the oracle backend must judge from the file's inputs.
  for (auto& [p, t] : ref::oracle_end_to_end(bad.cfg, other)) {
    const std::string checked = ref::checked_path_of_bound(p);
    bad.tensors[p == ref::bound_exact_path(checked) ? ref::end_to_end_exact_path(checked)
                                                    : ref::end_to_end_radius_path(checked)] = t;
  }
  const std::string path = (dir_ / "other_weights.h5").string();
  ref::write_golden(path, bad);
  // The stage-local oracle judges y from the file's act and down weights, so it sees this too.
  r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/y"), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend oracle --end-to-end");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  // The end-to-end row of the output fails as well.
  const size_t row = r.out.find("outputs/output (end to end)");
  ASSERT_NE(row, std::string::npos) << r.out;
  EXPECT_NE(r.out.substr(row, r.out.find('\n', row) - row).find("FAILED"), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend oracle --end-to-end --json");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("\"tensor\": \"outputs/output (end to end)\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"tensor\": \"grads/d_x (end to end)\""), std::string::npos) << r.out;
}

// A golden that stores its end-to-end bounds (as mok-golden --end-to-end-bounds writes them) is
// judged against the stored ones: zeroed stored radii fail a run that computed bounds would pass,
// and --recompute-end-to-end ignores them.
TEST_F(CliTest, StoredEndToEndBoundsAreTheOnesJudgedWith) {
  ref::Golden with = golden_;
  for (auto& [p, t] : ref::oracle_end_to_end(with.cfg, golden_.tensors)) {
    const std::string checked = ref::checked_path_of_bound(p);
    with.tensors[p == ref::bound_exact_path(checked) ? ref::end_to_end_exact_path(checked)
                                                     : ref::end_to_end_radius_path(checked)] = t;
  }
  ASSERT_TRUE(with.tensors.count("bounds/d_w_shared_down_e2e_bound"));
  const std::string path = (dir_ / "stored_e2e.h5").string();
  ref::write_golden(path, with);
  CliRun r = run_cli("run " + path + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("stored in the golden"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("grads/d_w_routed_down (end to end)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# end to end: bounds stored in the golden"), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend emulate --end-to-end --json");
  EXPECT_NE(r.out.find("\"end_to_end_bounds\": \"stored\""), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend emulate --end-to-end --recompute-end-to-end --json");
  EXPECT_NE(r.out.find("\"end_to_end_bounds\": \"computed\""), std::string::npos) << r.out;
  r = run_cli("run " + path + " --backend emulate --json");
  EXPECT_NE(r.out.find("\"end_to_end_bounds\": null"), std::string::npos) << r.out;
  // The stored file reads back with the same bits as the freshly computed bounds.
  const ref::Golden back = ref::read_golden(path);
  for (const char* p : {"bounds/output_e2e_exact", "bounds/output_e2e_bound", "bounds/d_router_weights_e2e_bound"}) {
    const ref::Tensor &a = back.tensors.at(p), &b = with.tensors.at(p);
    ASSERT_EQ(a.size_bytes(), b.size_bytes()) << p;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.size_bytes()), 0) << p;
  }

  ref::Golden zeroed = with;
  ref::Tensor& radius = zeroed.tensors.at("bounds/d_x_e2e_bound");
  std::fill(radius.data<float>(), radius.data<float>() + radius.numel(), 0.0f);
  const std::string zpath = (dir_ / "stored_e2e_zero.h5").string();
  ref::write_golden(zpath, zeroed);
  r = run_cli("run " + zpath + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: end to end: grads/d_x"), std::string::npos) << r.out;
  r = run_cli("run " + zpath + " --backend emulate --end-to-end --recompute-end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("computed now"), std::string::npos) << r.err;
  // Without --end-to-end the flag means nothing: a usage error.
  EXPECT_EQ(run_cli("run " + zpath + " --backend emulate --recompute-end-to-end").code, 2);
  // The oracle backend judges the golden's own results, so it computes the bounds itself.
  r = run_cli("run " + zpath + " --backend oracle --end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("computed now"), std::string::npos) << r.err;

  // Stored bounds for only some of the tensors judged: all are computed instead.
  ref::Golden partial = zeroed;
  partial.tensors.erase("bounds/d_w_routed_up_e2e_exact");
  partial.tensors.erase("bounds/d_w_routed_up_e2e_bound");
  const std::string ppath = (dir_ / "stored_e2e_partial.h5").string();
  ref::write_golden(ppath, partial);
  r = run_cli("run " + ppath + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("computed now"), std::string::npos) << r.err;

  // A NaN stored radius is a broken file (the generator never samples): bad input, named.
  ref::Golden broken = with;
  broken.tensors.at("bounds/d_router_weights_e2e_bound").data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  const std::string bpath = (dir_ / "stored_e2e_nan.h5").string();
  ref::write_golden(bpath, broken);
  r = run_cli("run " + bpath + " --backend emulate --end-to-end");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("bounds/d_router_weights_e2e_bound at token=1 slot=1"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// A candidate made from other inputs (one bit of x changed here) is named as such on stderr before
// its report; a candidate with the golden's own inputs gets no such note.
TEST_F(CliTest, CompareNotesACandidateWithOtherInputs) {
  ref::Golden other = golden_;
  ref::Tensor& x = other.tensors.at("inputs/x");
  x.data<uint16_t>()[3] ^= 1;
  const std::string path = (dir_ / "other_inputs.h5").string();
  ref::write_golden(path, other);
  CliRun r = run_cli("compare " + good_ + " " + path);
  EXPECT_EQ(r.code, 0) << r.out << r.err;  // only x differs: the results are the golden's, so they match
  EXPECT_NE(r.err.find("other_inputs.h5's inputs differ from " + good_ + "'s (/inputs/x): its results come from other inputs"),
            std::string::npos)
      << r.err;
  r = run_cli("compare " + good_ + " " + good_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("inputs differ"), std::string::npos) << r.err;
}

// Found by review (2026-12-05): a candidate of another shape, one without the layer output, a
// golden without it, and bounds that cannot be right.
TEST_F(CliTest, ShapesMissingTensorsAndBrokenBoundsAreNotPassed) {
  // Another R for the same tokens: the shared-expert weight gradients are per rank.
  ref::Golden other = golden_;
  {
    const spec::LayerConfig cfg{32, 16, 16, 4, 2, 1, 12};
    other.cfg = cfg;
    ref::TensorMap in = golden_.tensors;
    for (auto it = in.begin(); it != in.end();) it = it->first.rfind("inputs/", 0) == 0 ? std::next(it) : in.erase(it);
    other.tensors = in;
    for (auto& [p, t] : ref::emulate(cfg, in)) other.tensors[p] = t;
  }
  const std::string r1 = (dir_ / "r1.h5").string();
  ref::write_golden(r1, other);
  CliRun r = run_cli("compare " + good_ + " " + r1);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("dtype/shape differ"), std::string::npos) << r.out;

  ref::Golden no_output = golden_;
  no_output.tensors.erase("outputs/output");
  no_output.tensors.erase("bounds/output_exact");
  no_output.tensors.erase("bounds/output_bound");
  const std::string cand = (dir_ / "no_output.h5").string();
  ref::write_golden(cand, no_output);
  r = run_cli("compare " + good_ + " " + cand);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: outputs/output: missing from the candidate"), std::string::npos) << r.out;
  r = run_cli("run " + cand + " --backend emulate");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("dataset /outputs/output is missing"), std::string::npos) << r.err;

  const std::string neg = (dir_ / "negative_radius.h5").string();  // write_golden refuses it: edited in the file
  ref::write_golden(neg, golden_);
  test::set_f32_element(neg, "bounds/d_x_bound", 3, -1.0f);
  r = run_cli("run " + neg + " --backend emulate");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("bounds/d_x_bound"), std::string::npos) << r.err;
}

// Found by audit (2026-12): --criterion bounds against a golden without /bounds reported every
// tensor FAILED (exit 1) with an empty worst element; there is nothing to judge with: bad input.
TEST_F(CliTest, BoundsCriterionNeedsTheGoldensBounds) {
  ref::Golden nb = golden_;
  for (auto it = nb.tensors.begin(); it != nb.tensors.end();)
    it = it->first.rfind("bounds/", 0) == 0 ? nb.tensors.erase(it) : std::next(it);
  const std::string path = (dir_ / "no_bounds.h5").string();
  ref::write_golden(path, nb);
  CliRun r = run_cli("compare " + path + " " + path + " --criterion bounds");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("/bounds/output_exact and /bounds/output_bound"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/bounds/d_x_exact and /bounds/d_x_bound"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--criterion bitwise"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(run_cli("compare " + path + " " + path).code, 0);
  EXPECT_EQ(run_cli("compare " + good_ + " " + path + " --criterion bounds").code, 0);
}

// Found by audit (2026-12): with radii for only some elements (NaN: not sampled), the table said
// "compared 384, #outside 0" as if every element were within its bound.
TEST_F(CliTest, TableSaysHowManyElementsWereBoundChecked) {
  CliRun r = run_cli("run " + good_ + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("# bound-checked:"), std::string::npos) << r.out;
  ref::Golden sparse = golden_;
  ref::Tensor& radius = sparse.tensors.at("bounds/output_bound");
  const int64_t n = radius.numel();
  for (int64_t i = 1; i < n; ++i) radius.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = (dir_ / "sparse_bounds.h5").string();
  ref::write_golden(path, sparse);
  r = run_cli("run " + path + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# bound-checked: outputs/output: 1 of " + std::to_string(n) + " compared elements"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("# bound-checked: grads/d_x"), std::string::npos) << r.out;
  // The columns stay where scripts find them.
  EXPECT_NE(r.out.find("tensor                                compared      equal  max_ulp   #outside  err/bound  "
                       "result  worst element"),
            std::string::npos)
      << r.out;
}

TEST_F(CliTest, EveryMalformedFileExitsTwoWithOneMessage) {
  const fs::path mdir = dir_ / "malformed";
  fs::create_directories(mdir);
  const auto cases = mok::test::write_malformed_goldens(mdir.string(), golden_);
  ASSERT_GE(cases.size(), 36u);  // every case the reader test knows, K >= 2 here
  for (const auto& [name, path] : cases) {
    const std::string expected = mok::test::malformed_expected_text(name);
    ASSERT_FALSE(expected.empty()) << name << ": no expected text (find(\"\") would match any message)";
    const CliRun r = run_cli("run " + path + " --backend emulate");
    EXPECT_EQ(r.code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << name << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << name << " printed a partial report: " << r.out;
  }
}

// Every file of a case whose bounds cannot judge (bounds of a missing gradient, a negative stored
// radius) is bad input in every mode (found by audit, 2026-12: the gradients went unchecked, and
// the oracle backend dropped the stored bounds unread; both exited 0). The writer refuses the first.
TEST_F(CliTest, BadBoundsAreBadInputInEveryMode) {
  const fs::path mdir = dir_ / "bad_bounds";
  fs::create_directories(mdir);
  int seen = 0;
  for (const auto& [name, path] : mok::test::write_malformed_goldens(mdir.string(), golden_)) {
    if (name != "bounds_without_grads" && name != "bounds_without_d_x" && name != "negative_radius") continue;
    ++seen;
    const std::string expected = mok::test::malformed_expected_text(name);
    for (const std::string& args : {"run " + path + " --backend oracle", "run " + path + " --backend emulate --end-to-end",
                                    "compare " + path + " " + good_ + " --criterion bounds", "compare " + path + " " + good_}) {
      const CliRun r = run_cli(args);
      EXPECT_EQ(r.code, 2) << args << ": " << r.out << r.err;
      EXPECT_NE(r.err.find(path + ": " + expected), std::string::npos) << args << ": " << r.err;
      EXPECT_EQ(r.out, "") << args;
    }
  }
  EXPECT_EQ(seen, 3);
  ref::Golden no_grads = golden_;
  std::erase_if(no_grads.tensors, [](const auto& kv) { return kv.first.rfind("grads/", 0) == 0; });
  EXPECT_THROW(ref::write_golden((dir_ / "no_grads.h5").string(), no_grads), Error);
}

// Found by audit (2026-12): a NaN in an intermediate that the oracle takes as an operand of the
// output or a gradient stopped it with "ExactSum: non-finite term", naming nothing (exit 2 from a
// generic handler). It names the file, the dataset, the element and the fix.
TEST_F(CliTest, OracleNamesANonFiniteOperand) {
  const ref::Tensor& topk = golden_.tensors.at("inputs/topk_experts");
  int64_t slot = 0;
  while (topk.data<int32_t>()[slot] < 0) ++slot;
  for (const char* name : {"act", "y", "dy", "d_gate", "d_up", "dx_slot", "shared_act", "shared_d_gate", "shared_d_up"}) {
    const std::string tensor = std::string("intermediates/") + name;
    ref::Golden bad = golden_;
    ref::Tensor& t = bad.tensors.at(tensor);
    // A routed slot's column 1, or token 1's for the shared expert ([G, Is]).
    const int64_t idx = t.shape().size() == 3 ? slot * t.shape()[2] + 1 : t.shape()[1] + 1;
    t.data<uint16_t>()[idx] = spec::kBf16QuietNanBits;
    const std::string path = (dir_ / (std::string("nan_") + name + ".h5")).string();
    ref::write_golden(path, bad);
    const CliRun r = run_cli("run " + path + " --backend oracle");
    EXPECT_EQ(r.code, 2) << name << ": " << r.out << r.err;
    const std::string where = ref::locate(*ref::find_spec(tensor), golden_.cfg, idx, &topk);
    EXPECT_NE(r.err.find(path + ": dataset /" + tensor + ": element " + where + " is NaN (bf16 bits 0x7fc0)"),
              std::string::npos)
        << name << ": " << r.err;
    EXPECT_NE(r.err.find("regenerate the file with mok-golden"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << name;
  }
  // Without intermediates the oracle emulates its operands: inputs that overflow there (x at the
  // largest bf16, the gate and up weights 1) are named as such.
  ref::Golden big = golden_;
  std::erase_if(big.tensors, [](const auto& kv) { return kv.first.rfind("intermediates/", 0) == 0; });
  for (const char* p : {"inputs/x", "inputs/w_routed_gate", "inputs/w_routed_up"}) {
    ref::Tensor& t = big.tensors.at(p);
    std::fill(t.data<uint16_t>(), t.data<uint16_t>() + t.numel(), p == std::string("inputs/x") ? 0x7F7F : 0x3F80);
  }
  const std::string path = (dir_ / "overflowing_inputs.h5").string();
  ref::write_golden(path, big);
  const CliRun r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(path + ": the emulated intermediates/"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("scale the inputs down"), std::string::npos) << r.err;
}

// Found by audit (2026-12): where the oracle's own values overflow fp32 (a router weight at the
// largest fp32 times an expert output of 2), the message said to regenerate the golden's bounds,
// which the oracle backend computes itself. It says the layer overflows: scale the inputs down.
TEST_F(CliTest, OracleOverflowSaysScaleTheInputsDown) {
  const ref::Tensor& topk = golden_.tensors.at("inputs/topk_experts");
  int64_t slot = 0;
  while (topk.data<int32_t>()[slot] < 0) ++slot;
  ref::Golden bad = golden_;
  bad.tensors.at("inputs/router_weights").data<float>()[slot] = std::numeric_limits<float>::max();
  bad.tensors.at("intermediates/y").data<uint16_t>()[slot * golden_.cfg.hidden] = 0x4000;  // 2.0 at h = 0
  const std::string path = (dir_ / "overflow.h5").string();
  ref::write_golden(path, bad);
  const CliRun r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("outputs/output at token=" + std::to_string(slot / golden_.cfg.top_k) + " h=0: the oracle's value is"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("scale the inputs down"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Regenerate the golden's bounds"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// Found by audit (2026-12): a layer too large for the memory here was found only when an
// allocation failed mid-run, with a message naming no file. Loading is refused up front, naming
// the file and its largest dataset, and so is a run whose results cannot fit beside the golden.
// The files declare their datasets without writing them (a few KiB on disk); ulimit -v sets the
// memory at hand.
TEST_F(CliTest, ALayerTooLargeForTheMemoryHereIsRefusedByName) {
  const std::string huge = (dir_ / "huge_layer.h5").string();
  mok::test::write_placeholder_golden(huge, spec::LayerConfig{4096, 4096, 0, 16, 1, 1, 16}, true);  // 10.5 GiB
  CliRun r = run_cli("run " + huge + " --backend emulate", "", "ulimit -v 3000000; ");
  if (r.err.find("Sanitizer") != std::string::npos) GTEST_SKIP() << "a sanitizer build cannot start under ulimit -v";
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(huge + ": loading its datasets takes 10.5 GiB of memory (the largest, /grads/d_w_routed_down, "
                              "1.0 GiB), but only"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run on a machine with more memory"), std::string::npos) << r.err;
  // 288 MiB to load and 288 MiB more to emulate. What mok-verify maps itself differs by build (30
  // MiB on the CPU, more with the CUDA libraries), so the limit rises in 64 MiB steps from 400 MiB
  // until the load fits: the 288 MiB window after that holds the load but not the run.
  const std::string mid = (dir_ / "mid_layer.h5").string();
  mok::test::write_placeholder_golden(mid, spec::LayerConfig{1024, 1024, 0, 16, 1, 1, 16}, false, /*zeros=*/true);
  for (int64_t kib = 400 * 1024; kib <= 4096 * 1024; kib += 64 * 1024) {
    r = run_cli("run " + mid + " --backend emulate", "", "ulimit -v " + std::to_string(kib) + "; ");
    if (r.err.find("loading its datasets takes") == std::string::npos) break;
  }
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(mid + ": the emulate backend needs at least 288 MiB more memory for this layer (H=1024 I=1024"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run on a machine with more memory, or use a smaller layer"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// Found by audit (2026-12): a report that could not be written (a full disk, a closed pipe) exited
// 0 or 1 as if someone had read the verdict.
TEST_F(CliTest, AReportThatCannotBeWrittenIsBadInput) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  for (const std::string& args : {"run " + good_ + " --backend emulate", "run " + good_ + " --backend emulate --json",
                                  "compare " + good_ + " " + good_, "compare " + good_ + " " + good_ + " --json"}) {
    const CliRun r = run_cli(args, "/dev/full");
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("cannot write the report to standard output"), std::string::npos) << args << ": " << r.err;
  }
}

// A pipe whose reader has gone (`mok-verify ... | true`): SIGPIPE ended the process silently
// (exit 141, found by audit, 2026-12). The shell runs the binary with stdout on a pipe whose read
// end is already closed and with SIGPIPE at its default, as a terminal's shell would.
TEST_F(CliTest, AReportIntoAClosedPipeIsBadInput) {
  const std::string err = (scratch().path / "pipe_err.txt").string();
  fs::create_directories(scratch().path);
  for (const std::string& args : {"run " + good_ + " --backend emulate", "compare " + good_ + " " + good_ + " --json"}) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ::close(fds[0]);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::signal(SIGPIPE, SIG_DFL);
      ::dup2(fds[1], 1);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(e, 2);
      ::execl("/bin/sh", "sh", "-c", (std::string(MOK_VERIFY_BIN) + " " + args).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    std::ifstream f(err);
    std::stringstream text;
    text << f.rdbuf();
    ASSERT_TRUE(WIFEXITED(status)) << args << ": ended by signal " << WTERMSIG(status) << "\n" << text.str();
    EXPECT_EQ(WEXITSTATUS(status), 2) << args << ": " << text.str();
    EXPECT_NE(text.str().find("cannot write the report to standard output: Broken pipe"), std::string::npos)
        << args << ": " << text.str();
  }
}

// Found by audit (2026-12): --json with a file name that is not UTF-8 threw in the JSON writer
// (exit 2 on a passing check). The bad bytes are replaced (U+FFFD); the verdict stands.
TEST_F(CliTest, JsonReportsAnyFileName) {
  const std::string path = (dir_ / "latin1-\xe9t\xe9.h5").string();
  fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
  for (const std::string& args : {"run '" + path + "' --backend emulate --json", "compare '" + path + "' '" + path + "' --json"}) {
    const CliRun r = run_cli(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find("\"passed\": true"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("latin1-\xef\xbf\xbdt\xef\xbf\xbd.h5"), std::string::npos) << r.out;
  }
}

// Under mok-launch only rank 0 prints; an empty MOK_RANK (found by audit, 2026-12: it suppressed
// the report) is no rank at all.
TEST_F(CliTest, OnlyRankZeroPrintsAndEmptyRankIsUnset) {
  CliRun r = run_cli("run " + good_ + " --backend emulate", "", "MOK_RANK= ");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("# PASSED"), std::string::npos) << r.out;
  r = run_cli("run " + good_ + " --backend emulate", "", "MOK_RANK=0 ");
  EXPECT_NE(r.out.find("# PASSED"), std::string::npos) << r.out;
  r = run_cli("run " + good_ + " --backend emulate", "", "MOK_RANK=1 ");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliTest, UsageErrorsAndUnsupportedBackends) {
  EXPECT_EQ(run_cli("").code, 2);
  EXPECT_EQ(run_cli("run").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " --backend nonsense").code, 2);
  EXPECT_EQ(run_cli("run /nonexistent/file.h5").code, 2);
  EXPECT_EQ(run_cli("--help").code, 0);
  EXPECT_EQ(run_cli("bogus").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " --sample-tokens 0").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " -j -1").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " --backend emulate --transport nccl").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " --backend emulate --transport split").code, 2);
  EXPECT_EQ(run_cli("run " + good_ + " --backend cuda --transport bogus").code, 2);
  EXPECT_EQ(run_cli("determinism " + good_ + " --transport bogus").code, 2);
  EXPECT_EQ(run_cli("determinism " + good_ + " --ranks 0").code, 2);  // usage before support
  for (const char* items : {"--items bad", "--items shared,x", "--items ''"}) {
    const CliRun r = run_cli("determinism " + good_ + " " + items);
    EXPECT_EQ(r.code, 2) << items << ": " << r.err;
    EXPECT_NE(r.err.find("--items"), std::string::npos) << items << ": " << r.err;
  }
  // Usage and file errors come before "not supported here" (found by audit, 2026-12: a missing
  // file under --backend cuda exited 3).
  for (const std::string& args :
       {std::string("run /nonexistent/file.h5 --backend cuda"), "run " + good_ + " --backend cuda --full --sample-tokens 3",
        "run " + good_ + " --backend cuda --no-bounds --end-to-end", std::string("run /nonexistent/file.h5 --backend cuda --transport nccl"),
        std::string("determinism /nonexistent/file.h5")}) {
    const CliRun r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
  }
  // determinism: a rank count or minibatch that does not divide is a usage error (it was skipped
  // with a stderr line), found before whether this machine has a GPU. E = 4, G = 12 here.
  for (const auto& [args, text] : std::vector<std::pair<std::string, std::string>>{
           {"--ranks 1,3", "--ranks 3 does not divide E = 4"},
           {"--minibatch 5", "--minibatch 5 does not divide the batch (G = R*T = 12"},
           {"--ranks 4 --minibatch 6", "--ranks 4 does not divide the minibatch 6"},
           {"--ranks 8", "--ranks 8 does not divide E = 4"}}) {
    const CliRun r = run_cli("determinism " + good_ + " " + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << args << ": " << r.err;
  }
  if (std::string no_gpu; !verify::cuda_available(&no_gpu)) {
    EXPECT_EQ(run_cli("determinism " + good_ + " --ranks 1,2,4 --minibatch 4,12 --runs 1").code, 3);
  }
  // Seeds out of range are refused, not wrapped or clamped to another seed.
  for (const char* seed : {"-1", "99999999999999999999999", "1.5", "x"}) {
    CliRun r = run_cli("run " + good_ + " --backend emulate --sample-tokens 3 --sample-seed " + seed);
    EXPECT_EQ(r.code, 2) << seed << ": " << r.err;
    EXPECT_NE(r.err.find("--sample-seed"), std::string::npos) << r.err;
    r = run_cli("determinism " + good_ + " --seed " + seed);
    EXPECT_EQ(r.code, 2) << seed << ": " << r.err;
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_cli("run " + good_ + " --backend emulate --sample-tokens 3 --sample-seed 18446744073709551615").code, 0);
  // --no-bounds where the check is a bounds check: a usage error, not silently ignored.
  CliRun nb = run_cli("run " + good_ + " --backend oracle --no-bounds");
  EXPECT_EQ(nb.code, 2) << nb.err;
  EXPECT_NE(nb.err.find("the oracle backend is a bounds check"), std::string::npos) << nb.err;
  nb = run_cli("run " + good_ + " --backend emulate --no-bounds --end-to-end");
  EXPECT_EQ(nb.code, 2) << nb.err;
  EXPECT_NE(nb.err.find("the end-to-end check is a bounds check"), std::string::npos) << nb.err;
  EXPECT_EQ(run_cli("run " + good_ + " --backend emulate --no-bounds").code, 0);
  std::string why;
  if (!verify::cuda_available(&why)) {  // no CUDA build, or no GPU here: exit 3 and say why
    CliRun r = run_cli("run " + good_ + " --backend cuda");
    EXPECT_EQ(r.code, 3) << r.err;
    EXPECT_NE(r.err.find("not supported here"), std::string::npos) << r.err;
    // An explicit nccl transport under auto would silently run emulate: not supported here.
    r = run_cli("run " + good_ + " --transport nccl");
    EXPECT_EQ(r.code, 3) << r.out << r.err;
    EXPECT_NE(r.err.find("--transport nccl needs the cuda backend"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    r = run_cli("run " + good_ + " --transport split");  // the split rack needs the GPU as much
    EXPECT_EQ(r.code, 3) << r.out << r.err;
    EXPECT_NE(r.err.find("--transport split needs the cuda backend"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    r = run_cli("run " + good_ + " --backend auto --transport virtual");
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("--transport virtual applies to the cuda backend only"), std::string::npos) << r.err;
    // auto says once why it runs the emulator.
    const std::string fallback = "--backend auto: the GPU kernel is not available here (" + why + "); running the CPU emulator";
    EXPECT_NE(r.err.find(fallback), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(why), r.err.rfind(why)) << "the reason is given twice: " << r.err;
    r = run_cli("run " + good_);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.err.find(fallback), std::string::npos) << r.err;
  }
}

}  // namespace

namespace {

// Found by the forty-ninth session's audit: a forward-only golden (no /grads, as the reader's
// advice for a golden missing a gradient suggests) that kept the backward intermediates had
// them skipped in silence by the emulate backend, so wrong ones passed. They are now checked:
// corrupted, they fail (exit 1) at the first one.
TEST_F(CliTest, BackwardIntermediatesWithoutGradientsAreChecked) {
  ref::Golden fwd = golden_;
  std::erase_if(fwd.tensors, [](const auto& kv) {
    const std::string& p = kv.first;
    return p.rfind("grads/", 0) == 0 || (p.rfind("bounds/", 0) == 0 && p.rfind("bounds/output", 0) != 0);
  });
  ASSERT_TRUE(fwd.tensors.count("intermediates/dy"));
  const std::string kept = (dir_ / "fwd_kept.h5").string();
  ref::write_golden(kept, fwd);
  CliRun r = run_cli("run " + kept + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("intermediates/dy"), std::string::npos) << "dy was not compared: " << r.out;
  ref::Tensor& dy = fwd.tensors.at("intermediates/dy");
  dy.data<uint16_t>()[0] ^= 0x0100;
  const std::string bad = (dir_ / "fwd_bad_dy.h5").string();
  ref::write_golden(bad, fwd);
  r = run_cli("run " + bad + " --backend emulate");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/dy at token=0"), std::string::npos) << r.out;
}

// Found by an audit (fiftieth session): a golden that kept some intermediates and not others.
// The oracle bounds each stage from its operands; where the file lacked them, the stage was
// neither judged nor listed (gate and up gone: act, d_gate and d_up left out, and a moved act
// bit reported at y), and a missing operand (act) ended the run with exit 2. The missing ones
// are now emulated as operands, and every intermediate the file holds is judged.
TEST_F(CliTest, TheOracleJudgesEveryIntermediateOfAGoldenThatKeptSome) {
  ref::Golden part = golden_;
  part.tensors.erase("intermediates/gate");
  part.tensors.erase("intermediates/up");
  uint16_t* act = part.tensors.at("intermediates/act").data<uint16_t>();
  const int32_t* tk = part.tensors.at("inputs/topk_experts").data<int32_t>();
  int64_t slot = 0;
  while (tk[slot] < 0) ++slot;
  act[slot * 16 + 2] = static_cast<uint16_t>(act[slot * 16 + 2] + 2);  // 2 ULP
  const std::string path = (dir_ / "no_gate_up.h5").string();
  ref::write_golden(path, part);
  CliRun r = run_cli("run " + path + " --backend oracle");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("lacks intermediates gate, up"), std::string::npos) << r.err;
  for (const char* p : {"intermediates/act ", "intermediates/d_gate ", "intermediates/d_up "})
    EXPECT_NE(r.out.find(p), std::string::npos) << p << " was not judged\n" << r.out;
  EXPECT_NE(r.out.find("# first failing stage: intermediates/act at token=" + std::to_string(slot / 2) + " slot=" +
                       std::to_string(slot % 2)),
            std::string::npos)
      << r.out;

  ref::Golden no_act = golden_;
  no_act.tensors.erase("intermediates/act");
  const std::string path2 = (dir_ / "no_act.h5").string();
  ref::write_golden(path2, no_act);
  r = run_cli("run " + path2 + " --backend oracle");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("intermediates/y "), std::string::npos) << "y, act's consumer, was not judged\n" << r.out;
}

// The entry of one tensor in a --json report (null when the report has none).
nlohmann::json tensor_entry(const std::string& report, const std::string& tensor) {
  const nlohmann::json j = nlohmann::json::parse(report);  // kept: the loop must not range over a temporary's member
  for (const auto& t : j["tensors"])
    if (t["tensor"] == tensor) return t;
  return nullptr;
}

// `mok-verify compare GOLDEN CANDIDATE --json ARGS` for a candidate written from `cand`: the run's
// exit code is 1 (the candidate differs), and the report's entry for `tensor` is returned.
nlohmann::json compare_json_entry(const ref::Golden& cand, const std::string& file, const std::string& args,
                                  const std::string& tensor, const std::string& good, const fs::path& dir) {
  const std::string path = (dir / file).string();
  ref::write_golden(path, cand);
  const CliRun r = run_cli("compare " + good + " " + path + " --json" + args);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const nlohmann::json t = tensor_entry(r.out, tensor);
  EXPECT_TRUE(t.is_object()) << r.out;
  return t;
}

// Found by the same audit: under --criterion bounds the JSON's first_element was the first
// element whose bits differ, not the first outside its radius (the table's, and the README's).
TEST_F(CliTest, JsonFirstElementUnderBoundsIsTheFirstOutsideItsRadius) {
  ref::Golden cand = golden_;
  ref::Tensor& g = cand.tensors.at("grads/d_w_routed_down");
  float* v = g.data<float>();
  const int64_t far = g.numel() - 3;
  uint32_t bits;
  std::memcpy(&bits, &v[1], 4);
  ++bits;  // one ulp: inside any radius
  std::memcpy(&v[1], &bits, 4);
  v[far] = v[far] * 4 + 1;  // far outside
  const nlohmann::json t =
      compare_json_entry(cand, "bounds_first.h5", " --criterion bounds", "grads/d_w_routed_down", good_, dir_);
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t["first_index"], far) << t.dump();
  EXPECT_EQ(t["first_outside_index"], far) << t.dump();
  EXPECT_EQ(t["first_element"], t["first_outside_element"]) << t.dump();
}

// Infinite values in the JSON report are strings, as the ratio is (they were null).
TEST_F(CliTest, JsonWritesInfiniteValuesAsStrings) {
  ref::Golden cand = golden_;
  cand.tensors.at("outputs/output").data<uint16_t>()[0] = 0x7f80;  // bf16 +inf
  const nlohmann::json t = compare_json_entry(cand, "inf_output.h5", "", "outputs/output", good_, dir_);
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t["worst_actual"], "inf") << t.dump();
  EXPECT_TRUE(t["worst_expected"].is_number()) << t.dump();
}

// determinism: the default --ranks keep the counts this layer takes (E = 4 here: 1, 2, 4), and a
// list with an empty or repeated item is refused (they were dropped or run twice).
TEST_F(CliTest, DeterminismListsAreCheckedAndDefaultsFitTheLayer) {
  CliRun r = run_cli("determinism " + good_ + " --runs 1");
  EXPECT_NE(r.err.find("--ranks defaults to 1,2,4,8; this layer (E = 4, 12 tokens) takes 1,2,4 of them"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.code, 2) << r.err;  // 0 with a GPU, 3 without
  for (const std::string& args : {"--ranks 1,,2", "--ranks=1,2,", "--items shared,,own", "--comm-sms ,1"}) {
    r = run_cli("determinism " + good_ + " " + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("has an empty item"), std::string::npos) << args << ": " << r.err;
  }
  for (const auto& [args, says] : {std::pair<std::string, std::string>{"--ranks 1,2,1", "--ranks lists 1 twice"},
                                   {"--comm-sms 2,1,2", "--comm-sms lists 2 twice"},
                                   {"--items own,own", "--items lists own twice"},
                                   {"--minibatch 12,12", "--minibatch lists 12 twice"}}) {
    r = run_cli("determinism " + good_ + " " + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << ": " << r.err;
  }
}

// A /config that disagrees with the datasets is named as such, not as a layer too large for the
// memory here (T = 2^24 said "loading its datasets takes 64.0 GiB"; the shapes are now checked
// before the memory).
TEST_F(CliTest, AConfigThatDisagreesWithTheDatasetsIsAShapeError) {
  const std::string path = (dir_ / "huge_T.h5").string();
  fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
  {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t cfg = H5Gopen2(f, "/config", H5P_DEFAULT);
    const hid_t attr = H5Aopen(cfg, "T", H5P_DEFAULT);
    const int64_t T = int64_t{1} << 24;
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &T), 0);
    H5Aclose(attr);
    H5Gclose(cfg);
    H5Fclose(f);
  }
  const CliRun r = run_cli("run " + path + " --backend emulate", "", "ulimit -v 4000000; ");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(": expected shape ["), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("loading its datasets takes"), std::string::npos) << r.err;
}

// DESIGN section 7 asks for the dtype attribute on bf16 datasets (uint16 in the file): a float32
// or int32 dataset without it is read by its HDF5 type (it was refused), a bf16 one is not.
TEST_F(CliTest, TheDtypeAttributeIsRequiredForBf16DatasetsOnly) {
  auto without = [&](const char* dataset, const std::string& name) {
    const std::string path = (dir_ / name).string();
    fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(f, 0);
    EXPECT_GE(H5Adelete_by_name(f, dataset, "dtype", H5P_DEFAULT), 0) << dataset;
    H5Fclose(f);
    return path;
  };
  CliRun r = run_cli("run " + without("/inputs/router_weights", "no_dtype_f32.h5") + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.err;
  r = run_cli("run " + without("/inputs/topk_experts", "no_dtype_i32.h5") + " --backend emulate");
  EXPECT_EQ(r.code, 0) << r.err;
  r = run_cli("run " + without("/inputs/x", "no_dtype_bf16.h5") + " --backend emulate");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("dataset /inputs/x: attribute dtype is missing"), std::string::npos) << r.err;
}

// The sample line claims a sampled token only for experts that have tokens (it said "every expert
// has one" where an expert had none).
TEST_F(CliTest, TheSampleLineClaimsOnlyWhatItCovers) {
  const CliRun r = run_cli("run " + good_ + " --backend emulate --sample-tokens 1");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tokens (one at least per expert that has any)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("every expert has one"), std::string::npos) << r.err;
}

// A golden another program holds open for writing (a notebook's h5py.File(..., "r+")): HDF5's
// lock, named as such, not "not an HDF5 file or truncated ... copy it again".
TEST_F(CliTest, AGoldenOpenForWritingElsewhereIsNamedAsLocked) {
  const std::string path = (dir_ / "locked.h5").string();
  fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
  const hid_t held = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(held, 0);
  const CliRun r = run_cli("run " + path + " --backend emulate");
  H5Fclose(held);
  if (r.code == 0) GTEST_SKIP() << "HDF5 file locking is not in effect here (HDF5_USE_FILE_LOCKING or the file system)";
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("another program has it open for writing and HDF5 locks it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HDF5_USE_FILE_LOCKING=FALSE"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("truncated"), std::string::npos) << r.err;
}

}  // namespace
