// RapidCheck properties of the fused kernel on the GPU (DESIGN.md section 4: the determinism
// contract's invariances asserted as properties on the kernel, not only on the CPU reference):
// random layer shapes (the slow engine's 16-multiples and the fast engine's 64-multiples), random
// routing (uniform, power law, hot experts, empty slots, per-rank skew), random seeds and random
// kernel options (block counts, communication blocks, TMA or thread-filled tiles, gathers,
// epilogue forms, item groups), forward and backward:
//   - every result equals the emulator's bits;
//   - every result is the same for any split into ranks and any options;
//   - a token's results do not depend on which other tokens share the batch;
//   - permuting the tokens permutes the results.
// Label gpu; without a GPU the program prints why and exits 77 (ctest's skip). Cases per property:
// RapidCheck's default 100, or RC_PARAMS="max_success=N".
#include "mok/kernel/layer.hpp"
#include "mok/reference/emulate.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/schema.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace mok;
using ref::Tensor;
using ref::TensorMap;

// A layer for the kernel: half the cases the slow engine's small shapes (test::gen_config: H, I,
// Is multiples of 16), half the fast engine's (multiples of 64, up to 8 ranks, top-10, row tiles
// of more than 128 rows for hot experts).
spec::LayerConfig gen_kernel_config() {
  if (*rc::gen::arbitrary<bool>()) {
    spec::LayerConfig c = test::gen_config();
    c.tokens_per_rank = *rc::gen::inRange<int64_t>(1, 40);
    return c;
  }
  spec::LayerConfig c;
  c.hidden = 64 * *rc::gen::inRange(1, 5);
  c.intermediate = 64 * *rc::gen::inRange(1, 4);
  c.shared_intermediate = 64 * *rc::gen::inRange(0, 3);
  c.num_ranks = *rc::gen::element<int64_t>(1, 2, 4, 8);
  c.num_experts = c.num_ranks * *rc::gen::inRange<int64_t>(1, 6);
  c.top_k = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(c.num_experts, 10) + 1);
  c.tokens_per_rank = *rc::gen::inRange<int64_t>(1, 320 / c.num_ranks + 1);
  return c;
}

// Options the kernel must give the same bits under. Block counts small enough for R ranks on
// any GPU of 16 SMs or more, or 0 (fill the GPU, uneven ranks where the SMs do not divide).
kernel::KernelOptions gen_options(int64_t R) {
  kernel::KernelOptions o;
  const int most = std::max<int>(2, std::min<int>(9, 16 / static_cast<int>(R)));
  o.blocks_per_rank = *rc::gen::element(0, *rc::gen::inRange(2, most + 1));
  if (o.blocks_per_rank > 0) {
    o.comm_blocks_per_rank = *rc::gen::inRange(0, o.blocks_per_rank);
    o.forward_comm_blocks_per_rank = *rc::gen::inRange(0, o.blocks_per_rank);
  }
  o.disable_tma = *rc::gen::element(false, false, true);
  o.bulk_gather = *rc::gen::arbitrary<bool>();
  o.bulk_gather_stores = *rc::gen::inRange(1, 5);
  o.bulk_gather_batch = *rc::gen::inRange(1, 17);
  o.swiglu = *rc::gen::element(kernel::SwigluEpilogue::kAuto, kernel::SwigluEpilogue::kFragments,
                               kernel::SwigluEpilogue::kStaged);
  o.x_rows = *rc::gen::element(kernel::XRows::kAuto, kernel::XRows::kGathered, kernel::XRows::kDirect);
  o.group_rows = *rc::gen::element(1, 2, 3, 8, 16);
  o.shared_items = *rc::gen::arbitrary<bool>();
  o.wait_timeout_s = 20.0;
  return o;
}

std::string describe(const kernel::KernelOptions& o) {
  char s[256];
  std::snprintf(s, sizeof s,
                "blocks/rank %d comm %d fwd comm %d no-TMA %d bulk %d (stores %d batch %d) swiglu %d x_rows %d "
                "groups %d shared items %d",
                o.blocks_per_rank, o.comm_blocks_per_rank, o.forward_comm_blocks_per_rank, o.disable_tma ? 1 : 0,
                o.bulk_gather ? 1 : 0, o.bulk_gather_stores, o.bulk_gather_batch, static_cast<int>(o.swiglu),
                static_cast<int>(o.x_rows), o.group_rows, o.shared_items ? 1 : 0);
  return s;
}

struct Case {
  spec::LayerConfig cfg;
  TensorMap inputs;
};

Case gen_case(const spec::LayerConfig& cfg) {
  Case c{cfg, {}};
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const ref::RoutingSpec routing = test::gen_routing();
  c.inputs = ref::generate_inputs(cfg, routing, seed);
  RC_LOG() << ref::format_config(cfg) << " seed=" << seed << "\n";
  return c;
}

// The kernel's forward and backward (outputs, gradients, and the slot buffers y and dx_slot).
TensorMap run_kernel(const spec::LayerConfig& cfg, const TensorMap& inputs, const kernel::KernelOptions& o) {
  RC_LOG() << "R=" << cfg.num_ranks << " " << describe(o) << "\n";
  return kernel::run_layer(cfg, inputs, true, o, false);
}

// Every tensor of `got` (but `left_out`) equals `want`'s bit for bit; `want` holds each.
void require_bitwise(const TensorMap& want, const TensorMap& got, const spec::LayerConfig& cfg, const std::string& what,
                     const std::vector<std::string>& left_out = {}) {
  RC_ASSERT(got.count("outputs/output") == 1u);
  RC_ASSERT(got.count("grads/d_x") == 1u);
  for (const auto& [path, t] : got) {
    if (std::find(left_out.begin(), left_out.end(), path) != left_out.end()) continue;
    MOK_RC_REQUIRE(want.count(path) == 1u, what << ": the reference has no " << path);
    const Tensor& w = want.at(path);
    MOK_RC_REQUIRE(w.size_bytes() == t.size_bytes(), what << ": " << path << " sizes differ");
    if (std::memcmp(w.raw(), t.raw(), t.size_bytes()) == 0) continue;
    int64_t first = 0;
    while (w.bits_at(first) == t.bits_at(first)) ++first;
    MOK_RC_REQUIRE(false, what << ": " << path << " differs first at " << ref::locate(*ref::find_spec(path), cfg, first)
                                << " (reference " << w.value_at(first) << ", kernel " << t.value_at(first) << ")");
  }
}

// Per rank by contract (each rank's partial sums), so they differ between splits.
const std::vector<std::string> kPerRank{"grads/d_w_shared_gate", "grads/d_w_shared_up", "grads/d_w_shared_down"};

bool token_tensor(const std::string& path) {
  return path == "inputs/x" || path == "inputs/topk_experts" || path == "inputs/router_weights" ||
         path == "inputs/d_output";
}

Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = t.size_bytes() / static_cast<size_t>(shape[0]);
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out(t.dtype(), shape);
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * row_bytes,
                static_cast<const char*>(t.raw()) + static_cast<size_t>(rows[r]) * row_bytes, row_bytes);
  return out;
}

TensorMap with_tokens(const TensorMap& in, const std::vector<int64_t>& rows) {
  TensorMap out;
  for (const auto& [p, t] : in) out[p] = token_tensor(p) ? take_rows(t, rows) : t;
  return out;
}

// Row a_rows[i] of a equals row b_rows[i] of b (leading axis: tokens).
void require_rows_equal(const Tensor& a, const std::vector<int64_t>& a_rows, const Tensor& b,
                        const std::vector<int64_t>& b_rows, const std::string& what) {
  const size_t row_bytes = a.size_bytes() / static_cast<size_t>(a.shape()[0]);
  for (size_t i = 0; i < a_rows.size(); ++i) {
    const bool same = std::memcmp(static_cast<const char*>(a.raw()) + static_cast<size_t>(a_rows[i]) * row_bytes,
                                  static_cast<const char*>(b.raw()) + static_cast<size_t>(b_rows[i]) * row_bytes,
                                  row_bytes) == 0;
    MOK_RC_REQUIRE(same, what << " differs at token " << a_rows[i]);
  }
}

const char* const kPerToken[] = {"outputs/output", "grads/d_x", "grads/d_router_weights"};

RC_GTEST_PROP(KernelProperty, EqualsTheEmulatorBitForBit, ()) {
  const Case c = gen_case(gen_kernel_config());
  const kernel::KernelOptions o = gen_options(c.cfg.num_ranks);
  const TensorMap got = run_kernel(c.cfg, c.inputs, o);
  const TensorMap want = ref::emulate(c.cfg, c.inputs);
  require_bitwise(want, got, c.cfg, "kernel against the emulator");
}

// The same global inputs at R = 1 with the default options and at another split that divides both
// the tokens and the experts, with random options: every result but the per-rank shared-expert
// weight gradients bit for bit; and the second configuration run again gives the same bits.
RC_GTEST_PROP(KernelProperty, SameBitsForEverySplitOptionsAndRun, ()) {
  spec::LayerConfig base = gen_kernel_config();
  base.tokens_per_rank *= base.num_ranks;
  base.num_ranks = 1;
  const Case c = gen_case(base);
  const int64_t G = base.num_tokens(), E = base.num_experts;
  std::vector<int64_t> splits;
  for (int64_t r = 1; r <= std::min<int64_t>(G, 8); ++r)
    if (G % r == 0 && E % r == 0) splits.push_back(r);
  spec::LayerConfig split = base;
  split.num_ranks = *rc::gen::elementOf(splits);
  split.tokens_per_rank = G / split.num_ranks;
  const TensorMap one = run_kernel(base, c.inputs, kernel::KernelOptions{});
  const kernel::KernelOptions o = gen_options(split.num_ranks);
  const TensorMap a = run_kernel(split, c.inputs, o);
  require_bitwise(one, a, split, "R=1 default options against R=" + std::to_string(split.num_ranks), kPerRank);
  const TensorMap b = run_kernel(split, c.inputs, o);
  require_bitwise(a, b, split, "the same configuration run twice");
}

// A random sub-batch (one rank of its own) gives each of its tokens the bits the whole batch gave it.
RC_GTEST_PROP(KernelProperty, BatchInvariant, ()) {
  const Case c = gen_case(gen_kernel_config());
  const int64_t G = c.cfg.num_tokens();
  const int64_t must = *rc::gen::inRange<int64_t>(0, G);
  const auto coin = *rc::gen::container<std::vector<bool>>(static_cast<size_t>(G), rc::gen::arbitrary<bool>());
  std::vector<int64_t> rows;
  for (int64_t g = 0; g < G; ++g)
    if (g == must || coin[static_cast<size_t>(g)]) rows.push_back(g);
  spec::LayerConfig sub = c.cfg;
  sub.num_ranks = 1;
  sub.tokens_per_rank = static_cast<int64_t>(rows.size());
  RC_LOG() << "sub-batch of " << rows.size() << " tokens\n";
  const TensorMap full = run_kernel(c.cfg, c.inputs, gen_options(c.cfg.num_ranks));
  const TensorMap part = run_kernel(sub, with_tokens(c.inputs, rows), gen_options(1));
  std::vector<int64_t> iota(rows.size());
  std::iota(iota.begin(), iota.end(), 0);
  for (const char* p : kPerToken) require_rows_equal(full.at(p), rows, part.at(p), iota, p);
}

// Tokens in another order (so on other ranks, in other row positions of every expert's tiles):
// each token's results move with it.
RC_GTEST_PROP(KernelProperty, EquivariantUnderTokenPermutation, ()) {
  const Case c = gen_case(gen_kernel_config());
  const int64_t G = c.cfg.num_tokens();
  std::vector<int64_t> perm(static_cast<size_t>(G));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = G - 1; i > 0; --i) std::swap(perm[i], perm[*rc::gen::inRange<int64_t>(0, i + 1)]);
  const TensorMap a = run_kernel(c.cfg, c.inputs, gen_options(c.cfg.num_ranks));
  const TensorMap b = run_kernel(c.cfg, with_tokens(c.inputs, perm), gen_options(c.cfg.num_ranks));
  std::vector<int64_t> iota(static_cast<size_t>(G));
  std::iota(iota.begin(), iota.end(), 0);
  for (const char* p : kPerToken) require_rows_equal(a.at(p), perm, b.at(p), iota, p);
}

}  // namespace

// Exit 77 (ctest's skip) without a GPU, naming why; otherwise gtest's result.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (!mok::kernel::gpu_available(&why)) {
    std::printf("test_kernel_props: no GPU (%s): the kernel's properties skipped; reporting a skip to ctest\n",
                why.c_str());
    return 77;
  }
  return RUN_ALL_TESTS() == 0 ? 0 : 1;
}
