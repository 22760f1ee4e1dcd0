// GPU tests of the fused kernel: bit-exact with the emulator on every fixture, determinism across
// ranks and role splits, bounded waits, and routing validation. Skip with a message without a GPU.
#include "mok/kernel/layer.hpp"
#include "mok/kernel/nccl.hpp"
#include "mok/kernel/split_rack.hpp"
#include "mok/reference/emulate.hpp"
#include "mok/reference/error.hpp"
#include "mok/reference/generate.hpp"
#include "mok/reference/golden.hpp"
#include "mok/reference/schema.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace mok;

#define REQUIRE_GPU()                                      \
  do {                                                     \
    std::string why;                                       \
    if (!kernel::gpu_available(&why)) GTEST_SKIP() << why; \
  } while (0)

// The NCCL tests: a usable GPU and the NCCL transport (skipped with the reason otherwise).
#define REQUIRE_GPU_AND_NCCL()                              \
  do {                                                      \
    REQUIRE_GPU();                                          \
    std::string why;                                        \
    if (!kernel::nccl_available(&why)) GTEST_SKIP() << why; \
  } while (0)

// The split rack's tests: the ranks' launches must run at once (split_rack.hpp), which
// CUDA_LAUNCH_BLOCKING=1 forbids (run_layer_split refuses it).
#define REQUIRE_GPU_SPLIT()                                                                     \
  do {                                                                                          \
    REQUIRE_GPU();                                                                              \
    const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");                                 \
    if (blocking && std::string(blocking) == "1") {                                             \
      GTEST_SKIP() << "CUDA_LAUNCH_BLOCKING=1 runs the split rack's launches one after another"; \
    }                                                                                           \
  } while (0)

int visible_devices() {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  return devices;
}

ref::TensorMap inputs_of(const ref::TensorMap& all) {
  ref::TensorMap in;
  for (const auto& [p, t] : all)
    if (p.rfind("inputs/", 0) == 0) in[p] = t;
  return in;
}

// The shared-expert weight gradients, which the determinism checks leave out (per rank by
// contract, so they differ between rank counts).
const std::vector<std::string> kSharedWeightGrads{"grads/d_w_shared_gate", "grads/d_w_shared_up",
                                                  "grads/d_w_shared_down"};

// Every tensor the kernel returns must equal the reference bit for bit (reports the first miss),
// and the kernel must return every output and gradient the reference holds except `left_out`:
// a kernel that returned nothing would otherwise pass.
void expect_bitwise(const ref::TensorMap& want, const ref::TensorMap& got, const spec::LayerConfig& cfg,
                    const std::string& what, const std::vector<std::string>& left_out = {}) {
  const ref::Tensor* topk = want.count("inputs/topk_experts") ? &want.at("inputs/topk_experts") : nullptr;
  for (const auto& [path, t] : want) {
    if (path.rfind("outputs/", 0) != 0 && path.rfind("grads/", 0) != 0) continue;
    if (std::find(left_out.begin(), left_out.end(), path) != left_out.end()) continue;
    EXPECT_TRUE(got.count(path)) << what << ": the kernel returned no " << path;
  }
  for (const auto& [path, t] : got) {
    ASSERT_TRUE(want.count(path)) << what << ": reference lacks " << path;
    const ref::Tensor& w = want.at(path);
    ASSERT_EQ(w.size_bytes(), t.size_bytes()) << path;
    if (std::memcmp(w.raw(), t.raw(), t.size_bytes()) == 0) continue;
    int64_t first = -1, count = 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (w.bits_at(i) != t.bits_at(i)) {
        if (first < 0) first = i;
        ++count;
      }
    ADD_FAILURE() << what << ": " << path << " differs in " << count << " of " << t.numel() << " elements; first at "
                  << ref::locate(*ref::find_spec(path), cfg, first, topk) << " (reference " << w.value_at(first)
                  << ", kernel " << t.value_at(first) << ")";
  }
}

std::vector<std::string> fixtures() {
  std::vector<std::string> files;
  const char* env = std::getenv("MOK_FIXTURES_DIR");  // where the tree was copied elsewhere
  for (const auto& e : std::filesystem::directory_iterator(env ? env : MOK_FIXTURES_DIR))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Kernel, EveryFixtureBitExactWithTheEmulator) {
  REQUIRE_GPU();
  const auto files = fixtures();
  ASSERT_GE(files.size(), 5u);
  for (const std::string& f : files) {
    const ref::Golden g = ref::read_golden(f);
    const ref::TensorMap got = kernel::run_layer(g.cfg, inputs_of(g.tensors), true);
    ref::TensorMap want = g.tensors;
    // The workspace's intermediates come back too (Layer::copy_intermediates), so a wrong stage
    // inside an expert is named there; each is compared bit for bit below.
    for (const char* p : {"intermediates/gate", "intermediates/up", "intermediates/act", "intermediates/y",
                          "intermediates/dy", "intermediates/d_gate", "intermediates/d_up", "intermediates/dx_slot"})
      EXPECT_TRUE(got.count(p)) << f << ": run_layer returned no " << p;
    if (g.cfg.has_shared()) {
      for (const char* p : {"intermediates/shared_gate", "intermediates/shared_up", "intermediates/shared_act",
                            "intermediates/shared_out", "intermediates/shared_d_gate", "intermediates/shared_d_up",
                            "intermediates/dx_shared"})
        EXPECT_TRUE(got.count(p)) << f << ": run_layer returned no " << p;
    }
    expect_bitwise(want, got, g.cfg, f);
  }
}

// The same global inputs split over R = 1, 2, 4, 8 ranks, with two communication/compute
// splits and repeated runs: every output bit identical (the determinism contract).
void check_determinism(const spec::LayerConfig& base);
void check_fast_engine(const spec::LayerConfig& base, const std::vector<int>& ranks);

TEST(Kernel, DeterminismAcrossRanksRolesAndRuns) {
  REQUIRE_GPU();
  // Two shapes: powers of two, and H = 48 / I = 96, whose rows share cache lines across tiles.
  for (const spec::LayerConfig& base : {spec::LayerConfig{128, 64, 64, 16, 4, 1, 64}, spec::LayerConfig{48, 96, 32, 16, 4, 1, 64}})
    check_determinism(base);
}

// The fast engine (sm_90a: TMA, 128x128 tiles, MN-major operands, gate and up in one pass) on a
// shape that takes every path of it: K of 6 chunks (the 4-stage ring wraps), experts with more
// than one 128-row tile, weight gradients over a partial last chunk, the shared expert, 1 and 2
// ranks. Everything bit-exact with the emulator. The second shape (I = 256, Is = 192) fills both
// 128-column halves of the backward phase-1 tiles (256 wide over I), whole and partial, which
// the row epilogues store in separate passes. With 3 blocks, each block takes many GEMM and
// weight-gradient tiles in a row, each reusing the ring right after the last one's staged epilogue.
// The third (H = 2304) gives the router gradients two chunks per slot, a whole one and a partial
// one, so each warp's next-chunk copies land both within a slot and across slots.
TEST(Kernel, FastEngineBitExactWithTheEmulator) {
  REQUIRE_GPU();
  for (const spec::LayerConfig& base : {spec::LayerConfig{384, 128, 128, 8, 2, 1, 320}, spec::LayerConfig{384, 256, 192, 8, 2, 1, 320},
                                        spec::LayerConfig{2304, 128, 128, 8, 2, 1, 96}})
    check_fast_engine(base, base.intermediate == 128 && base.hidden == 384 ? std::vector<int>{1, 2} : std::vector<int>{1});
}

// Each pass maps work items to experts through a per-block row-tile table, or walks the offsets
// when a rank has more experts than its table holds (moe.cuh, above row_tile_at: the forward's
// static table holds 512, the backward's, in the ring's padding, 236). 520 experts: at R = 1 both
// passes walk, at R = 2 (260 local) the forward searches and the backward walks, at R = 4 (130)
// both search. Zipf routing: a few hot experts take several row tiles, most one, some none.
// Top-10 also takes the combines past their first batch of 8 slots. R = 8 with the GPU filled
// gives uneven ranks where the SMs do not divide by 8 (132 SMs: four ranks of 17 blocks, four of
// 16; the next test checks the split).
TEST(Kernel, FastEngineRowTileTablesAndWalksAgree) {
  REQUIRE_GPU();
  check_fast_engine(spec::LayerConfig{128, 128, 64, 520, 10, 1, 512}, {1, 2, 4, 8});
}

// Filling the GPU (blocks_per_rank = 0), every co-resident block serves a rank: the blocks that do
// not divide among the ranks go one each to the first ranks (rank_block_of), none is left idle.
TEST(Kernel, FilledLaunchUsesEverySmWithUnevenRanks) {
  REQUIRE_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  for (int R : {1, 3, 5, 8}) {
    spec::LayerConfig cfg{128, 128, 64, 120, 4, R, 64};
    kernel::Layer layer(cfg, kernel::KernelOptions{});
    // One block of 256 threads per SM (the ring takes most of its shared memory).
    EXPECT_EQ(layer.launch_blocks(), prop.multiProcessorCount) << "R=" << R;
    EXPECT_EQ(layer.blocks_per_rank(), prop.multiProcessorCount / R) << "R=" << R;
    EXPECT_EQ(layer.wide_ranks(), prop.multiProcessorCount % R) << "R=" << R;
    kernel::KernelOptions fixed;
    fixed.blocks_per_rank = 3;  // a given count is every rank's
    kernel::Layer even(cfg, fixed);
    EXPECT_EQ(even.wide_ranks(), 0);
    EXPECT_EQ(even.launch_blocks(), 3 * R);
  }
}

// The routing plan (moe.cuh, plan_slice): each block places the rows of its token slice, 256
// tokens a round, the local experts 128 at a time, after the rows that the slices of the blocks
// before it counted (block_counts, read four blocks at a time). Two blocks a rank give slices of
// two or three rounds, the last one partial; 160 and 300 experts give several expert groups, the
// last one partial (at R = 2 too for 300); top-6, 12 and 20 take the three row readers (8 and 16
// ids in registers, and any K id by id); nine blocks read block_counts past its first four
// entries and, with 6 tokens, leave slices empty; at R = 2 each rank plans its experts from both
// ranks' tokens, and nine blocks' slices cross from one rank's tokens to the next. Zipf routing
// with empty slots. A misplaced row changes the bits, so everything must equal the emulator.
TEST(Kernel, PlanSlicesOfSeveralRoundsAndExpertGroups) {
  REQUIRE_GPU();
  for (const spec::LayerConfig& base : {spec::LayerConfig{64, 32, 32, 160, 6, 1, 1100}, spec::LayerConfig{64, 32, 0, 300, 12, 1, 600},
                                        spec::LayerConfig{64, 32, 32, 300, 20, 1, 700}, spec::LayerConfig{64, 32, 32, 16, 4, 1, 6}}) {
    ref::RoutingSpec rs = ref::parse_routing("zipf:1.2");
    rs.empty_prob = 0.05;
    const ref::TensorMap in = ref::generate_inputs(base, rs, 777);
    ref::TensorMap want = ref::emulate(base, in);
    for (auto& [p, t] : in) want[p] = t;
    for (int R : {1, 2})
      for (int blocks : {2, 9}) {
        spec::LayerConfig cfg = base;
        cfg.num_ranks = R;
        cfg.tokens_per_rank = base.num_tokens() / R;
        kernel::KernelOptions o;
        o.blocks_per_rank = blocks;
        ref::TensorMap got = kernel::run_layer(cfg, in, true, o);
        if (R > 1)
          for (const std::string& p : kSharedWeightGrads) got.erase(p);
        expect_bitwise(want, got, cfg,
                       "plan: E=" + std::to_string(base.num_experts) + " K=" + std::to_string(base.top_k) +
                           " R=" + std::to_string(R) + " blocks/rank " + std::to_string(blocks),
                       R > 1 ? kSharedWeightGrads : std::vector<std::string>{});
      }
  }
}

void check_fast_engine(const spec::LayerConfig& base, const std::vector<int>& ranks) {
  ref::RoutingSpec rs = ref::parse_routing("zipf:1.2");
  rs.empty_prob = 0.03;
  const ref::TensorMap in = ref::generate_inputs(base, rs, 4242);
  ref::TensorMap want = ref::emulate(base, in);
  for (auto& [p, t] : in) want[p] = t;
  for (int R : ranks)
    for (int blocks : {0, 3})
      // bulk gather, fragment SwiGLU; thread gather; staged SwiGLU; x rows read where they lie
      // (RowsOperand, no gather; the first column tiles write S.xd for the backward) with the staged
      // SwiGLU; the same with fragments
      for (int variant : {0, 1, 2, 3, 4}) {
        const bool bulk = variant != 1 && variant != 3, staged = variant == 2 || variant == 3;
        const bool direct = variant >= 3;
        const int group = variant == 0 || variant == 4 ? 8 : variant == 1 ? 3 : 1;  // item groups: default, partial, none
        spec::LayerConfig cfg = base;
        cfg.num_ranks = R;
        cfg.tokens_per_rank = base.num_tokens() / R;
        kernel::KernelOptions o;
        o.blocks_per_rank = blocks;
        o.bulk_gather = bulk;
        o.swiglu = staged ? kernel::SwigluEpilogue::kStaged : kernel::SwigluEpilogue::kFragments;
        o.group_rows = group;
        o.x_rows = direct ? kernel::XRows::kDirect : kernel::XRows::kGathered;
        if (variant == 2) {  // the bulk gather's other pipeline shapes: more stores in flight, more rows per fence
          o.bulk_gather_stores = blocks == 0 ? 3 : 2;
          o.bulk_gather_batch = blocks == 0 ? 16 : 1;
        }
        ref::TensorMap got = kernel::run_layer(cfg, in, true, o);
        if (R > 1)
          for (const std::string& p : kSharedWeightGrads) got.erase(p);
        expect_bitwise(want, got, cfg,
                       "fast engine R=" + std::to_string(R) + " blocks/rank " + std::to_string(blocks) +
                           (bulk || direct ? "" : " thread gather") + (staged ? " staged SwiGLU" : "") +
                           (direct ? " x rows direct" : "") +
                           " gather stores " + std::to_string(o.bulk_gather_stores) + " batch " +
                           std::to_string(o.bulk_gather_batch) + " item groups of " +
                           std::to_string(group),
                       R > 1 ? kSharedWeightGrads : std::vector<std::string>{});
      }
}

// Runs the forward on routing that host validation would reject (uploaded directly) and expects
// the device's check to stop the pass with a message naming `want`.
void expect_device_rejects(const spec::LayerConfig& cfg, int64_t token, int64_t slot, int32_t id, const std::string& want) {
  ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 8);
  in.at("inputs/topk_experts").data<int32_t>()[token * cfg.top_k + slot] = id;
  std::vector<void*> owned;
  auto up = [&](const char* p) -> void* {
    const ref::Tensor& t = in.at(p);
    void* d = nullptr;
    cudaMalloc(&d, t.size_bytes());
    cudaMemcpy(d, t.raw(), t.size_bytes(), cudaMemcpyHostToDevice);
    owned.push_back(d);
    return d;
  };
  kernel::DeviceInputs di;
  di.x = static_cast<const uint16_t*>(up("inputs/x"));
  di.topk_experts = static_cast<const int32_t*>(up("inputs/topk_experts"));
  di.router_weights = static_cast<const float*>(up("inputs/router_weights"));
  di.w_routed_gate = static_cast<const uint16_t*>(up("inputs/w_routed_gate"));
  di.w_routed_up = static_cast<const uint16_t*>(up("inputs/w_routed_up"));
  di.w_routed_down = static_cast<const uint16_t*>(up("inputs/w_routed_down"));
  di.w_shared_gate = static_cast<const uint16_t*>(up("inputs/w_shared_gate"));
  di.w_shared_up = static_cast<const uint16_t*>(up("inputs/w_shared_up"));
  di.w_shared_down = static_cast<const uint16_t*>(up("inputs/w_shared_down"));
  kernel::DeviceOutputs dout;
  void* o = nullptr;
  cudaMalloc(&o, cfg.num_tokens() * cfg.hidden * 2);
  owned.push_back(o);
  dout.output = static_cast<uint16_t*>(o);
  kernel::KernelOptions opt;
  opt.wait_timeout_s = 1.0;
  kernel::Layer layer(cfg, opt);
  layer.forward(di, dout);
  try {
    layer.check_errors();
    ADD_FAILURE() << "invalid routing (" << want << ") was not detected on the device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
  }
  for (void* p : owned) cudaFree(p);
}

// The plan's check of each routing row, once per rank by the block whose token slice holds it:
// rows of up to 8 or 16 ids are checked in registers, longer ones id by id (moe.cuh, plan_slice
// and check_row); each must catch a repeated id and one out of range.
TEST(Kernel, DeviceSideRoutingValidationStopsThePass) {
  REQUIRE_GPU();
  const spec::LayerConfig k2{64, 32, 32, 8, 2, 2, 8}, k12{64, 32, 32, 16, 12, 2, 8}, k20{64, 32, 32, 32, 20, 2, 8};
  const ref::TensorMap in2 = ref::generate_inputs(k2, ref::parse_routing("uniform"), 8);
  const ref::TensorMap in12 = ref::generate_inputs(k12, ref::parse_routing("uniform"), 8);
  const ref::TensorMap in20 = ref::generate_inputs(k20, ref::parse_routing("uniform"), 8);
  // The same seed regenerates these inputs inside expect_device_rejects; repeat an earlier slot's id.
  const int32_t dup2 = in2.at("inputs/topk_experts").data<int32_t>()[3 * 2 + 0];
  const int32_t dup12 = in12.at("inputs/topk_experts").data<int32_t>()[9 * 12 + 4];
  const int32_t dup20 = in20.at("inputs/topk_experts").data<int32_t>()[3 * 20 + 2];
  expect_device_rejects(k2, 3, 1, dup2, "token 3 slot 1 (expert id " + std::to_string(dup2) + ",");
  expect_device_rejects(k2, 3, 1, 8, "token 3 slot 1 (expert id 8, E=8)");
  expect_device_rejects(k2, 5, 0, -2, "token 5 slot 0 (expert id -2, E=8)");
  // 400 tokens: token 300 lies in a later block's slice than the first (with a whole GPU's blocks
  // a rank, three or four tokens a slice), so a block other than block 0 must report it.
  const spec::LayerConfig k2_long{64, 32, 32, 8, 2, 2, 200};
  expect_device_rejects(k2_long, 300, 1, 8, "token 300 slot 1 (expert id 8, E=8)");
  expect_device_rejects(k12, 9, 11, dup12, "token 9 slot 11 (expert id " + std::to_string(dup12) + ",");
  expect_device_rejects(k12, 14, 7, 16, "token 14 slot 7 (expert id 16, E=16)");
  expect_device_rejects(k20, 3, 17, dup20, "token 3 slot 17 (expert id " + std::to_string(dup20) + ",");
  expect_device_rejects(k20, 6, 19, 32, "token 6 slot 19 (expert id 32, E=32)");
}

void check_determinism(const spec::LayerConfig& base) {
  ref::RoutingSpec rs = ref::parse_routing("zipf:1.2");
  rs.empty_prob = 0.05;
  const ref::TensorMap in = ref::generate_inputs(base, rs, 99);
  ref::TensorMap first;
  std::string first_name;
  for (int R : {1, 2, 4, 8, 16}) {
    spec::LayerConfig cfg = base;
    cfg.num_ranks = R;
    cfg.tokens_per_rank = base.num_tokens() / R;
    for (int comm : {1, 3, 5}) {  // 5 = blocks_per_rank - 1: one compute block runs every tile
      for (int run = 0; run < 4; ++run) {
        kernel::KernelOptions o;
        o.comm_blocks_per_rank = comm;
        o.blocks_per_rank = 6;
        o.disable_tma = run % 2 == 1;  // sm_90a: TMA-filled and thread-filled tiles alternate
        o.bulk_gather = run != 2;      // the forward's gather by threads once (with TMA),
        o.swiglu = run == 2 ? kernel::SwigluEpilogue::kStaged    // that time with the gate/up epilogue through
                            : kernel::SwigluEpilogue::kFragments;  // shared memory,
        if (run == 0) o.forward_comm_blocks_per_rank = 6 - comm;  // and the forward's own gathering count once
        if (run == 3) o.group_rows = 2 + comm;                     // and other item groups (3, 5, 7)
        o.shared_items = run != 1;  // and each block on its own rank's GEMM items once
        // and x rows read where they lie (no gather), the rest gathered
        o.x_rows = run == 0 && comm != 1 ? kernel::XRows::kDirect : kernel::XRows::kGathered;
        ref::TensorMap got = kernel::run_layer(cfg, in, true, o);
        // Shared-expert weight gradients are per rank by contract: compare the rest.
        for (const std::string& p : kSharedWeightGrads) got.erase(p);
        const std::string name = "R=" + std::to_string(R) + " comm=" + std::to_string(comm) + " run=" + std::to_string(run) +
                                 (o.disable_tma ? " (no TMA)" : "") + (o.forward_comm_blocks_per_rank ? " (forward comm=" + std::to_string(o.forward_comm_blocks_per_rank) + ")" : "") +
                                 (o.bulk_gather ? "" : " (thread gather)") + (o.swiglu == kernel::SwigluEpilogue::kStaged ? " (staged SwiGLU)" : "") +
                                 (o.group_rows != 8 ? " (item groups of " + std::to_string(o.group_rows) + ")" : "") +
                                 (o.shared_items ? "" : " (own rank's items)") + (o.x_rows == kernel::XRows::kDirect ? " (x rows direct)" : "");
        if (first.empty()) {
          first = got;
          first_name = name;
          // And the first configuration equals the emulator.
          ref::TensorMap emu = ref::emulate(cfg, in);
          for (auto& [p, t] : in) emu[p] = t;
          expect_bitwise(emu, got, cfg, "emulator vs " + name, kSharedWeightGrads);
        } else {
          expect_bitwise(first, got, cfg, first_name + " vs " + name, kSharedWeightGrads);
        }
      }
    }
  }
}

// A layer (R = 4) whose rank `silent` does nothing must end in a timeout whose message holds every
// one of `wants`, not hang: `run` runs a forward with the options it is given.
void expect_silent_rank_timeout(
    const std::function<void(const spec::LayerConfig&, const ref::TensorMap&, const kernel::KernelOptions&)>& run,
    int silent, double timeout_s, const std::vector<std::string>& wants) {
  const spec::LayerConfig cfg{64, 32, 32, 8, 2, 4, 16};
  const ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 5);
  kernel::KernelOptions o;
  o.silent_rank = silent;
  o.wait_timeout_s = timeout_s;
  try {
    run(cfg, in, o);
    FAIL() << "rank " << silent << ", which never signals, was not detected";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& w : wants) EXPECT_NE(m.find(w), std::string::npos) << "want '" << w << "' in: " << m;
  }
}

// The NCCL transport (symmetric windows, LSA pointers) against the virtual rack: bit for bit.
// One rank runs on any GPU; more ranks need that many GPUs (skipped otherwise).
TEST(Kernel, NcclTransportMatchesTheVirtualRack) {
  REQUIRE_GPU_AND_NCCL();
  const int devices = visible_devices();
  const ref::Golden g = ref::read_golden(fixtures().front());
  std::string not_run;
  for (int R : {1, 2, 4, 8}) {
    if (R > devices || g.cfg.num_experts % R || g.cfg.num_tokens() % R) {
      not_run += " R=" + std::to_string(R);
      continue;
    }
    spec::LayerConfig cfg = g.cfg;
    cfg.num_ranks = R;
    cfg.tokens_per_rank = g.cfg.num_tokens() / R;
    const ref::TensorMap in = inputs_of(g.tensors);
    ref::TensorMap virt = kernel::run_layer(cfg, in, true);
    for (auto& [p, t] : in) virt[p] = t;
    const ref::TensorMap nccl = kernel::run_layer_nccl(cfg, in, true);
    expect_bitwise(virt, nccl, cfg, "NCCL R=" + std::to_string(R) + " vs virtual rack");
  }
  // A partial run says so (one GPU runs R = 1 only): the rest needs that many GPUs.
  if (!not_run.empty()) {
    std::printf("[   NOTE   ] not run:%s (%d GPU(s) visible, or the fixture does not split)\n", not_run.c_str(), devices);
    RecordProperty("not_run", not_run);
  }
}

// The NCCL transport's windowed protocol on one GPU (run_layer_split): every rank its own launch
// on its own stream, inputs copied into windows, no host synchronisation between passes, ranks
// entering passes at different times. Three input sets back to back (a forward and a backward
// each), every set bit for bit the virtual rack's, for both engines and R = 2, 4, 8: a rank that
// read a peer's window before the peer published this set's copy, or a copy a peer still read,
// would differ.
TEST(Kernel, SplitRackMatchesTheVirtualRackPassAfterPass) {
  REQUIRE_GPU_SPLIT();
  const std::vector<std::string> routings{"uniform", "zipf:1.2", "hot:2:10"};
  for (const bool fast : {false, true}) {
    for (int R : {2, 4, 8}) {
      // fast: H, I, Is multiples of 64 (the TMA engine); slow: a small layer of the slow engine.
      const spec::LayerConfig cfg = fast ? spec::LayerConfig{128, 64, 64, 16, 4, R, 64}
                                         : spec::LayerConfig{64, 32, 32, 8, 2, R, 16};
      std::vector<ref::TensorMap> sets;
      for (size_t i = 0; i < routings.size(); ++i)
        sets.push_back(ref::generate_inputs(cfg, ref::parse_routing(routings[i]), 100 + 7 * i + R));
      kernel::SplitRackOptions split;
      for (int r = 0; r < R; ++r) split.delay_us.push_back(r % 2 ? 300.0 * r : 0.0);  // odd ranks late
      const std::vector<ref::TensorMap> got = kernel::run_layer_split(cfg, sets, true, {}, split);
      ASSERT_EQ(got.size(), sets.size());
      for (size_t i = 0; i < sets.size(); ++i) {
        ref::TensorMap want = kernel::run_layer(cfg, sets[i], true);
        for (auto& [p, t] : sets[i]) want[p] = t;
        const std::string what = std::string(fast ? "fast" : "slow") + " R=" + std::to_string(R) + " set " +
                                 std::to_string(i) + " (" + routings[i] + ")";
        // Only the last set keeps its intermediates; the earlier sets' results are outputs and grads.
        if (i + 1 < sets.size()) {
          for (const auto& [p, t] : got[i]) EXPECT_NE(p.rfind("intermediates/", 0), 0u) << what << ": " << p;
        }
        expect_bitwise(want, got[i], cfg, "split rack " + what);
      }
    }
  }
}

// A rank that never enters a pass is named in its peers' timeout, not a hang.
TEST(Kernel, SplitRackNamesARankThatNeverEnters) {
  REQUIRE_GPU_SPLIT();
  expect_silent_rank_timeout(
      [](const spec::LayerConfig& cfg, const ref::TensorMap& in, const kernel::KernelOptions& o) {
        kernel::run_layer_split(cfg, {in}, false, o);
      },
      1, 0.3, {"timed out", "pass entry", "rank 1 had not entered pass 1"});
}

// The entry wait is what keeps a rank from reading a window before its owner has published it:
// without it (SplitRackOptions::skip_entry_wait), with one rank 50 ms late, the early ranks read
// its window's zeroed routing (expert 0 in every slot: more rows than the workspace holds, or the
// device's routing check) or push into it before it resets its arrivals, so the run fails or its
// results differ (the GPU runs so far failed on the workspace).
// Two ranks of the slow engine's small layer on the split rack, uniform routing from `seed`, rank 1
// `late_us` late into each pass, waits bounded at `timeout_s`.
struct LateRankCase {
  spec::LayerConfig cfg{64, 32, 32, 8, 2, 2, 16};
  ref::TensorMap in;
  kernel::KernelOptions o;
  kernel::SplitRackOptions split;
  LateRankCase(uint64_t seed, double timeout_s, double late_us)
      : in(ref::generate_inputs(cfg, ref::parse_routing("uniform"), seed)) {
    o.wait_timeout_s = timeout_s;
    split.delay_us = {0.0, late_us};
  }
};

TEST(Kernel, SplitRackNeedsTheEntryWait) {
  REQUIRE_GPU_SPLIT();
  LateRankCase c(9, 0.5, 50000.0);
  const spec::LayerConfig& cfg = c.cfg;
  const ref::TensorMap& in = c.in;
  const kernel::KernelOptions& o = c.o;
  kernel::SplitRackOptions& split = c.split;
  EXPECT_NO_THROW(kernel::run_layer_split(cfg, {in}, false, o, split)) << "with the wait";
  split.skip_entry_wait = true;
  bool wrong = false;
  std::string how;
  try {
    const ref::TensorMap got = kernel::run_layer_split(cfg, {in}, false, o, split).front();
    const ref::TensorMap want = kernel::run_layer(cfg, in, false);
    const ref::Tensor& a = want.at("outputs/output");
    const ref::Tensor& b = got.at("outputs/output");
    wrong = std::memcmp(a.raw(), b.raw(), a.size_bytes()) != 0;
    how = wrong ? "the output differs" : "the output matched";
  } catch (const Error& e) {
    how = e.what();
    // The zeroed routing's failures (the comment above): any other error is not what this shows.
    wrong = how.find("rows, more than its workspace's") != std::string::npos ||
            how.find("found invalid routing") != std::string::npos ||
            how.find("waiting for flag 'forward arrivals") != std::string::npos;
  }
  EXPECT_TRUE(wrong) << "without the entry wait the late rank's window was read before it was published, yet " << how;
  std::printf("[   NOTE   ] without the entry wait: %s\n", how.c_str());
}

// The second copy of each window input is what lets a rank run into the next pass while a peer
// is still reading this one. Set 0 sends no token across ranks, so rank 0 finishes its first
// forward without rank 1, which stalls 30 ms after entering it; rank 0 then stages set 1, whose
// tokens all cross, into its window. With two copies rank 1 still reads set 0's routing there and
// both sets are bit for bit the virtual rack's; with one (SplitRackOptions::single_copy) it reads
// set 1's, counts rank 0's tokens as its experts' rows, twice what its workspace holds, and the
// run fails (or, were the workspace larger, its results would differ).
TEST(Kernel, SplitRackNeedsTheSecondCopy) {
  REQUIRE_GPU_SPLIT();
  const spec::LayerConfig cfg{64, 32, 32, 8, 2, 2, 16};
  std::vector<ref::TensorMap> sets;
  for (int set = 0; set < 2; ++set) {
    ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 40 + set);
    int32_t* topk = in.at("inputs/topk_experts").data<int32_t>();
    for (int64_t t = 0; t < cfg.num_tokens(); ++t) {
      const int64_t home = t / cfg.tokens_per_rank;          // the token's rank
      const int64_t to = set == 0 ? home : 1 - home;          // set 0: its own rank's experts; set 1: the other's
      for (int64_t k = 0; k < cfg.top_k; ++k) topk[t * cfg.top_k + k] = static_cast<int32_t>(to * 4 + (t + k) % 4);
    }
    sets.push_back(std::move(in));
  }
  kernel::KernelOptions o;
  o.wait_timeout_s = 2;
  kernel::SplitRackOptions split;
  split.stall_us = {0.0, 30000.0};
  const std::vector<ref::TensorMap> got = kernel::run_layer_split(cfg, sets, false, o, split);
  for (size_t i = 0; i < sets.size(); ++i) {
    ref::TensorMap want = kernel::run_layer(cfg, sets[i], false);
    for (auto& [p, t] : sets[i]) want[p] = t;
    expect_bitwise(want, got[i], cfg, "split rack, rank 1 stalled, set " + std::to_string(i));
  }
  split.single_copy = true;
  bool wrong = false;
  std::string how;
  try {
    const std::vector<ref::TensorMap> one = kernel::run_layer_split(cfg, sets, false, o, split);
    for (size_t i = 0; i < sets.size(); ++i) {
      const ref::TensorMap want = kernel::run_layer(cfg, sets[i], false);
      const ref::Tensor& a = want.at("outputs/output");
      const ref::Tensor& b = one[i].at("outputs/output");
      if (std::memcmp(a.raw(), b.raw(), a.size_bytes()) != 0) wrong = true;
    }
    how = wrong ? "an output differs" : "every output matched";
  } catch (const Error& e) {
    how = e.what();
    // Rank 1 counted set 1's rows of rank 0 on top of set 0's own: more than its workspace holds
    // (rank 0 then times out waiting for it to enter the next pass).
    wrong = how.find("split rack rank 1: kernel: rank 1 received ") != std::string::npos &&
            how.find("rows, more than its workspace's 32") != std::string::npos;
  }
  EXPECT_TRUE(wrong) << "with one copy the stalled rank read the next set's routing, yet " << how;
  std::printf("[   NOTE   ] with one copy: %s\n", how.c_str());
}

// A windowed pass refuses to start once a wait has timed out: the stalled rank's peers time out
// (timeout 0.2 s, stall 1 s) and the run says which rank and flag, in the first rank's words.
TEST(Kernel, SplitRackTimeoutNamesTheLateRank) {
  REQUIRE_GPU_SPLIT();
  const LateRankCase c(12, 0.2, 1000000.0);
  try {
    kernel::run_layer_split(c.cfg, {c.in, c.in}, false, c.o, c.split);
    FAIL() << "a rank 1 s late with a 0.2 s timeout was not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("split rack rank 0: kernel: rank 0's entry into pass 1 timed out after 0.2 s: rank 1 had not "
                     "entered pass 1"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("pass entry"), std::string::npos) << m;
  }
}

// The benchmark entry of the NCCL transport (mok-bench --transport nccl): every rank's time of
// every timed pass, and the last forward's output equal to the virtual rack's, bit for bit.
TEST(Kernel, NcclTimingGivesEveryRanksTimesAndTheOutput) {
  REQUIRE_GPU_AND_NCCL();
  const int devices = visible_devices();
  for (int R : {1, 2}) {
    if (R > devices) {
      std::printf("[   NOTE   ] R=%d not run: %d GPU(s) visible\n", R, devices);
      RecordProperty("not_run", "R=" + std::to_string(R));
      continue;
    }
    const spec::LayerConfig cfg{64, 32, 32, 8, 2, R, 16};
    const ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("zipf:1.2"), 11);
    const kernel::NcclTimes t = kernel::time_layer_nccl(cfg, in, true, 1, 3);
    ASSERT_EQ(t.num_ranks, R);
    ASSERT_EQ(t.reps, 3);
    ASSERT_EQ(t.forward_ms.size(), size_t(R) * 3);
    ASSERT_EQ(t.backward_ms.size(), size_t(R) * 3);
    for (float ms : t.forward_ms) EXPECT_GT(ms, 0.0f) << "R=" << R;
    for (float ms : t.backward_ms) EXPECT_GT(ms, 0.0f) << "R=" << R;
    EXPECT_GT(t.blocks_per_rank, 1);
    EXPECT_GE(t.comm_blocks_per_rank, 1);
    const ref::TensorMap virt = kernel::run_layer(cfg, in, false);
    const ref::Tensor& want = virt.at("outputs/output");
    ASSERT_EQ(t.output.size_bytes(), want.size_bytes());
    EXPECT_EQ(std::memcmp(t.output.raw(), want.raw(), want.size_bytes()), 0) << "R=" << R << ": output differs";
  }
}

// Where the forward reads routed x rows by default: directly up to the threshold hidden size,
// gathered past it; an explicit request is kept whatever the size.
TEST(KernelOptions, XRowsAutoResolvesByHiddenSize) {
  using kernel::XRows;
  EXPECT_EQ(kernel::KernelOptions{}.x_rows, XRows::kAuto);
  for (int64_t h : {int64_t{64}, int64_t{1024}, kernel::kDirectRowsMaxHidden})
    EXPECT_EQ(kernel::resolve_x_rows(XRows::kAuto, h), XRows::kDirect) << h;
  for (int64_t h : {kernel::kDirectRowsMaxHidden + 64, int64_t{7168}})
    EXPECT_EQ(kernel::resolve_x_rows(XRows::kAuto, h), XRows::kGathered) << h;
  for (int64_t h : {int64_t{2048}, int64_t{7168}}) {
    EXPECT_EQ(kernel::resolve_x_rows(XRows::kGathered, h), XRows::kGathered) << h;
    EXPECT_EQ(kernel::resolve_x_rows(XRows::kDirect, h), XRows::kDirect) << h;
  }
}

// The default gate/up epilogue: staged up to the threshold hidden size, fragments past it; an
// explicit request is kept whatever the size.
TEST(KernelOptions, SwigluAutoResolvesByHiddenSize) {
  using kernel::SwigluEpilogue;
  EXPECT_EQ(kernel::KernelOptions{}.swiglu, SwigluEpilogue::kAuto);
  for (int64_t h : {int64_t{64}, int64_t{2048}, kernel::kStagedSwigluMaxHidden})
    EXPECT_EQ(kernel::resolve_swiglu(SwigluEpilogue::kAuto, h), SwigluEpilogue::kStaged) << h;
  for (int64_t h : {kernel::kStagedSwigluMaxHidden + 64, int64_t{7168}})
    EXPECT_EQ(kernel::resolve_swiglu(SwigluEpilogue::kAuto, h), SwigluEpilogue::kFragments) << h;
  for (int64_t h : {int64_t{2048}, int64_t{7168}}) {
    EXPECT_EQ(kernel::resolve_swiglu(SwigluEpilogue::kFragments, h), SwigluEpilogue::kFragments) << h;
    EXPECT_EQ(kernel::resolve_swiglu(SwigluEpilogue::kStaged, h), SwigluEpilogue::kStaged) << h;
  }
}

// The layer's time of a repetition is its slowest rank's; the median is over repetitions.
TEST(NcclTimes, MedianOfTheSlowestRank) {
  // rank 0: 1 5 3, rank 1: 2 4 9 -> slowest 2 5 9 -> median 5
  EXPECT_EQ(kernel::median_of_slowest_rank({1, 5, 3, 2, 4, 9}, 2, 3), 5.0f);
  // an even count takes the upper median: slowest 3 2 -> 3
  EXPECT_EQ(kernel::median_of_slowest_rank({1, 2, 3, 1}, 2, 2), 3.0f);
  EXPECT_EQ(kernel::median_of_slowest_rank({7, 1, 4}, 1, 3), 4.0f);
  EXPECT_EQ(kernel::median_of_slowest_rank({}, 2, 3), 0.0f);
}

TEST(Kernel, SilentRankEndsInADiagnosticNotAHang) {
  REQUIRE_GPU();
  expect_silent_rank_timeout(
      [](const spec::LayerConfig& cfg, const ref::TensorMap& in, const kernel::KernelOptions& o) {
        kernel::run_layer(cfg, in, false, o);
      },
      2, 0.2, {"timed out", "forward arrivals", "rank "});
}

// Bytes of a golden-schema tensor of this config.
size_t spec_bytes(const spec::LayerConfig& cfg, const char* path) {
  const ref::TensorSpec* s = ref::find_spec(path);
  size_t n = ref::dtype_size(s->dtype);
  for (int64_t d : ref::spec_shape(*s, cfg)) n *= static_cast<size_t>(d);
  return n;
}

// Device buffers of a layer's inputs and results for Layer's own calls (freed with it).
struct LayerBuffers {
  std::vector<void*> owned;
  kernel::DeviceInputs in;
  kernel::DeviceOutputs out;
  LayerBuffers(const spec::LayerConfig& cfg, const ref::TensorMap& inputs) {
    auto upload = [&](const char* path) -> void* {
      const ref::Tensor& t = inputs.at(path);
      void* d = nullptr;
      if (cudaMalloc(&d, t.size_bytes()) != cudaSuccess) throw std::runtime_error("cudaMalloc");
      owned.push_back(d);
      cudaMemcpy(d, t.raw(), t.size_bytes(), cudaMemcpyHostToDevice);
      return d;
    };
    auto zeros = [&](const char* path) -> void* {
      const size_t n = spec_bytes(cfg, path);
      void* d = nullptr;
      if (cudaMalloc(&d, n) != cudaSuccess) throw std::runtime_error("cudaMalloc");
      owned.push_back(d);
      cudaMemset(d, 0, n);
      return d;
    };
    in.x = static_cast<const uint16_t*>(upload("inputs/x"));
    in.topk_experts = static_cast<const int32_t*>(upload("inputs/topk_experts"));
    in.router_weights = static_cast<const float*>(upload("inputs/router_weights"));
    in.w_routed_gate = static_cast<const uint16_t*>(upload("inputs/w_routed_gate"));
    in.w_routed_up = static_cast<const uint16_t*>(upload("inputs/w_routed_up"));
    in.w_routed_down = static_cast<const uint16_t*>(upload("inputs/w_routed_down"));
    in.w_shared_gate = static_cast<const uint16_t*>(upload("inputs/w_shared_gate"));
    in.w_shared_up = static_cast<const uint16_t*>(upload("inputs/w_shared_up"));
    in.w_shared_down = static_cast<const uint16_t*>(upload("inputs/w_shared_down"));
    in.d_output = static_cast<const uint16_t*>(upload("inputs/d_output"));
    out.output = static_cast<uint16_t*>(zeros("outputs/output"));
    out.d_x = static_cast<uint16_t*>(zeros("grads/d_x"));
    out.d_router_weights = static_cast<float*>(zeros("grads/d_router_weights"));
    out.d_w_routed_gate = static_cast<float*>(zeros("grads/d_w_routed_gate"));
    out.d_w_routed_up = static_cast<float*>(zeros("grads/d_w_routed_up"));
    out.d_w_routed_down = static_cast<float*>(zeros("grads/d_w_routed_down"));
    out.d_w_shared_gate = static_cast<float*>(zeros("grads/d_w_shared_gate"));
    out.d_w_shared_up = static_cast<float*>(zeros("grads/d_w_shared_up"));
    out.d_w_shared_down = static_cast<float*>(zeros("grads/d_w_shared_down"));
  }
  ~LayerBuffers() {
    for (void* p : owned) cudaFree(p);
  }
};

// A pass's error is kept until check_errors() reports it: forward(); backward(); check_errors()
// reports the forward's overflow, and the backward does not run on the plan it left (which would
// read and write past the workspace). A backward with no forward before it is refused at once.
TEST(Kernel, AFailedForwardIsReportedAfterTheBackwardAndStopsIt) {
  REQUIRE_GPU();
  const spec::LayerConfig cfg{64, 32, 32, 8, 2, 2, 16};
  const ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("zipf:1.2"), 21);
  const int64_t need = kernel::rows_per_rank(cfg, in.at("inputs/topk_experts").data<int32_t>());
  ASSERT_GE(need, 2);
  LayerBuffers buf(cfg, in);
  kernel::KernelOptions small;
  small.row_capacity = need - 1;  // one row short on the busiest rank
  {
    kernel::Layer layer(cfg, small);
    try {
      layer.backward(buf.in, buf.out);
      ADD_FAILURE() << "a backward before any forward was launched";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("before any forward"), std::string::npos) << e.what();
    }
    layer.forward(buf.in, buf.out);
    layer.backward(buf.in, buf.out);  // no check in between: the forward's error must survive it
    try {
      layer.check_errors();
      ADD_FAILURE() << "the forward's overflow was lost";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("more than its workspace's"), std::string::npos) << e.what();
    }
    // Reported once: the backward alone again finds the plan past the workspace.
    layer.backward(buf.in, buf.out);
    try {
      layer.check_errors();
      ADD_FAILURE() << "a backward on an overflowed plan ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("backward found the routing plan"), std::string::npos) << e.what();
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  // A layer with room runs both passes after all of that (no sticky device fault).
  kernel::KernelOptions enough;
  enough.row_capacity = need;
  kernel::Layer layer(cfg, enough);
  layer.forward(buf.in, buf.out);
  layer.backward(buf.in, buf.out);
  EXPECT_NO_THROW(layer.check_errors());
}

// Fills a device result with a byte pattern; unchanged() says whether it still holds it.
struct Sentinel {
  void* p;
  size_t n;
  Sentinel(void* ptr, size_t bytes) : p(ptr), n(bytes) { cudaMemset(p, 0x5a, n); }
  bool unchanged() const {
    std::vector<unsigned char> h(n);
    cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost);
    return std::all_of(h.begin(), h.end(), [](unsigned char b) { return b == 0x5a; });
  }
};

// Expects check_errors() to report a non-finite router weight with every piece of `want` in its text.
void expect_weight_error(kernel::Layer& layer, const std::vector<std::string>& want, const std::string& what) {
  try {
    layer.check_errors();
    ADD_FAILURE() << what << ": the non-finite router weight was not detected on the device";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    for (const std::string& w : want) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << what << ": " << e.what();
  }
}

// DESIGN.md section 3 asks the kernel itself (not only the host wrappers, which check first) to
// refuse a non-finite router weight before any work: Layer::forward and backward get device
// pointers, so the device checks every weight (empty slots too) at the start of each pass. Three
// cases (400 tokens over two ranks, 9 blocks a rank): a NaN in rank 1's tokens (token 300, in the
// seventh block's slice of each rank), a +Inf in rank 0's, a -Inf in an empty slot; two of them
// with later bad weights beside (in other blocks' slices and on the other rank), where the error
// must name the first in token order whichever block raised first. Each case runs a forward with
// the bad weights, then a clean forward and a backward given the bad weights; the results keep a
// byte pattern written before the pass (no result was written), and the layer runs clean passes
// afterwards.
TEST(Kernel, DeviceSideRouterWeightValidationStopsThePass) {
  REQUIRE_GPU();
  const spec::LayerConfig cfg{64, 32, 32, 8, 2, 2, 200};
  ref::RoutingSpec rs = ref::parse_routing("uniform");
  rs.empty_prob = 0.2;
  const ref::TensorMap in = ref::generate_inputs(cfg, rs, 31);
  const int32_t* topk = in.at("inputs/topk_experts").data<int32_t>();
  int64_t empty = -1;  // an empty slot (id -1)
  for (int64_t i = 0; i < cfg.num_tokens() * cfg.top_k && empty < 0; ++i)
    if (topk[i] < 0) empty = i;
  ASSERT_GE(empty, 0) << "the routing drew no empty slot";
  const int64_t K = cfg.top_k;
  struct Bad {
    int64_t entry;  // the first bad weight in token order: the one the error must name
    float value;
    std::string text;
    std::vector<int64_t> later;  // entries after it set to NaN as well
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Bad& b : {Bad{300 * K + 1, std::nanf(""), "NaN", {399 * K}},
                       Bad{5 * K + 0, inf, "+Inf", {5 * K + 1, 120 * K, 250 * K + 1}}, Bad{empty, -inf, "-Inf", {}}}) {
    const int64_t g = b.entry / K;
    const std::vector<std::string> want{"at token " + std::to_string(g) + " (rank " + std::to_string(g / cfg.tokens_per_rank) +
                                            "'s token " + std::to_string(g % cfg.tokens_per_rank) + ") slot " +
                                            std::to_string(b.entry % K) + ": " + b.text + " (bits 0x",
                                        "the first in token order", "router weights must be finite"};
    ref::TensorMap bad = in;
    bad.at("inputs/router_weights").data<float>()[b.entry] = b.value;
    for (int64_t e : b.later) bad.at("inputs/router_weights").data<float>()[e] = std::nanf("");
    LayerBuffers good(cfg, in), buf(cfg, bad);
    kernel::KernelOptions o;
    o.blocks_per_rank = 9;  // slices of 45 tokens: token 300 in each rank's seventh block's
    o.wait_timeout_s = 2.0;
    kernel::Layer layer(cfg, o);
    {  // the forward
      Sentinel out(buf.out.output, spec_bytes(cfg, "outputs/output"));
      layer.forward(buf.in, buf.out);
      expect_weight_error(layer, want, "forward, entry " + std::to_string(b.entry));
      EXPECT_TRUE(out.unchanged()) << "the forward wrote its output before stopping";
    }
    {  // the backward alone: a clean forward, then the backward with the bad weights
      layer.forward(good.in, good.out);
      ASSERT_NO_THROW(layer.check_errors());
      kernel::DeviceOutputs res = good.out;
      Sentinel dx(res.d_x, spec_bytes(cfg, "grads/d_x"));
      Sentinel drw(res.d_router_weights, spec_bytes(cfg, "grads/d_router_weights"));
      Sentinel dwg(res.d_w_routed_gate, spec_bytes(cfg, "grads/d_w_routed_gate"));
      kernel::DeviceInputs mixed = good.in;
      mixed.router_weights = buf.in.router_weights;
      layer.backward(mixed, res);
      expect_weight_error(layer, want, "backward, entry " + std::to_string(b.entry));
      EXPECT_TRUE(dx.unchanged() && drw.unchanged() && dwg.unchanged()) << "the backward wrote results before stopping";
    }
    // Clean passes run afterwards and give the emulator's bits.
    layer.forward(good.in, good.out);
    layer.backward(good.in, good.out);
    ASSERT_NO_THROW(layer.check_errors());
    std::vector<uint16_t> dx(cfg.num_tokens() * cfg.hidden);
    cudaMemcpy(dx.data(), good.out.d_x, dx.size() * 2, cudaMemcpyDeviceToHost);
    const ref::TensorMap emu = ref::emulate(cfg, in);
    EXPECT_EQ(std::memcmp(dx.data(), emu.at("grads/d_x").raw(), dx.size() * 2), 0) << "d_x after the refused passes";
  }
}

TEST(Kernel, HostValidationRejectsBadInputsBeforeLaunch) {
  REQUIRE_GPU();
  const spec::LayerConfig cfg{64, 32, 32, 8, 2, 2, 8};
  ref::TensorMap in = ref::generate_inputs(cfg, ref::parse_routing("uniform"), 6);
  in.at("inputs/topk_experts").data<int32_t>()[3] = 8;  // out of range
  EXPECT_THROW(kernel::run_layer(cfg, in, false), Error);
  // Each block-count rule (block_counts.hpp) names the option it refuses.
  const auto expect_refused = [&cfg](const kernel::KernelOptions& opts, const std::string& names) {
    try {
      kernel::Layer layer(cfg, opts);
      ADD_FAILURE() << "accepted; expected an error naming " << names;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  kernel::KernelOptions o;
  o.comm_blocks_per_rank = -1;
  expect_refused(o, "kernel: comm_blocks_per_rank must be");
  o.comm_blocks_per_rank = 4;
  o.blocks_per_rank = 4;  // no block left to compute
  expect_refused(o, "kernel: comm_blocks_per_rank must be");
  o.blocks_per_rank = 1;
  o.comm_blocks_per_rank = 0;
  expect_refused(o, "at least 2 blocks");
  o.blocks_per_rank = 4;
  o.comm_blocks_per_rank = 1;
  o.forward_comm_blocks_per_rank = 4;  // the forward's count, likewise
  expect_refused(o, "forward_comm_blocks_per_rank must be");
  o.forward_comm_blocks_per_rank = -2;
  expect_refused(o, "forward_comm_blocks_per_rank must be");
  o.forward_comm_blocks_per_rank = 0;
  for (int bad : {0, -1, 65}) {  // row tiles per item group
    o.group_rows = bad;
    try {
      kernel::Layer layer(cfg, o);
      ADD_FAILURE() << "group_rows " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("group_rows"), std::string::npos) << e.what();
    }
  }
  o.group_rows = 64;  // the largest allowed
  EXPECT_NO_THROW(kernel::Layer(cfg, o));
  o.group_rows = 8;
  for (int bad : {0, 5}) {  // the bulk gather's stores in flight, and rows flagged per fence
    kernel::KernelOptions b = o;
    b.bulk_gather_stores = bad;
    EXPECT_THROW(kernel::Layer(cfg, b), Error) << "bulk_gather_stores " << bad;
  }
  for (int bad : {0, 17}) {
    kernel::KernelOptions b = o;
    b.bulk_gather_batch = bad;
    EXPECT_THROW(kernel::Layer(cfg, b), Error) << "bulk_gather_batch " << bad;
  }
  for (double bad : {0.0, -1.0, std::nan(""), 2e6}) {  // every wait is bounded, by a positive bound
    o.wait_timeout_s = bad;
    EXPECT_THROW(kernel::Layer(cfg, o), Error) << "wait_timeout_s " << bad;
  }
  o.wait_timeout_s = 10;
  o.blocks_per_rank = -3;
  EXPECT_THROW(kernel::Layer(cfg, o), Error);
  o.blocks_per_rank = 1 << 30;  // more than fit (the product with R must not wrap)
  EXPECT_THROW(kernel::Layer(cfg, o), Error);
}

}  // namespace

// Exit codes for ctest: 1 when anything failed; 77 (the test's SKIP_RETURN_CODE) when nothing
// failed but no GPU was there to run the kernel tests, which then skipped with the reason; 0
// otherwise. ctest never reads a failure as a skip.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (failed != 0) return 1;
  std::string why;
  if (!mok::kernel::gpu_available(&why)) {
    std::printf("test_kernel: no GPU (%s): the kernel tests skipped; reporting a skip to ctest\n", why.c_str());
    return 77;
  }
  return 0;
}
